"""Issue 21 item 3: every missed function is named with the step at which it was missed, and the
status says what to change.

Fast tests drive the pure parts: the trainer's JSON and line (:func:`compilecache.frameworks.jax.verdict.verdict`
with the steps of a tally), the controller's advice (:mod:`compilecache.controller.reports`) and which
step function a cache's manifests name (:func:`compilecache.frameworks.jax.stepcount.warmed_steps`). The slow
ones run real JAX on the CPU: a script whose evaluation first runs after its third step is warmed
with ``--steps 2`` and trained with the trainer's verdict, its step function jitted at module
level (before JAX's backends start: rebound) or inside ``main`` after the first array (through the
patched ``jax.jit``, here via a ``from jax import jit`` bound before the patch); a warm-up that
counted no step function leaves the step out; and the counting's cost per step call is measured.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

from compilecache.cache.cacheenv import TERMINATION_LOG
from compilecache.controller import reports
from compilecache.frameworks.jax import verdict
from compilecache.frameworks.jax.env import jax_cache_env, trainer_env
from compilecache.frameworks.jax.stepcount import warmed_steps
from compilecache.training import report
from jaxhelpers import REPO, clean_env, declare_trainer_plugin, run_cli, run_trainer

HERE = {"jax": "0.10.2", "jaxlib": "0.10.2", "backend": "cpu", "device_kind": "cpu", "device_count": 1}

# ---- fast: the trainer's report and the controller's advice -------------------------------------


def test_each_missed_function_carries_the_step_of_its_first_miss() -> None:
    tally = verdict.Tally(
        requests=10,
        hits=6,
        missed=["jit_eval_step", "jit_eval_step", "jit_train_step", "jit_gather"],
        steps=[3, 7, 0, 20],
        step_fn="train_step",
        warmed_steps=2,
    )
    result = verdict.verdict(tally, HERE, manifests=[])
    steps = {item["name"]: item["step"] for item in result["missed"]}
    assert steps == {"eval_step": 3, "train_step": 0, "gather": 20}, result  # each function once, its first
    line = result["summary"]
    assert "eval_step ×2 (not warmed, first compiled at step 3)" in line, line
    assert "gather (not warmed, first compiled at step 20)" in line, line
    # Step 0 (before the first step returned) adds nothing to the line: the function's own compile.
    assert "train_step (not warmed)" in line, line
    assert (result["step_fn"], result["warmed_steps"]) == ("train_step", 2)
    assert len(json.dumps(result).encode()) < report.MAX_BYTES


def test_without_a_counted_step_function_the_step_is_left_out_not_guessed() -> None:
    tally = verdict.Tally(requests=3, hits=2, missed=["jit_eval_step"])
    result = verdict.verdict(tally, HERE, manifests=[])
    assert result["missed"] == [{"name": "eval_step", "reason": verdict.NOT_WARMED}]
    assert "step_fn" not in result and "warmed_steps" not in result
    assert result["summary"].endswith("missed: eval_step (not warmed)"), result["summary"]


def _message(step: int | None, warmed: Any, reason: str = verdict.NOT_WARMED) -> str:
    item: dict[str, Any] = {"name": "eval_step", "reason": reason, **({} if step is None else {"step": step})}
    document = {"schema": reports.SCHEMA, "requests": 4, "hits": 3, "missed": [item], "summary": "s"}
    if step is not None:
        document |= {"step_fn": "train_step", "warmed_steps": warmed}
    return "other text the container wrote\n" + json.dumps(document)


@pytest.mark.parametrize(
    ("step", "warmed", "advice"),
    [
        # `--steps N` stops once the N-th call returned: a program first compiled after 17 calls needs 18.
        (17, 2, "eval_step: not warmed, first compiled at step 17 (after 17 calls of train_step): set steps >= 18"),
        (3, "auto", "first compiled at step 3 (after 3 calls of train_step): the warm-up's budget ran out before it"),
        (0, 2, "eval_step: not warmed, compiled before the first step returned"),
        (None, None, f"eval_step: not warmed: {reports.NOT_WARMED_FIX}"),
    ],
)
def test_the_status_says_what_to_change_from_the_step_of_the_first_miss(
    step: int | None, warmed: Any, advice: str
) -> None:
    parsed = reports.parse(_message(step, warmed))
    assert parsed is not None
    assert advice in parsed.miss_reason, parsed.miss_reason
    assert len(parsed.miss_reason) <= reports.REASON_CHARS
    if warmed == "auto":
        assert "raise workloads[].budget" in parsed.miss_reason
    pod = {"status": {"phase": "Succeeded", "containerStatuses": [{"state": {"terminated": {"message": "x"}}}]}}
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = _message(step, warmed)
    assert reports.totals(reports.counted([pod])[0])["lastMissReason"] == parsed.miss_reason[: reports.REASON_CHARS]


def test_another_reason_says_the_step_too_and_junk_steps_are_ignored() -> None:
    parsed = reports.parse(_message(5, 2, reason="arg 1 (batch): float32[8] vs float32[16]"))
    assert (
        parsed is not None and parsed.miss_reason == "eval_step: arg 1 (batch): float32[8] vs float32[16] (at step 5)"
    )
    junk = json.loads(_message(5, "many").splitlines()[-1]) | {"missed": [{"name": "e", "reason": "r", "step": -1}]}
    parsed = reports.parse(json.dumps(junk))
    assert parsed is not None and (parsed.first_step, parsed.warmed_steps) == (None, None)
    assert parsed.miss_reason == "e: r"


def test_the_step_function_is_the_newest_exact_warm_ups() -> None:
    older = {"finished_at": "2026-11-01T00:00:00Z", "targets": [{"step_fn": "train_step", "steps": 2}]}
    newer = {
        "finished_at": "2026-11-02T00:00:00Z",
        # The first run, then its resumed run (one step on the restored state).
        "targets": [{"step_fn": "train_step", "steps": "auto"}, {"step_fn": "train_step", "steps": 1}],
    }
    aot = {"finished_at": "2026-11-03T00:00:00Z", "targets": [{"name": "matmul", "signature": {}}]}
    assert warmed_steps([older, newer, aot]) == {"train_step": "auto"}
    assert warmed_steps([aot]) == {}  # AOT targets name no step function: nothing is counted


# ---- slow: real JAX ------------------------------------------------------------------------------

# The evaluation first runs after the third step, so a `--steps 2` warm-up never reaches it. Its step
# function is jitted at module level (before JAX's backends start, so the trainer rebinds the global)
# or, with INNER=1, inside main after the first array through `jit` imported before the trainer's patch.
SCRIPT = """
import os
import jax, jax.numpy as jnp
from jax import jit

