"""kopf handlers: every trigger funnels into one locked, idempotent reconciliation per cache.

Level-triggered on purpose: watch events of the cache and of its Jobs, and a
periodic resync (for Nodes coming and going), all run the same pass. No kopf
progress annotations and no finalizer are needed, so an uninstalled operator never
blocks the deletion of a CompileCache; owned Jobs go with it by ownerReference.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from typing import Any

import kopf

from compilecache import api, jobs
from compilecache.kube import ApiError, Client
from compilecache.reconcile import reconcile

logger = logging.getLogger(__name__)

CACHES = (api.GROUP, api.VERSION, api.PLURAL)

# An explicit registry: the handlers are the same whichever registry was kopf's default
# when this module was first imported (tests run other operators in the same process).
registry = kopf.OperatorRegistry()
RESYNC_SECONDS_ENV = "COMPILECACHE_RESYNC_SECONDS"
DEFAULT_RESYNC_SECONDS = 60.0


@kopf.on.login(registry=registry)
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The same credentials as the API client's: the pod's service account, else the kubeconfig."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup(registry=registry)
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Build the API client once (its first build is slow), then start the periodic resync."""
    # Our own Events tell what happened to a cache; kopf's per-handler messages would be noise there.
    settings.posting.level = logging.WARNING
    memo.client = await asyncio.to_thread(Client.from_environment)
    memo.known = set()
    memo.locks = {}
    memo.locks_guard = threading.Lock()
    interval = float(os.environ.get(RESYNC_SECONDS_ENV, DEFAULT_RESYNC_SECONDS))
    memo.resync = asyncio.create_task(_resync_forever(memo, interval))


@kopf.on.cleanup(registry=registry)
async def stop(memo: kopf.Memo, **_: Any) -> None:
    """Stop the periodic resync."""
    task = memo.get("resync")
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@kopf.on.event(*CACHES, registry=registry)
def cache_changed(type: str, namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    """The cache was created, changed (spec, annotations or our own status) or listed at start-up."""
    assert namespace is not None  # CompileCaches are namespaced
    if type == "DELETED":
        memo.known.discard((namespace, name))
        return
    memo.known.add((namespace, name))
    _reconcile(memo, namespace, name)


@kopf.on.event("batch", "v1", "jobs", labels={jobs.LABEL_CACHE: kopf.PRESENT}, registry=registry)
def job_changed(namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    """A warm-up Job started, progressed, finished or went away: refresh its cache."""
    assert namespace is not None  # Jobs are namespaced
    _reconcile(memo, namespace, labels[jobs.LABEL_CACHE])


def _reconcile(memo: kopf.Memo, namespace: str, name: str) -> None:
    # One pass at a time per cache: Job events and cache events arrive on different
    # kopf workers, and two passes must never both decide to post the same transition.
    with memo.locks_guard:
        lock = memo.locks.setdefault((namespace, name), threading.Lock())
    with lock:
        try:
            reconcile(memo.client, namespace, name)
        except ApiError as exc:
            # Event handlers are not retried by kopf; the periodic resync is the retry.
            logger.error("Reconciling %s/%s failed, will retry on resync: %s", namespace, name, exc)


async def _resync_forever(memo: kopf.Memo, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        for namespace, name in sorted(memo.known):
            try:
                await asyncio.to_thread(_reconcile, memo, namespace, name)
            except Exception:  # a resync must survive one cache's failure, and retry it next round
                logger.exception("Resync of %s/%s failed.", namespace, name)
