"""Resolve ``MODULE:FUNC`` workload specs and call them for their targets."""

from __future__ import annotations

import importlib
import os
import sys

from compilecache.cache.errors import WarmError, one_line
from compilecache.frameworks.jax.target import Target, check_target
from compilecache.jobtools.entrypoint import parse_spec


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
