"""A user's training entrypoint as every framework's warm-up runs it: checked, started, stopped.

An entrypoint is a script path (run as ``__main__``) or ``MODULE:FUNC`` (called with no
arguments). Shared by the frameworks' child processes (JAX's :mod:`compilecache.frameworks.jax.scriptrun`,
PyTorch's :mod:`compilecache.frameworks.pytorch.run`): the check before anything starts
(:func:`entry_problem`), the fresh scratch working directory each run gets (:func:`in_scratch`),
the imports as in the caller's directory (:func:`set_import_path`), and the run itself, which a
framework's step hook ends at a step boundary with :class:`StopWarm` (:func:`run_guarded`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import runpy
import sys
import tempfile
import traceback
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compilecache.cache.errors import WarmError, one_line

# What a script tests to skip uploads and other side effects outside its working directory during a
# warm-up (not its local checkpoint saves: JAX's resumed run restores them, see frameworks/jax/resume.py).
WARMUP_ENV = "COMPILECACHE_WARMUP"
# `--steps auto`: run whole epochs, bounded by a time budget instead of a step count.
AUTO = "auto"
# Seconds the auto mode runs after the first step returned. The shipped examples reach their first
# evaluation within a few seconds on a CPU; a real epoch may need more (`--budget`, workload `budget`).
DEFAULT_BUDGET = 120.0

_SPEC = re.compile(r"^(?P<module>[A-Za-z_][\w.]*):(?P<attr>[A-Za-z_][\w.]*)$")


class StopWarm(SystemExit):
    """Raised inside the training loop at a step boundary: the warm-up has what it needs."""

    def __init__(self, reason: str, step_fn: str) -> None:
        super().__init__(0)
        self.reason, self.step_fn = reason, step_fn


@dataclass(frozen=True)
class Launch:
    """One run of an entrypoint in its scratch directory: what the child process is started with."""

    target: str  # the entrypoint, a path made absolute
    env: dict[str, str]
    request: dict[str, Any]
    cwd: str


@contextlib.contextmanager
def in_scratch(entry: str, env: Mapping[str, str], request: Mapping[str, Any]) -> Iterator[Launch]:
    """A fresh scratch working directory under ``$TMPDIR`` for the runs of ``entry``, removed afterwards.

    What the script writes relative to its working directory (checkpoints, logs) is gone before
    the next run: verify's run never restores the warm run's checkpoint. ``COMPILECACHE_WARMUP=1``
    lets the script skip its uploads. A path entry is made absolute first: it is found where the
    caller saw it; the request carries how the user spelled it and the caller's directory.
    """
    origin = os.getcwd()
    target = str(Path(entry).resolve()) if is_path(entry) else entry
    with tempfile.TemporaryDirectory(prefix="compilecache-workdir-", ignore_cleanup_errors=True) as scratch:
        yield Launch(
            target=target,
            env={**env, WARMUP_ENV: "1", "PWD": scratch},
            request={**request, "shown": entry, "origin": origin},
            cwd=scratch,
        )


def run_in_scratch(
    module: str,
    request: Mapping[str, Any],
    env: Mapping[str, str],
    entry: str,
    entry_args: Sequence[str],
    timeout: float | None = None,
) -> tuple[int, dict[str, Any], str]:
    """Run ``module``'s child main on the entrypoint once, in a fresh scratch directory (:func:`in_scratch`)."""
    from compilecache.jobtools.childproc import run_child

    with in_scratch(entry, env, request) as launch:
        argv = [launch.target, *entry_args]
        return run_child(module, launch.request, launch.env, argv, timeout=timeout, cwd=launch.cwd)


def set_import_path(entry: str, origin: Any) -> None:
    """Imports as in the caller's working directory, although this process runs in a scratch one.

    ``python -m`` put the scratch directory first on ``sys.path``; the caller's directory takes its
    place (``MODULE:FUNC`` entries, and scripts importing code from the image's WORKDIR), and a
    script's own directory comes first, as ``python PATH`` does.
    """
    here = os.getcwd()
    sys.path[:] = [path for path in sys.path if path not in ("", here)]
    sys.path.insert(0, str(origin or here))  # run by hand (no origin): its own directory, as before
    if is_path(entry):
        sys.path.insert(0, str(Path(entry).resolve().parent))


def is_path(entry: str) -> bool:
    """Whether ``entry`` is a script path (else ``MODULE:FUNC``)."""
    return entry.endswith(".py") or "/" in entry or Path(entry).is_file()


def parse_spec(spec: str) -> tuple[str, str]:
    """Split ``pkg.module:func`` (``func`` may be dotted: ``Class.method``)."""
    match = _SPEC.match(spec)
    if match is None:
        raise WarmError(f"workload {spec!r} is not MODULE:FUNC (e.g. mypkg.train:targets)")
    return match["module"], match["attr"]


def entry_problem(entry: str, cwd: str) -> str | None:
    """Why ``--script ENTRY`` cannot run, on one line, or ``None``: checked before anything starts.

    A path must be a file; ``MODULE:FUNC`` must name a top-level module found from ``cwd`` or the
    installed packages. Only found, not imported: importing the user's code may compile, and the
    cache options are not set yet. A missing function is reported by the run itself.
    """
    from importlib.machinery import PathFinder

    path = Path(cwd, entry)
    if path.is_file():
        return None
    if path.is_dir():
        return f"script {entry} is a directory; give the training script's file or MODULE:FUNC"
    if entry.endswith(".py") or "/" in entry or _SPEC.match(entry) is None:
        return (
            f"script {entry} not found: no such file in {cwd}, and not MODULE:FUNC "
            "(give a script path, e.g. train.py, or a function, e.g. mypkg.train:main)"
        )
    module_name, _ = parse_spec(entry)
    top = module_name.split(".")[0]
    if top not in sys.builtin_module_names and PathFinder.find_spec(top, [cwd, *sys.path]) is None:
        return f"script {entry}: no module named {top!r} in {cwd} or the installed packages"
    return None


def run_guarded(entry: str, shown: str) -> tuple[int, str | None, StopWarm | None]:
    """Run the entrypoint in this process: its exit code, the one-line error, and the stop that ended it.

    A :class:`StopWarm` (ours, at a step boundary) is a success; the script's own ``SystemExit``
    gives its code; anything else it raises is exit 1, with the traceback on stderr.
    """
    try:
        _run_entry(entry)
    except StopWarm as stop:  # before SystemExit: StopWarm is one
        return 0, None, stop
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        return code, (f"script {shown} exited with status {code}" if code else None), None
    except BaseException as raised:
        traceback.print_exc()
        return 1, f"script {shown} raised {one_line(raised)}", None
    return 0, None, None


def _run_entry(entry: str) -> None:
    if is_path(entry):
        runpy.run_path(entry, run_name="__main__")
        return
    module_name, attr = parse_spec(entry)
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    obj()
