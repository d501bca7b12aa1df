"""Real JAX: a training process with exactly what the webhook gives a pod hits every entry the warm-up Job wrote.

The warm-up runs the command and environment of the cache's warm-up Job manifest
(``jobs.warmup_job``); the "training" process gets the environment of the mutated
pod's container (``admission.mutate``) and finds the cache at the pod's mount path.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from compilecache.controller import admission, jobs
from compilecache.controller.api import parse_spec
from compilecache.controller.pools import resolve_pools
from jaxhelpers import TINY_MODEL, clean_env, entry_files, run_cli, run_train
from specs import cache, cache_spec, cluster

pytestmark = [pytest.mark.slow, pytest.mark.jax]


def test_training_pod_env_hits_every_entry_the_warmup_job_wrote(tmp_path: Path) -> None:
    mount = tmp_path / "mnt" / "compilecache"  # stands for the PVC, mounted at the same path in both pods
    warmup = cache_spec()["warmup"]
    model_env = [{"name": key, "value": value} for key, value in TINY_MODEL.items()]
    warmup["workloads"] = [
        {"name": "train-step", "entrypoint": "examples.workloads.transformer:targets", "env": model_env}
    ]
    llama = cache(mountPath=str(mount), warmup=warmup)
    spec = parse_spec(llama["spec"])

    # The warm-up Job's container, run here as its pod would run it.
    job = jobs.warmup_job(llama, spec, resolve_pools(spec, cluster())[0])
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["volumeMounts"][-1]["mountPath"] == str(mount)
    command = list(container["command"])
    assert command[0] == "compilecache"
    command[command.index("--report") + 1] = str(tmp_path / "report.json")
    mount.mkdir(parents=True)  # the kubelet creates the volume's mount point before the container starts
    job_env = {item["name"]: item["value"] for item in container["env"]}
    job_env |= {"TMPDIR": str(tmp_path), "HOME": str(tmp_path)}  # the Job's /tmp is its own emptyDir
    done = run_cli(command[1:], clean_env(job_env))
    assert done.returncode == 0, done.stderr
    written = entry_files(mount)
    assert written, "the warm-up wrote no entries"

    # The training pod as the webhook mutates it: same mount path, and its container's env only.
    pod = {
        "metadata": {"namespace": "default", "labels": {"compilecache.dev/cache": "llama"}},
        "spec": {"containers": [{"name": "train", "image": "trainer:1.2", "env": model_env}]},
    }
    mutated = admission.mutate(pod, llama | {"status": {"phase": "Ready"}}).pod
    trainer = mutated["spec"]["containers"][0]
    assert trainer["volumeMounts"] == [{"name": "compilecache", "mountPath": str(mount), "readOnly": True}]
    pod_env = {item["name"]: item["value"] for item in trainer["env"]}
    result = run_train(clean_env(pod_env))
    assert result["misses"] == 0, result
    assert result["hits"] == result["requests"] == len(written), (result, written)
