"""High availability on the local cluster: two real ``compilecache operator`` processes under kopf peering.

Issue 18's "done when": SIGKILL the active replica during a warm-up, and the other finishes it
to Ready within the peering lifetime, with no Job duplicated and the gated pods released at
Ready; and with no replica active at all, a gated pod still goes at its ``gateTimeout`` (the
gate watchdog every replica runs). The warm-up is real (``compilecache warm`` on a one-layer
transformer) but held by the test until it lets it go, so the kill lands while it runs.
"""

from __future__ import annotations

import contextlib
import datetime
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compilecache.controller import gates
from compilecache.local.cluster import PEERING, PEERINGS, LocalCluster, Operator, free_port, run_operator
from compilecache.local.jobrunner import is_finished

pytestmark = [pytest.mark.slow, pytest.mark.emulator, pytest.mark.jax]

ROOT = Path(__file__).resolve().parent.parent
NS = "default"
CC, JOBS, PODS, EVENTS = "compilecache.dev/v1alpha1/compilecaches", "batch/v1/jobs", "v1/pods", "v1/events"
# The promise (issue 18): another replica takes over within 30 s of a SIGKILL; slack for this
# shared, busy machine (process start-up and the first pass are not part of kopf's takeover).
TAKEOVER_PROMISE_S, SLACK_S = 30.0, 10.0
NO_METRICS = ["--metrics-port=0"]  # two replicas on one machine cannot share the default port

# The workload's module in the image: the real example transformer, once the test lets it go.
HELD_WORKLOAD = f"""
import os, sys, time
sys.path.insert(0, {str(ROOT)!r})
from examples.workloads import transformer

def targets():
    # Beside this module: the pod's /tmp is its own (an emptyDir), the image's files are shared.
    hold = os.path.join(os.path.dirname(__file__), os.environ["HOLD_UNTIL"])
    deadline = time.monotonic() + 300
    while not os.path.exists(hold):
        if time.monotonic() > deadline:
            raise SystemExit("the test never let the warm-up go")
        time.sleep(0.1)
    return transformer.targets()
"""


def cache_body(name: str, hold: str, gate_timeout: str = "30m") -> dict[str, Any]:
    """A cache warmed on the one h100 pool by the held workload; its pods gated for ``gate_timeout``."""
    workload = {
        "name": "train-step",
        "entrypoint": "held_workload:targets",
        "env": [{"name": "MODEL_LAYERS", "value": "1"}, {"name": "HOLD_UNTIL", "value": hold}],
    }
    return {
        "metadata": {"name": name},
        "spec": {
            "storage": {"pvc": {"claimName": f"{name}-cache", "create": {"size": "1Gi"}}},
            "warmup": {
                "image": "registry.example.com/trainer:1",
                "workloads": [workload],
                "pools": [
                    {
                        "name": "h100",
                        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    }
                ],
            },
            "lifecycle": {"verify": False},
            "consumers": {"gate": True, "gateTimeout": gate_timeout},
        },
    }


def training_pod(name: str, cache: str) -> dict[str, Any]:
    container = {"name": "train", "image": "registry.example.com/trainer:1", "command": ["python", "-c", "pass"]}
    return {
        "metadata": {"name": name, "labels": {"compilecache.dev/cache": cache}},
        "spec": {"restartPolicy": "Never", "containers": [container]},
    }


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    app = tmp_path / "app"
    app.mkdir()
    (app / "held_workload.py").write_text(HELD_WORKLOAD)
    with LocalCluster(tmp_path / "cluster", workdir=app) as running:
        yield running


@contextlib.contextmanager
def two_replicas(cluster: LocalCluster, names: tuple[str, str] = ("a", "b")) -> Iterator[tuple[Operator, Operator]]:
    """Two operators in one peering, started one after the other (the first is the older and registers the webhook)."""
    with (
        run_operator(cluster, name=names[0], peering=True, resync_seconds=2.0, extra_args=NO_METRICS) as a,
        run_operator(
            cluster, name=names[1], peering=True, resync_seconds=2.0, register_webhook=False, extra_args=NO_METRICS
        ) as b,
    ):
        yield a, b
    for operator in (a, b):
        assert "Traceback" not in operator.output(), operator.output()[-5000:]


