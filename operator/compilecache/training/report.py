"""A trainer's verdict as every framework reports it: one line, and one JSON document at exit.

Shared by each framework's training-side hook (JAX's :mod:`compilecache.frameworks.jax.verdict`,
loaded as a ``jax_plugins`` entry point; PyTorch's :mod:`compilecache.frameworks.pytorch.hook`,
loaded at ``import torch``): the document's schema, the summary line, its fit in a termination
message, and the write; which entries it used (``used``, ``usedMore``: :mod:`compilecache.cache.lastuse`).
The operator reads the document back from the pod's status
(:mod:`compilecache.controller.reports`), whatever framework wrote it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from compilecache.cache import lastuse
from compilecache.cache.errors import cut

SCHEMA = "compilecache.dev/trainer/v1"
NOT_WARMED = "not warmed"
MAX_NAMED = 5  # distinct function names per reason in the one line; the rest are "+k more functions"
MAX_BYTES = 4096  # Kubernetes truncates a termination message beyond this


def summary_line(
    requests: int,
    hits: int,
    reasons: Sequence[tuple[str, str]],
    unnamed: int = 0,
    *,
    unit: str = "compiles",
    idle: str = "no compile used the persistent cache",
) -> str:
    """``compilecache: 10/26 compiles hit; missed: train_step ×2 (XLA_FLAGS differs: ...), eval_step (not warmed)``.

    ``unit`` and ``idle`` (what ``0/0`` means) are the framework's words: PyTorch's verdict counts graphs.
    """
    line = f"compilecache: {hits}/{requests} {unit} hit"
    if requests == 0:
        return line + f" ({idle})"
    groups: dict[str, list[str]] = {}
    for name, reason in reasons:
        groups.setdefault(reason, []).append(name)
    parts = []
    for reason in sorted(groups, key=lambda r: r.startswith(NOT_WARMED)):  # the informative reasons first
        parts.append(f"{functions_named(groups[reason])} ({reason})")
    if unnamed:
        parts.append(f"{_programs(unnamed)} (not named: JAX's miss log was off)")
    if parts:
        line += "; missed: " + ", ".join(parts)
    return cut(line, 1500)


def functions_named(names: Sequence[str], limit: int = MAX_NAMED) -> str:
    """``train_step ×2, eval_step, +3 more functions``: each distinct function once, with how many of
    its programs missed, never a bare count; past ``limit`` distinct functions, the first ``limit``
    and how many more (a user acts on a name: two misses of one reason are often one function)."""
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    shown = [name if count == 1 else f"{name} ×{count}" for name, count in list(counts.items())[:limit]]
    more = len(counts) - limit
    if more > 0:
        shown.append(f"+{more} more function" + ("" if more == 1 else "s"))
    return ", ".join(shown)


def fit(result: dict[str, Any]) -> dict[str, Any]:
    """Drop missed items, then used keys (counted in ``usedMore``), until the JSON is under :data:`MAX_BYTES`."""
    while len(json.dumps(result).encode()) >= MAX_BYTES and result["missed"]:
        result["missed"].pop()
    while len(json.dumps(result).encode()) >= MAX_BYTES and result.get(lastuse.USED):
        result[lastuse.USED] = result[lastuse.USED][: -lastuse.KEY_CHARS]
        result[lastuse.USED_MORE] = int(result.get(lastuse.USED_MORE) or 0) + 1
    if result.get(lastuse.USED) == "":
        del result[lastuse.USED]
    if len(json.dumps(result).encode()) >= MAX_BYTES:
        result["summary"] = cut(result["summary"], 500)
    return result


def write_termination_message(result: Mapping[str, Any], path: str) -> bool:
    """Write ``result`` to ``path`` if it exists, is writable and empty; whether it did."""
    try:
        if not os.path.exists(path):  # the kubelet creates it; elsewhere there is nothing to write
            return False
        if not os.access(path, os.W_OK) or os.path.getsize(path) > 0:
            return False
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(result, separators=(",", ":")))
        return True
    except OSError:
        return False


def _programs(count: int) -> str:
    return f"{count} program" if count == 1 else f"{count} programs"


def sides(training: str, warm_up: str) -> str:
    """``float32[32,16] in training, float32[64,16] in the warm-up``: how every difference names its two
    values, training's (or verify's fresh run of training's call) first, each with whose it is."""
    return f"{training} in training, {warm_up} in the warm-up"
