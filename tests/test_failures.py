"""Failures are loud and never hold training: the real operator against an API emulator that misbehaves.

The emulator here is the tests' :class:`KubeEmulator` with two behaviours of a real API
server added for the test: refusing a creation (as validation or admission does: 422,
nothing stored) or failing it (500), and hanging (an API server that stopped answering).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import pytest
from kopf.testing import KopfRunner

from compilecache.controller import gates, handlers
from compilecache.local.apiserver import KubeEmulator, kube_error
from conftest import SESSION_KUBECONFIG, KubeClient, running_emulator, write_kubeconfig
from specs import cluster
from test_gates import create_pod, gate_names
from test_operator import NS, create_cache, jobs_of, status_of, wait_jobs, wait_phase

pytestmark = [pytest.mark.slow, pytest.mark.emulator]


@attrs.define(kw_only=True)
class MisbehavingEmulator(KubeEmulator):
    """Refuses creations of the resources in ``refuse`` (plural → (status, message)); hangs while ``hanging``."""

    refuse: dict[str, tuple[int, str]] = attrs.field(factory=dict)
    attempts: dict[str, int] = attrs.field(factory=dict)
    attempted_at: dict[str, list[float]] = attrs.field(factory=dict)  # time.monotonic() of each attempt
    hanging: bool = False
    hung: int = 0
    _unhang: asyncio.Event | None = attrs.field(default=None, init=False)

    async def _create(self, request: Any, info: Any) -> Any:
        plural = request.resource.plural
        self.attempts[plural] = self.attempts.get(plural, 0) + 1
        self.attempted_at.setdefault(plural, []).append(time.monotonic())
        if plural in self.refuse:
            # As a real server's validation or admission: an error answer, and nothing stored.
            status, message = self.refuse[plural]
            raise kube_error(status, "Invalid" if status == 422 else "InternalError", message)
        return await super()._create(request, info)

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if self.hanging:
            self.hung += 1
            if self._unhang is None:
                self._unhang = asyncio.Event()
            await self._unhang.wait()
        return await super().__call__(raw_request)

    async def unhang(self) -> None:
        """Answer the hung requests (so that the server can stop)."""
        self.hanging = False
        if self._unhang is not None:
            self._unhang.set()


@dataclass
class Cluster:
    kube: KubeClient
    emulator: MisbehavingEmulator
    operator: KopfRunner | None = None


@pytest.fixture
def cluster_(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    """The misbehaving emulator with 5 GPU nodes, ``$KUBECONFIG`` pointing at it."""
    emulator = MisbehavingEmulator()
    with running_emulator(tmp_path, emulator) as runner:
        write_kubeconfig(SESSION_KUBECONFIG, runner.url)
        monkeypatch.setenv("KUBECONFIG", str(SESSION_KUBECONFIG))
        monkeypatch.setenv(handlers.RESYNC_SECONDS_ENV, "0.3")
        monkeypatch.delenv("COMPILECACHE_WEBHOOK", raising=False)
        kube = KubeClient(runner)
        for node in cluster():
            kube.create("v1/nodes", node)
            kube.patch("v1/nodes", node["metadata"]["name"], {"status": node["status"]}, subresource="status")
        try:
            yield Cluster(kube, emulator)
        finally:
            runner.call(emulator.unhang)
            SESSION_KUBECONFIG.unlink(missing_ok=True)


@pytest.fixture
def running(cluster_: Cluster) -> Iterator[Cluster]:
    """The real operator on the misbehaving emulator."""
    with KopfRunner(["run", "--standalone", "-A"], registry=handlers.registry, timeout=30) as runner:
        cluster_.operator = runner
        yield cluster_
    assert runner.exception is None, runner.output
    assert "Traceback" not in runner.output, runner.output


def warnings_of(kube: KubeClient, reason: str) -> list[dict[str, Any]]:
    return [e for e in kube.list("v1/events", NS) if e["reason"] == reason and e["type"] == "Warning"]


REFUSAL = 'Job.batch "llama" is invalid: spec.template.spec.containers[0].resources.requests: Invalid value: "4"'


def test_a_refused_job_fails_its_pool_with_the_apis_message_and_training_is_not_held(running: Cluster) -> None:
    kube, emulator = running.kube, running.emulator
    emulator.refuse["jobs"] = (422, REFUSAL)
    create_pod(kube, "train-0")
    create_cache(kube, consumers={"gateTimeout": "1h"})
    status = wait_phase(kube, "Failed")
    assert {pool["state"] for pool in status["pools"]} == {"Failed"}
    assert {pool["reason"] for pool in status["pools"]} == {"JobRejected"}
    assert all(REFUSAL in pool["message"] for pool in status["pools"])
    assert "warm-up failed on every pool" in status["message"]
    kube.wait_for(lambda: warnings_of(kube, "PoolFailed") and warnings_of(kube, "Failed"))
    # Training is not held: nothing can warm (every pool failed), so the gate goes at once, not at gateTimeout.
    kube.wait_for(lambda: gate_names(kube, "train-0") == ["example.com/quota"], timeout=15)
    annotations = kube.get("v1/pods", "train-0", NS)["metadata"]["annotations"]
    assert annotations[gates.ANNOTATION_RELEASED].startswith(f"{gates.CACHE_FAILED} ")
    # The record stands: the same Jobs are not tried again at every resync.
    tried = emulator.attempts["jobs"]
    time.sleep(1.5)  # five resync periods
    assert emulator.attempts["jobs"] == tried == 2 and jobs_of(kube) == {}
    assert status_of(kube)["phase"] == "Failed"


def test_a_failing_api_is_a_failed_status_a_warning_and_retries_with_backoff(running: Cluster) -> None:
    kube, emulator = running.kube, running.emulator
    emulator.refuse["jobs"] = (500, "etcdserver: request timed out")
    create_pod(kube, "train-0")
    create_cache(kube, consumers={"gateTimeout": "2s"})
    status = wait_phase(kube, "Failed")
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (conditions["Reconciled"]["status"], conditions["Reconciled"]["reason"]) == ("False", "ReconcileError")
    assert "etcdserver: request timed out" in conditions["Reconciled"]["message"]
    assert "etcdserver: request timed out" in status["message"]
    kube.wait_for(lambda: warnings_of(kube, "ReconcileError"))
    kube.wait_for(lambda: gate_names(kube, "train-0") == ["example.com/quota"], timeout=15)
    # Retried with a growing delay (1, 2, 4 s ...), not at every 0.3 s resync: the next retry comes, and no
    # 4 s since the first failure held more than 5 tries (an event may wake one pass early). Timed from the
    # attempts themselves: when this test gets here on a busy machine, the delay may be 8 s already.
    tried = emulator.attempts["jobs"]
    kube.wait_for(lambda: emulator.attempts["jobs"] > tried, timeout=20, interval=0.02)
    times = emulator.attempted_at["jobs"]
    busiest = max(sum(1 for later in times if start <= later <= start + 4) for start in times)
    assert busiest <= 5, times
    # The API recovers: the next retry goes through, with no other trigger.
    del emulator.refuse["jobs"]
    wait_jobs(kube, 2)
    status = kube.wait_for(lambda: status_of(kube)["phase"] == "Warming" and status_of(kube), timeout=20)
    assert "Reconciled" not in {c["type"] for c in status["conditions"]}
    assert len(warnings_of(kube, "ReconcileError")) == 1  # one Warning for the one failure, not one per retry


def test_the_operator_stops_promptly_while_the_api_hangs(cluster_: Cluster) -> None:
    kube, emulator = cluster_.kube, cluster_.emulator
    runner = KopfRunner(["run", "--standalone", "-A"], registry=handlers.registry, timeout=60)
    with runner:
        create_cache(kube)
        wait_jobs(kube, 2)
        wait_phase(kube, "Warming")
        emulator.hanging = True  # the API stops answering; the next resync pass hangs in a call
        kube.wait_for(lambda: emulator.hung >= 1, timeout=10)
        stopping = time.monotonic()
    stopped = time.monotonic() - stopping
    # Bounded by one call's read timeout (kube.REQUEST_TIMEOUT), not by retries of every call of a pass.
    assert stopped < 15, f"the operator took {stopped:.1f}s to stop"
    assert runner.exception is None, runner.output
