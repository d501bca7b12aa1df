"""What every framework's run manifest and report share: run ids, names, states, the JSON.

One manifest per run, under ``DIR/.compilecache/manifests/<run_id>.json``; the
run id holds a UTC timestamp, the host and random bits, so concurrent Jobs
never write the same file and names sort by time. Each framework writes its own
document (JAX's: :mod:`compilecache.frameworks.jax.manifest`; PyTorch's:
:mod:`compilecache.frameworks.pytorch.warm`), each checked on reading by
:mod:`compilecache.cache.manifests`.
"""

from __future__ import annotations

import json
import secrets
import socket
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

# A manifest's "state": "pending" is stored before the run publishes its entries (they are
# recorded, with their sha256, whatever fails later); the run replaces it with "complete" at its end.
PENDING = "pending"
COMPLETE = "complete"
REPORT_SCHEMA = "compilecache.dev/report/v1"


def new_run_id(now: datetime | None = None, host: str | None = None) -> str:
    """``20251121T135800Z-<host>-<8 hex>``: unique, sortable, safe as a file name."""
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    safe_host = "".join(c if c.isalnum() or c in "-." else "-" for c in (host or socket.gethostname()))
    return f"{stamp}-{safe_host[:40] or 'host'}-{secrets.token_hex(4)}"


def manifest_name(run_id: str) -> str:
    """File name of a run's manifest."""
    return f"{run_id}.json"


def utc_now() -> str:
    """RFC 3339 UTC time, second precision (Kubernetes style)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def dumps(document: Mapping[str, Any]) -> bytes:
    """Stable, readable JSON bytes."""
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()
