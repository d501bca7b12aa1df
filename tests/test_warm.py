"""The warmer: fast tests of its pure parts, and real-JAX tests through the CLI in fresh processes."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

from compilecache.cache.entries import EntryError, check_entry, entry_module, is_entry_name
from compilecache.cache.errors import WarmError
from compilecache.cache.store import LocalStore, StagedEntry, open_store
from compilecache.cli.main import build_parser
from compilecache.frameworks.jax.compiler import TargetRun
from compilecache.frameworks.jax.env import jax_cache_env
from compilecache.frameworks.jax.manifest import build_manifest, build_report
from compilecache.frameworks.jax.target import Target, check_target
from compilecache.frameworks.jax.verify import differing_components, miss_messages
from compilecache.jobtools.entrypoint import parse_spec
from compilecache.jobtools.manifest import manifest_name, new_run_id
from jaxhelpers import (
    REPO,
    TINY_MODEL,
    TINY_WORKLOAD,
    clean_env,
    entry_files,
    probe_hits,
    run_cli,
    run_train,
    write_module,
)

KEY = "jit_step-" + "ab" * 32
FACTS = {"jax": "0.10.2", "jaxlib": "0.10.2", "backend": "cpu", "device_kind": "cpu", "device_count": 1}


def _entry(payload: bytes = b"\x08\x03executable-bytes" * 20, seconds: int = 3) -> bytes:
    return zlib.compress(seconds.to_bytes(4, "big") + payload)


# ---- fast: pure parts ------------------------------------------------------------------------


def test_check_entry_accepts_a_jax_shaped_entry() -> None:
    info = check_entry(_entry(seconds=12))
    assert (info.compression, info.compile_seconds) == ("zlib", 12)
    assert info.executable_bytes > 0


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (_entry()[:-7], "truncated"),
        (_entry()[:5], "truncated"),
        (_entry() + b"junk", "after the zlib stream"),
        (b"\x00\x01plain bytes, not compressed", "neither zlib nor zstd"),
        (zlib.compress(b"\x00\x00"), "no executable"),
        (zlib.compress((10**9).to_bytes(4, "big") + b"x" * 50), "not a JAX entry"),
        (b"\x78\x9c" + b"\xff" * 40, "corrupt"),
    ],
)
def test_check_entry_rejects_unsound_bytes(data: bytes, reason: str) -> None:
    with pytest.raises(EntryError, match=reason):
        check_entry(data)


def test_entry_names() -> None:
    assert is_entry_name(f"{KEY}-cache")
    assert not is_entry_name(f"{KEY}-atime")
    assert not is_entry_name("jit_step-abc-cache")
    assert entry_module(f"{KEY}-cache") == "jit_step"


def test_publish_is_all_or_nothing_and_manifest_hashes(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "cache")
    staging = Path(store.prepare("run-1"))
    good, bad = f"{'jit_a-' + 'a' * 64}-cache", f"{'jit_b-' + 'b' * 64}-cache"
    (staging / good).write_bytes(_entry())
    (staging / bad).write_bytes(_entry()[:-3])
    with pytest.raises(EntryError, match="nothing published"):
        store.check(str(staging), store.new_entries(str(staging)))
    assert entry_files(store.root) == []
    (staging / bad).unlink()
    [checked] = store.check(str(staging), store.new_entries(str(staging)))
    assert checked.published and entry_files(store.root) == []  # checked, not yet visible
    [published] = store.publish(str(staging), [checked])
    assert published == checked and published.sha256 == hashlib.sha256(_entry()).hexdigest()
    assert entry_files(store.root) == [good]
    # A second run links the published entry into its staging: not "new", not re-published.
    again = store.prepare("run-2")
    assert (Path(again) / good).exists() and store.new_entries(again) == []


def test_check_says_which_entries_a_concurrent_run_published_first(tmp_path: Path) -> None:
    # The pending manifest records each entry as check() predicts; publish() decides again at the rename.
    store = LocalStore(tmp_path / "cache")
    staging = Path(store.prepare("run-1"))
    mine, theirs = f"{'jit_a-' + 'a' * 64}-cache", f"{'jit_b-' + 'b' * 64}-cache"
    for entry in (mine, theirs):
        (staging / entry).write_bytes(_entry())
    checked = store.check(str(staging), [mine, theirs])
    (store.root / theirs).write_bytes(_entry(seconds=9))  # another run publishes the same key meanwhile
    assert [entry.published for entry in checked] == [True, True]
    assert [entry.published for entry in store.publish(str(staging), checked)] == [True, False]
    assert (store.root / theirs).read_bytes() == _entry(seconds=9)
    assert [entry.published for entry in store.check(str(staging), [theirs])] == [False]


def test_open_store_takes_local_paths_and_gcs_only() -> None:
    assert open_store("gs://bucket/a/b/").url == "gs://bucket/a/b"
    with pytest.raises(WarmError, match=r"only local paths and gs://"):
        open_store("s3://bucket/prefix")
    with pytest.raises(WarmError, match="no bucket"):
        open_store("gs:///prefix")


def test_manifest_and_report_shape() -> None:
    run = TargetRun("pkg.mod:targets", "step", compile_seconds=1.5, requests=1, keys_written=[KEY])
    hit = TargetRun("pkg.mod:targets", "eval", requests=1, hits=1, keys_hit=["jit_eval-" + "c" * 64])
    staged = [StagedEntry(f"{KEY}-cache", 1234, "f" * 64, True)]
    arguments: dict[str, Any] = {
        "run_id": "r1",
        "cache_dir": "/c",
        "facts": FACTS,
        "runs": [run, hit],
        "staged": staged,
        "started_at": "t0",
        "finished_at": "t1",
        "workloads": ["pkg.mod:targets"],
    }
    manifest = build_manifest(**arguments)
    [entry] = manifest["entries"]
    assert entry["file"] == f"{KEY}-cache" and entry["sha256"] == "f" * 64 and entry["size"] == 1234
    assert (entry["target"], entry["workload"], entry["compile_seconds"]) == ("step", "pkg.mod:targets", 1.5)
    assert entry["jaxlib"] == "0.10.2" and entry["device_count"] == 1 and entry["written_at"] == "t1"
    assert manifest["hits"] == [
        {
            "file": "jit_eval-" + "c" * 64 + "-cache",
            "workload": "pkg.mod:targets",
            "target": "eval",
            "at": "t1",
        }
    ]
    report = build_report(manifest, "/c/m.json", None)
    assert (report["entries"], report["bytes"], report["ok"]) == (1, 1234, True)
    # The PJRT plugin and platform version come from the recorded settings (keysettings.current).
    settings = {"pjrt_plugins": "jax-cuda12-pjrt 0.10.2", "platform_version": "cuda 12090"}
    plugged = build_manifest(**{**arguments, "facts": {**FACTS, "settings": settings}})
    assert plugged["settings"] == settings
    assert {key: build_report(plugged, None, None)[key] for key in settings} == settings
    step, evaluation = report["targets"]
    assert step["entries_written"] == [f"{KEY}-cache"] and step["bytes"] == 1234 and not step["hit"]
    assert evaluation["hit"] and evaluation["entries_written"] == []


def test_run_ids_are_unique_file_names() -> None:
    ids = {new_run_id(host="node/1 a") for _ in range(50)}
    assert len(ids) == 50
    assert all("/" not in manifest_name(i) and " " not in i for i in ids)


def test_cli_parses_warm_flags_and_script_args() -> None:
    args = build_parser().parse_args(
        [
            "warm",
            "--cache-dir",
            "/c",
            "--workload",
            "a:b",
            "--workload",
            "c.d:e",
            "--jobs",
            "3",
            "--no-verify",
            "--script",
            "s.py",
            "--",
            "--steps",
            "2",
        ]
    )
    assert (args.cache_dir, args.workload, args.jobs, args.verify) == ("/c", ["a:b", "c.d:e"], 3, False)
    assert args.script == "s.py" and args.script_args == ["--", "--steps", "2"]
    assert build_parser().parse_args(["warm", "--cache-dir", "/c", "--workload", "a:b"]).verify is True


@pytest.mark.parametrize("spec", ["nocolon", "a:", ":f", "a b:c", "mod:fn:x"])
def test_parse_spec_rejects_bad_workloads(spec: str) -> None:
    with pytest.raises(WarmError, match="MODULE:FUNC"):
        parse_spec(spec)


def test_jobs_are_capped_at_half_the_cores() -> None:
    from compilecache.frameworks.jax.compiler import effective_jobs

    assert (effective_jobs(4, cpus=2), effective_jobs(4, cpus=16), effective_jobs(16, cpus=16)) == (1, 4, 8)


def test_check_target_requires_a_jitted_fn() -> None:
    with pytest.raises(WarmError, match=r"not jax\.jit-wrapped"):
        check_target(Target("t", lambda x: x, ()), "m:f")
    with pytest.raises(WarmError, match=r"expected compilecache\.Target"):
        check_target(("t", None), "m:f")


def test_miss_messages_name_the_target_and_the_differing_key_parts() -> None:
    warm = TargetRun("m:f", "step", keys_written=[KEY], key_components={"computation": "1", "compile_options": "2"})
    fresh = TargetRun(
        "m:f",
        "step",
        requests=1,
        miss_log=["PERSISTENT COMPILATION CACHE MISS for 'jit_step'"],
        key_components={"computation": "1", "compile_options": "3"},
    )
    [message] = miss_messages([warm], [fresh])
    assert "'step'" in message and "compile_options" in message and "computation" not in message.split("in:")[-1]
    assert miss_messages([warm], [TargetRun("m:f", "step", requests=1, hits=1)]) == []
    assert differing_components({"a": "1", "b": "2"}, {"a": "1", "b": "9"}) == ["b"]


# ---- slow: real JAX, fresh processes --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.jax
def test_warm_then_fresh_training_process_hits(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    report_path = tmp_path / "report.json"
    env = clean_env(TINY_MODEL)
    done = run_cli(
        [
            "warm",
            "--cache-dir",
            str(cache),
            "--workload",
            "examples.workloads.transformer:targets",
            "--report",
            str(report_path),
        ],
        env,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(report_path.read_text())
    assert report["ok"] and report["verify"]["ok"] and report["entries"] == 2
    assert {t["name"] for t in report["targets"]} == {"init_state", "train_step"}
    for key in ("jax", "jaxlib", "backend", "device_kind", "device_count", "bytes"):
        assert report[key] is not None
    # Staged, checked, renamed: the live dir holds the entries, staging is gone.
    published = entry_files(cache)
    assert sorted(e for t in report["targets"] for e in t["entries_written"]) == published
    assert list((cache / ".compilecache" / "staging").iterdir()) == []
    result = run_train(clean_env({**TINY_MODEL, **jax_cache_env(str(cache))}))
    assert (result["requests"], result["hits"], result["misses"]) == (2, 2, 0)


@pytest.mark.slow
@pytest.mark.jax
def test_a_workload_that_configures_logging_gets_no_debug_flood(tmp_path: Path) -> None:
    """absl, TensorFlow or clu put a handler on the root logger: JAX's key DEBUG lines must not reach it."""
    folder = write_module(
        tmp_path / "wl",
        "loud",
        "import logging, sys\n"
        "logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format='%(levelname)s:%(name)s:%(message)s')\n"
        + TINY_WORKLOAD,
    )
    cache = tmp_path / "cache"
    done = run_cli(["warm", "--cache-dir", str(cache), "--workload", "loud:targets"], clean_env(pythonpath=[folder]))
    assert done.returncode == 0, done.stderr
    assert "DEBUG:" not in done.stderr and "cache_key" not in done.stderr, done.stderr[:2000]
    report_lines = [line for line in done.stdout.splitlines() if "matmul" in line]
    assert report_lines, done.stdout  # the keys were still captured: each target is reported


