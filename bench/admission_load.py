"""How long one hostile CompileCache or training pod holds the operator: its answer time and the loop's stall.

Runs the real ``compilecache operator`` (a subprocess, with kopf's liveness endpoint and its TLS
webhooks) against the Kubernetes API emulator, and POSTs the AdmissionReviews kube-apiserver would
send: to ``/validate-compilecaches`` for caches with hostile values (a 1 MB string in each of
several fields, the 32,000-dot image of issue 28, a template nested 900 levels deep or made of
250,000 empty lists, the largest values the CRD admits), and to the pod webhook for training pods
(20,000 containers; the largest pod it still mutates). While each request is answered, a thread polls ``/healthz`` every
5 ms: kopf answers it on the operator's event loop, so its worst latency is how long the loop (and
with it every pass, the gate watchdog and the pod webhook) stood still. Each figure is set against
a benign cache's, measured in the same run.

A second table times the policy's image pattern on growing inputs with Python's ``re`` (what the
policy used before) and with ``compilecache.cache.linear`` (what it uses now), in this process.

Usage: .venv/bin/python bench/admission_load.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from compilecache.cache import linear  # noqa: E402
from compilecache.controller import jobs, policy, webhook  # noqa: E402
from conftest import KubeClient, running_emulator  # noqa: E402
from test_webhook import POD_KIND, free_port, make_certificates, post, review, wait_listening  # noqa: E402

MB = 1_000_000
UNDER_CAP = 480_000  # what the operator still parses (webhook.MAX_REVIEW_BYTES: 512 KiB)
CC = "compilecache.dev/v1alpha1/compilecaches"


CACHE_KIND = (
    {"group": "compilecache.dev", "version": "v1alpha1", "kind": "CompileCache"},
    {"group": "compilecache.dev", "version": "v1alpha1", "resource": "compilecaches"},
)


def _nested(depth: int) -> dict[str, Any]:
    inner: dict[str, Any] = {"x": "y"}
    for _ in range(depth):
        inner = {"x": inner}
    return inner


def payloads() -> dict[str, dict[str, Any]]:
    """Name → CompileCache: the benign example, then hostile variants of it."""
    base = yaml.safe_load((ROOT / "examples/cache-template.yaml").read_text())
    base["metadata"]["namespace"] = "default"
    # The training Job's pod spec inline (examples/training-data.yaml), so the template's fields are read too.
    job = next(
        doc for doc in yaml.safe_load_all((ROOT / "examples/training-data.yaml").read_text()) if doc["kind"] == "Job"
    )
    base["spec"]["warmup"]["podTemplate"] = {"spec": job["spec"]["template"]["spec"], "container": "train"}

    def variant(change: Any) -> dict[str, Any]:
        cache = copy.deepcopy(base)
        change(cache["spec"])
        return cache

    template = base["spec"]["warmup"]["podTemplate"]["spec"]
    return {
        "benign (cache-template, template inline)": base,
        "image: 32,000 dots": variant(lambda s: s["warmup"].__setitem__("image", "." * 32_000)),
        "image: 1 MB of dots": variant(lambda s: s["warmup"].__setitem__("image", "." * MB)),
        "image: 480 KB of dots": variant(lambda s: s["warmup"].__setitem__("image", "." * UNDER_CAP)),
        "image: the longest admitted (1024 dots)": variant(lambda s: s["warmup"].__setitem__("image", "." * 1024)),
        "workload arg: 1 MB": variant(lambda s: s["warmup"]["workloads"][0].__setitem__("args", ["a" * MB])),
        "jax.xlaFlags: 1 MB": variant(lambda s: s["warmup"].setdefault("jax", {}).__setitem__("xlaFlags", "-" * MB)),
        "pvc claimName: 1 MB": variant(lambda s: s["storage"]["pvc"].__setitem__("claimName", "a" * MB + "!")),
        "template env value: 1 MB": variant(
            lambda s: (
                s["warmup"]["podTemplate"]["spec"]["containers"][0]
                .setdefault("env", [])
                .append({"name": "BIG", "value": "x" * MB})
            )
        ),
        "template of 250,000 empty lists": variant(
            lambda s: s["warmup"]["podTemplate"]["spec"].__setitem__("affinity", {"x": [[]] * 250_000})
        ),
        "template of 140,000 empty lists (420 KB)": variant(
            lambda s: s["warmup"]["podTemplate"]["spec"].__setitem__("affinity", {"x": [[]] * 140_000})
        ),
        "template of 19,000 strings (480 KB)": variant(
            lambda s: s["warmup"]["podTemplate"]["spec"].__setitem__("affinity", {"x": ["x" * 20] * 19_000})
        ),
        "template nested 900 deep": variant(
            lambda s: s["warmup"]["podTemplate"]["spec"].__setitem__("affinity", _nested(900))
        ),
        "template mount path: 1 MB": variant(
            lambda s: (
                s["warmup"]["podTemplate"]["spec"]["containers"][0]
                .setdefault("volumeMounts", [])
                .append({"name": template["volumes"][0]["name"], "mountPath": "/a" * (MB // 2) + ":"})
            )
        ),
    }


def pod_payloads() -> dict[str, dict[str, Any]]:
    """Name → a training pod of the cache ``llama`` (examples/cache-pvc.yaml, made in the emulator)."""

    def pod(containers: int, env: int = 0) -> dict[str, Any]:
        variables = [{"name": f"V{index}", "value": "x" * 50} for index in range(env)]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"generateName": "train-", "namespace": "default", "labels": {jobs.LABEL_CACHE: "llama"}},
            "spec": {
                "containers": [{"name": f"c{i}", "image": "x:1", "env": list(variables)} for i in range(containers)]
            },
        }

    return {
        "pod: benign (1 container)": pod(1),
        "pod: 20,000 containers": pod(20_000),
        "pod: 9,000 containers (480 KB)": pod(9_000),
        "pod: 64 containers, 240 KiB (the largest mutated)": pod(64, env=48),
    }


def _probe(url: str, stop: threading.Event, worst: list[float]) -> None:
    """Poll ``url`` every 5 ms until ``stop``; keep the worst answer time in ``worst[0]``."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    while not stop.is_set():
        started = time.perf_counter()
        try:
            with opener.open(url, timeout=30) as answer:
                answer.read()
        except urllib.error.URLError:
            pass
        worst[0] = max(worst[0], time.perf_counter() - started)
        stop.wait(0.005)