@jax.jit
def train_step(x):
    return x * 0.5 + 1.0

@jax.jit
def eval_step(x):
    return (x * x).sum()

def main():
    x = jnp.ones((8, 8))  # JAX's backends start here: the trainer's verdict is installed
    step = train_step
    if os.environ.get("INNER") == "1":
        def train_step_in_main(x):
            return x * 0.5 + 1.0

        train_step_in_main.__name__ = "train_step"
        step = jit(train_step_in_main)
    for done in range(1, 6):
        x = step(x)
        if done == 3 and not (os.environ.get("COMPILECACHE_WARMUP") and os.environ.get("SKIP_EVAL_IN_WARMUP")):
            eval_step(x).block_until_ready()

main()
"""


def _warm(tmp_path: Path, name: str, *steps: str, extra: dict[str, str] | None = None) -> Path:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "train.py").write_text(textwrap.dedent(SCRIPT))
    cache = tmp_path / name
    argv = ["warm", "--cache-dir", str(cache), "--script", str(code / "train.py"), *steps, "--no-resume"]
    done = run_cli(argv, clean_env(extra, [code]))
    assert done.returncode == 0, done.stderr
    return cache


def _train(tmp_path: Path, cache: Path, inner: bool) -> dict[str, Any]:
    plugin = declare_trainer_plugin(tmp_path / "plugin")
    termination = tmp_path / "termination-log"
    env = trainer_env(jax_cache_env(str(cache)), read_only=True) | {TERMINATION_LOG: str(termination)}
    env |= {"INNER": "1" if inner else "0"}
    return run_trainer(tmp_path / "code" / "train.py", clean_env(env, [plugin, tmp_path / "code"]), termination)[0]


@pytest.mark.slow
@pytest.mark.jax
def test_an_evaluation_after_the_warmed_steps_is_named_with_its_step_and_the_fix(tmp_path: Path) -> None:
    cache = _warm(tmp_path, "cache", "--steps", "2")
    targets = [
        t
        for path in (cache / ".compilecache" / "manifests").glob("*.json")
        for t in json.loads(path.read_text())["targets"]
    ]
    assert [(t.get("step_fn"), t.get("steps")) for t in targets] == [("train_step", 2)], targets
    for inner in (False, True):
        report = _train(tmp_path, cache, inner)
        assert report["missed"] == [{"name": "eval_step", "reason": verdict.NOT_WARMED, "step": 3}], (inner, report)
        assert report["summary"].endswith("missed: eval_step (not warmed, first compiled at step 3)"), report
        assert (report["step_fn"], report["warmed_steps"]) == ("train_step", 2)
        parsed = reports.parse(json.dumps(report))
        assert parsed is not None and parsed.miss_reason.endswith("set steps >= 4"), parsed
    # What the status says to do works: a warm-up of 4 steps caches the evaluation.
    enough = _train(tmp_path, _warm(tmp_path, "enough", "--steps", "4"), inner=False)
    assert enough["misses"] == 0 and enough["requests"] > 0, enough


@pytest.mark.slow
@pytest.mark.jax
def test_a_warm_up_that_counted_no_step_leaves_the_step_out(tmp_path: Path) -> None:
    # Run to its end with no step count (the evaluation skipped during the warm-up): the manifests
    # name no step function, so the trainer counts nothing and says nothing of steps.
    cache = _warm(tmp_path, "cache", extra={"SKIP_EVAL_IN_WARMUP": "1"})
    report = _train(tmp_path, cache, inner=False)
    assert report["missed"] == [{"name": "eval_step", "reason": verdict.NOT_WARMED}], report
    assert "step_fn" not in report and "first compiled" not in report["summary"], report


@pytest.mark.slow
@pytest.mark.jax
def test_counting_step_calls_costs_microseconds() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "miss_naming.py"), "--leaves", "4", "--repeat", "2000"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    print(done.stdout)  # the figures, with pytest -s
    found = re.search(
        r"step count, every step call: ([\d.]+) us \(a bare call of a one-array step: ([\d.]+) us", done.stdout
    )
    assert found, done.stdout
    # A Python call and an increment; a training step's dispatch alone is several microseconds, its run ms.
    assert float(found[1]) < 50, done.stdout


@pytest.mark.slow
@pytest.mark.jax
def test_rebinding_reaches_jitted_globals_only() -> None:
    import jax

    from compilecache.frameworks.jax.stepcalls import CountingJitted, jitted_name, rebind_globals

    module = types.ModuleType("user_code")

    def train_step(x: Any) -> Any:
        return x

    module.train_step = jax.jit(train_step)  # type: ignore[attr-defined]
    module.plain = train_step  # type: ignore[attr-defined]
    module.other = jax.jit(lambda x: x)  # type: ignore[attr-defined]
    rebound = rebind_globals([module], ["train_step"], lambda jitted: CountingJitted(jitted, after=lambda _: None))
    assert rebound == 1
    assert isinstance(module.train_step, CountingJitted) and module.plain is train_step
    assert jitted_name(module.train_step) is None  # never wrapped twice
    assert module.train_step.lower(1.0) is not None and module.train_step.__wrapped__ is train_step


def test_the_script_s_own_modules_are_searched_not_installed_packages() -> None:
    import sysconfig

    from compilecache.frameworks.jax.stepcalls import own_modules

    def module(name: str, where: str | None) -> types.ModuleType:
        made = types.ModuleType(name)
        made.__file__ = where
        return made

    main = module("__main__", "/app/train.py")
    mine = module("model", "/app/model.py")
    installed = module("flax.linen", f"{sysconfig.get_paths()['purelib']}/flax/linen/__init__.py")
    stdlib = module("json", f"{sysconfig.get_paths()['stdlib']}/json/__init__.py")
    ours = module("compilecache.frameworks.jax.verdict", "/src/frameworks/jax/verdict.py")
    built_in = module("sys", None)
    found = own_modules({m.__name__: m for m in (main, mine, installed, stdlib, ours, built_in)})
    assert found == [main, mine]