@pytest.mark.slow
@pytest.mark.jax
def test_a_warm_up_never_reports_as_a_trainer(tmp_path: Path) -> None:
    """A shell that ran `eval "$(compilecache env ...)"` carries COMPILECACHE_REPORT=1 into `warm`."""
    from importlib.metadata import entry_points

    if not any(point.value == "compilecache.frameworks.jax.verdict" for point in entry_points(group="jax_plugins")):
        pytest.skip("the package's jax_plugins entry point is not installed (pip install -e .)")
    folder = write_module(tmp_path / "wl", "tiny", TINY_WORKLOAD)
    env = clean_env({"COMPILECACHE_REPORT": "1"}, pythonpath=[folder])
    done = run_cli(["warm", "--cache-dir", str(tmp_path / "cache"), "--workload", "tiny:targets"], env)
    assert done.returncode == 0, done.stderr
    assert "compiles hit" not in done.stdout + done.stderr, done.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.jax
def test_setup_compiles_are_named_and_a_capped_jobs_says_so(tmp_path: Path) -> None:
    setup_workload = TINY_WORKLOAD + (
        "\n_scale = jax.jit(lambda x: x * 2.0)(jnp.ones((4,)))  # a workload that compiles while importing\n"
    )
    folder = write_module(tmp_path / "wl", "initing", setup_workload)
    argv = ["warm", "--cache-dir", str(tmp_path / "cache"), "--workload", "initing:targets", "--jobs", "64"]
    done = run_cli(argv, clean_env(pythonpath=[folder]))
    assert done.returncode == 0, done.stderr
    [setup] = [line for line in done.stdout.splitlines() if "initing:targets setup:" in line]
    assert " programs (" in setup and "compiled" in setup and "miss" not in setup, setup
    assert "--jobs 64 runs" in done.stderr and "compile thread" in done.stderr, done.stderr