def measure(
    url: str, health: str, context: ssl.SSLContext, obj: dict[str, Any], kind: Any = CACHE_KIND
) -> tuple[float, float, str]:
    """(answer seconds, worst /healthz seconds meanwhile, the answer) of one AdmissionReview of ``obj``."""
    body = json.dumps(review(obj, kind)).encode()
    worst = [0.0]
    stop = threading.Event()
    prober = threading.Thread(target=_probe, args=(health, stop, worst))
    prober.start()
    started = time.perf_counter()
    try:
        _, answer = post(url, context, body)
        response = answer["response"]
        verdict = "allowed" if response["allowed"] else f"refused {response['status']['code']}"
        verdict += " (patched)" if "patch" in response else ""
    except urllib.error.HTTPError as exc:  # the API server then applies failurePolicy: Fail
        verdict = f"HTTP {exc.code}"
    finally:
        elapsed = time.perf_counter() - started
        stop.set()
        prober.join()
    return elapsed, worst[0], verdict


def operator_table(repeat: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, running_emulator(Path(tmp)) as runner:
        ca, cert, key = make_certificates(Path(tmp))
        port, health_port = free_port(), free_port()
        env = {
            **os.environ,
            "KUBECONFIG": str(runner.kubeconfig),
            "COMPILECACHE_WEBHOOK": "tls",
            "COMPILECACHE_WEBHOOK_CERT_FILE": str(cert),
            "COMPILECACHE_WEBHOOK_KEY_FILE": str(key),
            "COMPILECACHE_WEBHOOK_ADDR": "127.0.0.1",
            "COMPILECACHE_WEBHOOK_PORT": str(port),
        }
        command = [sys.executable, "-m", "compilecache.cli", "operator", "--standalone", "-A", "-q"]
        command += [f"--liveness=http://127.0.0.1:{health_port}/healthz"]
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            context = ssl.create_default_context(cafile=str(ca))
            url = f"https://127.0.0.1:{port}{webhook.VALIDATE_PATH}"
            pods_url = f"https://127.0.0.1:{port}{webhook.PATH}"
            health = f"http://127.0.0.1:{health_port}/healthz"
            wait_listening(url, context, timeout=60)
            llama = yaml.safe_load((ROOT / "examples/cache-pvc.yaml").read_text())
            KubeClient(runner).create(CC, {"metadata": {"name": "llama"}, "spec": llama["spec"]}, "default")
            cases = [(name, url, cache, CACHE_KIND) for name, cache in payloads().items()]
            cases += [(name, pods_url, pod, POD_KIND) for name, pod in pod_payloads().items()]
            results = {}
            for name, target, obj, kind in cases:
                runs = [measure(target, health, context, obj, kind) for _ in range(repeat)]
                results[name] = (
                    statistics.median(run[0] for run in runs),
                    max(run[1] for run in runs),
                    runs[0][2],
                )
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
    _, benign_stall, _ = next(iter(results.values()))
    print(f"{'payload':50} {'answer ms':>10} {'loop stall ms':>14} {'x benign':>9}  answer")
    for name, (answer, stall, verdict) in results.items():
        print(f"{name:50} {answer * 1000:10.1f} {stall * 1000:14.1f} {stall / benign_stall:9.2f}  {verdict}")
    worst = max(stall for name, (_, stall, _) in results.items() if "benign" not in name)
    print(
        f"worst loop stall of a hostile request: {worst * 1000:.1f} ms ({worst / benign_stall:.2f}x the benign one's)"
    )


def pattern_table() -> None:
    print(f"\n{'image of N dots':>16} {'python re s':>12} {'linear s':>10} {'ratio':>8}")
    for size in (4_000, 8_000, 16_000, 32_000):
        value = "." * size
        started = time.perf_counter()
        re.fullmatch(policy.NAMED_REGISTRY, value)
        backtracking = time.perf_counter() - started
        started = time.perf_counter()
        linear.regex(policy.NAMED_REGISTRY)(value)
        linear_time = time.perf_counter() - started
        print(f"{size:16,} {backtracking:12.4f} {linear_time:10.6f} {backtracking / linear_time:8.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="requests per payload (median answer, worst stall)")
    args = parser.parse_args()
    operator_table(args.repeat)
    pattern_table()


if __name__ == "__main__":
    main()
