"""bench/coldwarm.py where the product's dependencies come only from ``PYTHONPATH``, as on the GPU machine.

There, Python's own site-packages hold JAX but not the product's other dependencies: they are
wheels unpacked into a folder named by ``PYTHONPATH``. A bench that replaces its children's
``PYTHONPATH`` with this tree's folders starts children that cannot import them
(``ModuleNotFoundError: croniter`` was the GPU machine's). Here the same: a bare virtual
environment (no packages of its own) runs the bench, with this environment's site-packages on
``PYTHONPATH`` (its ``.pth`` files, the editable install among them, are not read from there).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxhelpers import REPO, clean_env, inherited_pythonpath

ENTRY = st.text(st.characters(exclude_characters=os.pathsep), max_size=12)


@given(first=st.lists(ENTRY.filter(bool), max_size=4), inherited=st.lists(ENTRY, max_size=6))
def test_a_child_pythonpath_is_ours_then_the_callers_entries(first: list[str], inherited: list[str]) -> None:
    joined = inherited_pythonpath(first, {"PYTHONPATH": os.pathsep.join(inherited)})
    entries = joined.split(os.pathsep) if joined else []
    assert entries[: len(first)] == first
    kept = [entry for entry in inherited if entry and entry not in first]
    assert entries[len(first) :] == kept
    assert "" not in entries  # an empty entry would put the child's working directory on its path


def bare_python(folder: Path) -> Path:
    """A virtual environment with no packages of its own; its interpreter."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    return folder / "bin" / "python"


@pytest.mark.slow
@pytest.mark.jax
def test_the_cold_warm_benchmark_runs_with_its_dependencies_only_on_pythonpath(tmp_path: Path) -> None:
    python = bare_python(tmp_path / "bare")
    env = {k: v for k, v in clean_env().items() if k != "PYTHONPATH"}
    alone = subprocess.run(
        [str(python), "-c", "import croniter"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert alone.returncode != 0, "the bare interpreter must not find the product's dependencies by itself"
    env["PYTHONPATH"] = sysconfig.get_paths()["purelib"]
    done = subprocess.run(
        [str(python), str(REPO / "bench" / "coldwarm.py"), "--layers", "1", "--repeat", "1", "--skip-jobs"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, (done.stdout[-1000:], done.stderr[-3000:])
    [row] = [line.split() for line in done.stdout.splitlines() if line.split()[:1] == ["1"]]
    cold, warm, floor, misses = float(row[1]), float(row[2]), float(row[3]), int(row[-1])
    assert cold > 0 and warm > 0 and floor > 0, row
    assert misses == 0, row  # `compilecache warm` ran in a child too, and trainers hit what it wrote
