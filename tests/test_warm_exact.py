"""Issue 11: the exact warm mode, misses named by what differs, and the traps of the AOT path.

Fast tests drive the pure comparison (:mod:`compilecache.frameworks.jax.keydiff`); the slow
ones warm the Flax example (``examples/workloads/flax_mlp.py``, 4 CPU devices)
both ways through the CLI in fresh processes and train from the result.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compilecache.frameworks.jax.compiler import TargetRun
from compilecache.frameworks.jax.env import jax_cache_env
from compilecache.frameworks.jax.keydiff import first_difference
from compilecache.frameworks.jax.verify import donation_unchecked, miss_messages, self_consistency_only
from jaxhelpers import FOUR_CPUS, clean_env, entry_files, run_cli, run_flax_train, write_module


def _arg(path: str, **fields: Any) -> dict[str, Any]:
    return {"path": path, "type": "int32[]", "weak_type": False, "sharding": "P()", "donated": True, **fields}


BASE: dict[str, Any] = {
    "args": [_arg("[0][0].step"), _arg("[0][1]", type="float32[8,16]", sharding="P('data',)", donated=False)],
    "static": {},
    "mesh_axes": ["data"],
    "settings": {"xla_flags": "--a", "x64": False},
}


def _with(change: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps({**BASE, **change}))


# ---- fast: the comparison ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("other", "line"),
    [
        (
            _with({"args": [_arg("[0][0].step", weak_type=True), BASE["args"][1]]}),
            "train_step arg 0 (.step): int32[] weak_type=True in training, False in the warm-up",
        ),
        (
            _with({"args": [BASE["args"][0], {**BASE["args"][1], "sharding": "unspecified"}]}),
            "train_step arg 1: float32[8,16] sharding=unspecified in training, P('data',) in the warm-up",
        ),
        (
            _with({"args": [_arg("[0][0].step", donated=False), BASE["args"][1]]}),
            "train_step arg 0 (.step): int32[] donated=False in training, True in the warm-up",
        ),
        (
            _with({"args": [_arg("[0][0].step", type="float32[]"), BASE["args"][1]]}),
            "train_step arg 0 (.step): float32[] in training, int32[] in the warm-up",
        ),
        # Every difference names its sides, training's value first (keysettings.sides).
        (
            _with({"settings": {**BASE["settings"], "xla_flags": ""}}),
            "train_step: XLA_FLAGS differs: (none) in training, --a in the warm-up",
        ),
        (
            _with({"settings": {**BASE["settings"], "x64": True}}),
            "train_step: jax_enable_x64 differs: True in training, False in the warm-up",
        ),
        (_with({"static": {"2": "True"}}), "train_step static arg 2: True in training, unset in the warm-up"),
        (_with({"mesh_axes": ["batch"]}), "train_step: mesh axis names ['batch'] in training, ['data'] in the warm-up"),
        (_with({"args": BASE["args"][:1]}), "train_step arg 1: present in the warmer only"),
        (_with({"args": [*BASE["args"], _arg("[1]['x']")]}), "train_step arg kwarg 'x': present in training only"),
    ],
)
def test_first_difference_names_what_differs_on_one_line(other: dict[str, Any], line: str) -> None:
    found = first_difference("train_step", BASE, other)
    assert found is not None and found.startswith(line) and "\n" not in found


_FIELD = st.sampled_from(["type", "weak_type", "sharding", "donated"])


@settings(derandomize=True, max_examples=60)
@given(index=st.integers(0, 1), field=_FIELD, setting=st.booleans())
def test_any_single_change_is_named_and_no_change_is_none(index: int, field: str, setting: bool) -> None:
    assert first_difference("f", BASE, json.loads(json.dumps(BASE))) is None
    other = json.loads(json.dumps(BASE))
    if setting:
        other["settings"]["x64"] = True
        assert "jax_enable_x64" in (first_difference("f", BASE, other) or "")
        return
    value = other["args"][index][field]
    other["args"][index][field] = (not value) if isinstance(value, bool) else f"{value}!"
    found = first_difference("f", BASE, other)
    assert found is not None and f"arg {index}" in found


def test_a_miss_with_signatures_is_explained_by_the_difference_not_the_hash() -> None:
    warm = TargetRun("w:t", "train_step", requests=1, keys_written=["k"], signature=BASE)
    fresh = TargetRun("w:t", "train_step", requests=1, hits=0, checks_training=True)
    fresh.signature = _with({"args": [_arg("[0][0].step", donated=False), BASE["args"][1]]})
    fresh.key_components = {"computation": "1" * 64}
    warm.key_components = {"computation": "2" * 64}
    [message] = miss_messages([warm], [fresh])
    assert "train_step arg 0 (.step): int32[] donated=False in training, True in the warm-up" in message
    assert "key differs" not in message


def test_exact_mode_verify_requires_every_compile_of_the_warm_up_again() -> None:
    warm = TargetRun("script:t.py", "t.py", requests=3, keys_written=["a", "b"], keys_hit=["c"])
    same = TargetRun("script:t.py", "t.py", requests=3, hits=3, keys_hit=["a", "b", "c"])
    fewer = TargetRun("script:t.py", "t.py", requests=2, hits=2, keys_hit=["a", "c"])
    assert miss_messages([warm], [same]) == []
    [problem] = miss_messages([warm], [fewer])
    assert "did not compile 1 program(s) the warm-up compiled" in problem


def test_targets_without_training_side_are_listed_as_self_consistency_only() -> None:
    runs = [
        TargetRun("w:t", "a", checks_training=True),
        TargetRun("w:t", "b"),
        TargetRun("w:t", "(setup)"),
        TargetRun("script:x.py", "x.py"),
    ]
    assert self_consistency_only(runs) == ["b"]


@pytest.mark.jax
def test_abstract_keeps_weak_type_and_sharding() -> None:
    import jax
    import jax.numpy as jnp

    import compilecache

    step = jnp.asarray(0)  # a Python int made an array: weakly typed
    tree: dict[str, Any] = {"step": step, "w": jnp.ones((2, 3), jnp.bfloat16), "lr": 0.1}
    out = compilecache.abstract(tree)
    assert out["step"].weak_type is True and out["w"].weak_type is False
    assert (out["w"].shape, out["w"].dtype, out["w"].sharding) == ((2, 3), jnp.bfloat16, tree["w"].sharding)
    assert out["lr"] == 0.1
    naive = jax.ShapeDtypeStruct(step.shape, step.dtype, sharding=step.sharding)
    assert naive.weak_type is False  # what abstract() exists for


@pytest.mark.jax
def test_signature_of_reads_weak_types_donation_and_static_args_off_the_lowering() -> None:
    import jax
    import jax.numpy as jnp

    from compilecache.frameworks.jax.keydiff import signature_of

    def fn(state: dict[str, jax.Array], n: int, *, k: int) -> tuple[jax.Array, jax.Array]:
        return state["step"] + n * k, state["w"]

    step = jax.jit(fn, static_argnums=1, static_argnames="k")
    donating = jax.jit(fn, static_argnums=1, static_argnames="k", donate_argnums=0)
    state = {"step": jnp.asarray(0), "w": jnp.ones((2,), jnp.float32)}

    def signature(fn: Any, n: int) -> dict[str, Any]:
        return signature_of(fn.lower(state, n, k=3), (state, n), {"k": 3})

    base = signature(step, 2)
    assert base["static"] == {"1": "2", "k": "3"}
    assert [(a["path"], a["type"], a["weak_type"], a["donated"]) for a in base["args"]] == [
        ("[0][0]['step']", "int32[]", True, False),
        ("[0][0]['w']", "float32[2]", False, False),
    ]
    assert first_difference("f", base, signature(step, 5)) == "f static arg 1: 5 in training, 2 in the warm-up"
    assert (
        first_difference("f", base, signature(donating, 2))
        == "f arg 0 (['step']): int32[] donated=True in training, False in the warm-up"
    )


# ---- slow: the Flax example warmed both ways, and the traps -------------------------------------

FLAX_ENV = {"XLA_FLAGS": FOUR_CPUS}


@pytest.mark.slow
@pytest.mark.jax
@pytest.mark.parametrize(
    ("entry", "steps_from"),
    [("examples/train_flax.py", "flag"), ("examples.train_flax:main", "env")],
)
def test_exact_mode_stops_the_real_entrypoint_and_training_then_hits_everything(
    tmp_path: Path, entry: str, steps_from: str
) -> None:
    cache, report_path = tmp_path / "cache", tmp_path / "r.json"
    argv = ["warm", "--cache-dir", str(cache), "--report", str(report_path), "--script", entry]
    # The entrypoint asks for 10 000 steps; 2 (by flag, or a workload's env in a Job) stops it after the second.
    env = clean_env(FLAX_ENV)
    if steps_from == "flag":
        argv += ["--steps", "2"]
    else:
        env["COMPILECACHE_WARM_STEPS"] = "2"
    done = run_cli([*argv, "--", "--steps", "10000"], env)
    assert done.returncode == 0, done.stderr
    assert f"stopped {entry} after 2 calls of train_step" in done.stdout
    [manifest_path] = (cache / ".compilecache" / "manifests").iterdir()
    settings = json.loads(manifest_path.read_text())["settings"]
    # JAX leaves the host-device-count flag out of the key; the device count itself is recorded.
    assert (settings["device_count"], settings["xla_flags"]) == (4, "") and settings["xla_flags_hash"], settings
    report = json.loads(report_path.read_text())
    verify = report["verify"]
    assert verify["ok"] and verify["requests"] == verify["hits"] >= 2, verify
    assert verify["self_consistency_only"] == []
    if steps_from == "env":
        return  # the same run as above, started another way: one training check is enough
    training = run_flax_train(clean_env({**FLAX_ENV, **jax_cache_env(str(cache))}), "--steps", "3")
    assert training["devices"] == 4
    assert training["requests"] == training["hits"] == report["targets"][0]["requests"], training


@pytest.mark.slow
@pytest.mark.jax
def test_aot_mode_hits_and_a_trainer_with_other_xla_flags_is_told_which_setting(tmp_path: Path) -> None:
    cache, report_path = tmp_path / "cache", tmp_path / "r.json"
    argv = ["warm", "--cache-dir", str(cache), "--report", str(report_path)]
    done = run_cli([*argv, "--workload", "examples.workloads.flax_mlp:targets"], clean_env(FLAX_ENV))
    assert done.returncode == 0, done.stderr
    assert "self-consistency for create_state" in done.stdout  # no training side given for it
    report = json.loads(report_path.read_text())
    assert report["verify"]["self_consistency_only"] == ["create_state"]
    assert len(entry_files(cache)) == 2
    training = run_flax_train(clean_env({**FLAX_ENV, **jax_cache_env(str(cache))}), "--steps", "2")
    assert training["requests"] == training["hits"] == 2, training

    # The trap: the trainer runs with other XLA flags. Every key changes; the recorded
    # signature says why (what the trainer's verdict prints, from the same function).
    other_flags = f"{FOUR_CPUS} --xla_cpu_enable_fast_math=false"
    env = clean_env({**FLAX_ENV, **jax_cache_env(str(cache), xla_flags=other_flags)})
    missed = run_flax_train(env, "--steps", "1")
    assert missed["hits"] == 0 < missed["requests"]
    recorded = next(t for t in report["targets"] if t["name"] == "train_step")["signature"]
    completed = subprocess.run(
        [sys.executable, "-c", SIGNATURE_PROBE, json.dumps(recorded)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    # JAX leaves the host device count out of the key; the difference is the flag the trainer added.
    expected = "train_step: XLA_FLAGS differs: --xla_cpu_enable_fast_math=false in training, (none) in the warm-up"
    assert completed.stdout.strip().splitlines()[-1] == expected


SIGNATURE_PROBE = """
import json, sys
from compilecache.frameworks.jax.keydiff import first_difference, signature_of
from examples.workloads.flax_mlp import Config, make_batch, make_create_state, make_mesh, make_train_step
config, mesh = Config.from_env(), make_mesh()
args = (make_create_state(config, mesh)(), *make_batch(config, mesh, 0))
mine = signature_of(make_train_step().lower(*args), args)
print(first_difference("train_step", json.loads(sys.argv[1]), mine))
"""

TRAPS = """
import jax
import compilecache
from compilecache import Target
from examples.workloads.flax_mlp import (
    Config, abstract_batch, make_batch, make_create_state, make_mesh, make_train_step,
)


