"""The trainer's own verdict (compilecache.frameworks.jax.verdict): pure parts here, then real JAX processes.

The real-JAX tests load the report exactly as a training image does, through JAX's
``jax_plugins`` entry-point discovery: a throwaway ``*.dist-info`` on ``PYTHONPATH`` declares
the entry point of pyproject.toml (the shared venv's editable install may predate it).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compilecache.cache.cacheenv import REPORT, TERMINATION_LOG
from compilecache.frameworks.jax import keysettings, verdict
from compilecache.frameworks.jax.env import jax_cache_env, trainer_env
from compilecache.training import report
from jaxhelpers import REPO, clean_env, declare_trainer_plugin, entry_files, run_cli

HERE = {
    "jax": "0.10.2",
    "jaxlib": "0.10.2",
    "backend": "cpu",
    "device_kind": "cpu",
    "device_count": 1,
    "process_count": 1,
    "xla_flags": "--xla_b=2",
    "xla_caches": "none",
    "x64": False,
}
WARMED = {
    "run_id": "r1",
    "finished_at": "2026-11-22T04:00:00Z",
    **{key: HERE[key] for key in ("jax", "jaxlib", "backend", "device_kind", "device_count")},
    "entries": [{"file": "jit_train_step-" + "a" * 64 + "-cache"}],
    "targets": [{"name": "train_step", "cache_keys": ["jit_eval_step-" + "b" * 64]}],
}


def test_the_entry_point_is_declared_for_the_trainer_module() -> None:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["jax_plugins"]
    assert declared == {"compilecache_report": "compilecache.frameworks.jax.verdict"}
    assert callable(verdict.initialize)


def test_installed_distribution_registers_the_entry_point() -> None:
    found = [ep.value for ep in entry_points(group="jax_plugins")]
    if "compilecache.frameworks.jax.verdict" not in found:
        pytest.skip(f"the installed package predates the entry point (jax_plugins: {found}); pip install -e .")
    assert found.count("compilecache.frameworks.jax.verdict") == 1


def test_miss_reasons_name_a_differing_setting_another_key_or_not_warmed() -> None:
    old_manifest = {**WARMED, "settings": {"xla_flags": "--xla_a=1", "xla_caches": "none"}}
    assert (
        verdict.miss_reason("jit_train_step", HERE, [old_manifest])
        == "XLA_FLAGS differs: --xla_b=2 in training, --xla_a=1 in the warm-up"
    )
    same = {**WARMED, "settings": {"xla_flags": "--xla_b=2"}}
    assert verdict.miss_reason("jit_train_step", HERE, [same]) == verdict.KEY_DIFFERS
    assert verdict.miss_reason("jit_eval_step", HERE, [same]) == verdict.KEY_DIFFERS  # a key the warm-up hit
    assert verdict.miss_reason("jit_train", HERE, [same]) == verdict.NOT_WARMED  # a prefix is not a name
    eight = {**same, "device_count": 8}
    assert (
        verdict.miss_reason("jit_train_step", HERE, [eight]) == "device count differs: 1 in training, 8 in the warm-up"
    )
    # The newest run that warmed the program decides.
    newer = {**same, "finished_at": "2026-11-22T05:00:00Z"}
    assert verdict.miss_reason("jit_train_step", HERE, [old_manifest, newer]) == verdict.KEY_DIFFERS
    assert verdict.miss_reason("jit_train_step", HERE, []) == verdict.NOT_WARMED


CUDA = {
    **HERE,
    "backend": "gpu",
    "device_kind": "NVIDIA H100 80GB HBM3",
    "pjrt_plugins": "jax-cuda12-pjrt 0.10.2, jax-cuda12-plugin 0.10.2",
    "platform_version": "PJRT C API\ncuda 12090",
}


def test_a_trainer_on_another_pjrt_plugin_or_platform_is_told_so_by_name() -> None:
    older = "jax-cuda12-pjrt 0.10.1, jax-cuda12-plugin 0.10.1"
    plugin = {**WARMED, "settings": {**CUDA, "pjrt_plugins": older}}
    assert verdict.miss_reason("jit_train_step", CUDA, [plugin]) == (
        f"PJRT plugin differs: {CUDA['pjrt_plugins']} in training, {older} in the warm-up"
    )
    platform = {**WARMED, "settings": {**CUDA, "platform_version": "PJRT C API\ncuda 12080"}}
    assert verdict.miss_reason("jit_train_step", CUDA, [platform]).startswith("platform version differs: ")
    # A warm-up without any plugin (a CPU image) and a trainer with one: "(none)", not a blank.
    cpu = {**WARMED, "settings": {**CUDA, "pjrt_plugins": ""}}
    assert (
        verdict.miss_reason("jit_train_step", CUDA, [cpu])
        == f"PJRT plugin differs: {CUDA['pjrt_plugins']} in training, (none) in the warm-up"
    )
    # A manifest written before these were recorded says nothing about them.
    assert verdict.miss_reason("jit_train_step", CUDA, [{**WARMED, "settings": HERE}]).startswith("backend differs")
    # jaxlib first: it explains every miss, and the plugin is released with it.
    both = {**WARMED, "settings": {**CUDA, "jaxlib": "0.10.1", "pjrt_plugins": older}}
    assert (
        verdict.miss_reason("jit_train_step", CUDA, [both])
        == "jaxlib version differs: 0.10.2 in training, 0.10.1 in the warm-up"
    )


def test_pjrt_plugins_are_found_by_distribution_name() -> None:
    found = keysettings.pjrt_plugins(
        [("jax_cuda12_plugin", "0.10.2"), ("jax-cuda12-pjrt", "0.10.2"), ("jax", "0.10.2"), ("libtpu", "0.0.21")]
    )
    assert found == "jax-cuda12-pjrt 0.10.2, jax-cuda12-plugin 0.10.2, libtpu 0.0.21"
    assert keysettings.pjrt_plugins([("jaxlib", "0.10.2"), ("jax-cuda12-plugin-extra", "1")]) == ""


def test_settings_differences_follow_how_jax_hashes_the_flags() -> None:
    assert keysettings.differences({"xla_flags": "--b --a"}, {"xla_flags": "--a  --b"}) == []
    assert keysettings.differences({"xla_flags": ""}, {"xla_flags": "--a"}) == [
        "XLA_FLAGS differs: (none) in training, --a in the warm-up"
    ]
    assert keysettings.differences({"x64": True}, {}) == []  # an older manifest without it says nothing
    # A manifest without settings still has the hash of its flags (targets[].key_components).
    hashed = {"xla_flags": "--a", "xla_flags_hash": "1" * 64}
    assert keysettings.differences(hashed, {"xla_flags_hash": keysettings.NO_FLAGS_HASH}) == [
        "XLA_FLAGS differs: --a in training, (none) in the warm-up"
    ]
    assert keysettings.differences(hashed, {"xla_flags_hash": "2" * 64}) == [
        "XLA_FLAGS differs: --a in training, other flags in the warm-up"
    ]
    assert keysettings.differences(hashed, {"xla_flags_hash": "1" * 64}) == []
    assert keysettings.normal_flags("--z=1 --a --xla_dump_to=/x", frozenset({"--xla_dump_to"})) == "--a --z=1"
    assert keysettings.from_manifest({"jaxlib": "1", "settings": {"xla_flags": "--a"}}) == {
        "jaxlib": "1",
        "xla_flags": "--a",
    }


def test_summary_line_groups_misses_by_reason() -> None:
    tally = verdict.Tally(requests=27, hits=10, missed=["jit_train_step", *[f"jit_op{i}" for i in range(15)]])
    manifest = {**WARMED, "settings": {"xla_flags": "--xla_a=1"}}
    result = verdict.verdict(tally, HERE, [manifest])
    assert result["summary"] == (
        "compilecache: 10/27 compiles hit; missed: "
        "train_step (XLA_FLAGS differs: --xla_b=2 in training, --xla_a=1 in the warm-up), "
        "op0, op1, op2, op3, op4, +10 more functions (not warmed), 1 program (not named: JAX's miss log was off)"
    )
    assert (result["requests"], result["hits"], result["misses"]) == (27, 10, 17)
    assert result["missed"][0] == {
        "name": "train_step",
        "reason": "XLA_FLAGS differs: --xla_b=2 in training, --xla_a=1 in the warm-up",
    }
    assert len(result["missed"]) == verdict.MAX_MISSED
    assert verdict.summary_line(3, 3, []) == "compilecache: 3/3 compiles hit"
    assert "no compile used" in verdict.summary_line(0, 0, [])


def test_misses_of_one_function_are_named_with_how_many_never_as_a_bare_count() -> None:
    reasons = [("train_step", "device count differs: 2 in training, 4 in the warm-up")] * 2 + [
        ("eval_step", verdict.NOT_WARMED)
    ] * 4
    assert verdict.summary_line(8, 2, reasons) == (
        "compilecache: 2/8 compiles hit; missed: "
        "train_step ×2 (device count differs: 2 in training, 4 in the warm-up), "
        "eval_step ×4 (not warmed)"
    )


@settings(derandomize=True, max_examples=80, deadline=None)
@given(
    missed=st.lists(
        st.tuples(
            st.sampled_from(["train_step", "eval_step", "_mean", "stack", "_reduce_sum", "gather"]),
            st.sampled_from(
                [verdict.NOT_WARMED, "XLA_FLAGS differs: --a in training, (none) in the warm-up", "arg 0 (.step): x"]
            ),
        ),
        max_size=30,
    )
)
def test_the_line_names_every_missed_function_up_to_the_limit(missed: list[tuple[str, str]]) -> None:
    line = verdict.summary_line(len(missed) + 1, 1, missed)
    assert " programs" not in line and " program " not in line  # every miss here has a name
    for reason in {reason for _, reason in missed}:
        functions = list(dict.fromkeys(name for name, why in missed if why == reason))
        named = functions[: report.MAX_NAMED]
        for name in named:
            assert name in line
        if len(functions) > report.MAX_NAMED:
            assert f"+{len(functions) - report.MAX_NAMED} more function" in line


@settings(derandomize=True, max_examples=60, deadline=None)
@given(
    names=st.lists(st.text(min_size=0, max_size=600), max_size=40),
    flags=st.text(max_size=3000),
    hits=st.integers(min_value=0, max_value=10**6),
)
def test_the_termination_message_is_always_one_json_object_under_4096_bytes(
    names: list[str], flags: str, hits: int
) -> None:
    tally = verdict.Tally(requests=hits + len(names), hits=hits, missed=names)
    manifest = {**WARMED, "entries": [{"file": f"{name}-x-cache"} for name in names], "settings": {"xla_flags": flags}}
    result = verdict.verdict(tally, HERE, [manifest])
    text = json.dumps(result, separators=(",", ":"))
    assert len(text.encode()) < report.MAX_BYTES
    assert json.loads(text)["schema"] == verdict.SCHEMA and result["misses"] == len(names)
    assert len(result["missed"]) <= verdict.MAX_MISSED and "\n" not in result["summary"]


def test_the_termination_message_goes_only_into_an_existing_empty_file(tmp_path: Path) -> None:
    result = {"schema": verdict.SCHEMA, "summary": "x"}
    assert not verdict.write_termination_message(result, str(tmp_path / "missing"))
    assert not (tmp_path / "missing").exists()
    taken = tmp_path / "taken"
    taken.write_text("the container's own message")
    assert not verdict.write_termination_message(result, str(taken))
    assert taken.read_text() == "the container's own message"
    empty = tmp_path / "empty"
    empty.touch()
    assert verdict.write_termination_message(result, str(empty))
    assert json.loads(empty.read_text()) == result


def test_the_filter_keeps_the_names_and_drops_only_the_debug_it_caused() -> None:
    recorder = verdict.Recorder()
    logger = logging.getLogger("jax._src.compiler")
    text = "PERSISTENT COMPILATION CACHE MISS for '%s' with key %r"
    miss = logger.makeRecord(logger.name, logging.DEBUG, "f", 1, text, ("jit_f", "k"), None)
    recorder.lowered_level = True
    assert recorder.filter(miss) is False  # the logger passed WARNING and up before we lowered it
    assert recorder.snapshot().missed == ["jit_f"]
    warning = logger.makeRecord(logger.name, logging.WARNING, "f", 1, "Error writing %s", ("x",), None)
    assert recorder.filter(warning) is True
    recorder.lowered_level = False  # a level the user set: theirs to filter
    assert recorder.filter(miss) is True


# --- real JAX ----------------------------------------------------------------------------------

WORKLOAD = """
import jax, jax.numpy as jnp
from compilecache import Target

