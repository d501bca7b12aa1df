"""Shared by the PyTorch tests: whether the PyTorch warmer is here, and one run of the PyTorch example."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from compilecache.frameworks.pytorch import demo as torchdemo

ROOT = Path(__file__).resolve().parent.parent


def torch_warmer_or_skip(command: str = "warm") -> None:
    """Skip unless ``compilecache COMMAND`` (``warm``, ``expire``) takes ``--framework``: the PyTorch side of
    the Job commands is not in every checkout (it is written apart from the operator's side)."""
    done = subprocess.run(
        [sys.executable, "-m", "compilecache.cli", command, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    if "--framework" not in done.stdout:
        pytest.skip(f"`compilecache {command} --help` has no --framework: the PyTorch side is not in this checkout yet")


def run_example(env: dict[str, str], *args: str) -> dict[str, Any]:
    """``examples/pytorch/train.py --json`` as a fresh process from the repository root; its result."""
    done = subprocess.run(
        [sys.executable, str(ROOT / torchdemo.SCRIPT), "--json", *args],
        cwd=ROOT,
        env={**torchdemo.clean_env(), **env},
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return torchdemo.train_result(done.stdout)