def _setup():
    config, mesh = Config.from_env(), make_mesh()
    create = make_create_state(config, mesh)
    return config, mesh, create, lambda: (create(), *make_batch(config, mesh, 0))


def weak_type():
    # The obvious ShapeDtypeStruct drops TrainState.step's weak_type.
    config, mesh, create, real = _setup()
    naive = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), jax.eval_shape(create))
    return [Target("train_step", make_train_step(), (naive, *abstract_batch(config, mesh)), training_args=real)]


def unsharded():
    config, mesh, create, real = _setup()
    state = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=x.weak_type), jax.eval_shape(create)
    )
    plain = [jax.ShapeDtypeStruct(s.shape, s.dtype) for s in abstract_batch(config, mesh)]
    return [Target("train_step", make_train_step(), (state, *plain), training_args=real)]


def weak_type_matters():
    # Here the weak type reaches the program: int8 * weak int32 stays int8, * int32 widens.
    import jax.numpy as jnp
    scale = jax.jit(lambda step, x: x * step)
    step = jnp.asarray(3)  # weakly typed, as training's counter is
    naive = jax.ShapeDtypeStruct(step.shape, step.dtype)
    real = lambda: (jnp.asarray(3), jnp.ones(4, jnp.int8))
    return [Target("scale", scale, (naive, jax.ShapeDtypeStruct((4,), jnp.int8)), training_args=real)]


