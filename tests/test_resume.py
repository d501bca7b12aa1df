"""Issue 20 item 1: restarts hit. The exact mode also runs the entrypoint resumed from its own checkpoint.

Fast tests drive the pure parts (:mod:`compilecache.frameworks.jax.resume`, verify's pairing of runs).
The slow ones warm ``examples/workloads/flax_resume.py`` (a Flax ``TrainState`` restored with
``flax.serialization``: its ``step`` comes back strong-typed) through the CLI, then train in fresh
processes with only the ``compilecache env`` settings and the trainer's own verdict: first a fresh
start that writes its checkpoint, then a restart from it, as a requeued job does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from compilecache.cli.main import build_parser
from compilecache.frameworks.jax import compilehook, verdict
from compilecache.frameworks.jax.compiler import TargetRun
from compilecache.frameworks.jax.env import jax_cache_env, trainer_env
from compilecache.frameworks.jax.keydiff import closest_difference, first_difference, signature_of_computation
from compilecache.frameworks.jax.resume import RESUMED_SUFFIX, ResumePlan, describe, merge_results, resume_plan
from compilecache.frameworks.jax.verify import miss_messages
from jaxhelpers import REPO, clean_env, declare_trainer_plugin, run_cli, write_module
from test_warm_exact import FLAX_ENV, TRAPS

SCRIPT = REPO / "examples" / "workloads" / "flax_resume.py"

# ---- fast: flags, environment, merging ------------------------------------------------------------


@pytest.mark.parametrize(
    ("enabled", "extra", "when", "env", "expected"),
    [
        (None, [], None, {}, ResumePlan()),  # the default: when the first run left something, no added arguments
        (False, ["--restore"], None, {}, None),
        (None, [], None, {"COMPILECACHE_WARM_RESUME": "false"}, None),
        (None, [], None, {"COMPILECACHE_WARM_RESUME": "1"}, ResumePlan(always=True)),
        (True, [], None, {"COMPILECACHE_WARM_RESUME": "0"}, ResumePlan(always=True)),  # the flag wins
        (None, [], None, {"COMPILECACHE_RESUME_ARGS": "--restore 'a b'"}, ResumePlan(args=("--restore", "a b"))),
        (None, ["--x"], None, {"COMPILECACHE_RESUME_ARGS": "--restore"}, ResumePlan(args=("--x",))),
        (None, [], None, {"COMPILECACHE_RESUME_WHEN": "ckpt"}, ResumePlan(when="ckpt")),
        (None, [], "/c", {"COMPILECACHE_RESUME_WHEN": "ckpt"}, ResumePlan(when="/c")),
    ],
)
def test_resume_plan_from_flags_then_environment(
    enabled: bool | None, extra: list[str], when: str | None, env: dict[str, str], expected: ResumePlan | None
) -> None:
    assert resume_plan(enabled, extra, when, env) == expected


def test_the_cli_parses_the_resume_flags() -> None:
    args = build_parser().parse_args(
        [
            *["warm", "--cache-dir", "c", "--script", "t.py", "--steps", "2", "--resume-arg=--restore"],
            *["--no-resume", "--resume-when", "ckpt/state"],
        ]
    )
    assert (args.resume, args.resume_arg, args.resume_when) == (False, ["--restore"], "ckpt/state")
    assert describe(None).startswith("no resumed run")
    assert describe(ResumePlan(args=("--restore",))) == "resumed run with --restore"


def test_a_failed_resumed_run_is_named_and_a_good_one_adds_its_targets() -> None:
    first = (0, {"runs": [{"name": "t.py"}], "facts": {"a": 1}, "stepped": {"ran": 2}}, "")
    failed = merge_results(first, (1, {"error": "script t.py raised KeyError: 'step'"}, "tail"))
    assert failed[0] == 1 and failed[1]["error"] == (
        "the resumed run (again in the first run's working directory): script t.py raised KeyError: 'step'"
    )
    code, merged, _ = merge_results(first, (0, {"runs": [{"name": "t.py (resumed)"}], "stepped": {"ran": 2}}, ""))
    assert code == 0 and [run["name"] for run in merged["runs"]] == ["t.py", "t.py (resumed)"]
    assert merged["facts"] == {"a": 1} and merged["stepped"] == merged["resumed_stepped"] == {"ran": 2}


def test_verify_checks_the_resumed_run_against_its_own_warm_counterpart() -> None:
    name = "t.py" + RESUMED_SUFFIX
    warm = [
        TargetRun("script:t.py", "t.py", requests=2, keys_written=["a", "b"]),
        TargetRun("script:t.py", name, requests=2, keys_written=["c"], keys_hit=["a"]),
    ]
    fresh_only = [TargetRun("script:t.py", "t.py", requests=2, hits=2, keys_hit=["a", "b"])]
    [problem] = miss_messages(warm, fresh_only)
    assert f"target {name!r}" in problem and "was not produced again" in problem
    missed = [*fresh_only, TargetRun("script:t.py", name, requests=2, hits=1, keys_hit=["a"], keys_missed=["c"])]
    [problem] = miss_messages(warm, missed)
    assert f"target {name!r}" in problem and "MISSED" in problem


def _sig(*args: dict[str, Any]) -> dict[str, Any]:
    return {"args": list(args), "static": {}, "mesh_axes": [], "settings": {}}


def _arg(path: str, **fields: Any) -> dict[str, Any]:
    return {"path": path, "type": "int32[]", "weak_type": False, "sharding": "unspecified", "donated": False, **fields}


FRESH = _sig(_arg("[0][0].step", weak_type=True), _arg("[0][1]", type="float32[8,8]"))
RESTORED = _sig(_arg("[0][0].step"), _arg("[0][1]", type="float32[8,8]"))
WARMED = {
    "finished_at": "2026-11-25T10:00:00Z",
    "settings": {},
    "entries": [{"file": "jit_train_step-abc-cache"}],
    "targets": [{"name": "t.py", "signatures": {"jit_train_step": [FRESH]}}],
}


def test_the_trainer_names_the_resumed_state_difference_against_the_recorded_signature() -> None:
    here: dict[str, Any] = {}
    reason = verdict.miss_reason("jit_train_step", here, [WARMED], RESTORED)
    assert reason == "arg 0 (.step): int32[] weak_type=False in training, True in the warm-up"
    tally = verdict.Tally(requests=3, hits=2, missed=["jit_train_step"], signatures=[RESTORED])
    line = verdict.verdict(tally, here, [WARMED])["summary"]
    assert line == (
        "compilecache: 2/3 compiles hit; missed: "
        "train_step (arg 0 (.step): int32[] weak_type=False in training, True in the warm-up)"
    )
    # Without a signature (JAX internals moved), or a manifest without one: the general reason.
    assert verdict.miss_reason("jit_train_step", here, [WARMED], None) == verdict.KEY_DIFFERS
    bare = {**WARMED, "targets": [{"name": "t.py"}]}
    assert verdict.miss_reason("jit_train_step", here, [bare], RESTORED) == verdict.KEY_DIFFERS


def test_an_aot_target_s_signature_is_compared_when_its_key_is_the_module_s() -> None:
    key = "jit_train_step-" + "d" * 64
    settings = {"xla_flags": "--a"}
    recorded = {**FRESH, "settings": settings, "static": {"1": "2"}}
    target = {"name": "train_step", "cache_keys": [key], "signature": recorded}
    aot = {**WARMED, "targets": [target]}
    # Settings and static args are the manifest's and the key's business: the argument is what is named.
    named = verdict.miss_reason("jit_train_step", {}, [aot], RESTORED)
    assert named == "arg 0 (.step): int32[] weak_type=False in training, True in the warm-up"
    assert verdict.miss_reason("jit_eval_step", {}, [aot], RESTORED) == verdict.NOT_WARMED


def test_the_nearest_recorded_variant_is_compared() -> None:
    other_batch = _sig(_arg("[0][0].step"), _arg("[0][1]", type="float32[4,8]"))
    both = [FRESH, other_batch]
    donated = _sig(_arg("[0][0].step"), _arg("[0][1]", type="float32[4,8]", donated=True))
    # One argument from the second variant, two from the first: the second is named.
    assert (
        closest_difference("f", both, donated) == "f arg 1: float32[4,8] donated=True in training, False in the warm-up"
    )
    assert closest_difference("f", [FRESH, RESTORED], RESTORED) is None
    assert closest_difference("f", [], RESTORED) is None


def test_verify_names_what_a_missed_program_of_the_entrypoint_differs_in() -> None:
    a, b, c = ("a" * 64, "b" * 64, "c" * 64)
    warm = TargetRun("script:t.py", "t.py", requests=2, keys_written=[f"jit_train_step-{a}", f"jit_init-{b}"])
    warm.signatures = {"jit_train_step": [FRESH]}
    fresh = TargetRun("script:t.py", "t.py", requests=2, hits=1, keys_hit=[f"jit_init-{b}"])
    fresh.keys_missed, fresh.signatures = [f"jit_train_step-{c}"], {"jit_train_step": [RESTORED]}
    [problem] = miss_messages([warm], [fresh])
    assert (
        "differs from what the warmer compiled: "
        "train_step arg 0 (.step): int32[] weak_type=False in training, True in the warm-up" in problem
    )


@pytest.mark.jax
def test_the_compile_hook_reads_the_program_being_compiled_with_jax_argument_names() -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    seen: list[tuple[str, dict[str, Any]]] = []
    assert compilehook.install(lambda computation: seen.append(signature_of_computation(computation)))

    def ramp_step(state: dict[str, Any], x: jax.Array) -> jax.Array:
        return x.astype(jnp.bfloat16) * jnp.minimum(1.0, (state["step"] + 1) / 10)

    step = jax.jit(ramp_step, donate_argnums=1)
    step({"step": 0}, jnp.ones((2,)))
    step({"step": np.int32(4)}, jnp.ones((2,)))
    assert compilehook.current() is None  # only inside a compile
    modules = [(module, sig) for module, sig in seen if module == "jit_ramp_step"]
    assert len(modules) == 2, [module for module, _ in seen]
    (_, fresh), (_, restored) = modules
    assert [(a["path"], a["type"], a["weak_type"], a["donated"]) for a in fresh["args"]] == [
        ("[0][0]['step']", "int32[]", True, False),
        ("[0][1]", "float32[2]", False, True),
    ]
    named = first_difference("ramp_step", fresh, restored)
    assert named == "ramp_step arg 0 (state['step']): int32[] weak_type=False in training, True in the warm-up"


# ---- slow: the Flax TrainState restored from a checkpoint -----------------------------------------


def _warm(cache: Path, *extra: str, script_args: tuple[str, ...] = ()) -> dict[str, Any]:
    report = cache.parent / f"{cache.name}.json"
    argv = ["warm", "--cache-dir", str(cache), "--report", str(report), "--script", str(SCRIPT), "--steps", "2"]
    done = run_cli([*argv, *extra, "--", "--steps", "1000", *script_args], clean_env())
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(report.read_text())
    return result


def _train(cache: Path, workdir: Path, plugin: Path, *args: str) -> tuple[dict[str, Any], str]:
    """The script as training runs it, in ``workdir``, with only ``compilecache env``'s settings."""
    env = clean_env(trainer_env(jax_cache_env(str(cache)), read_only=True), [plugin])
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--json", "--steps", "3", *args],
        env=env,
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("compilecache: ")]
    counts: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return counts, line


