"""The gate watchdog: no training pod waits past its ``gateTimeout`` (+ one period), whoever is active.

Every replica runs it, paused by kopf's peering or not, by design: it is the safety valve
for the time when no replica reconciles (a takeover after a crash, a higher-priority peer,
a broken warm-up). Every ``PERIOD_SECONDS`` it lists the pods held by the
``compilecache.dev/warm`` gate in the served namespaces, reads each one's cache, and releases
those that are due through the same code as a pass (``reconcile.release_gates``): the cache
is Ready, Degraded or gone, its gate is off, or the pod's ``gateTimeout`` passed. It lists the
pods not yet scheduled (field selector ``spec.nodeName=``, which kube-apiserver serves for pods:
a gated pod is never bound), not the pods labelled ``compilecache.dev/cache``: an owner may
remove that label after admission, and such a pod, still gated, is released at once. The served
namespaces are kopf's own options: names, or kopf's patterns (``-n 'team-*'``, ``-n '!kube-*'``),
which each round matches, with kopf's own matcher, against the namespaces that exist then. Two replicas
releasing the same pod make one release and one Event: the JSON patch tests the gate list it
read (``gates.release_patch``), so the second one gets 422 and moves on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

# kopf's own reading of its --namespace patterns (private, pinned by the lock; a test runs both).
from kopf._cogs.structs.references import match_namespace, select_specific_namespaces

from compilecache.controller import gates
from compilecache.controller.jobs import LABEL_CACHE
from compilecache.controller.kube import COMPILECACHES, NAMESPACES, PODS, ApiError, Client
from compilecache.controller.policy import DEFAULT, Policy
from compilecache.controller.reconcile import release_gates

logger = logging.getLogger(__name__)

# Between two rounds: a due pod waits at most this long past its gateTimeout (plus one round's calls).
PERIOD_SECONDS = 10.0


def parse_namespaces(value: str | None) -> list[str | None] | None:
    """The served namespaces from ``WATCHDOG_NAMESPACES_ENV`` (JSON: ``null`` for all, or a list of names).

    ``[None]`` means cluster-wide (one list over all namespaces); ``None``: not told, no watchdog.
    """
    if value is None:
        return None
    names = json.loads(value)
    if names is None:
        return [None]
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"not null nor a list of namespace names: {value!r}")
    return list(names)


def held_by_cache(pods: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The gated pods grouped by (namespace, cache name), in a stable order; a pod that names no
    cache (its label removed) comes under the name ``""``."""
    held: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        cache = str((meta.get("labels") or {}).get(LABEL_CACHE) or "")
        if meta.get("namespace") and gates.is_gated(pod):
            held.setdefault((meta["namespace"], cache), []).append(dict(pod))
    return dict(sorted(held.items()))


def namespace_names(client: Client, served: Sequence[str | None]) -> list[str | None]:
    """The served namespaces as names to list in (``None``: all), kopf's patterns matched now.

    As kopf does when it may not list namespaces, a refused list leaves the literal names only.
    """
    if None in served:
        return [None]
    names = sorted(select_specific_namespaces(name for name in served if name))
    patterns = [name for name in served if name and name not in names]
    if patterns:
        try:
            existing = [ns["metadata"]["name"] for ns in client.list(NAMESPACES, None)]
        except ApiError as exc:
            logger.warning("The gate watchdog could not list namespaces for %s: %s", ", ".join(patterns), exc)
            existing = []
        names += sorted(n for n in existing if n not in names and any(match_namespace(n, p) for p in patterns))
    return list(names)


def release_overdue(client: Client, namespaces: Sequence[str | None], policy: Policy = DEFAULT) -> None:
    """One round: release every gated pod in ``namespaces`` that is due (``None``: all namespaces).

    ``namespaces`` may hold kopf's patterns (:func:`namespace_names`). ``policy`` bounds each
    cache's gateTimeout, as in a pass.
    """
    pods: list[dict[str, Any]] = []
    for namespace in namespace_names(client, namespaces):
        pods.extend(client.list(PODS, namespace, fields={"spec.nodeName": ""}))  # not scheduled: gated ones too
    for (namespace, name), held in held_by_cache(pods).items():
        if not name:  # its cache label was removed: it waits for nothing (gates.CACHE_LABEL_REMOVED)
            release_gates(client, namespace, name, None, phase=None, pods=held, policy=policy)
            continue
        cache = client.get(COMPILECACHES, name, namespace)
        if cache is not None and cache["metadata"].get("deletionTimestamp"):
            cache = None  # going: no pod waits for it (as a pass decides)
        phase = (cache.get("status") or {}).get("phase") if cache is not None else None
        release_gates(client, namespace, name, cache, phase=phase, pods=held, policy=policy)


async def run_forever(
    client: Client,
    namespaces: Sequence[str | None],
    workers: concurrent.futures.Executor,
    period: float = PERIOD_SECONDS,
    policy: Policy = DEFAULT,
) -> None:
    """Run a round every ``period`` seconds on ``workers`` (the client blocks), until cancelled.

    The operator's own workers, not asyncio's default ones: the loop waits for those at exit,
    and a round blocked on an unreachable API would hold the shutdown.
    """
    loop = asyncio.get_running_loop()
    while True:
        try:
            await loop.run_in_executor(workers, release_overdue, client, namespaces, policy)
        except ApiError as exc:  # the API is down or refuses: the next round tries again
            logger.warning("The gate watchdog could not list or read: %s", exc)
        except Exception:  # a bug must not end the safety valve
            logger.exception("The gate watchdog's round failed.")
        await asyncio.sleep(period)