@jax.jit
def train_step(x):
    return jnp.tanh(x @ x).sum()

def targets():
    return [Target("train_step", train_step, (jax.ShapeDtypeStruct((16, 16), jnp.float32),))]
"""

TRAIN = """
import json, logging
import jax, jax.numpy as jnp
logging.basicConfig(level=logging.INFO)  # as absl, TensorFlow or clu configure logging
counts = {"requests": 0, "hits": 0}
def on(event, **_):
    if event == "/jax/compilation_cache/compile_requests_use_cache": counts["requests"] += 1
    if event == "/jax/compilation_cache/cache_hits": counts["hits"] += 1
jax.monitoring.register_event_listener(on)
import trainwl
x = jnp.ones((16, 16), jnp.float32)
trainwl.train_step(x).block_until_ready()

@jax.jit
def scale(y):
    return jnp.cos(y) * 3

scale(x).block_until_ready()
print(json.dumps(counts))
"""

WRITE_ERROR = "Error writing persistent compilation cache entry"


@pytest.fixture(scope="module")
def warmed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(a cache warmed by ``compilecache warm`` for train_step, the workload dir, the entry-point dir)."""
    root = tmp_path_factory.mktemp("trainer")
    code = root / "code"
    code.mkdir()
    (code / "trainwl.py").write_text(textwrap.dedent(WORKLOAD))
    (code / "train.py").write_text(textwrap.dedent(TRAIN))
    plugin = declare_trainer_plugin(root / "plugin")
    cache = root / "cache"
    done = run_cli(["warm", "--cache-dir", str(cache), "--workload", "trainwl:targets"], clean_env({}, [code]))
    assert done.returncode == 0, done.stderr
    assert any(name.startswith("jit_train_step-") for name in entry_files(cache)), entry_files(cache)
    return cache, code, plugin


