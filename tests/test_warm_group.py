"""The parts of a multi-host ``compilecache warm`` that need no group: its place, ports, summary.

The groups themselves run in tests/test_multihost_warm.py (real JAX processes, slow).
"""

from __future__ import annotations

import json

import pytest

from compilecache.cache.errors import WarmError
from compilecache.frameworks.jax.manifest import build_report
from compilecache.frameworks.jax.multihost import (
    COMPILE_PORT,
    SCRIPT_PORT,
    VERIFY_PORT,
    group_from,
    group_request,
    script_env,
    single_process_message,
    verify_script_env,
)
from compilecache.jobtools.warm import termination_summary

JOB_ENV = {"COMPILECACHE_NUM_PROCESSES": "4", "JOB_COMPLETION_INDEX": "3", "JAX_COORDINATOR_ADDRESS": "job-0.svc:8476"}


def test_the_group_comes_from_flags_then_the_jobs_environment() -> None:
    env = {"COMPILECACHE_NUM_PROCESSES": "4", "JOB_COMPLETION_INDEX": "3", "JAX_COORDINATOR_ADDRESS": "job-0.svc:8476"}
    group = group_from(None, None, None, env)
    assert group is not None and (group.processes, group.process_id, group.host, group.port) == (
        4,
        3,
        "job-0.svc",
        8476,
    )
    assert group.address(3) == "job-0.svc:8479"
    assert group_from(None, None, None, {**env, "COMPILECACHE_PROCESS_ID": "1"}).process_id == 1  # type: ignore[union-attr]
    flagged = group_from(2, 0, "[::1]:9000", env)
    assert flagged is not None and (flagged.processes, flagged.process_id, flagged.host, flagged.port) == (
        2,
        0,
        "[::1]",
        9000,
    )
    assert group_from(None, None, None, {}) is None
    assert group_from(1, None, None, env) is None  # one process: today's warmer


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        ((None, None, None), {"COMPILECACHE_NUM_PROCESSES": "two"}, "must be a whole number"),
        ((0, None, None), {}, "at least 1"),
        ((2, None, "h:1"), {}, "no process id"),
        ((2, 2, "h:1"), {}, "outside 0..1"),
        ((2, 1, None), {}, "no coordinator"),
        ((2, 1, "nohost"), {}, "not HOST:PORT"),
        ((2, 1, "h:65534"), {}, "not HOST:PORT"),
        ((2, 1, "h:1"), {"COMPILECACHE_GROUP_PHASE_TIMEOUT": "soon"}, "must be a whole number"),
    ],
)
def test_a_bad_group_is_a_one_line_error(
    flags: tuple[int | None, int | None, str | None], env: dict[str, str], message: str
) -> None:
    with pytest.raises(WarmError, match=message):
        group_from(*flags, env)


def test_every_group_of_the_warmer_has_its_own_port_and_the_script_reads_the_job_variables() -> None:
    group = group_from(None, None, None, JOB_ENV)
    assert group is not None
    assert len({COMPILE_PORT, SCRIPT_PORT, VERIFY_PORT, 0}) == 4 and max(COMPILE_PORT, SCRIPT_PORT, VERIFY_PORT) == 3
    assert script_env(group) == {
        "JAX_COORDINATOR_ADDRESS": "job-0.svc:8478",
        "COMPILECACHE_NUM_PROCESSES": "4",
        "COMPILECACHE_PROCESS_ID": "3",
    }
    assert verify_script_env(group)["JAX_COORDINATOR_ADDRESS"] == "job-0.svc:8479"
    request = group_request(group, VERIFY_PORT)
    assert (request["coordinator"], request["processes"], request["process_id"]) == ("job-0.svc:8479", 4, 3)
    message = single_process_message(4)
    assert all(
        name in message for name in ("JAX_COORDINATOR_ADDRESS", "COMPILECACHE_NUM_PROCESSES", "COMPILECACHE_PROCESS_ID")
    )


def test_a_group_members_report_and_termination_summary_say_which_process_it_is() -> None:
    manifest = {"run_id": "r-p1", "entries": [], "group": {"run_id": "r", "process": 1, "processes": 2}}
    report = build_report(manifest, "m.json", None)
    assert (report["process"], report["processes"]) == (1, 2)
    summary = json.loads(termination_summary(report))
    assert (summary["process"], summary["processes"]) == (1, 2)
    # A lone warmer's summary is what it was: no such fields.
    lone = json.loads(termination_summary(build_report({"run_id": "r", "entries": []}, "m.json", None)))
    assert "process" not in lone and "processes" not in lone
