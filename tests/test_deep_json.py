"""A CompileCache nested as deep as kube-apiserver stores it stalls nothing (issue 28, a suspected case).

kube-apiserver decodes and stores JSON nested up to 10000 levels (``api.bounds.JSON_DEPTH``), and
``spec.warmup.podTemplate.spec`` keeps unknown fields, so with the validating webhook off a cache can
be stored that deep. Python's ``json`` counts each level against the recursion limit (1000): kopf's
watch stream ends in ``RecursionError`` on the one event (kopf logs "Watcher for ... has failed" and
watches that resource no more, so no new cache gets a pass), and every read of that cache (its pass,
the gate watchdog's round, the pod webhook's list of a namespace's caches) fails the same way.

The operator runs as a subprocess here (``compilecache operator``), so that its interpreter is its own:
the test process stands in for kube-apiserver and parses as deep as it does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compilecache.api import bounds
from specs import cache_spec, cluster

pytestmark = [pytest.mark.emulator]

CC = "compilecache.dev/v1alpha1/compilecaches"
NS = "default"
DEPTH = bounds.JSON_DEPTH - 10  # what the API server still stores (the object's own levels come on top)


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def test_the_emulator_stores_as_deep_as_kube_apiserver_and_no_deeper(kube: Any) -> None:
    """The stand-in must take what the real server takes (10000 levels), or the test below proves nothing."""
    levels_above = 6  # the object, spec, warmup, podTemplate, spec, deep
    for depth, code in [(bounds.JSON_DEPTH - levels_above, 201), (bounds.JSON_DEPTH + 1 - levels_above, 400)]:
        deep = cache_spec()["warmup"] | {
            "podTemplate": {"spec": {"containers": [{"name": "t"}], "deep": nested(depth)}}
        }
        body = {"apiVersion": "compilecache.dev/v1alpha1", "kind": "CompileCache", "metadata": {"name": f"d{code}"}}
        answer, said = kube.call("POST", kube.path(CC, NS), body | {"spec": cache_spec(warmup=deep)})
        assert answer == code, said if code == 400 else answer
    assert "exceeded max depth of 10000" in said["message"]


@pytest.fixture
def operator_process(kube_env: Any, tmp_path: Path) -> Iterator[Path]:
    """``compilecache operator --standalone -A`` on the emulator (webhooks off); yields its log file."""
    for node in cluster():
        kube_env.create("v1/nodes", node)
        kube_env.patch("v1/nodes", node["metadata"]["name"], {"status": node["status"]}, subresource="status")
    log = tmp_path / "operator.log"
    env = {**os.environ, "KUBECONFIG": str(kube_env.kubeconfig), "COMPILECACHE_RESYNC_SECONDS": "0.5"}
    env.pop("COMPILECACHE_WEBHOOK", None)
    command = [sys.executable, "-m", "compilecache.cli", "operator", "--standalone", "-A", "--metrics-port", "0"]
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield log
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def create(kube: Any, name: str, **spec: Any) -> None:
    body = {"apiVersion": "compilecache.dev/v1alpha1", "kind": "CompileCache", "metadata": {"name": name}}
    kube.create(CC, body | {"spec": cache_spec(**spec)}, NS)


@pytest.mark.slow
def test_a_cache_nested_as_deep_as_the_api_server_stores_stalls_no_watch_and_no_other_cache(
    kube_env: Any, operator_process: Path
) -> None:
    deep = cache_spec()["warmup"] | {
        "podTemplate": {"spec": {"containers": [{"name": "train"}], "deep": nested(DEPTH)}}
    }
    create(kube_env, "deep", warmup=deep)

    def wait(predicate: Any) -> Any:
        try:
            return kube_env.wait_for(predicate, timeout=60)
        except AssertionError as exc:  # what the operator said is the story
            raise AssertionError(f"{exc}\n{operator_process.read_text(errors='replace')[-3000:]}") from None

    # The operator has seen the deep one first; a cache created after it must still get its pass.
    wait(lambda: (kube_env.get(CC, "deep", NS) or {}).get("status"))
    create(kube_env, "llama", storage={"pvc": {"claimName": "llama-cache", "create": {"size": "10Gi"}}})
    jobs = wait(lambda: len(found := kube_env.list("batch/v1/jobs", NS, "compilecache.dev/cache=llama")) == 2 and found)
    assert len(jobs) == 2
    wait(lambda: ((kube_env.get(CC, "llama", NS) or {}).get("status") or {}).get("phase") == "Warming")
    output = operator_process.read_text(errors="replace")
    for failure in ("RecursionError", "has failed", "Traceback"):
        assert failure not in output, output[-5000:]