@pytest.mark.slow
@pytest.mark.jax
def test_a_restart_misses_train_step_without_the_resumed_run_and_hits_everything_with_it(tmp_path: Path) -> None:
    plugin = declare_trainer_plugin(tmp_path / "plugin")
    fresh_only, paired = tmp_path / "fresh-only", tmp_path / "paired"
    report = _warm(fresh_only, "--no-resume")
    assert [target["name"] for target in report["targets"]] == ["flax_resume.py"]
    report = _warm(paired)
    assert [target["name"] for target in report["targets"]] == ["flax_resume.py", "flax_resume.py (resumed)"]
    [resumed] = [target for target in report["targets"] if target["name"].endswith(RESUMED_SUFFIX)]
    # The restart compiled exactly one program the fresh start never did: train_step, strong-typed.
    assert [name.split("-")[0] for name in resumed["entries_written"]] == ["jit_train_step"], resumed
    assert report["verify"]["ok"] and report["verify"]["hits"] == report["verify"]["requests"], report["verify"]

    for cache, restart_hits_all in ((fresh_only, False), (paired, True)):
        workdir = tmp_path / f"train-{cache.name}"
        workdir.mkdir()
        first, line = _train(cache, workdir, plugin)
        assert not first["resumed"] and first["hits"] == first["requests"], (first, line)
        assert (workdir / "checkpoint.msgpack").is_file()
        again, line = _train(cache, workdir, plugin)
        assert again["resumed"] and again["step"] == 6, again
        if restart_hits_all:
            assert again["hits"] == again["requests"] > 0, (again, line)
            assert line.startswith(f"compilecache: {again['hits']}/{again['requests']} compiles hit"), line
            assert "missed" not in line, line
        else:
            assert again["hits"] == again["requests"] - 1, (again, line)
            # Named by what differs from the program the warm-up recorded for train_step (its manifest).
            assert line.endswith(
                "missed: train_step (arg 0 (state.step): int32[] weak_type=False in training, True in the warm-up)"
            ), line