@pytest.mark.slow
@pytest.mark.jax
def test_sharded_warm_then_fresh_training_process_hits(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    devices = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    env = clean_env({**TINY_MODEL, **devices, "MODEL_SHARDED": "1"})
    done = run_cli(["warm", "--cache-dir", str(cache), "--workload", "examples.workloads.transformer:targets"], env)
    assert done.returncode == 0, done.stderr
    result = run_train(
        clean_env({**TINY_MODEL, **jax_cache_env(str(cache), **{"xla_flags": devices["XLA_FLAGS"]})}),
        "--sharded",
    )
    assert result["devices"] == 2
    assert (result["requests"], result["hits"], result["misses"]) == (2, 2, 0)


MISMATCH_WORKLOAD = """
import jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from compilecache import Target

def targets():
    mesh = Mesh(jax.devices(), ("data",))
    step = jax.jit(lambda x: jnp.tanh(x).sum(0))
    # The warmer describes the batch without its sharding; training shards it.
    unsharded = jax.ShapeDtypeStruct((8, 16), jnp.float32)
    def as_training_passes_it():
        return (jax.device_put(jnp.ones((8, 16)), NamedSharding(mesh, PartitionSpec("data"))),)
    return [Target("sum_step", step, (unsharded,), training_args=as_training_passes_it)]
"""


@pytest.mark.slow
@pytest.mark.jax
def test_verify_catches_a_sharding_mismatch_and_names_the_target(tmp_path: Path) -> None:
    modules = write_module(tmp_path / "mods", "mismatch", MISMATCH_WORKLOAD)
    env = clean_env({"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}, [modules])
    report_path = tmp_path / "report.json"
    done = run_cli(
        [
            "warm",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--workload",
            "mismatch:targets",
            "--report",
            str(report_path),
        ],
        env,
    )
    assert done.returncode == 3, done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("compilecache warm: error:")]
    assert "'sum_step'" in line and "MISSED" in line
    # What differs, on the line, rather than JAX's "key differs in: computation".
    assert line.endswith("sum_step arg 0: float32[8,16] sharding=P('data',) in training, unspecified in the warm-up"), (
        line
    )
    report = json.loads(report_path.read_text())
    assert not report["ok"] and "sum_step" in report["error"] and not report["verify"]["ok"]
    # --no-verify cannot see it: the mismatch is only visible against training's real inputs.
    again = run_cli(["warm", "--cache-dir", str(tmp_path / "c2"), "--workload", "mismatch:targets", "--no-verify"], env)
    assert again.returncode == 0, again.stderr


@pytest.mark.slow
@pytest.mark.jax
def test_manifest_lists_every_entry_with_its_sha256_and_jobs_attribute(tmp_path: Path) -> None:
    modules = write_module(tmp_path / "mods", "tiny", TINY_WORKLOAD)
    cache = tmp_path / "cache"
    done = run_cli(
        [
            "warm",
            "--cache-dir",
            str(cache),
            "--workload",
            "tiny:targets",
            "--jobs",
            "2",
            "--report",
            str(tmp_path / "r.json"),
        ],
        clean_env(pythonpath=[modules]),
    )
    assert done.returncode == 0, done.stderr
    [manifest_path] = list((cache / ".compilecache" / "manifests").glob("*.json"))
    manifest = json.loads(manifest_path.read_text())
    files = {entry["file"]: entry for entry in manifest["entries"]}
    assert sorted(files) == entry_files(cache) and len(files) == 3
    for name, entry in files.items():
        data = (cache / name).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest() and entry["size"] == len(data)
        assert entry["workload"] == "tiny:targets" and entry["backend"] == "cpu"
    # With two compile threads each target still gets exactly its own entry.
    assert sorted(entry["target"] for entry in files.values()) == ["cosine", "matmul", "scaled"]
    # A second run re-produces all three as hits, writes nothing, and records the hits.
    second = run_cli(
        ["warm", "--cache-dir", str(cache), "--workload", "tiny:targets", "--no-verify"],
        clean_env(pythonpath=[modules]),
    )
    assert second.returncode == 0, second.stderr
    manifests = sorted((cache / ".compilecache" / "manifests").glob("*.json"))
    latest = max((json.loads(p.read_text()) for p in manifests), key=lambda m: len(m["hits"]))
    assert latest["entries"] == [] and sorted(h["file"] for h in latest["hits"]) == sorted(files)


@pytest.mark.slow
@pytest.mark.jax
def test_keys_are_path_independent_with_our_settings(tmp_path: Path) -> None:
    modules = write_module(tmp_path / "mods", "tiny", TINY_WORKLOAD)
    a, b = tmp_path / "a", tmp_path / "b"
    done = run_cli(
        ["warm", "--cache-dir", str(a), "--workload", "tiny:targets", "--no-verify"],
        clean_env(pythonpath=[modules]),
    )
    assert done.returncode == 0, done.stderr
    shutil.copytree(a, b)
    assert probe_hits("tiny:targets", clean_env(jax_cache_env(str(b)), [modules])) == {"req": 3, "hit": 3}
    # The control: JAX's default XLA-cache setting hashes the cache path into the key.
    default = {k: v for k, v in jax_cache_env(str(tmp_path / "c")).items() if "XLA_CACHES" not in k}
    probe_hits("tiny:targets", clean_env(default, [modules]))
    shutil.copytree(tmp_path / "c", tmp_path / "d")
    moved = {**default, "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "d")}
    assert probe_hits("tiny:targets", clean_env(moved, [modules])) == {"req": 3, "hit": 0}


@pytest.mark.slow
@pytest.mark.jax
def test_a_truncated_entry_is_never_published(tmp_path: Path) -> None:
    modules = write_module(tmp_path / "mods", "tiny", TINY_WORKLOAD)
    store = LocalStore(tmp_path / "cache")
    staging = Path(store.prepare("run-x"))
    # Real entries, written by real JAX into staging (as the warmer's compile step does).
    probe_hits("tiny:targets", clean_env(jax_cache_env(str(staging)), [modules]))
    names = store.new_entries(str(staging))
    assert len(names) == 3
    victim = staging / names[0]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    with pytest.raises(EntryError, match=f"{names[0]}.*truncated"):
        store.check(str(staging), names)
    assert entry_files(store.root) == []


@pytest.mark.slow
@pytest.mark.jax
def test_a_damaged_published_entry_is_replaced_atomically_by_the_next_warm(tmp_path: Path) -> None:
    # Regression: the warmer reused a truncated or bit-flipped published entry; JAX missed it,
    # recompiled, never overwrote the existing file, verify missed, and the pool stayed Failed.
    modules = write_module(tmp_path / "mods", "tiny", TINY_WORKLOAD)
    env = clean_env(pythonpath=[modules])
    cache = tmp_path / "cache"
    first = run_cli(["warm", "--cache-dir", str(cache), "--workload", "tiny:targets"], env)
    assert first.returncode == 0, first.stderr
    truncated, flipped, sound = (cache / name for name in entry_files(cache))
    sound_bytes = sound.read_bytes()
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x10
    flipped.write_bytes(bytes(data))
    reader = flipped.open("rb")  # a training process that has the damaged file open

    report_path = tmp_path / "report.json"
    second = run_cli(
        ["warm", "--cache-dir", str(cache), "--workload", "tiny:targets", "--report", str(report_path)], env
    )
    assert second.returncode == 0, second.stderr
    report = json.loads(report_path.read_text())
    assert {r["file"] for r in report["repaired"]} == {truncated.name, flipped.name}
    assert report["verify"]["ok"] and report["verify"]["hits"] == 3
    assert f"replacing damaged entry {truncated.name}: " in second.stdout
    # Replaced by rename, not rewritten in place: the open reader still sees the old bytes, whole.
    with reader:
        assert reader.read() == bytes(data)
    manifests = [json.loads(p.read_text()) for p in (cache / ".compilecache" / "manifests").glob("*.json")]
    latest = max(manifests, key=lambda m: len(m["repaired"]))
    written = {entry["file"]: entry for entry in latest["entries"]}
    assert set(written) == {truncated.name, flipped.name}
    for path in (truncated, flipped):
        check_entry(path.read_bytes())
        assert hashlib.sha256(path.read_bytes()).hexdigest() == written[path.name]["sha256"]
        assert written[path.name]["published"]
    assert sound.read_bytes() == sound_bytes  # a sound entry is reused, not replaced
    assert list((cache / ".compilecache" / "staging").iterdir()) == []
    training = clean_env(jax_cache_env(str(cache)), [modules])
    assert probe_hits("tiny:targets", training) == {"req": 3, "hit": 3}


@pytest.mark.slow
@pytest.mark.jax
def test_script_is_warmed_published_and_verified(tmp_path: Path) -> None:
    script = tmp_path / "compile_only.py"
    script.write_text(
        "import sys, jax, jax.numpy as jnp\n"
        "n = int(sys.argv[1])\n"
        "jax.jit(lambda x: jnp.sin(x) * n).lower(jax.ShapeDtypeStruct((n, n), jnp.float32)).compile()\n"
    )
    cache = tmp_path / "cache"
    done = run_cli(
        [
            "warm",
            "--cache-dir",
            str(cache),
            "--script",
            str(script),
            "--report",
            str(tmp_path / "r.json"),
            "--",
            "12",
        ],
        clean_env(),
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["entries"] == 1 and report["verify"] == {**report["verify"], "ok": True, "hits": 1}
    assert len(entry_files(cache)) == 1


BAD_WORKLOADS = {
    "raises_after_compiling": """
        import jax, jax.numpy as jnp
        jax.jit(lambda x: x + 1)(jnp.ones(3))  # compiles into staging at import
        def targets():
            raise RuntimeError("no GPU here")
    """,
    "not_jitted": """
        import jax.numpy as jnp
        from compilecache import Target
        def targets():
            return [Target("plain", lambda x: x, (jnp.ones(2),))]
    """,
    "not_callable": "targets = 42\n",
}


@pytest.mark.slow
@pytest.mark.jax
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workload", "no_such_module_xyz:targets"], "cannot import module 'no_such_module_xyz'"),
        (["--workload", "not_callable:targets"], "is a int, not callable"),
        (["--workload", "raises_after_compiling:targets"], "raised RuntimeError: no GPU here"),
        (["--workload", "not_jitted:targets"], "'plain'.*not jax.jit-wrapped"),
        (["--workload", "not_callable:missing"], "has no attribute 'missing'"),
        (["--script", "SCRIPT_FAILS"], "exited with status 3"),
        (["--script", "does/not/exist.py"], "script does/not/exist.py not found"),
    ],
)
def test_bad_input_one_line_error_nonzero_nothing_published(tmp_path: Path, argv: list[str], message: str) -> None:
    modules = tmp_path / "mods"
    for name, source in BAD_WORKLOADS.items():
        write_module(modules, name, source)
    failing = tmp_path / "fails.py"
    failing.write_text("import jax, jax.numpy as jnp, sys\njax.jit(lambda x: x * 2)(jnp.ones(2))\nsys.exit(3)\n")
    argv = [str(failing) if a == "SCRIPT_FAILS" else a for a in argv]
    cache = tmp_path / "cache"
    done = run_cli(["warm", "--cache-dir", str(cache), *argv], clean_env(pythonpath=[modules]))
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("compilecache warm: error:")]
    assert len(errors) == 1 and re.search(message, errors[0]), done.stderr
    assert "Traceback" not in done.stderr
    assert not cache.exists() or entry_files(cache) == []
    assert not cache.exists() or list((cache / ".compilecache" / "staging").iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("where", "said"),
    [
        # Issue 28: a file given as the cache dir said only "not writable: prepare ... EEXIST".
        ("a_file", "file is a file, not a folder; give the path of a folder"),
        ("under_a_file", "file is a file, not a folder; give the path of a folder"),
        ("other_scheme", "only local paths and gs://"),
    ],
)
def test_unusable_cache_dir_is_a_one_line_error(tmp_path: Path, where: str, said: str) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cache = {"a_file": str(blocker), "under_a_file": str(blocker / "cache")}.get(where, "s3://bucket/prefix")
    done = run_cli(["warm", "--cache-dir", cache, "--workload", "m:f"], clean_env())
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert said in line, line


def test_warm_module_does_not_import_jax() -> None:
    modules = ", ".join(
        [
            "compilecache",
            "compilecache.jobtools.warm",
            "compilecache.training.envcmd",
            "compilecache.local.demo",
            "compilecache.training.runtime",
        ]
    )
    code = f"import sys, {modules}; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "False"
