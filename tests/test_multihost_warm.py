"""``compilecache warm`` as N processes of one group, proven with real JAX on the CPU.

The group is what a multi-host warm-up Job runs: N copies of the same CLI, each told its place by
the Job's environment (``COMPILECACHE_NUM_PROCESSES``, ``JOB_COMPLETION_INDEX``,
``JAX_COORDINATOR_ADDRESS``), 2 CPU devices each, over 127.0.0.1, on one shared cache dir. Then
a fresh plain-JAX group (the "training run", :data:`groupharness.WORKER`) compiles the same
sharded programs over a 2x2 mesh of all global devices and must hit every entry in EVERY
process: with JAX's default only process 0 would (tests/test_multihost_keys.py).

Every group is bounded, logs to files and is killed (its stacks dumped) at its bound:
:mod:`groupharness`.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from groupharness import (
    Finished,
    cpu_env,
    distributed_cpu_problem,
    explain,
    free_port,
    hits,
    require_success,
    run_group,
    run_processes,
    write_model,
)
from jaxhelpers import REPO, clean_env, entry_files

pytestmark = [pytest.mark.slow, pytest.mark.jax]

# A 2x2 warm-up (compile, publish, verify in fresh processes) takes ~10-20 s on 2 shared cores.
WARM_TIMEOUT_S = 240
# How soon a dead process is noticed by the others (the group's heartbeat bound, seconds).
HEARTBEAT_S = 10

# exact mode: a training script that joins its group from the environment the warmer gives it,
# as the contract says a multi-host training entrypoint does, and trains.
TRAIN_SCRIPT = """
import os
import jax

jax.distributed.initialize(
    coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
    num_processes=int(os.environ["COMPILECACHE_NUM_PROCESSES"]),
    process_id=int(os.environ["COMPILECACHE_PROCESS_ID"]),
    initialization_timeout=60,
    heartbeat_timeout_seconds=10,
    shutdown_timeout_seconds=30,
    cluster_detection_method="deactivate",
)
import mhmodel

model = mhmodel.Model()
for _ in range(100):
    model.run_step(model.step)  # the jitted step is named after its function: loss
"""

# One process of a failing group: process MH_FAILING's workload fails (or dies) before it compiles.
FAILING_WORKLOAD = """
import os
import mhmodel


def targets():
    if os.environ["JOB_COMPLETION_INDEX"] == os.environ["MH_FAILING"]:
        if os.environ["MH_FAILURE"] == "die":
            os._exit(17)  # no Python cleanup, no word to the group: as a killed pod
        raise RuntimeError("this process cannot build its model")
    return mhmodel.targets()
