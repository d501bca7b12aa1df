"""Expectations: what a cache's passes created that the watch-fed indexes have not shown yet.

A pass reads from the indexes (``indexes.py``), which learn of an object from its watch event,
a moment after the create that made it. A pass in that moment (the cache's own status change
or another Job's event woke it) would find no Job, plan to create it again, get a 409, and
read everything again from the API. So, as the ReplicaSet controller does with client-go's
``ControllerExpectations``, each pass hands on the keys (``plural/name``) it created, and the
next pass treats those it does not see yet as created (``Snapshot.created``): the plan neither
creates them again nor mistakes them for missing. A key is dropped once the indexes show the
object, or after ``EXPECT_SECONDS`` (an object deleted before its watch event came would
otherwise never be made again; past that, a create's 409 makes the pass read the API).
"""

from __future__ import annotations

from collections.abc import Mapping

from compilecache.controller.kube import JOBS, PROVISIONING_REQUESTS, PVCS, SERVICES
from compilecache.controller.snapshot import Snapshot

EXPECT_SECONDS = 60.0

Expected = Mapping[str, float]  # key (``plural/name``) → when it was created (time.monotonic())


def seen(snapshot: Snapshot) -> set[str]:
    """The keys of the objects a snapshot holds (what a pass may create: claim, Jobs, Services, requests)."""
    keys = {JOBS.key(job["metadata"]["name"]) for job in (*snapshot.jobs, *snapshot.expiry_jobs)}
    keys |= {SERVICES.key(service["metadata"]["name"]) for service in snapshot.services}
    # Read from the API, not an index: seen at once (a request deleted to be asked again is made again at once).
    keys |= {PROVISIONING_REQUESTS.key(request["metadata"]["name"]) for request in snapshot.requests}
    if snapshot.claim is not None:
        keys.add(PVCS.key(snapshot.claim["metadata"]["name"]))
    return keys


def unseen(expected: Expected, snapshot: Snapshot, now: float) -> dict[str, float]:
    """The expectations still standing: created, not in ``snapshot``, and not older than ``EXPECT_SECONDS``."""
    present = seen(snapshot)
    return {key: at for key, at in expected.items() if key not in present and now - at < EXPECT_SECONDS}