def no_donation():
    config, mesh, create, real = _setup()
    args = (compilecache.abstract(jax.eval_shape(create)), *abstract_batch(config, mesh))
    return [Target("train_step", make_train_step(donate=False), args, training_fn=make_train_step())]


def no_donation_args():
    # Training's real arrays, but the warmer's own jit: its donation cannot come from the arrays.
    config, mesh, create, real = _setup()
    args = (compilecache.abstract(jax.eval_shape(create)), *abstract_batch(config, mesh))
    return [Target("train_step", make_train_step(donate=False), args, training_args=real)]


def no_donation_plain():
    # No training side at all: verify re-checks the warmer against itself; the trainer names it.
    config, mesh, create, real = _setup()
    args = (compilecache.abstract(jax.eval_shape(create)), *abstract_batch(config, mesh))
    return [Target("train_step", make_train_step(donate=False), args)]


def weak_type_plain():
    config, mesh, create, real = _setup()
    naive = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), jax.eval_shape(create))
    return [Target("train_step", make_train_step(), (naive, *abstract_batch(config, mesh)))]


def unsharded_plain():
    config, mesh, create, real = _setup()
    state = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=x.weak_type), jax.eval_shape(create)
    )
    plain = [jax.ShapeDtypeStruct(s.shape, s.dtype) for s in abstract_batch(config, mesh)]
    return [Target("train_step", make_train_step(), (state, *plain))]
