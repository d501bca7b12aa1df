"""Issue 21 items 3 and 5: a script that sets XLA_FLAGS itself before JAX starts is warmed under those
flags and its manifest records them (what the compile used, read in the script's own process); a
trainer without them is told ``XLA_FLAGS differs`` for its step function by name."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from compilecache.cache.cacheenv import TERMINATION_LOG
from compilecache.controller import reports as consumers
from compilecache.frameworks.jax import verdict
from compilecache.frameworks.jax.env import jax_cache_env, trainer_env
from jaxhelpers import clean_env, declare_trainer_plugin, run_cli, run_trainer

FLAG = "--xla_cpu_enable_fast_math=false"

# As the Flax FSDP example does: the script sets XLA_FLAGS itself, before importing JAX.
# It restores the environment when training ends (a context manager, unittest.mock.patch.dict...):
# what the compiles used is then no longer in os.environ when the run ends.
SCRIPT = """
import os
before = os.environ.get("XLA_FLAGS")
flags = os.environ.get("TRAIN_FLAGS", "{flag}")  # not in argv: a --xla_* word there changes JAX's key
if flags:
    os.environ["XLA_FLAGS"] = flags
try:
    import jax, jax.numpy as jnp

    @jax.jit
    def train_step(x):
        return jnp.tanh(x @ x).sum()

    x = jnp.ones((16, 16), jnp.float32)
    for _ in range(3):
        train_step(x).block_until_ready()
finally:
    os.environ.pop("XLA_FLAGS", None)
    if before is not None:
        os.environ["XLA_FLAGS"] = before
"""


def test_the_status_tells_what_to_change_for_a_program_not_warmed() -> None:
    # The controller keeps its own copy of the reason (it never loads the trainer's side): the same words.
    assert consumers.NOT_WARMED == verdict.NOT_WARMED
    report = consumers.Report(8, 6, (("eval_step", verdict.NOT_WARMED), ("train_step", "arg 0 (.step): x")))
    assert report.miss_reason == f"eval_step: not warmed: {consumers.NOT_WARMED_FIX}"
    assert "steps: auto" in report.miss_reason and len(report.miss_reason) <= consumers.REASON_CHARS
    assert consumers.Report(8, 6, (("train_step", "arg 0 (.step): x"),)).miss_reason == "train_step: arg 0 (.step): x"


def manifests(cache: Path) -> list[dict[str, Any]]:
    folder = cache / ".compilecache" / "manifests"
    return [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]


@pytest.mark.slow
@pytest.mark.jax
def test_flags_a_script_sets_itself_are_recorded_and_a_trainer_without_them_is_told(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(textwrap.dedent(SCRIPT.format(flag=FLAG)))
    cache = tmp_path / "cache"
    cache.mkdir()
    argv = ["warm", "--cache-dir", str(cache), "--script", str(code / "train.py"), "--steps", "2", "--no-resume"]
    done = run_cli(argv, clean_env({}, [code]))  # no XLA_FLAGS in the warm-up's own environment
    assert done.returncode == 0, done.stderr
    recorded = [m["settings"].get("xla_flags") for m in manifests(cache) if m.get("state") != "pending"]
    assert recorded and all(flags == FLAG for flags in recorded), recorded

    plugin = declare_trainer_plugin(tmp_path / "plugin")
    termination = tmp_path / "termination-log"
    env = trainer_env(jax_cache_env(str(cache)), read_only=True) | {TERMINATION_LOG: str(termination)}

    def train(flags: str) -> dict[str, Any]:
        return run_trainer(code / "train.py", clean_env({**env, "TRAIN_FLAGS": flags}, [plugin, code]), termination)[0]

    assert f"train_step (XLA_FLAGS differs: (none) in training, {FLAG} in the warm-up)" in train("")["summary"]
    # The trainer's own flags are read at its miss too, not at exit, after the script restored them.
    other = "--xla_cpu_enable_fast_min_max=true"
    summary = train(other)["summary"]
    assert f"train_step (XLA_FLAGS differs: {other} in training, {FLAG} in the warm-up)" in summary, summary
    # The same flags as the warm-up's: every compile hits.
    same = train(FLAG)
    assert same["misses"] == 0 and same["requests"] > 0, same["summary"]


SHAPES = """
import os
import jax, jax.numpy as jnp

@jax.jit
def train_step(w, batch):
    return jnp.tanh(batch["image"].reshape(batch["image"].shape[0], -1) @ w).sum()

n = int(os.environ.get("BATCH", "64"))
w = jnp.ones((28 * 28, 4), jnp.float32)
batch = {"image": jnp.ones((n, 28, 28, 1), jnp.float32), "label": jnp.zeros((n,), jnp.int32)}
for _ in range(3):
    train_step(w, batch).block_until_ready()
"""


@pytest.mark.slow
@pytest.mark.jax
def test_a_shape_miss_names_the_function_the_parameter_and_both_shapes(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "shapes.py").write_text(textwrap.dedent(SHAPES))
    cache = tmp_path / "cache"
    cache.mkdir()
    argv = ["warm", "--cache-dir", str(cache), "--script", str(code / "shapes.py"), "--steps", "2", "--no-resume"]
    done = run_cli(argv, clean_env({}, [code]))
    assert done.returncode == 0, done.stderr
    plugin = declare_trainer_plugin(tmp_path / "plugin")
    termination = tmp_path / "termination-log"
    env = trainer_env(jax_cache_env(str(cache)), read_only=True) | {TERMINATION_LOG: str(termination), "BATCH": "128"}
    summary = run_trainer(code / "shapes.py", clean_env(env, [plugin, code]), termination)[0]["summary"]
    # Every difference names its sides, training's value first (keysettings.sides).
    assert (
        "train_step (arg 1 (batch['image']): float32[128,28,28,1] in training, float32[64,28,28,1] in the warm-up)"
        in summary
    ), summary