"""


@pytest.fixture(scope="module", autouse=True)
def _distributed_cpu() -> None:
    problem = distributed_cpu_problem()
    if problem:
        pytest.skip(problem)


@dataclass
class Warmed:
    """How each process of a warm-up group ended, with what it wrote."""

    finished: list[Finished]
    reports: list[dict[str, Any]]
    summaries: list[dict[str, Any]]
    seconds: float


def warm_group(
    cache: Path,
    model_dir: Path,
    warm_args: Sequence[str],
    *,
    processes: int = 2,
    extra_env: Mapping[str, str] | None = None,
    process_env: Mapping[int, Mapping[str, str]] | None = None,
) -> Warmed:
    """Run ``compilecache warm`` N times at once, as the pods of one Indexed Job."""
    port = free_port(block=4)  # the warmer uses port..port+3
    run_dir = cache.parent / f"warm-{time.monotonic_ns()}"
    run_dir.mkdir()
    envs, commands = [], []
    for index in range(processes):
        envs.append(
            cpu_env(
                cache,
                2,
                {
                    "PYTHONPATH": os.pathsep.join([str(model_dir), clean_env()["PYTHONPATH"]]),
                    "COMPILECACHE_NUM_PROCESSES": str(processes),
                    "JOB_COMPLETION_INDEX": str(index),
                    "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
                    "COMPILECACHE_GROUP_HEARTBEAT_TIMEOUT": str(HEARTBEAT_S),
                    "COMPILECACHE_GROUP_CONNECT_TIMEOUT": "90",
                    "COMPILECACHE_GROUP_PHASE_TIMEOUT": "180",
                    **(extra_env or {}),
                    **(process_env or {}).get(index, {}),
                },
            )
        )
        commands.append(
            [
                sys.executable,
                "-m",
                "compilecache.cli",
                "warm",
                "--cache-dir",
                str(cache),
                "--report",
                str(run_dir / f"{index}.report.json"),
                "--termination-log",
                str(run_dir / f"{index}.termination"),
                *warm_args,
            ]
        )
    start = time.monotonic()
    finished = run_processes(commands, envs, run_dir, WARM_TIMEOUT_S, cwd=model_dir)
    seconds = time.monotonic() - start

    def read(path: Path) -> dict[str, Any]:
        return json.loads(path.read_text()) if path.exists() else {}

    return Warmed(
        finished,
        [read(run_dir / f"{index}.report.json") for index in range(processes)],
        [read(run_dir / f"{index}.termination") for index in range(processes)],
        seconds,
    )


def manifests(cache: Path) -> list[dict[str, Any]]:
    folder = cache / ".compilecache" / "manifests"
    return [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))] if folder.exists() else []


def test_a_two_process_warm_up_serves_every_process_of_a_two_by_two_run(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    model_dir = write_model(tmp_path / "model")

    warmed = warm_group(cache, model_dir, ["--workload", "mhmodel:targets"])

    require_success(warmed.finished, "2x2 warm-up", WARM_TIMEOUT_S)
    for index, (report, summary) in enumerate(zip(warmed.reports, warmed.summaries, strict=True)):
        # Every process verified in a fresh process of a fresh 2-process group, and hit all.
        assert report["ok"] and report["device_count"] == 4, report
        assert report["verify"]["hits"] == report["verify"]["requests"] == 2, report["verify"]
        assert (report["process"], report["processes"]) == (index, 2)
        assert summary["ok"] and (summary["process"], summary["processes"]) == (index, 2), summary
        assert summary["entries"] == 2 and summary["verify"] == {"hits": 2, "requests": 2}
    # One manifest per process, of one group run; each lists its own entries: 2 programs x 2 processes.
    found = manifests(cache)
    assert sorted(m["group"]["process"] for m in found) == [0, 1]
    assert len({m["group"]["run_id"] for m in found}) == 1
    own = [sorted(entry["file"] for entry in m["entries"]) for m in found]
    assert not set(own[0]) & set(own[1]) and sorted(own[0] + own[1]) == entry_files(cache)
    assert len(entry_files(cache)) == 4
    assert not any((cache / ".compilecache" / "staging").iterdir())

    train = run_group(cache, processes=2, devices_per_process=2, model_dir=model_dir)

    # The point: every process of a fresh 2x2 training run finds its own entries.
    assert [hits(result) for result in train] == [{"step": (1, 1), "update": (1, 1)}] * 2
    assert train[0]["value"] == train[1]["value"]
    assert len(entry_files(cache)) == 4  # training wrote nothing new
    print(f"2x2 warm-up: {warmed.seconds:.1f} s wall")


def test_exact_mode_warms_a_two_process_training_script(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    model_dir = write_model(tmp_path / "model")
    (model_dir / "mhtrain.py").write_text(TRAIN_SCRIPT)

    warmed = warm_group(
        cache, model_dir, ["--script", str(model_dir / "mhtrain.py"), "--steps", "1", "--step-fn", "loss"]
    )

    require_success(warmed.finished, "2x2 exact-mode warm-up", WARM_TIMEOUT_S)
    for index, report in enumerate(warmed.reports):
        assert report["ok"] and report["process"] == index, report
        # The script's second run, a fresh group of 2, hit everything it compiled, in each process.
        assert report["verify"]["requests"] >= 1
        assert report["verify"]["hits"] == report["verify"]["requests"], report["verify"]
    own = [sorted(entry["file"] for entry in m["entries"]) for m in manifests(cache)]
    assert len(own) == 2 and own[0] and own[1] and not set(own[0]) & set(own[1])


@pytest.mark.parametrize(("failing", "failure"), [(1, "error"), (0, "error"), (1, "die")])
def test_a_process_that_fails_before_the_barrier_fails_the_group_and_nothing_is_published(
    tmp_path: Path, failing: int, failure: str
) -> None:
    cache = tmp_path / "cache"
    model_dir = write_model(tmp_path / "model")
    (model_dir / "mhfail.py").write_text(textwrap.dedent(FAILING_WORKLOAD))

    warmed = warm_group(
        cache,
        model_dir,
        ["--workload", "mhfail:targets"],
        extra_env={"MH_FAILURE": failure, "MH_FAILING": str(failing)},
    )

    zero, one = warmed.finished
    logs = explain(warmed.finished, f"group with a process that {failure}s", WARM_TIMEOUT_S)
    # Nobody is left waiting: both ended on their own, well inside the harness's bound.
    assert not zero.killed and not one.killed, logs
    assert zero.returncode != 0 and one.returncode != 0, logs
    assert entry_files(cache) == [] and manifests(cache) == [], logs
    other = 1 - failing
    summary = warmed.summaries[other]
    assert summary["ok"] is False and (summary["process"], summary["processes"]) == (other, 2), summary
    if failure == "error":
        # Both exit 2 with a summary that names the cause: the failing process its own error, the
        # other the failing one's (process 0, which hosts the group, waits until it was heard).
        assert zero.returncode == one.returncode == 2, logs
        assert f"process {failing} of 2 failed" in summary["error"], summary
        assert "cannot build its model" in summary["error"], summary
        assert "cannot build its model" in warmed.summaries[failing]["error"]
    else:
        # Process 0 is ended by JAX's coordination client once process 1's heartbeats stop; the
        # summary it wrote in advance says so.
        assert one.returncode == 17, logs
        assert "ended abruptly" in summary["error"] or "process 1" in summary["error"], summary
    print(f"group with a process that {failure}s ended in {warmed.seconds:.1f} s")


# One process of a bare Coordination group, as the warmer runs it: a watcher ends it once another
# process failed; the failing process fails before or after it joined the compile's JAX group.
LEAVER = """
import os, sys, threading, time
from compilecache.frameworks.jax.multihost import COMPILE_PORT, Coordination, Timeouts, group_from
from compilecache.frameworks.jax.multihost import group_request, join_jax

