"""The expiry Job's command runs: what the operator generates, the real `compilecache expire` accepts.

Issue 9: ``lifecycle.maxAge: 14d`` became ``--max-age 1.2096e+06s``, which ``expire`` refused, so
every cache of the shipped PVC example ended Failed. Each case here builds the command with
``expiryjob.expire_command`` and runs the CLI on an empty local cache with ``--dry-run``.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compilecache.cli import main as cli
from compilecache.controller import api, expiryjob
from torchhelpers import torch_warmer_or_skip

ROOT = Path(__file__).resolve().parent.parent


def _example_specs() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if isinstance(doc, dict) and doc.get("kind") == "CompileCache":
                found.append((f"{path.name}:{doc['metadata']['name']}", doc["spec"]))
    return found


EXAMPLES = _example_specs()


def _runnable(command: list[str], cache_dir: Path) -> list[str]:
    """The Job's argv for a local run: the cache and the termination log moved into ``cache_dir``."""
    assert command[:2] == ["compilecache", "expire"]
    argv = list(command[1:])
    argv[argv.index("--cache-dir") + 1] = str(cache_dir)
    argv[argv.index("--termination-log") + 1] = str(cache_dir.parent / "termination-log")
    return [*argv, "--dry-run"]


def _run_in_process(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exit_:  # argparse refusing a flag or a value
            code = exit_.code if isinstance(exit_.code, int) else 2
    return code, err.getvalue()


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize("spec", [spec for _, spec in EXAMPLES], ids=[name for name, _ in EXAMPLES])
def test_the_examples_expiry_command_runs(spec: dict[str, Any], tmp_path: Path) -> None:
    if spec.get("framework") == "pytorch":
        torch_warmer_or_skip("expire")
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    command = expiryjob.expire_command(api.parse_spec(spec))
    code, err = _run_in_process(_runnable(command, cache_dir))
    assert code == 0, (command, err)


@pytest.mark.slow
def test_the_pvc_examples_expiry_command_runs_as_a_process(tmp_path: Path) -> None:
    # The same, through the console entry point in a fresh interpreter: nothing in-process helps.
    spec = dict(EXAMPLES)["cache-pvc.yaml:llama-pvc"]
    assert spec["lifecycle"]["maxAge"] == "14d"  # the value that broke
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    argv = _runnable(expiryjob.expire_command(api.parse_spec(spec)), cache_dir)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "operator")}
    done = subprocess.run(
        [sys.executable, "-m", "compilecache.cli", *argv], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


_DURATION = st.from_regex(r"\A([0-9]{1,5}(\.[0-9]{1,3})?(ms|s|m|h|d|w)){1,3}\Z")
_QUANTITY = st.from_regex(r"\A[0-9]{1,6}(\.[0-9]{1,3})?([KMGTPE]i|[kMGTPE])?\Z")


@settings(derandomize=True, max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lifecycle=st.fixed_dictionaries(
        {},
        optional={
            "maxAge": _DURATION,
            "maxSize": _QUANTITY,
            "keepVersions": st.integers(1, 2**31 - 1),
            "verify": st.booleans(),
        },
    )
)
def test_any_lifecycle_gives_a_command_expire_accepts(lifecycle: dict[str, Any], tmp_path: Path) -> None:
    spec = {
        "storage": {"pvc": {"claimName": "cache"}},
        "warmup": {"image": "trainer:1", "workloads": [{"name": "w", "entrypoint": "m:f"}], "discover": {}},
        "lifecycle": lifecycle,
    }
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir(exist_ok=True)
    command = expiryjob.expire_command(api.parse_spec(spec))
    assert ("--verify" in command) != ("--no-verify" in command)  # explicit either way
    code, err = _run_in_process(_runnable(command, cache_dir))
    assert code == 0, (command, err)
