"""bench/scale.py (issue #30's curve): its tiny run on the local cluster, and the readings its figures rest on.

The figures themselves go in docs/benchmarks.md. Here what must hold on any machine: a run at a tiny N
prints a row per N in which every cache got its 3 warm-up Jobs and the operator's requests were
counted (its own Job creates among them), and the bench reads what the operator exposes (its
request counter, as ``compilecache.controller.metrics`` renders it) and what ``/proc`` says (CPU
seconds) correctly, so that a figure in the docs is not a misreading.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest

from compilecache.controller.metrics import Metrics
from compilecache.local.client import KubeClient
from compilecache.local.server import running_emulator
from jaxhelpers import clean_env
from specs import cache_spec, node

REPO = Path(__file__).resolve().parent.parent


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_scale", REPO / "bench" / "scale.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


scale = load_bench()

CALL = st.tuples(
    st.sampled_from(["get", "list", "create", "patch", "delete"]),
    st.sampled_from(["jobs", "pods", "compilecaches/status", "nodes"]),
)


@given(before=st.lists(CALL, max_size=30), between=st.lists(CALL, max_size=30))
def test_the_requests_between_two_scrapes_are_those_the_operator_counted_between_them(
    before: list[tuple[str, str]], between: list[tuple[str, str]]
) -> None:
    metrics = Metrics()  # the operator's own: the counter's name and labels as /metrics serves them
    for call in before:
        metrics.api_request(*call)
    first = scale.api_requests(generate_latest(metrics.registry).decode())
    for call in between:
        metrics.api_request(*call)
    second = scale.api_requests(generate_latest(metrics.registry).decode())
    expected: dict[str, int] = {}
    for verb, resource in between:
        expected[f"{verb} {resource}"] = expected.get(f"{verb} {resource}", 0) + 1
    assert scale.difference(first, second) == expected


def test_a_process_cpu_seconds_are_read_from_proc_as_the_kernel_counts_them() -> None:
    spent = time.process_time() + 0.3
    while time.process_time() < spent:  # burn some CPU: a reading of 0 must not pass
        pass
    times = os.times()
    assert scale.cpu_seconds(os.getpid()) == pytest.approx(times.user + times.system, abs=0.05)
    assert scale.peak_rss_mib(os.getpid()) > 1


def test_a_wait_that_is_not_met_says_how_many_came_and_one_that_is_met_when_the_last_came() -> None:
    seen = scale.Seen()
    seen.add("jobs", "a-1", "a", 1.0)
    seen.add("jobs", "a-2", "a", 3.0)
    seen.add("jobs", "b-1", "b", 2.0)
    seen.add("jobs", "a-1", "a", 9.0)  # seen again (MODIFIED): it came at its first sighting
    with pytest.raises(TimeoutError, match="3 of 4 warm-up Jobs came within 0 s"):
        seen.wait("jobs", {"a", "b"}, 2, 0.0, "warm-up Jobs")
    assert seen.wait("jobs", {"a", "b"}, 1, 0.0, "warm-up Jobs") == (2, 2.0)
    seen.add("jobs", "b-2", "b", 5.0)
    assert seen.wait("jobs", {"a", "b"}, 2, 0.0, "warm-up Jobs") == (4, 5.0)


def test_a_failed_watch_ends_the_wait_with_its_reason() -> None:
    seen = scale.Seen()
    failing = threading.Timer(0.2, seen.failed, [scale.CacheFailed("scale-0001 Failed: bad spec")])
    failing.start()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="scale-0001 Failed: bad spec"):
        seen.wait("jobs", {"scale-0001"}, 3, 60.0, "warm-up Jobs")
    assert time.monotonic() - started < 30  # the failure, not the timeout, ended it


@pytest.mark.slow
@pytest.mark.emulator
def test_the_scale_benchmark_runs_tiny_on_the_local_cluster_and_its_figures_parse() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "scale.py"), "--caches", "2", "4"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    lines = done.stdout.splitlines()
    rows = {int(line.split()[0]): line.split() for line in lines if line.split()[:1] and line.split()[0].isdigit()}
    assert sorted(rows) == [2, 4], done.stdout
    for caches, row in rows.items():
        figures = dict(zip(scale.COLUMNS, row, strict=True))
        assert int(figures["jobs"]) == 3 * caches, figures  # 3 GPU products: 3 warm-up Jobs per cache
        for column in ("jobs s", "floor s", "ratio", "ms/cache", "CPU s", "RSS MiB"):
            assert float(figures[column]) > 0, (column, figures)
        assert float(figures["warming s"]) >= 0, figures
        # Passes list nothing (they read from the indexes); the gate watchdog's round lists pods every 10 s.
        assert int(figures["requests"]) > 0 and 0 <= int(figures["lists"]) <= 1, figures
        [breakdown] = [line for line in lines if line.startswith(f"requests at {caches}: ")]
        made = dict(item.rsplit(" ", 1) for item in breakdown.split(": ", 1)[1].split(", "))
        assert int(made["create jobs"]) >= 3 * caches, breakdown  # the operator made every Job itself
        assert sum(map(int, made.values())) == int(figures["requests"]), (breakdown, figures)
    assert float(lines[-1].split("grew ")[1].split("x")[0]) > 0, lines[-1]


def run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "bench" / "scale.py"), *args],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.emulator
def test_on_a_cluster_given_by_kubeconfig_the_bench_deletes_what_it_made_and_nothing_else(tmp_path: Path) -> None:
    """The real-cluster mode, on an emulator standing in for one: its Nodes, a namespace, a user's own cache."""
    cc = "compilecache.dev/v1alpha1/compilecaches"
    with running_emulator(tmp_path) as runner:
        kube = KubeClient(runner)
        kube.create("v1/namespaces", {"metadata": {"name": "team"}})
        for product in range(3):
            kube.create("v1/nodes", node(f"n{product}", f"GPU-{product}", 8))
        theirs = {"metadata": {"name": "theirs"}, "spec": cache_spec()}
        kube.create(cc, theirs, "team")
        args = ["--kubeconfig", str(runner.kubeconfig), "--namespace", "team", "--caches", "2"]
        done = run_bench(*args)
        assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
        [row] = [line.split() for line in done.stdout.splitlines() if line.split()[:1] == ["2"]]
        figures = dict(zip(scale.COLUMNS, row, strict=True))
        assert int(figures["jobs"]) == 6 and figures["emul. CPU s"] == "-", (
            figures
        )  # 3 products; no emulator of its own
        assert [c["metadata"]["name"] for c in kube.list(cc, "team")] == ["theirs"]  # the bench's caches are gone
        left = [j["metadata"]["name"] for j in kube.list("batch/v1/jobs", "team")]
        assert left and all(name.startswith("theirs-") for name in left), left  # the operator served theirs too
        assert kube.get("v1/persistentvolumeclaims", scale.CLAIM, "team") is None

        kube.create(
            cc, {"metadata": {"name": "left", "labels": {scale.BENCH_LABEL: "scale"}}, "spec": cache_spec()}, "team"
        )
        refused = run_bench(*args)
        assert refused.returncode != 0
        assert (
            "1 CompileCaches of an earlier run are left in team: kubectl delete compilecaches -n team" in refused.stderr
        )
        assert kube.get(cc, "left", "team") is not None  # refused before touching anything
