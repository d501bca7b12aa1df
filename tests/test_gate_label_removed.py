"""A gated pod whose ``compilecache.dev/cache`` label its owner removed is still released.

After creation a pod's labels may change, but its scheduling gates can only be removed (Kubernetes'
"Pod Scheduling Readiness": "After creation, each schedulingGate can be removed in arbitrary order,
but addition of a new scheduling gate is disallowed"): the pod keeps our gate. No cache's pass lists
it (they list by the label), the watchdog listed by the label too, and the ``pod_held`` handler was
filtered on it: the pod waited for ever, past any gateTimeout. Now it waits for no cache and goes at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kopf.testing import KopfRunner

from compilecache.controller import gates, handlers, status, watchdog
from compilecache.controller.api import Consumers
from compilecache.controller.kube import Client
from test_gates import GATE, NOW, OTHER_GATE, gate_names, gated_pod
from test_operator import NS, create_cache, wait_jobs

PODS = "v1/pods"


def test_an_unlabelled_gated_pod_waits_for_no_cache() -> None:
    pod = gated_pod()
    del pod["metadata"]["labels"]
    # The watchdog and the pod handler find no cache for it, as for a deleted cache; the reason says which.
    assert gates.reason_to_release(pod, None, phase=None, now=NOW) == gates.CACHE_LABEL_REMOVED
    assert gates.reason_to_release(gated_pod(), None, phase=None, now=NOW) == gates.CACHE_DELETED
    assert gates.reason_to_release(gated_pod(), Consumers(), phase=status.WARMING, now=NOW) is None


def _unlabel(kube: Any, name: str, namespace: str = NS) -> None:
    """The pod's owner removes the cache label (a merge patch: null deletes the key)."""
    kube.patch(PODS, name, {"metadata": {"labels": {"compilecache.dev/cache": None}}}, namespace)
    assert "compilecache.dev/cache" not in (kube.get(PODS, name, namespace)["metadata"].get("labels") or {})


@pytest.mark.emulator
def test_the_watchdog_releases_a_gated_pod_whose_cache_label_was_removed(kube_env: Any) -> None:
    for name in ("unlabelled", "waiting"):
        body = gated_pod(name, cache="llama")
        del body["metadata"]["creationTimestamp"]  # the server stamps it: now, so no gateTimeout is due
        kube_env.create(PODS, body, NS)
    kube_env.create(
        "compilecache.dev/v1alpha1/compilecaches",
        {"apiVersion": "compilecache.dev/v1alpha1", "kind": "CompileCache", "metadata": {"name": "llama"}},
        NS,
    )
    _unlabel(kube_env, "unlabelled")
    client = Client.from_environment()
    try:
        watchdog.release_overdue(client, [NS])
    finally:
        client.close()
    assert gate_names(kube_env, "unlabelled") == [OTHER_GATE["name"]]  # ours went, the other gate stays
    released = kube_env.get(PODS, "unlabelled", NS)["metadata"]["annotations"][gates.ANNOTATION_RELEASED]
    assert released.startswith(gates.CACHE_LABEL_REMOVED + " ")
    assert gate_names(kube_env, "waiting") == [OTHER_GATE["name"], GATE]  # its cache is there, not Ready: it waits


@pytest.fixture
def operator(kube_env: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[KopfRunner]:
    """The real operator; its gate watchdog is off (no served namespaces told), so the handler is what acts."""
    monkeypatch.setenv(handlers.RESYNC_SECONDS_ENV, "0.3")
    monkeypatch.delenv("COMPILECACHE_WEBHOOK", raising=False)
    monkeypatch.delenv(handlers.WATCHDOG_NAMESPACES_ENV, raising=False)
    with KopfRunner(["run", "--standalone", "-A"], registry=handlers.registry, timeout=30) as runner:
        yield runner
    assert runner.exception is None, runner.output
    assert "Traceback" not in runner.output, runner.output


@pytest.mark.slow
@pytest.mark.emulator
def test_the_operator_releases_a_gated_pod_at_once_when_its_cache_label_is_removed(
    kube_env: Any, operator: KopfRunner
) -> None:
    from specs import cluster

    for node in cluster():
        kube_env.create("v1/nodes", node)
        kube_env.patch("v1/nodes", node["metadata"]["name"], {"status": node["status"]}, subresource="status")
    create_cache(kube_env, consumers={"gateTimeout": "1h"})
    wait_jobs(kube_env, 2)  # the cache warms: nothing releases its pods for an hour
    body = gated_pod("train-0")
    del body["metadata"]["creationTimestamp"]
    kube_env.create(PODS, body, NS)
    _unlabel(kube_env, "train-0")
    kube_env.wait_for(lambda: gate_names(kube_env, "train-0") == [OTHER_GATE["name"]], timeout=15)
    released = kube_env.get(PODS, "train-0", NS)["metadata"]["annotations"][gates.ANNOTATION_RELEASED]
    assert released.startswith(gates.CACHE_LABEL_REMOVED + " ")
