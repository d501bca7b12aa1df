"""Issue 21's weak_type trap where the weak type reaches the program, without ``training_args``: the
AOT warm-up's self-check passes, so the training process itself must name the difference.

``int8 * weak int32`` stays ``int8``, ``int8 * int32`` widens: the program, and so the key, depends
on the weak type of the scalar. A target declared with a plain ``ShapeDtypeStruct((), int32)``
(strong) misses in training, which passes a Python int (weak); the trainer's line names the
function, the argument and both weak types. Declared ``weak_type=True``, training hits. (With
``training_args`` verify names it first: ``tests/test_warm_exact.py`` ``weak_type_matters``.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from compilecache.cache.cacheenv import TERMINATION_LOG
from compilecache.frameworks.jax.env import jax_cache_env, trainer_env
from jaxhelpers import clean_env, declare_trainer_plugin, run_cli, run_trainer, write_module

SCALING = """
import jax
import jax.numpy as jnp
from compilecache import Target


def scale(step, x):
    return x * step


def _target(weak):
    step = jax.ShapeDtypeStruct((), jnp.int32, weak_type=weak)
    return [Target("scale", jax.jit(scale), (step, jax.ShapeDtypeStruct((4,), jnp.int8)))]


def naive():
    return _target(False)


def weak():
    return _target(True)
"""

# Training passes the step as a Python int (weakly typed) and numpy data (no other JAX compile).
TRAIN = """
import numpy as np
import jax
from scaling import scale

step = jax.jit(scale)
x = np.ones(4, np.int8)
for i in range(2):
    x = step(3, x)
print(x.dtype)
"""


@pytest.mark.slow
@pytest.mark.jax
@pytest.mark.parametrize(
    ("workload", "named"),
    [("naive", "scale (arg 0 (step): int32[] weak_type=True in training, False in the warm-up)"), ("weak", None)],
)
def test_a_weak_type_that_reaches_the_program_ends_in_a_hit_or_its_name(
    tmp_path: Path, workload: str, named: str | None
) -> None:
    code = write_module(tmp_path / "code", "scaling", SCALING)
    write_module(code, "train", TRAIN)
    cache = tmp_path / "cache"
    done = run_cli(["warm", "--cache-dir", str(cache), "--workload", f"scaling:{workload}"], clean_env({}, [code]))
    assert done.returncode == 0, done.stderr  # verify without training_args checks the warm-up against itself
    termination = tmp_path / "termination-log"
    env = trainer_env(jax_cache_env(str(cache)), read_only=True) | {TERMINATION_LOG: str(termination)}
    plugin = declare_trainer_plugin(tmp_path / "plugin")
    report = run_trainer(code / "train.py", clean_env(env, [plugin, code]), termination)[0]
    if named is None:
        assert report["requests"] == report["hits"] > 0, report
    else:
        assert report["summary"] == f"compilecache: 0/1 compiles hit; missed: {named}", report