@pytest.mark.slow
@pytest.mark.jax
def test_a_script_that_restores_only_when_asked_gets_the_resume_args(tmp_path: Path) -> None:
    plugin = declare_trainer_plugin(tmp_path / "plugin")
    cache = tmp_path / "cache"
    # The first run never restores; the second must (required: it fails without the first run's checkpoint).
    report = _warm(cache, "--resume-arg=--restore=required", script_args=("--restore", "never"))
    assert report["verify"]["ok"], report["verify"]
    workdir = tmp_path / "train"
    workdir.mkdir()
    _train(cache, workdir, plugin, "--restore", "never")
    again, line = _train(cache, workdir, plugin, "--restore", "required")
    assert again["resumed"] and again["hits"] == again["requests"], (again, line)


@pytest.mark.slow
@pytest.mark.jax
@pytest.mark.parametrize(
    ("trap", "trainer_flags", "named"),
    [
        # weak_type of TrainState.step does not reach this program: training hits, with or without training_args.
        ("weak_type", "", None),
        ("weak_type_plain", "", None),
        (
            "unsharded",
            "",
            "train_step (arg 0 (state.step): int32[] sharding=P() in training, unspecified in the warm-up)",
        ),
        (
            "unsharded_plain",
            "",
            "train_step (arg 0 (state.step): int32[] sharding=P() in training, unspecified in the warm-up)",
        ),
        ("no_donation", "", "train_step (arg 0 (state.step): int32[] donated=True in training, False in the warm-up)"),
        (
            "no_donation_args",
            "",
            "train_step (arg 0 (state.step): int32[] donated=True in training, False in the warm-up)",
        ),
        (
            "no_donation_plain",
            "",
            "train_step (arg 0 (state.step): int32[] donated=True in training, False in the warm-up)",
        ),
        # Other XLA flags in training: every key differs, the setting is named (verify cannot see it).
        (
            "weak_type",
            " --xla_cpu_enable_fast_math=false",
            "train_step (XLA_FLAGS differs: --xla_cpu_enable_fast_math=false in training, (none) in the warm-up)",
        ),
    ],
)
def test_the_trainer_names_an_aot_trap_against_the_target_s_recorded_signature(
    tmp_path: Path, trap: str, trainer_flags: str, named: str | None
) -> None:
    # Issue 21's traps, warmed without verify: the training process itself says what differs.
    folder = write_module(tmp_path / "mods", "traps", TRAPS)
    cache = tmp_path / "cache"
    done = run_cli(
        ["warm", "--cache-dir", str(cache), "--workload", f"traps:{trap}", "--no-verify"],
        clean_env(FLAX_ENV, pythonpath=[folder]),
    )
    assert done.returncode == 0, done.stderr
    xla_flags = FLAX_ENV["XLA_FLAGS"] + trainer_flags
    env = clean_env({**FLAX_ENV, **trainer_env(jax_cache_env(str(cache), xla_flags=xla_flags), read_only=True)})
    env["PYTHONPATH"] += f":{declare_trainer_plugin(tmp_path / 'plugin')}"
    trained = subprocess.run(
        [sys.executable, str(REPO / "examples" / "train_flax.py"), "--steps", "2", "--json"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert trained.returncode == 0, trained.stderr
    [line] = [line for line in trained.stderr.splitlines() if line.startswith("compilecache: ")]
    # The traps warm train_step only: create_state, which training also compiles, is "not warmed".
    if named is None:
        assert "train_step" not in line and line.startswith("compilecache: 1/2 compiles hit"), line
    else:
        assert f"missed: {named}" in line, line


SHORT = """
import json, os, sys
import jax, jax.numpy as jnp

TOTAL = 3  # the whole training: a restart after step 2 has one step left
path = "step.json"
start = json.load(open(path))["step"] if os.path.exists(path) else 0
step_size = jnp.int32(start) if start else 0  # a restored counter is strong-typed, a fresh one weak

@jax.jit
def train_step(x, k):
    return (x * k).astype(jnp.int8)

x = jnp.ones(4, jnp.int8)
for step in range(start, TOTAL):
    try:
        x = train_step(x, step_size)
    finally:
        json.dump({"step": step + 1}, open(path, "w"))
print(json.dumps({"started": start, "cwd": os.getcwd()}))
"""


@pytest.mark.slow
@pytest.mark.jax
def test_a_resumed_run_that_reaches_the_end_of_training_is_no_failure(tmp_path: Path) -> None:
    script = tmp_path / "short.py"
    script.write_text(SHORT)
    report_path = tmp_path / "r.json"
    argv = ["warm", "--cache-dir", str(tmp_path / "cache"), "--report", str(report_path), "--script", str(script)]
    done = run_cli([*argv, "--steps", "2"], clean_env())
    assert done.returncode == 0, done.stderr
    # It wrote step.json in its working directory: a restart reads it, so the resumed run happened.
    assert "ran to its end: its resumed run after 1 calls (it left step.json in its working directory)" in (
        done.stdout
    ), done.stdout
    # The restart's strong-typed counter widens the product: a program only the resumed run compiled.
    report = json.loads(report_path.read_text())
    [resumed] = [target for target in report["targets"] if target["name"].endswith(RESUMED_SUFFIX)]
    assert "jit_train_step" in [name.split("-")[0] for name in resumed["entries_written"]], resumed
    assert report["verify"]["ok"], report["verify"]
    # The first run is still held to its N steps.
    done = run_cli([*argv, "--steps", "4"], clean_env())
    assert done.returncode == 2 and "ended after 3 of 4 calls of 'train_step'" in done.stderr, done.stderr
