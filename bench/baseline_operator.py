"""The floor for bench/reconcile.py: a bare kopf operator that only acknowledges each cache.

It reacts to the same watch events as the real operator and answers with one
status patch, so the difference to the real operator is our own work.
"""

import kopf


@kopf.on.event("compilecache.dev", "v1alpha1", "compilecaches")
def acknowledge(type: str, patch: kopf.Patch, status: kopf.Status, **_: object) -> None:
    if type != "DELETED" and not status.get("phase"):
        patch.status["phase"] = "Pending"
