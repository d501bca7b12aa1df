"""The toy's training side: programs looked up in ``$TOY_CACHE_DIR``, and the trainer's verdict at exit.

A toy has no import hook of its own (JAX's verdict loads through ``jax_plugins``, PyTorch's at
``import torch``), so its training script calls :func:`program` for each program and :func:`step`
after each step, and importing this module arms the verdict when ``COMPILECACHE_REPORT`` is set:
at exit, one line on stderr and the shared trainer document (``compilecache.training.report``'s
schema, line and writer) in the termination log, which the operator's report reader counts.

A warm-up's runner (:mod:`.run`) sets :data:`on_step` to stop the script after its N-th step.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from compilecache.cache.cacheenv import DEFAULT_TERMINATION_LOG, REPORT, TERMINATION_LOG
from compilecache.training.report import NOT_WARMED, SCHEMA, fit, summary_line, write_termination_message
from toyframework import CACHE_DIR, FORMAT, READ_ONLY

SUFFIX = ".toy"
# A program name, and so every entry name, stays one plain file name.
PROGRAM = re.compile(r"[A-Za-z0-9_]{1,64}")
ENTRY = re.compile(r"[A-Za-z0-9_]{1,64}-[0-9a-f]{16}\.toy")
KEY_DIFFERS = f"warmed under another key: {FORMAT} differs"

requests = 0
hits = 0
missed: list[str] = []
on_step: Callable[[], None] | None = None


def entry_name(program_name: str, key_format: str) -> str:
    """``<name>-<16 hex>.toy``: the key hashes the program and the format, as a real key hashes its settings."""
    if PROGRAM.fullmatch(program_name) is None:
        raise ValueError(f"toy program {program_name[:80]!r} is not 1-64 letters, digits or '_'")
    return f"{program_name}-{hashlib.sha256(f'{program_name}|{key_format}'.encode()).hexdigest()[:16]}{SUFFIX}"


def program(name: str) -> bool:
    """Load ``name`` from the cache (a hit) or compile it (a miss: its file is written unless read-only)."""
    global requests, hits
    folder = Path(os.environ[CACHE_DIR])
    path = folder / entry_name(name, os.environ.get(FORMAT, ""))
    requests += 1
    if path.is_file():
        hits += 1
        return True
    missed.append(name)
    if os.environ.get(READ_ONLY) != "1":
        partial = path.with_name(f".{path.name}.tmp")
        partial.write_text(f"compiled {name}\n")
        partial.rename(path)  # whole or not at all, as the shared stores publish
    return False


def step() -> None:
    """A training step ended."""
    if on_step is not None:
        on_step()


def miss_reason(name: str, cache_dir: Path) -> str:
    """Another key's file for the same program: the settings differ; none at all: not warmed."""
    found = any(ENTRY.fullmatch(item.name) for item in cache_dir.glob(f"{name}-*{SUFFIX}"))
    return KEY_DIFFERS if found else NOT_WARMED


def verdict(total: int, hit: int, misses: Sequence[str], cache_dir: Path) -> dict[str, Any]:
    """The trainer's document, in the schema every framework's trainer writes."""
    reasons = [(name, miss_reason(name, cache_dir)) for name in misses]
    result = {
        "schema": SCHEMA,
        "requests": total,
        "hits": hit,
        "misses": total - hit,
        "missed": [{"name": name, "reason": reason} for name, reason in reasons[:10]],
        "summary": summary_line(total, hit, reasons, unit="programs", idle="no toy program was asked for"),
    }
    return fit(result)


def report() -> None:
    """The verdict line on stderr, and the document in the termination log (if empty, as the kubelet made it)."""
    result = verdict(requests, hits, missed, Path(os.environ.get(CACHE_DIR, ".")))
    print(result["summary"], file=sys.stderr, flush=True)
    write_termination_message(result, os.environ.get(TERMINATION_LOG, DEFAULT_TERMINATION_LOG))


if os.environ.get(REPORT) == "1":
    atexit.register(report)
