"""No silent Ready, and side effects stay in the warm-up (exact mode, ``compilecache warm --script``).

Fast tests drive the pure reasons (:func:`compilecache.frameworks.jax.scriptrun.step_failure`,
:func:`compilecache.frameworks.jax.verify.miss_messages`); the slow ones run tiny real-JAX scripts
written here through the CLI in fresh processes: a script that exits before its step, a wrong
``--step-fn``, and a script that writes a checkpoint into its working directory.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pytest

from compilecache.frameworks.jax.compiler import TargetRun
from compilecache.frameworks.jax.scriptrun import step_failure
from compilecache.frameworks.jax.verify import miss_messages
from jaxhelpers import clean_env, entry_files, run_cli

# ---- fast: the reasons -----------------------------------------------------------------------------


def _stepped(ran: int, jitted: int = 1, seen: tuple[str, ...] = ("init", "train_step")) -> dict[str, object]:
    return {"steps": 2, "step_fn": "train_step", "ran": ran, "jitted": jitted, "seen": list(seen)}


def test_an_entrypoint_that_ended_early_says_how_many_calls_of_how_many() -> None:
    reason = step_failure(_stepped(1))
    assert "ended after 1 of 2 calls of 'train_step'" in reason and "\n" not in reason


def test_a_step_function_never_jitted_is_named_with_the_functions_that_were() -> None:
    reason = step_failure(_stepped(0, jitted=0, seen=("init", "update", "<unnamed>")))
    assert "'train_step' was never called" in reason
    assert "jitted functions seen: init, update, <unnamed>" in reason
    # Both causes are named: the script stopped before its loop, or the step has another name.
    assert "a missing data file?" in reason and "--step-fn" in reason
    assert "no other jax.jit was seen" in step_failure(_stepped(0, jitted=0, seen=()))


def test_a_step_function_jitted_but_not_called_says_so() -> None:
    assert "'train_step' was jitted but never called; jitted functions seen: init" in step_failure(_stepped(0))


def test_the_deadline_reason_names_the_flag_and_the_seen_functions() -> None:
    reason = step_failure(_stepped(0, jitted=0, seen=("update",)), deadline=5)
    assert "not called within 5s of the start (--step-deadline); jitted functions seen: update" in reason


def test_a_long_list_of_jitted_functions_is_cut() -> None:
    reason = step_failure(_stepped(0, jitted=0, seen=tuple(f"f{i}" for i in range(20))))
    assert "f11 (+8 more)" in reason and "f12" not in reason


def test_verify_that_requested_fewer_compiles_than_the_warm_fails() -> None:
    # No keys logged (JAX logs them at DEBUG only): the counts alone must catch it.
    warm = TargetRun("script:t.py", "t.py", requests=3)
    fewer = TargetRun("script:t.py", "t.py", requests=1, hits=1)
    [problem] = miss_messages([warm], [fewer])
    assert "requested 1 compile(s), the warm-up 3" in problem
    assert miss_messages([warm], [TargetRun("script:t.py", "t.py", requests=3, hits=3)]) == []
    # AOT targets are one program each: their hit is the check.
    assert miss_messages([TargetRun("w:t", "a", requests=2)], [TargetRun("w:t", "a", requests=1, hits=1)]) == []


def test_the_step_deadline_comes_from_the_flag_else_the_environment() -> None:
    from compilecache.cache.errors import WarmError
    from compilecache.cli.main import build_parser
    from compilecache.frameworks.jax.warm import _exact_mode_from_env, _script_request

    def parsed(*flags: str) -> argparse.Namespace:
        return build_parser().parse_args(["warm", "--cache-dir", "/c", "--script", "t.py", "--steps", "2", *flags])

    args = parsed()
    _exact_mode_from_env(args, {"COMPILECACHE_STEP_DEADLINE": "30"})
    assert _script_request(args)["step_deadline"] == 30.0
    args = parsed("--step-deadline", "5")
    _exact_mode_from_env(args, {"COMPILECACHE_STEP_DEADLINE": "30"})
    assert _script_request(args)["step_deadline"] == 5.0
    args = parsed()
    _exact_mode_from_env(args, {})
    assert "step_deadline" not in _script_request(args)  # scriptrun's default applies
    with pytest.raises(WarmError, match="COMPILECACHE_STEP_DEADLINE must be a number of seconds"):
        _exact_mode_from_env(parsed(), {"COMPILECACHE_STEP_DEADLINE": "soon"})


# ---- slow: real scripts through the CLI ---------------------------------------------------------------

# Exits 0 before its step when its data file is missing, as a script whose volume was not mounted does.
EARLY_EXIT = """
import os, sys
import jax, jax.numpy as jnp

params = jax.jit(lambda: jnp.ones((8, 8)))()
if not os.path.exists(os.environ.get("DATA", "/data/train.bin")):
    print("no data, nothing to do")
    sys.exit(0)

@jax.jit
def train_step(p):
    return p * 0.5 + 1.0

for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 10):
    params = train_step(params)
"""

# The step is called `update`, and the loop would run for hours.
WRONG_NAME = """
import jax, jax.numpy as jnp

def init():
    return jnp.ones((8, 8))

def update(p):
    return p * 0.5 + 1.0

params = jax.jit(init)()
update = jax.jit(update)
while True:
    params = update(params)
"""

# Writes a checkpoint into its working directory after its steps, and restores it when present
# (as lm1b does): a restored state is another program, so verify's run would miss on it.
CHECKPOINT = """
import json, os, pathlib
import jax, jax.numpy as jnp

print(json.dumps({"cwd": os.getcwd(), "warmup": os.environ.get("COMPILECACHE_WARMUP"),
                  "restored": pathlib.Path("checkpoint_0").exists()}), flush=True)
