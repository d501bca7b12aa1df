"""What the Kubernetes API server enforces on names, for tests: one copy of the rules and versions.

The regular expressions are apimachinery's (pkg/util/validation/validation.go): a DNS-1123
label (pod hostnames) and a DNS-1035 label (Service names); label values are
``controller.api.is_label_value``. ``KUBERNETES_VERSIONS`` are the
releases whose OpenAPI schemas (kubernetes-validate) every generated or shipped object must pass.
"""

from __future__ import annotations

import re

KUBERNETES_VERSIONS = ["1.30", "1.31", "1.32", "1.33", "1.34", "1.35"]

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
LABEL_MAX = 63


def is_dns1123_label(value: str) -> bool:
    """A pod hostname, a namespace, most object names' parts: at most 63 of [a-z0-9-], alphanumeric ends."""
    return len(value) <= LABEL_MAX and _DNS1123_LABEL.fullmatch(value) is not None


def is_dns1035_label(value: str) -> bool:
    """A Service name: a DNS-1123 label that starts with a letter."""
    return len(value) <= LABEL_MAX and _DNS1035_LABEL.fullmatch(value) is not None