def train(env: dict[str, str], code: Path, paths: list[Path], *, drop_caps: bool = False) -> tuple[dict[str, int], str]:
    """Run the training script; (its own jax.monitoring counts, its stderr)."""
    argv = [sys.executable, str(code / "train.py")]
    if drop_caps:  # root without capabilities obeys file modes, as a non-root trainer does
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("needs setpriv (util-linux) to drop root's capabilities")
        argv = [setpriv, "--bounding-set=-all", "--inh-caps=-all", "--ambient-caps=-all", "--no-new-privs", "--", *argv]
    done = subprocess.run(
        argv, env=clean_env(env, [*paths, code]), cwd=code, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr
    counts: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    return counts, done.stderr


def verdict_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("compilecache: ")]


@pytest.mark.slow
@pytest.mark.jax
def test_a_trainer_with_the_cache_env_reports_counts_equal_to_jax_monitoring(
    warmed: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    cache, code, plugin = warmed
    termination = tmp_path / "termination-log"
    termination.touch()
    env = trainer_env(jax_cache_env(str(cache)), read_only=True) | {TERMINATION_LOG: str(termination)}

    counts, stderr = train(env, code, [plugin])
    [line] = verdict_lines(stderr)
    result = json.loads(termination.read_text())
    assert (result["requests"], result["hits"]) == (counts["requests"], counts["hits"]), (result, counts)
    assert result["misses"] == counts["requests"] - counts["hits"] > 0
    assert line == result["summary"] and line.startswith(f"compilecache: {counts['hits']}/{counts['requests']} ")
    missed = {item["name"]: item["reason"] for item in result["missed"]}
    assert missed.get("scale") == verdict.NOT_WARMED and "train_step" not in missed, result
    assert "DEBUG" not in stderr, stderr  # whatever logging the workload configured

    # No COMPILECACHE_REPORT, no report (the plugin is the mechanism).
    assert verdict_lines(train({k: v for k, v in env.items() if k != REPORT}, code, [plugin])[1]) == []
    # Without our dist-info on the path, the line comes only from the package's own entry point.
    installed = any(point.value == "compilecache.frameworks.jax.verdict" for point in entry_points(group="jax_plugins"))
    assert bool(verdict_lines(train(env, code, [])[1])) == installed


@pytest.mark.slow
@pytest.mark.jax
def test_a_trainer_with_other_xla_flags_is_told_which_setting_differs(warmed: tuple[Path, Path, Path]) -> None:
    cache, code, plugin = warmed
    flag = "--xla_cpu_enable_fast_math=false"
    env = trainer_env(jax_cache_env(str(cache), xla_flags=flag), read_only=True)
    counts, stderr = train(env, code, [plugin])
    [line] = verdict_lines(stderr)
    assert f"train_step (XLA_FLAGS differs: {flag} in training, (none) in the warm-up)" in line, line
    assert line.startswith(f"compilecache: 0/{counts['requests']} compiles hit;"), line


@pytest.mark.slow
@pytest.mark.jax
def test_a_trainer_on_another_pjrt_plugin_than_the_recorded_warm_up_is_told_so(
    warmed: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    # The real manifest of a real warm-up records this process's plugins (none, on the CPU) and
    # platform version; as if a CUDA image had warmed it, with the entry its key would not find.
    source, code, plugin = warmed
    cache = tmp_path / "cache"
    shutil.copytree(source, cache)
    [manifest_path] = (cache / ".compilecache" / "manifests").glob("*.json")
    manifest = json.loads(manifest_path.read_text())
    assert (manifest["settings"]["pjrt_plugins"], manifest["settings"]["platform_version"]) == ("", "cpu")
    manifest["settings"]["pjrt_plugins"] = CUDA["pjrt_plugins"]
    manifest_path.write_text(json.dumps(manifest))
    for name in entry_files(cache):
        if name.startswith("jit_train_step-"):
            (cache / name).unlink()
    _, stderr = train(trainer_env(jax_cache_env(str(cache)), read_only=True), code, [plugin])
    [line] = verdict_lines(stderr)
    assert f"train_step (PJRT plugin differs: (none) in training, {CUDA['pjrt_plugins']} in the warm-up)" in line, line


@pytest.mark.slow
@pytest.mark.jax
def test_a_read_only_trainer_tries_no_writes_and_still_hits(warmed: tuple[Path, Path, Path], tmp_path: Path) -> None:
    cache, code, plugin = warmed
    frozen = tmp_path / "frozen"
    shutil.copytree(cache, frozen)
    for folder, _, files in os.walk(frozen):
        for name in files:
            os.chmod(os.path.join(folder, name), 0o444)
        os.chmod(folder, 0o555)
    try:
        env = trainer_env(jax_cache_env(str(frozen)), read_only=True)
        counts, stderr = train(env, code, [plugin], drop_caps=True)
        assert WRITE_ERROR not in stderr, stderr
        [line] = verdict_lines(stderr)
        assert "train_step" not in line.split("missed:")[-1], line  # the key is unchanged: the entry hits
        assert counts["hits"] >= 1

        # The same trainer allowed to write tries, and fails, once per program not warmed.
        writer = trainer_env(jax_cache_env(str(frozen)), read_only=False)
        _, stderr = train(writer, code, [plugin], drop_caps=True)
        assert WRITE_ERROR in stderr, stderr
    finally:
        for folder, _, _ in os.walk(frozen):
            os.chmod(folder, 0o755)


@pytest.mark.slow
@pytest.mark.jax
def test_runtime_enable_installs_the_report(warmed: tuple[Path, Path, Path], tmp_path: Path) -> None:
    cache, code, _ = warmed
    script = code / "enable_then_train.py"
    script.write_text(
        "from compilecache.training import runtime\n"
        f"runtime.enable({str(cache)!r}, read_only=True)\n" + (code / "train.py").read_text()
    )
    env = clean_env({}, [code])
    argv = [sys.executable, str(script)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    [line] = verdict_lines(done.stderr)
    assert line.startswith(f"compilecache: {counts['hits']}/{counts['requests']} compiles hit"), line
    assert WRITE_ERROR not in done.stderr


EARLY = """
import sys, time
exec(open(sys.argv[1]).read())  # train.py: compiles train_step and scale, prints its counts
from compilecache.frameworks.jax import verdict
deadline = time.monotonic() + 60
while verdict._recorder.printed is None:  # bounded: the settle time is 0.2 s
    assert time.monotonic() < deadline, "no early report within 60 s"
    time.sleep(0.05)
print("EARLY-SEEN", file=sys.stderr, flush=True)
if sys.argv[2] == "more":
    jax.jit(lambda y: y - 1)(x).block_until_ready()  # a compile after the early report
"""


@pytest.mark.slow
@pytest.mark.jax
@pytest.mark.parametrize("then", ["more", "none"])
def test_the_line_comes_once_compiling_settles_and_again_at_exit_only_if_counts_changed(
    warmed: tuple[Path, Path, Path], then: str
) -> None:
    cache, code, plugin = warmed
    env = trainer_env(jax_cache_env(str(cache)), read_only=True) | {verdict.SETTLE: "0.2"}
    argv = [sys.executable, "-c", EARLY, str(code / "train.py"), then]
    done = subprocess.run(
        argv, env=clean_env(env, [plugin, code]), cwd=code, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("compilecache: ") or line == "EARLY-SEEN"]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    early = f"compilecache: {counts['hits']}/{counts['requests']} compiles hit"
    assert lines[0].startswith(early) and lines[1] == "EARLY-SEEN", lines
    if then == "more":
        assert len(lines) == 3 and lines[2].startswith(f"compilecache: {counts['hits']}/{counts['requests'] + 1} ")
    else:
        assert len(lines) == 2, lines  # the exit adds nothing new: no second line


def test_unreadable_manifests_are_said_not_blamed_on_the_warm_up(tmp_path: Path) -> None:
    # An image without gcsfs/etils, or a cache that is not a folder: nothing can be told about a miss.
    reason = verdict.miss_reason("jit_train_step", HERE, [], None, "ModuleNotFoundError: No module named 'gcsfs'")
    assert reason.startswith("reason unknown: the cache's manifests could not be read (ModuleNotFoundError")
    assert reason != verdict.NOT_WARMED
    manifests, problem = verdict._read_manifests("s3://bucket/cache")  # a store this package has not
    assert manifests == [] and problem is not None and "only local paths and gs://" in problem, problem
    linked = tmp_path / "cache"
    (linked / ".compilecache").mkdir(parents=True)
    (linked / ".compilecache" / "manifests").symlink_to(tmp_path)  # never followed out of the cache
    manifests, problem = verdict._read_manifests(str(linked))
    assert manifests == [] and problem is not None and "manifests not read" in problem, problem
    tally = verdict.Tally(requests=2, hits=1, missed=["jit_train_step"])
    line = verdict.verdict(tally, HERE, manifests, problem)["summary"]
    assert "train_step (reason unknown: the cache's manifests could not be read" in line, line
