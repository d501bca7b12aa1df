"""Issue 20 item 5: whole epochs without counting (``--steps auto``, a CompileCache's default).

Fast tests drive the stop decision (:func:`compilecache.frameworks.jax.scriptrun.stop_reason`) and the
requests warm and verify hand to scriptrun; the slow ones run real JAX on the CPU: the Flax
example, which evaluates at the end of each epoch, warmed by the command line the operator writes
for a script workload with nothing but its defaults, then trained with the trainer's verdict; and
a script that would run for ever, stopped by its budget at a step boundary, whose verify stops as
soon as it asked for every compile instead of running a second budget.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from compilecache.cache.errors import WarmError
from compilecache.cli.main import build_parser
from compilecache.controller import jobs, status
from compilecache.controller.api import parse_spec
from compilecache.frameworks.jax.env import jax_cache_env, trainer_env
from compilecache.frameworks.jax.scriptrun import StopRule, stop_reason
from compilecache.frameworks.jax.warm import _check_args, _exact_mode_from_env, _script_request
from compilecache.jobtools.entrypoint import DEFAULT_BUDGET
from compilecache.jobtools.warm import termination_summary
from jaxhelpers import FOUR_CPUS, REPO, clean_env, run_cli, write_module
from specs import cache_spec

CRD_SCHEMA = yaml.safe_load((REPO / "crds" / "compilecache.yaml").read_text())["spec"]["versions"][0]["schema"][
    "openAPIV3Schema"
]

# ---- fast: the decision ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "calls", "since_first", "requests", "reason"),
    [
        (StopRule(steps=2), 1, 999.0, 99, None),  # a count ignores time and requests
        (StopRule(steps=2), 2, 0.0, 0, "steps"),
        (StopRule(budget=10.0), 5000, 9.9, 3, None),  # within the budget: on, whatever the count
        (StopRule(budget=10.0), 6, 10.0, 3, "budget"),
        (StopRule(until_requests=3, max_calls=40), 7, 0.5, 2, None),  # verify: not everything asked yet
        (StopRule(until_requests=3, max_calls=40), 7, 0.5, 3, "requests"),
        (StopRule(until_requests=3, max_calls=40), 40, 0.5, 2, "calls"),  # never beyond the warm-up
        (StopRule(), 10**6, 10**6, 10**6, None),  # auto with nothing set: the entrypoint's own end
    ],
)
def test_stop_reason(rule: StopRule, calls: int, since_first: float, requests: int, reason: str | None) -> None:
    assert stop_reason(rule, calls, since_first, requests) == reason


def test_stop_rule_from_a_scriptrun_request() -> None:
    assert StopRule.from_request({}) is None
    assert StopRule.from_request({"steps": 3}) == StopRule(steps=3)
    auto = StopRule.from_request({"steps": "auto", "budget": 5})
    assert auto == StopRule(budget=5.0) and auto.auto
    assert StopRule.from_request({"steps": "auto", "until_requests": 4, "max_calls": 9}) == StopRule(
        until_requests=4, max_calls=9
    )


def _parsed(*flags: str) -> argparse.Namespace:
    script = str(REPO / "examples" / "train_flax.py")  # _check_args looks for it
    return build_parser().parse_args(["warm", "--cache-dir", "/c", "--script", script, *flags])


def test_warm_asks_for_a_budget_and_verify_for_the_warm_ups_compiles() -> None:
    args = _parsed("--steps", "auto")
    _exact_mode_from_env(args, {})
    assert _script_request(args) == {"steps": "auto", "step_fn": "train_step", "budget": DEFAULT_BUDGET}
    args = _parsed("--steps", "auto")
    _exact_mode_from_env(args, {"COMPILECACHE_WARM_BUDGET": "7.5"})
    assert _script_request(args)["budget"] == 7.5
    # Verify after a run its budget stopped: until as many compiles, never past as many calls.
    stopped = {"ran": 1200, "stopped": "budget"}
    assert _script_request(args, warmed=(stopped, 4)) == {
        "steps": "auto",
        "step_fn": "train_step",
        "until_requests": 4,
        "max_calls": 1200,
    }
    # After a run that ended by itself: its last calls may be followed by an evaluation, no call cap.
    assert "max_calls" not in _script_request(args, warmed=({"ran": 10, "stopped": None}, 4))
    # From a workload's env, as a Job gets it.
    args = _parsed()
    _exact_mode_from_env(args, {"COMPILECACHE_WARM_STEPS": "auto"})
    assert args.steps == "auto"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--steps", "2", "--budget", "5"), "--budget needs --steps auto"),
        (("--steps", "auto", "--budget", "0"), "--budget needs --steps auto and a positive number"),
        (("--steps", "0"), "--steps N needs --script and N of at least 1 (or auto)"),
    ],
)
def test_bad_budget_or_steps_is_one_line(flags: tuple[str, ...], message: str) -> None:
    args = _parsed(*flags)
    _exact_mode_from_env(args, {})
    with pytest.raises(WarmError, match=re.escape(message)):
        _check_args(args, [])


def test_steps_that_are_neither_a_count_nor_auto_are_refused_by_the_parser() -> None:
    with pytest.raises(SystemExit):
        _parsed("--steps", "epoch")


def test_the_pool_status_says_how_far_each_script_ran_and_what_that_leaves_out() -> None:
    def summary(script: str, ran: int, stopped: str | None) -> str:
        stepped = {"script": script, "step_fn": "train_step", "ran": ran, "stopped": stopped or "end"}
        return termination_summary({"ok": True, "entries": 1, "bytes": 10, "targets": [], "stepped": stepped})

    def pod(container: str, message: str, init: bool) -> dict[str, Any]:
        state = {"name": container, "state": {"terminated": {"exitCode": 0, "message": message}}}
        key = "initContainerStatuses" if init else "containerStatuses"
        return {"metadata": {"name": "p", "labels": {"job-name": "j"}}, "status": {key: [state]}}

    pods = [
        pod("warm-0", summary("/app/a.py", 2, "steps"), True),
        pod("warm", summary("/app/b.py", 800, "budget"), False),
    ]
    pods.append(pod("warm-1", summary("/app/c.py", 10, None), True))
    report = status.warm_report(pods)
    assert report is not None
    by_script = {item["script"]: item for item in report["steps"]}
    ran = {script: (item["calls"], item["stoppedBy"]) for script, item in by_script.items()}
    assert ran == {"/app/a.py": (2, "steps"), "/app/b.py": (800, "budget"), "/app/c.py": (10, "end")}
    assert "what training compiles later is not cached" in by_script["/app/a.py"]["message"]
    assert "raise budget" in by_script["/app/b.py"]["message"]
    assert "everything it compiles is cached" in by_script["/app/c.py"]["message"]
    # The CRD declares what the status carries (a real API server prunes undeclared fields).
    pools = CRD_SCHEMA["properties"]["status"]["properties"]["pools"]["items"]["properties"]
    assert set(report["steps"][0]) == set(pools["steps"]["items"]["properties"])


# ---- slow: real JAX --------------------------------------------------------------------------------


def _generated_warm(spec_dict: dict[str, Any], cache: Path, report: Path) -> list[str]:
    """The ``compilecache warm`` arguments the operator writes into a Job for this spec's one script
    workload, with the pod's paths (mount, report, termination log) mapped to this test's."""
    spec = parse_spec(spec_dict)
    [workload] = spec.warmup.workloads
    command = jobs._warm_command(spec, [workload])
    assert command[:2] == ["compilecache", "warm"]
    mapped = {spec.cache_dir: str(cache), jobs.REPORT_PATH: str(report), jobs.TERMINATION_LOG: str(report) + ".term"}
    return [mapped.get(arg, arg) for arg in command[1:]]


def _verdict(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("compilecache: ")]


def _train(cache: Path, *args: str) -> tuple[dict[str, Any], list[str]]:
    """``examples/train_flax.py --json ARGS`` as a training pod runs it: the cache env and the verdict."""
    env = clean_env(trainer_env({**jax_cache_env(str(cache)), "XLA_FLAGS": FOUR_CPUS}, read_only=True))
    env["COMPILECACHE_REPORT_SETTLE_SECS"] = "0"  # the verdict at exit, with every step counted
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "train_flax.py"), "--json", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), _verdict(done.stderr)


@pytest.mark.slow
@pytest.mark.jax
def test_default_settings_cache_the_epoch_end_evaluation_and_training_hits_everything(tmp_path: Path) -> None:
    # A CompileCache workload with nothing but its script and the script's own arguments (two
    # epochs of 5 steps, each ending in an evaluation): the operator's defaults do the rest.
    spec = cache_spec()
    workload = {"name": "train", "script": "examples/train_flax.py", "args": ["--steps", "10"]}
    spec["warmup"] = spec["warmup"] | {"workloads": [workload]}
    cache, report_path = tmp_path / "cache", tmp_path / "report.json"
    argv = _generated_warm(spec, cache, report_path)
    assert argv[argv.index("--steps") + 1] == "auto"
    done = run_cli(argv, clean_env({"XLA_FLAGS": FOUR_CPUS}))
    assert done.returncode == 0, done.stderr
    assert "examples/train_flax.py ended by itself after 10 calls of train_step" in done.stdout, done.stdout
    report = json.loads(report_path.read_text())
    assert report["verify"]["ok"] and report["verify"]["hits"] == report["verify"]["requests"], report["verify"]
    # What the operator reads into status.pools[].steps.
    told = json.loads(Path(f"{report_path}.term").read_text())["steps"]
    assert (told["calls"], told["stoppedBy"]) == (10, "end"), told

    result, verdict = _train(cache, "--steps", "10")
    assert result["evaluations"] == 2, result
    assert result["requests"] == result["hits"] >= 3, result  # create_state, train_step, eval_step
    assert verdict and all(re.match(r"compilecache: (\d+)/\1 compiles hit", line) for line in verdict), verdict

    # What counting by hand gave before: --steps 2 stops before the first evaluation, and training misses it.
    counted = tmp_path / "counted"
    at_two = [*argv[: argv.index("--steps")], "--steps", "2", *argv[argv.index("--") :]]
    at_two[at_two.index(str(cache))] = str(counted)
    assert run_cli(at_two, clean_env({"XLA_FLAGS": FOUR_CPUS})).returncode == 0
    result, verdict = _train(counted, "--steps", "10")
    assert result["hits"] == result["requests"] - 1, result
    assert any("eval_step" in line for line in verdict), verdict


# Trains for ever, evaluating every 50 steps: only a budget ends it.
FOREVER = """
import jax, jax.numpy as jnp

