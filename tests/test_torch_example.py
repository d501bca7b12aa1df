"""examples/pytorch/train.py as shipped: torch.compile's cache, cold then warm, and the PyTorch demo's pure parts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from compilecache.controller import admission
from compilecache.controller.api import parse_cache
from compilecache.frameworks.pytorch import demo as torchdemo
from compilecache.frameworks.pytorch.env import TORCH_CACHE_DIR, torch_cache_env
from torchhelpers import ROOT, run_example

pytest.importorskip("torch", reason="the `torch` extra is not installed (make test installs torch==2.13.0)")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_fresh_process_hits_every_graph_of_the_cache_a_first_run_wrote(tmp_path: Path) -> None:
    """The model, its backward and AdamW's step are each compiled; a second process loads them all."""
    cache = tmp_path / "inductor"
    cold = run_example(torch_cache_env(str(cache)), "--steps", "2")
    assert cold["fxgraph_misses"] >= 3 and cold["fxgraph_hits"] == 0, cold  # forward, backward, optimizer
    assert cold["autograd_misses"] >= 1, cold
    assert cold["cache_dir"] == str(cache) and any(cache.iterdir())
    warm = run_example(torch_cache_env(str(cache)), "--steps", "2")
    assert (warm["fxgraph_hits"], warm["fxgraph_misses"]) == (cold["fxgraph_misses"], 0), warm
    assert (warm["autograd_hits"], warm["autograd_misses"]) == (cold["autograd_misses"], 0), warm
    assert warm["losses"] == cold["losses"]  # the same program, loaded instead of compiled
    print(f"first step: cold {cold['first_step_seconds']:.2f}s, warm {warm['first_step_seconds']:.2f}s")


def test_the_examples_warm_and_train_the_same_model_with_the_same_threads() -> None:
    """What enters Inductor's key is set alike in the cache's workload and the training Job."""
    cache, training = torchdemo.sized_examples(ROOT, 48)
    assert cache["spec"]["framework"] == "pytorch"
    [workload] = cache["spec"]["warmup"]["workloads"]
    assert workload["script"] == torchdemo.SCRIPT and (ROOT / workload["script"]).is_file()
    warm_env = {e["name"]: e["value"] for e in workload["env"]}
    assert torchdemo.key_env(training) == {k: v for k, v in warm_env.items() if k.startswith(torchdemo.KEY_ENV)}
    assert warm_env["TORCH_WIDTH"] == "48"
    container = training["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == cache["spec"]["warmup"]["image"]
    assert training["spec"]["template"]["metadata"]["labels"]["compilecache.dev/cache"] == cache["metadata"]["name"]
    # The webhook finds nothing to warn about: same image, same thread count.
    pod = {"metadata": {"name": "p", "labels": {}}, "spec": training["spec"]["template"]["spec"]}
    result = admission.mutate(pod, cache)
    assert result.skipped == () and not [w for w in result.warnings if "image" in w], result.warnings
    # One GPU per warm-up pod, as per training process (Inductor's key holds the device index).
    [pool] = parse_cache(cache).warmup.pools
    assert pool.gpus_per_pod == container["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_the_demo_table_reads_torchs_counts() -> None:
    counts = ("fxgraph_hits", "fxgraph_misses", "autograd_hits", "autograd_misses")
    cold = {"first_step_seconds": 20.0, **dict(zip(counts, (0, 3, 0, 2), strict=True))}
    warm = {"first_step_seconds": 4.0, **dict(zip(counts, (3, 0, 2, 0), strict=True))}
    table = torchdemo.format_table(cold, warm, {"entries": 5, "bytes": 1234567})
    assert "FX graph hits/lookups     0/3                 3/3" in table
    assert "5.0x" in table and "5, 1,234,567" in table


def test_the_cold_process_starts_from_no_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TORCH_CACHE_DIR, "/somewhere")  # the caller's environment, not the code under test
    monkeypatch.setenv("COMPILECACHE_REPORT", "1")
    env = torchdemo.clean_env()
    assert TORCH_CACHE_DIR not in env and "COMPILECACHE_REPORT" not in env


@pytest.mark.slow
def test_the_warmer_only_demo_is_jaxs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "compilecache.cli", "demo", "--framework", "pytorch", "--warmer-only"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2 and "--warmer-only is the JAX demo's" in done.stderr, done.stderr