def peers(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    """The peering object's status: identity → {priority, lifetime, lastseen}."""
    found: dict[str, dict[str, Any]] = (cluster.client.get(PEERINGS, PEERING) or {}).get("status") or {}
    return found


def resumed(operator: Operator) -> bool:
    return "Resuming operations after the pause" in operator.output()


def wait_phase(
    cluster: LocalCluster,
    operator: Operator,
    name: str,
    phase: str,
    timeout: float,
    seen: list[str | None] | None = None,
) -> dict[str, Any]:
    """Wait for the cache's phase; fail with its status, its Jobs' logs and the operator's log tail.

    ``seen`` collects the phases polled on the way, each change once (to tell a flapping status).
    """
    deadline = time.monotonic() + timeout
    seen = [] if seen is None else seen
    while True:
        status = (cluster.client.get(CC, name, NS) or {}).get("status") or {}
        if not seen or seen[-1] != status.get("phase"):
            seen.append(status.get("phase"))
        if status.get("phase") == phase:
            return status
        if time.monotonic() > deadline:
            logs = [
                cluster.logs(NS, pod["metadata"]["name"], container["name"])[-2000:]
                for pod in cluster.client.list(PODS, NS)
                for container in pod["spec"]["containers"]
            ]
            raise AssertionError(f"{name} not {phase} in {timeout}s: {status}\n{logs}\n{operator.output()[-3000:]}")
        time.sleep(0.1)  # polling the API: there is nothing to wait on


def warmup_jobs(cluster: LocalCluster, cache: str) -> list[dict[str, Any]]:
    return cluster.client.list(JOBS, NS, f"compilecache.dev/cache={cache}")


def gate_of(cluster: LocalCluster, pod: str) -> tuple[bool, str]:
    """Whether the pod is still gated, and the operator's note of why it was released."""
    body = cluster.client.get(PODS, pod, NS) or {}
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    return gates.is_gated(body), annotations.get(gates.ANNOTATION_RELEASED, "")


def test_the_other_replica_takes_over_a_warm_up_after_a_sigkill(cluster: LocalCluster, tmp_path: Path) -> None:
    hold = tmp_path / "app" / "let-the-warm-up-go"
    client = cluster.client
    with two_replicas(cluster) as (a, b):
        # The oldest replica wins: a's priority is higher, a works and b stands by.
        client.wait_for(lambda: set(peers(cluster)) == {"a", "b"}, timeout=30)
        assert peers(cluster)["a"]["priority"] > peers(cluster)["b"]["priority"]
        client.wait_for(lambda: resumed(a), timeout=30)
        assert not resumed(b), b.output()[-3000:]

        client.create(CC, cache_body("held", hold.name), NS)
        client.create(PODS, training_pod("trainer", "held"), NS)
        assert gate_of(cluster, "trainer")[0], "the webhook did not gate the training pod"
        [job] = client.wait_for(lambda: warmup_jobs(cluster, "held"), timeout=60)
        running = f"job-name={job['metadata']['name']}"
        client.wait_for(lambda: any(p["status"].get("phase") == "Running" for p in client.list(PODS, NS, running)), 60)

        a.kill()
        killed = time.monotonic()
        assert not is_finished(client.get(JOBS, job["metadata"]["name"], NS) or {}), "the warm-up was not running"
        client.wait_for(lambda: resumed(b), timeout=TAKEOVER_PROMISE_S + SLACK_S, interval=0.1)
        takeover = time.monotonic() - killed
        print(f"\ntakeover after SIGKILL of the active replica: {takeover:.1f}s")
        assert takeover < TAKEOVER_PROMISE_S + SLACK_S
        assert gate_of(cluster, "trainer")[0], "released before Ready"

        hold.write_text("go")  # now the warm-up finishes, with only b to see it
        phases: list[str | None] = []
        status = wait_phase(cluster, b, "held", "Ready", timeout=150, seen=phases)
        assert phases in (["Warming", "Expiring", "Ready"], ["Warming", "Ready"]), phases  # no flapping
        held, why = client.wait_for(lambda: (s := gate_of(cluster, "trainer"))[1] and s, timeout=30)
        assert not held and why.startswith(gates.CACHE_READY), why

        # No Job duplicated: the one warm-up Job (same uid: never deleted and made again) and one expiry Job.
        [after] = warmup_jobs(cluster, "held")
        assert after["metadata"]["uid"] == job["metadata"]["uid"]
        assert len(client.list(JOBS, NS, "compilecache.dev/expiry-of=held")) == 1
        assert [pool["state"] for pool in status["pools"]] == ["Succeeded"]
        # One release, one Event per reason (no replica posted a second one).
        events = [e for e in client.list(EVENTS, NS) if e["involvedObject"]["name"] == "held"]
        reasons = [e["reason"] for e in events]
        assert len(reasons) == len(set(reasons)), reasons


def test_with_no_replica_active_a_gated_pod_still_goes_at_its_gate_timeout(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    client = cluster.client
    # A peer that outranks both (as a developer's `kopf run --dev` does) and stays alive for the
    # test: both replicas pause, and no pass runs anywhere.
    lastseen = datetime.datetime.now(datetime.UTC).isoformat()
    blocker = {"priority": 1000, "lifetime": 3600, "lastseen": lastseen}
    client.patch(PEERINGS, PEERING, {"status": {"blocker": blocker}})
    timeout_s = 3.0
    with two_replicas(cluster) as (a, b):
        # kopf starts a --peering operator paused, and it stays paused (silently) behind the blocker.
        client.wait_for(lambda: {"a", "b"} <= set(peers(cluster)), timeout=30)
        client.create(CC, cache_body("stuck", "never", gate_timeout=f"{timeout_s:g}s"), NS)
        client.create(PODS, training_pod("waiting", "stuck"), NS)
        created = time.monotonic()
        assert gate_of(cluster, "waiting")[0], "the webhook of a paused replica did not gate the pod"
        held, why = client.wait_for(
            lambda: (s := gate_of(cluster, "waiting"))[1] and s, timeout=timeout_s + 30 + SLACK_S, interval=0.2
        )
        released = time.monotonic() - created
        print(f"\nreleased by the watchdog {released:.1f}s after creation (gateTimeout {timeout_s:g}s)")
        assert not held and why.startswith(gates.GATE_TIMEOUT), why
        assert released < timeout_s + 30
        # Nothing else happened: both replicas stayed paused.
        assert warmup_jobs(cluster, "stuck") == []
        assert not (client.get(CC, "stuck", NS) or {}).get("status")
        assert not resumed(a) and not resumed(b)
        timeouts = [e for e in client.list(EVENTS, NS) if e["reason"] == gates.GATE_TIMEOUT]
        assert len([e for e in timeouts if e["involvedObject"]["name"] == "waiting"]) == 1


def test_a_rollout_hands_over_only_when_the_old_replica_exits(cluster: LocalCluster, tmp_path: Path) -> None:
    """A rolling update: the new pod stays paused while the old one runs, and resumes as soon as it exits."""
    client = cluster.client
    with two_replicas(cluster, ("old", "new")) as (old, new):
        client.wait_for(lambda: resumed(old), timeout=30)
        client.create(CC, cache_body("rolled", "never"), NS)
        [job] = client.wait_for(lambda: warmup_jobs(cluster, "rolled"), timeout=60)
        assert not resumed(new), new.output()[-3000:]
        old.process.send_signal(signal.SIGTERM)  # what the Deployment does to the old pod
        exited = time.monotonic()
        old.process.wait(30)
        client.wait_for(lambda: resumed(new), timeout=15, interval=0.1)
        handover = time.monotonic() - exited
        print(f"\nhandover after a graceful exit of the active replica: {handover:.1f}s")
        assert set(peers(cluster)) == {"new"}  # the old one said goodbye (kopf removes its entry on exit)
        # The new one carries on with the same Job (a pass after the resume found it: no second one).
        client.wait_for(lambda: "Handler 'job_changed' succeeded" in new.output(), timeout=30)
        [same] = warmup_jobs(cluster, "rolled")
        assert same["metadata"]["uid"] == job["metadata"]["uid"]
    assert old.process.returncode == 0


def test_a_paused_replica_stops_its_passes_and_metrics_and_resumes_them(cluster: LocalCluster) -> None:
    """A peer of higher priority appears (kopf run --dev) and goes: the daemons stop and start again."""
    client = cluster.client
    port = free_port()
    metrics_args = [f"--metrics-port={port}", "--metrics-addr=127.0.0.1"]

    def phase_series() -> list[str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
        return [line for line in text.splitlines() if line.startswith("compilecache_cache_phase{")]

    with run_operator(cluster, name="solo", peering=True, resync_seconds=1.0, extra_args=metrics_args) as solo:
        client.wait_for(lambda: resumed(solo), timeout=30)
        client.create(CC, cache_body("watched", "never"), NS)
        client.wait_for(phase_series, timeout=60)
        lastseen = datetime.datetime.now(datetime.UTC).isoformat()
        client.patch(PEERINGS, PEERING, {"status": {"dev": {"priority": 666, "lifetime": 3600, "lastseen": lastseen}}})
        client.wait_for(lambda: "Pausing operations in favour of" in solo.output(), timeout=30)
        # kopf stopped the cache's daemon (no more passes here), which dropped the cache's series:
        # the active replica (none now) reports it.
        client.wait_for(lambda: "Daemon 'passes' succeeded" in solo.output(), timeout=30)
        assert not phase_series()
        client.patch(PEERINGS, PEERING, {"status": {"dev": None}})  # the developer's operator exits
        client.wait_for(phase_series, timeout=30)

        # Deleted, the cache gets its last pass from its daemon (no finalizer): the pod waiting for it goes.
        assert not client.get(CC, "watched", NS)["metadata"].get("finalizers")
        client.create(PODS, training_pod("late", "watched"), NS)
        assert gate_of(cluster, "late")[0]
        client.delete(CC, "watched", NS)
        held, why = client.wait_for(lambda: (s := gate_of(cluster, "late"))[1] and s, timeout=30)
        assert not held and why.startswith(gates.CACHE_DELETED), why
        ended = "[default/watched] Daemon 'passes' succeeded"
        client.wait_for(lambda: solo.output().count(ended) == 2, timeout=30)  # at the pause, and now
