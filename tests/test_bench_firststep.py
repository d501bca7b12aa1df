"""CI's smoke run of bench/firststep.py on the CPU: the command works and its figures parse.

The figures themselves go in docs/benchmarks.md; here only what must hold on any machine: every
example's warm run hit the cache the cold run filled, and every figure is a number with its ratio.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAIR = re.compile(r"(\S+)=(\S+)")


@pytest.mark.slow
@pytest.mark.jax
def test_the_first_step_benchmark_runs_tiny_on_the_cpu_and_its_figures_parse() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "firststep.py"), "--tiny", "--no-multihost"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    heads = [dict(PAIR.findall(line)) for line in lines if line.startswith("example=") and "skipped" not in line]
    assert [head["example"] for head in heads] == ["transformer", "flax-mlp"], done.stdout
    for head in heads:
        for key in ("cold_first_step_s", "warm_first_step_s", "warm/cold", "cold_compile_s", "compile_warm/cold"):
            assert float(head[key]) >= 0, (key, head)
        hits, requests = map(int, head["warm_hits"].split("/"))
        assert hits == requests > 0, head  # the warm run loaded what the cold run wrote
        assert int(head["cache_bytes"]) > 0, head
        assert head["autotune_share"] == "n/a" if head["backend"] == "cpu" else float(head["autotune_share"]) >= 0
    functions = [dict(PAIR.findall(line)) for line in lines if line.strip().startswith("function=")]
    assert any("train_step" in fn["function"] for fn in functions), done.stdout
    assert all(float(fn["cold_s"]) > 0 and float(fn["warm/cold"]) >= 0 for fn in functions), functions
    assert "example=multihost-2proc skipped: --no-multihost" in lines
    assert lines[-1].startswith("multihost-keys skipped: --no-multihost"), lines[-1]
