"""Resolve ``MODULE:FUNC`` workload specs and call them for their targets."""

from __future__ import annotations

import importlib
import os
import re
import sys
from pathlib import Path

from compilecache.cache.errors import WarmError, one_line
from compilecache.jobtools.target import Target, check_target

_SPEC = re.compile(r"^(?P<module>[A-Za-z_][\w.]*):(?P<attr>[A-Za-z_][\w.]*)$")


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


def load_targets(spec: str) -> list[Target]:
    """Import the workload, call it and return its targets, or raise :class:`WarmError`.

    Call this only after the cache options are set: importing or calling a
    workload may already compile (e.g. initialising parameters).
    """
    module_name, attr_path = parse_spec(spec)
    # Like `python -m`, resolve workloads from the working directory too: a
    # console script's sys.path starts at its bin dir, not where the user is.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: object = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise WarmError(f"workload {spec}: cannot import module {module_name!r}: {error}") from error
    except Exception as error:
        raise WarmError(f"workload {spec}: importing {module_name!r} raised {one_line(error, limit=None)}") from error
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise WarmError(f"workload {spec}: module {module_name!r} has no attribute {attr_path!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise WarmError(f"workload {spec}: {attr_path!r} is a {type(obj).__name__}, not callable")
    try:
        produced = obj()
        values = list(produced)
    except Exception as error:
        raise WarmError(f"workload {spec} raised {one_line(error, limit=None)}") from error
    if not values:
        raise WarmError(f"workload {spec} returned no targets")
    return [check_target(value, spec) for value in values]