if pathlib.Path("checkpoint_0").exists():
    params = jnp.asarray(json.loads(pathlib.Path("checkpoint_0").read_text()), jnp.float16)
else:
    params = jnp.ones((8,), jnp.float32)

@jax.jit
def train_step(p):
    return p * 0.5 + 1.0

pathlib.Path("checkpoint_0").write_text(json.dumps([1.0] * 8))
for _ in range(2):
    params = train_step(params)
"""


def _warm(tmp_path: Path, script: str, *flags: str, env: dict[str, str] | None = None) -> tuple[int, str, dict]:
    (tmp_path / "train.py").write_text(script)
    report = tmp_path / "report.json"
    summary = tmp_path / "termination-log"
    argv = ["warm", "--cache-dir", str(tmp_path / "cache"), "--report", str(report), "--termination-log", str(summary)]
    done = run_cli([*argv, "--script", "train.py", *flags], clean_env(env), cwd=tmp_path)
    told = json.loads(summary.read_text())
    return done.returncode, done.stdout + done.stderr, told


@pytest.mark.slow
@pytest.mark.jax
def test_a_script_that_exits_before_its_step_fails_naming_why_and_publishes_nothing(tmp_path: Path) -> None:
    code, output, told = _warm(tmp_path, EARLY_EXIT, "--steps", "2", env={"DATA": str(tmp_path / "train.bin")})
    assert code == 2, output
    reason = "the entrypoint ended and the step function 'train_step' was never called; jitted functions seen: <lambda>"
    assert reason in told["error"] and not told["ok"], told
    assert entry_files(tmp_path / "cache") == []
    # With the data there, the same script reaches its steps and the run succeeds.
    (tmp_path / "train.bin").write_bytes(b"x")
    code, output, told = _warm(tmp_path, EARLY_EXIT, "--steps", "2", env={"DATA": str(tmp_path / "train.bin")})
    assert code == 0 and told["ok"], output
    assert told["verify"]["hits"] == told["verify"]["requests"] >= 2, told


@pytest.mark.slow
@pytest.mark.jax
def test_a_script_that_runs_fewer_steps_than_asked_says_how_many(tmp_path: Path) -> None:
    (tmp_path / "train.bin").write_bytes(b"x")
    code, output, told = _warm(
        tmp_path, EARLY_EXIT, "--steps", "3", "--", "1", env={"DATA": str(tmp_path / "train.bin")}
    )
    assert code == 2, output
    assert "ended after 1 of 3 calls of 'train_step'" in told["error"], told


@pytest.mark.slow
@pytest.mark.jax
def test_without_steps_a_script_that_compiles_nothing_is_never_ready(tmp_path: Path) -> None:
    code, output, told = _warm(tmp_path, "print('nothing here')\n")
    assert code == 2, output
    assert "ended without compiling anything through the cache: nothing to publish" in told["error"], told


@pytest.mark.slow
@pytest.mark.jax
def test_a_wrong_step_fn_fails_within_seconds_by_default_naming_the_function_that_ran(tmp_path: Path) -> None:
    start = time.monotonic()
    code, output, told = _warm(tmp_path, WRONG_NAME, "--steps", "2", "--step-fn", "train_step")
    took = time.monotonic() - start
    assert code == 2, output
    reason = "no function named 'train_step' was jitted, while 'update' was already called 20 times"
    assert reason in told["error"] and "jitted functions seen: init, update" in told["error"], told
    assert entry_files(tmp_path / "cache") == []
    # No deadline stopped it (600 s by default): the loop's own calls did, within seconds.
    assert took < 60, f"the warm-up took {took:.0f}s"


@pytest.mark.slow
@pytest.mark.jax
def test_without_patience_the_deadline_stops_a_wrong_step_fn_naming_the_jitted_functions(tmp_path: Path) -> None:
    start = time.monotonic()
    flags = ("--steps", "2", "--step-fn", "train_step", "--step-deadline", "3")
    code, output, told = _warm(tmp_path, WRONG_NAME, *flags, env={"COMPILECACHE_STEP_PATIENCE": "0"})
    took = time.monotonic() - start
    assert code == 2, output
    assert "'train_step' was not called within 3s of the start (--step-deadline)" in told["error"], told
    assert "jitted functions seen: init, update" in told["error"], told
    assert entry_files(tmp_path / "cache") == []
    assert took < 60, f"the warm-up took {took:.0f}s: the deadline did not stop the loop"


@pytest.mark.slow
@pytest.mark.jax
def test_a_checkpoint_written_by_the_warm_up_stays_in_its_scratch_dir(tmp_path: Path) -> None:
    code, output, told = _warm(tmp_path, CHECKPOINT, "--steps", "2")
    assert code == 0 and told["ok"], output
    runs = [json.loads(line) for line in output.splitlines() if line.startswith('{"cwd"')]
    assert len(runs) == 4, output  # the warm's pair (a fresh start, then resumed) and verify's pair
    # Each resumed run restored its own pair's checkpoint; verify's first run did not see the warm's.
    assert [run["restored"] for run in runs] == [False, True, False, True], runs
    assert [run["warmup"] for run in runs] == ["1"] * 4, runs
    assert not (tmp_path / "checkpoint_0").exists()  # the caller's working directory
    for run in runs:  # each pair in its own scratch dir, removed afterwards
        assert Path(run["cwd"]) != tmp_path and not Path(run["cwd"]).exists(), run
    assert runs[0]["cwd"] == runs[1]["cwd"] != runs[2]["cwd"] == runs[3]["cwd"]
    assert told["verify"]["hits"] == told["verify"]["requests"] >= 2, told
