"""Restarts hit on the local cluster (issue 20 item 1): a training pod resumed from its checkpoint hits every program.

The real operator warms ``examples/workloads/flax_resume.py`` (exact mode, the default resumed run)
in a warm-up Job; then the training Job runs twice with the same data volume, as a requeued job
does: the first pod starts fresh and saves its checkpoint there, the second restores it (its
``TrainState.step`` strong-typed) — and both hit every program, by the trainer's own verdict.
The cluster and operator are test_e2e's (its module fixture, started once for this module).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from test_e2e import CC, JOBS, NS, Setup, example, local, small_cache, status_of, wait_phase, wait_pod

pytestmark = [pytest.mark.slow, pytest.mark.emulator, pytest.mark.jax]
__all__ = ["local"]  # the module fixture this module runs on

SCRIPT = "examples/workloads/flax_resume.py"
CLAIMS = "v1/persistentvolumeclaims"


def training_job(name: str, cache: str, data_claim: str) -> dict[str, Any]:
    """``examples/training-job.yaml`` running the Flax script for 3 steps, its checkpoint on a data volume."""
    job = copy.deepcopy(example("training-job.yaml"))
    job["metadata"]["name"] = name
    template = job["spec"]["template"]
    template["metadata"]["labels"] = {"compilecache.dev/cache": cache, "app": cache}
    [container] = template["spec"]["containers"]
    container["command"] = ["python", SCRIPT, "--steps", "3", "--json", "--ckpt-dir=/data/run-1"]
    container["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    template["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": data_claim}}]
    return job


def run_training(setup: Setup, job: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """Create the Job, wait for its pod to end; (its JSON line, the trainer's verdict line)."""
    setup.cluster.client.create(JOBS, job, NS)
    pod = wait_pod(
        setup,
        job["metadata"]["name"],
        lambda p: (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"),
        timeout=120,
    )
    log = setup.cluster.logs(NS, pod["metadata"]["name"], "train")
    assert pod["status"]["phase"] == "Succeeded", log[-3000:]
    result = json.loads([line for line in log.splitlines() if line.startswith("{")][-1])
    verdicts = [line for line in log.splitlines() if line.startswith("compilecache: ")]
    assert verdicts, log[-3000:]
    return result, verdicts[-1]


@pytest.mark.parametrize("resume", [True, False])
def test_a_training_pod_resumed_from_its_checkpoint_hits_every_program(local: Setup, resume: bool) -> None:
    client = local.cluster.client
    name = "resume" if resume else "no-resume"
    cache = small_cache(name)
    workload = {"name": "train", "script": SCRIPT, "args": ["--steps", "1000"], "steps": 2}
    cache["spec"]["warmup"]["workloads"] = [workload if resume else {**workload, "resume": False}]
    client.create(CC, cache, NS)
    status = wait_phase(local, name, ("Ready", "Failed", "Degraded"), timeout=180)
    assert status["phase"] == "Ready", status
    [pool] = status["pools"]
    # Verify ran the pair too (a fresh start, then resumed in its workdir): every compile hit.
    assert pool["verifyHits"] == pool["verifyRequests"] > 0, pool
    data = f"{name}-train-data"
    client.create(CLAIMS, {"metadata": {"name": data}, "spec": {"resources": {"requests": {"storage": "1Gi"}}}}, NS)

    fresh, line = run_training(local, training_job(f"{name}-train-1", name, data))
    assert not fresh["resumed"] and fresh["hits"] == fresh["requests"] > 0, (fresh, line)
    assert (local.cluster.claim_dir(NS, data) / "run-1" / "checkpoint.msgpack").is_file()
    # The requeued job: the same data volume, so it restores the checkpoint (step 3) and trains on.
    resumed, line = run_training(local, training_job(f"{name}-train-2", name, data))
    assert resumed["resumed"] and resumed["step"] == 6, resumed
    if resume:
        assert resumed["hits"] == resumed["requests"] > 0, (resumed, line)
        assert line == f"compilecache: {resumed['hits']}/{resumed['requests']} compiles hit", line
    else:  # warmed from a fresh start only: the restored step's train_step misses, and is named so
        assert resumed["hits"] == resumed["requests"] - 1, (resumed, line)
        assert line.endswith(
            "missed: train_step (arg 0 (state.step): int32[] weak_type=False in training, True in the warm-up)"
        ), line
        # The pod's termination message carries it to the cache's status, for the user who never reads logs.
        reason = client.wait_for(
            lambda: (status_of(local, name).get("consumers") or {}).get("lastMissReason"), timeout=30
        )
        assert reason == "train_step: arg 0 (state.step): int32[] weak_type=False in training, True in the warm-up", (
            reason
        )