process, role, linger, address = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
group = group_from(2, process, address, {})
timeouts = Timeouts(connect=60, phase=60, heartbeat=30)
group = type(group)(group.processes, group.process_id, group.host, group.port, timeouts)
coordination = Coordination(group)
coordination.connect()


def heard(why):
    print("heard:", why, flush=True)
    coordination.abandon()
    print("left", flush=True)
    os._exit(2)


def join():  # as a --workload warm-up does before it compiles
    join_jax(group_request(group, COMPILE_PORT, ordered_leave=True), own_keys=False)
    import jax

    jax.devices()  # the backend joins the group too


coordination.watch(heard)
if role == "wait":
    join()  # the other process may never join: the watcher ends this one meanwhile
    threading.Event().wait(90)
    sys.exit("never heard of the other process's failure")
if role == "fail-joined":
    join()
coordination.fail(RuntimeError("this process cannot go on"))
time.sleep(linger)  # what a failing pod may do before it leaves: write its reports, on a slow node
coordination.abandon()
print("left", flush=True)
time.sleep(linger)  # and between leaving and its exit, descheduled on a busy node
os._exit(2)
"""


@pytest.mark.parametrize(("failing", "failure"), [(1, "fail-joined"), (0, "fail-joined"), (1, "fail"), (0, "fail")])
def test_a_failed_process_slow_to_leave_is_never_aborted_by_the_group_ending(
    tmp_path: Path, failing: int, failure: str
) -> None:
    # jaxlib's client aborts its process (SIGABRT) once process 0's service is gone; process 0 must
    # therefore outlast every other process's connection, however slowly that process leaves, and
    # whether or not every process had joined the compile's JAX group.
    port = free_port(block=4)
    script = tmp_path / "leaver.py"
    script.write_text(LEAVER)
    commands = [
        [sys.executable, str(script), str(index), failure if index == failing else "wait", "3", f"127.0.0.1:{port}"]
        for index in range(2)
    ]
    finished = run_processes(commands, [cpu_env(tmp_path / "cache", 1)] * 2, tmp_path / "run", 120, cwd=REPO)

    logs = explain(finished, f"group whose process {failing} fails ({failure}) and lingers", 120)
    assert [one.returncode for one in finished] == [2, 2], logs
    assert all("left" in one.tail() for one in finished), logs
    assert "heard: process" in finished[1 - failing].tail() and "cannot go on" in finished[1 - failing].tail(), logs


def test_a_script_that_never_joins_its_group_fails_and_says_what_to_read(tmp_path: Path) -> None:
    import subprocess

    script = tmp_path / "lonely.py"
    script.write_text("import jax, jax.numpy as jnp\njax.jit(lambda x: x + 1)(jnp.ones(3))\n")
    request, result = tmp_path / "request.json", tmp_path / "result.json"
    request.write_text(json.dumps({"processes": 2}))
    done = subprocess.run(
        [sys.executable, "-m", "compilecache.frameworks.jax.scriptrun", str(request), str(result), str(script)],
        env=cpu_env(tmp_path / "cache", 1),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    error = json.loads(result.read_text())["error"]
    assert "ran as a single process, but 2 were asked" in error
    assert (
        "JAX_COORDINATOR_ADDRESS" in error
        and "COMPILECACHE_NUM_PROCESSES" in error
        and "COMPILECACHE_PROCESS_ID" in error
    )


def test_a_process_whose_verify_misses_fails_every_process(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    model_dir = write_model(tmp_path / "model")

    # Process 1 keeps nothing (every entry is below its minimum size): its fresh process misses.
    warmed = warm_group(
        cache,
        model_dir,
        ["--workload", "mhmodel:targets"],
        process_env={1: {"JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": str(2**40)}},
    )

    zero, one = warmed.finished
    logs = explain(warmed.finished, "group whose process 1 misses", WARM_TIMEOUT_S)
    assert not zero.killed and not one.killed, logs
    assert one.returncode == 3 and "MISSED" in warmed.summaries[1]["error"], logs
    # Process 0 hit all of its own, and still fails: the group's run is sound only if all hit.
    assert zero.returncode == 3, logs
    assert warmed.summaries[0]["verify"] == {"hits": 2, "requests": 2}
    assert "process 1 of 2 failed" in warmed.summaries[0]["error"], warmed.summaries[0]
    # Each process published what it had, with its manifest (expiry can account for it).
    assert len(entry_files(cache)) == 2 and len(manifests(cache)) == 2
