"""The Kubernetes releases every generated or shipped object is checked against (kubernetes-validate).

One list for the chart, the property test and the examples. Name rules are the API
emulator's (``compilecache.local.validation``), which quotes the API server's.
"""

from __future__ import annotations

KUBERNETES_VERSIONS = ["1.30", "1.31", "1.32", "1.33", "1.34", "1.35"]
