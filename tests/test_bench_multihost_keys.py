"""CI's smoke run of bench/multihost_keys.py on the CPU: the command works and answers both questions.

What must hold on the CPU with jax 0.10.2 (docs/benchmarks.md, docs/multihost.md): the two processes
of a 2x2 group ask for different keys (the topology fingerprint, ``accelerator_config``), one
4-device process produces neither's keys, and ``jax_mock_gpu_topology`` does not reach the CPU
client. A JAX release that changes any of these fails here, and the docs must change with it.
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
    assert (probe["backend"], probe["applies"], probe["devices"]) == ("cpu", "no", "2"), probe
    answers = [line for line in lines if line.startswith("answer: ")]
    assert len(answers) == 2 and all(": no" in line for line in answers), answers
    assert float(rows[-1]["seconds"]) > 0, rows[-1]
