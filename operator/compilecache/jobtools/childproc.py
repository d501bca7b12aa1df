"""Run a fresh Python process for the warmer and read back its JSON result.

A fresh process is the point of ``--verify`` (nothing in memory) and the only
way to give a ``--script`` its own interpreter; both talk to the parent
through a JSON file under ``$TMPDIR`` (the one writable place besides the cache).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def run_child(
    module: str,
    request: Mapping[str, Any],
    env: Mapping[str, str],
    extra: Sequence[str] = (),
    timeout: float | None = None,
    cwd: str | None = None,
) -> tuple[int, dict[str, Any], str]:
    """Run ``python -m module REQUEST RESULT [extra...]`` (in ``cwd``); return (exit code, result, stderr tail).

    Past ``timeout`` seconds the child is killed: exit code 124, and the result says so.
    """
    with tempfile.TemporaryDirectory(prefix="compilecache-") as scratch:
        request_path = Path(scratch) / "request.json"
        result_path = Path(scratch) / "result.json"
        request_path.write_text(json.dumps(request))
        try:
            completed = subprocess.run(
                [sys.executable, "-m", module, str(request_path), str(result_path), *extra],
                env=dict(env),
                cwd=cwd,
                stdout=None,
                stderr=subprocess.PIPE,
                text=True,
                check=False,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as expired:  # subprocess.run has killed it
            stderr = expired.stderr.decode(errors="replace") if isinstance(expired.stderr, bytes) else ""
            return 124, {"error": f"{module} did not finish within {timeout:.0f}s (killed)"}, _tail(stderr)
        result: dict[str, Any] = json.loads(result_path.read_text()) if result_path.exists() else {}
    return completed.returncode, result, _tail(completed.stderr)


def write_result(path: str, result: Mapping[str, Any]) -> None:
    """Write a child's result atomically (the parent may read a killed child's dir)."""
    temporary = f"{path}.tmp"
    Path(temporary).write_text(json.dumps(result))
    os.replace(temporary, path)


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])
