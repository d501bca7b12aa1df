"""CI's smoke run of bench/multihost_keys.py on the CPU: the command works and answers both questions.

What must hold on the CPU with jax 0.10.2 (docs/benchmarks.md, docs/multihost.md): the two processes
of a 2x2 group ask for different keys (the topology fingerprint, ``accelerator_config``), one
4-device process produces neither's keys, and ``jax_mock_gpu_topology``, really set (the probed
process reads the flag back, set before its backend started), does not reach the CPU client. On a
1-GPU machine the probe's process reports the mock instead: 2 devices, 1 local, 2 processes. A
JAX release that changes any of these fails here, and the docs must change with it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from groupharness import distributed_cpu_problem
from jaxhelpers import clean_env

REPO = Path(__file__).resolve().parent.parent
PAIR = re.compile(r"(\S+)=(\S+)")


@pytest.mark.slow
@pytest.mark.jax
def test_the_key_questions_run_on_the_cpu_and_answer_both() -> None:
    problem = distributed_cpu_problem()
    if problem:
        pytest.skip(problem)
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "multihost_keys.py")],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    rows = [dict(PAIR.findall(line)) for line in lines if line.startswith("multihost-keys ")]
    [processes] = [row for row in rows if row.get("question") == "processes"]
    assert processes["same_keys"] == "no", processes
    assert processes["differing"] == "step:accelerator_config;update:accelerator_config", processes
    singles = [row for row in rows if row.get("question") == "single-process"]
    assert [row["process"] for row in singles] == ["0", "1"], rows
    assert all(row["same_keys"] == "no" and "compile_options" in row["differing"] for row in singles), singles
    [probe] = [row for row in rows if "probe" in row]
    # Set, not merely asked for: JAX itself reads the flag back in the probed process.
    assert probe["jax_mock_gpu_topology"] == probe["flag"] == "1x2x1", probe
    assert probe["set_before_backend"] == "yes", probe
    seen = (probe["backend"], probe["devices"], probe["local"], probe["processes"], probe["applies"])
    if probe["backend"] == "cpu":
        assert seen == ("cpu", "1", "1", "1", "no"), probe  # the CPU client has no mock topology
    else:
        assert seen[1:] == ("2", "1", "2", "yes"), probe  # a 1-GPU host, mocked as 2 hosts of 1 device
    answers = [line for line in lines if line.startswith("answer: ")]
    assert len(answers) == 2 and all(": no" in line for line in answers), answers
    assert ("does not apply to the cpu client" in answers[1]) == (probe["backend"] == "cpu"), answers
    assert float(rows[-1]["seconds"]) > 0, rows[-1]