"""


@pytest.mark.slow
@pytest.mark.jax
@pytest.mark.parametrize(
    ("trap", "named"),
    [
        # weak_type of TrainState.step does not reach this program's HLO: training hits.
        ("weak_type", None),
        ("weak_type_matters", "scale arg 0: int32[] weak_type=True in training, False in the warm-up"),
        ("unsharded", "train_step arg 0 (.step): int32[] sharding=P() in training, unspecified in the warm-up"),
        ("no_donation", "train_step arg 0 (.step): int32[] donated=True in training, False in the warm-up"),
    ],
)
def test_each_aot_trap_ends_in_a_hit_or_a_named_difference(tmp_path: Path, trap: str, named: str | None) -> None:
    folder = write_module(tmp_path / "mods", "traps", TRAPS)
    done = run_cli(
        ["warm", "--cache-dir", str(tmp_path / "cache"), "--workload", f"traps:{trap}"],
        clean_env(FLAX_ENV, pythonpath=[folder]),
    )
    if named is None:
        assert done.returncode == 0, done.stderr
        assert "verify: 1/1 hits" in done.stdout
    else:
        assert done.returncode == 3, done.stderr
        assert f"differs from what the warmer compiled: {named}" in done.stderr


@pytest.mark.slow
@pytest.mark.jax
def test_missing_donation_with_only_training_args_fails_verify_naming_the_argument(tmp_path: Path) -> None:
    # Issue 21: "missing donation, with training_args: verify passed (exit 0), and training missed".
    folder = write_module(tmp_path / "mods", "traps", TRAPS)
    done = run_cli(
        ["warm", "--cache-dir", str(tmp_path / "cache"), "--workload", "traps:no_donation_args"],
        clean_env(FLAX_ENV, pythonpath=[folder]),
    )
    assert done.returncode == 3, (done.stdout, done.stderr)
    line = "train_step arg 0 (.step): int32[] donated=False but returned updated"
    assert f"target 'train_step' of workload traps:no_donation_args: {line}" in done.stderr, done.stderr


def test_donation_is_unchecked_only_for_training_args_through_the_warmer_s_own_jit() -> None:
    state = {"path": "[0][0].step", "type": "int32[]", "sharding": "P()", "donated": False}
    batch = {"path": "[0][1]", "type": "float32[8,4]", "sharding": "P('data',)", "donated": False}
    signature = {"args": [batch, state], "outputs": ["int32[]", "float32[]"]}

    def run(**fields: Any) -> TargetRun:
        return TargetRun("traps:x", "train_step", signature=fields.pop("signature", signature), **fields)

    named = donation_unchecked(run(checks_training=True))
    assert named is not None and named.startswith("train_step arg 0 (.step): int32[] donated=False"), named
    assert donation_unchecked(run(checks_training=True, lowers_training_fn=True)) is None  # training's own jit
    assert donation_unchecked(run()) is None  # self-consistency only: reported as such
    donated = {"args": [batch, {**state, "donated": True}], "outputs": signature["outputs"]}
    assert donation_unchecked(run(checks_training=True, signature=donated)) is None
    nothing_returned = {"args": [batch, state], "outputs": ["float32[]"]}
    assert donation_unchecked(run(checks_training=True, signature=nothing_returned)) is None


def test_cli_parses_the_exact_mode_flags() -> None:
    from compilecache.cli.main import build_parser

    args = build_parser().parse_args(
        ["warm", "--cache-dir", "/c", "--script", "pkg.train:main", "--steps", "3", "--step-fn", "step", "--", "-x"]
    )
    assert (args.script, args.steps, args.step_fn, args.script_args) == ("pkg.train:main", 3, "step", ["--", "-x"])
    assert build_parser().parse_args(["warm", "--cache-dir", "/c", "--script", "t.py"]).step_fn is None


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workload", "a:b", "--steps", "2"], "--steps N needs --script"),
        (["--script", "t.py", "--steps", "0"], "at least 1"),
        (["--script", "t.py", "--steps", "1", "--step-deadline", "0"], "--step-deadline must be a positive"),
        (["--script", "no such entry"], "script no such entry not found: no such file in"),
    ],
)
def test_exact_mode_bad_input_is_a_one_line_error(tmp_path: Path, argv: list[str], message: str) -> None:
    (tmp_path / "t.py").write_text("")
    done = run_cli(["warm", "--cache-dir", str(tmp_path / "cache"), *argv], clean_env(), cwd=tmp_path)
    assert done.returncode == 2, done
    [line] = [line for line in done.stderr.splitlines() if line.startswith("compilecache warm: error:")]
    assert message in line


def test_the_step_is_found_by_name_through_partials() -> None:
    """lm1b and the example transformer jit a functools.partial of their step: it has no __name__."""
    import functools

    from compilecache.frameworks.jax.stepcalls import function_name

    def _train_step(params: Any, batch: Any, *, lr: float) -> Any:
        return params

    assert function_name(_train_step) == "_train_step"
    assert function_name(functools.partial(functools.partial(_train_step, lr=0.1), None)) == "_train_step"
    assert function_name(object()) is None