@jax.jit
def train_step(x):
    return x * 0.5 + 1.0

@jax.jit
def eval_step(x):
    return (x * x).sum()

x = jnp.ones((8, 8))
step = 0
while True:
    x = train_step(x)
    step += 1
    if step % 50 == 0:
        eval_step(x)
"""


@pytest.mark.slow
@pytest.mark.jax
def test_the_budget_stops_at_a_step_boundary_and_verify_stops_once_it_asked_for_everything(tmp_path: Path) -> None:
    folder = write_module(tmp_path / "src", "forever", FOREVER)
    cache, report_path = tmp_path / "cache", tmp_path / "report.json"
    budget = 4.0
    argv = ["warm", "--cache-dir", str(cache), "--report", str(report_path), "--script", str(folder / "forever.py")]
    started = time.monotonic()
    done = run_cli([*argv, "--steps", "auto", "--budget", f"{budget:g}"], clean_env())
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    found = re.search(r"stopped \S+ after (\d+) calls of train_step: its budget ran out ([\d.]+)s", done.stdout)
    assert found, done.stdout
    ran, seconds = int(found[1]), float(found[2])
    # Stopped at the first boundary past the budget: a step here takes microseconds.
    assert budget <= seconds < budget + 2, seconds
    assert ran > 50, ran  # it reached the periodic evaluation
    verify = json.loads(report_path.read_text())["verify"]
    assert verify["ok"] and verify["hits"] == verify["requests"] >= 2, verify
    # Verify stopped at the first step boundary after the evaluation it had to ask for (which runs
    # after the 50th step), not after a budget.
    assert verify["script_steps"] == 51, verify
    # One budget in all (the warm), plus start-ups; a second budget would add at least `budget`.
    assert took < 2 * budget + 60, took


NEVER_STEPS = """
import jax, jax.numpy as jnp
jax.jit(lambda: jnp.ones((4,)))()
print("done without training")
"""


@pytest.mark.slow
@pytest.mark.jax
def test_auto_still_fails_when_the_step_is_never_called(tmp_path: Path) -> None:
    folder = write_module(tmp_path / "src", "never", NEVER_STEPS)
    done = run_cli(
        ["warm", "--cache-dir", str(tmp_path / "c"), "--script", str(folder / "never.py"), "--steps", "auto"],
        clean_env(),
    )
    assert done.returncode == 2, done.stderr
    assert "--steps auto: the entrypoint ended and the step function 'train_step' was never called" in done.stderr
    assert not (tmp_path / "c").exists() or not list((tmp_path / "c").glob("*-cache"))


def test_a_warm_up_group_refuses_auto(tmp_path: Path) -> None:
    # Processes of a group each on their own clock would stop at different steps, and hang.
    folder = write_module(tmp_path / "src", "never", NEVER_STEPS)
    argv = ["warm", "--cache-dir", str(tmp_path / "c"), "--script", str(folder / "never.py"), "--steps", "auto"]
    done = run_cli([*argv, "--num-processes", "2", "--process-id", "0", "--coordinator", "127.0.0.1:1"], clean_env())
    assert done.returncode == 2, done.stderr
    assert "--steps auto stops by time, which the processes of a group cannot agree on" in done.stderr
