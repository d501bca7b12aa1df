"""PyTorch's side of the training runtime, loaded at ``import torch`` (the ``torch.backends`` entry point).

torch (2.5+) calls every entry point of that group at the end of ``import torch``
(``torch/__init__.py`` ``_import_device_backends``) and turns any exception into a failure of
``import torch`` itself, so :func:`initialize` never raises: one warning line on stderr instead.
It runs before the training script can compile anything, and does nothing at all (no copy, no
output) unless the process has ``COMPILECACHE_FRAMEWORK=pytorch`` (:mod:`compilecache.cache.cacheenv`).

1. The local copy. Inductor has no read-only mode (a read-only ``TORCHINDUCTOR_CACHE_DIR`` fails
   the first compile on its lock files), so with ``COMPILECACHE_TORCH_SOURCE`` set (the read-only
   mount, or ``gs://``) the published generations a trainer needs
   (:func:`compilecache.frameworks.pytorch.cache.pick_generations`) are copied into
   ``TORCHINDUCTOR_CACHE_DIR``, each file checked against its manifest's sha256
   (:func:`compilecache.frameworks.pytorch.store.fetch`); the copy's files, bytes and seconds are reported.
   Not in a warm-up (``COMPILECACHE_WARMUP=1``): its cache is its own staging folder.
2. The verdict. With ``COMPILECACHE_REPORT`` set, at exit: one line on stderr
   (``compilecache: 5/5 graphs hit``, torch's own FX graph and AOTAutograd counters) and the
   termination-message JSON in every trainer's schema (:mod:`compilecache.training.report`, whose
   summary line and writer it uses), so the operator reads both frameworks' reports alike. A miss
   names what differs from the warm-up's manifest (:func:`compilecache.frameworks.pytorch.cache.differences`):
   torch/triton/CUDA version, GPU, thread count, Inductor config. Torch's counters do not name the
   graph that missed, so a miss is named by its cache (``FX graph``, ``AOTAutograd entry``). When a
   graph hit, the generations copied are reported as used (``used``: :mod:`compilecache.cache.lastuse`),
   which keeps them past ``maxAge``.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from compilecache.cache.cacheenv import DEFAULT_TERMINATION_LOG, REPORT, TERMINATION_LOG
from compilecache.cache.errors import one_line
from compilecache.frameworks.pytorch.env import FRAMEWORK, TORCH_CACHE_DIR, TORCH_SOURCE
from compilecache.jobtools.entrypoint import WARMUP_ENV

# Set by the process that copied, inherited by the processes it starts (DataLoader workers under
# "spawn", the ranks torchrun starts): they import torch again, and must neither copy again over
# files a sibling may be loading nor write a 0/0 verdict into the pod's termination message first.
COPIED = "COMPILECACHE_TORCH_COPIED"
_TRUE = ("1", "true", "yes", "on")
NOT_WARMED = "not warmed: the cache has no PyTorch warm-up"
KEY_DIFFERS = "warmed under another key: the graph, its input shapes, strides or dtypes, or torch's own code differ"
COPY_FAILED = "the cache could not be copied at start"
CORRUPT = "entry corrupt: {n} published files differed from their manifest and were not copied"

_state: dict[str, Any] = {}  # what the copy did and which manifests it used, for the verdict


def initialize() -> None:
    """torch's entry-point call: copy the cache and arm the report when asked; never raises."""
    try:
        setup(os.environ)
    except Exception as error:  # a failing hook must not break `import torch`: training compiles cold
        _warn(error)


def _warn(error: Exception) -> None:
    print(
        f"compilecache: PyTorch cache hook failed, training compiles without the warm cache ({one_line(error)})",
        file=sys.stderr,
        flush=True,
    )


def setup(environ: Mapping[str, str]) -> None:
    """Do what ``environ`` asks (see the module's docstring); nothing without ``COMPILECACHE_FRAMEWORK=pytorch``."""
    if environ.get(FRAMEWORK) != "pytorch" or environ.get(WARMUP_ENV) == "1":
        return
    reporting = environ.get(REPORT, "").strip().lower() in _TRUE
    if reporting and not _state.get("armed"):
        # Armed before the copy: a copy that fails is then the reason the verdict gives for its misses.
        _state["armed"] = True
        # Loaded now, not at exit: importing concurrent.futures then fails (its exit hook is refused).
        import compilecache.frameworks.pytorch.cache
        import compilecache.training.report  # noqa: F401

        atexit.register(report_at_exit)
    source, local = environ.get(TORCH_SOURCE), environ.get(TORCH_CACHE_DIR)
    if source and local:
        inherited = environ.get(COPIED) == local
        _state["inherited"] = inherited
        try:
            copy_cache(source, Path(local), loud=reporting, copy=not inherited)
        except Exception as error:
            _state["copy_error"] = one_line(error)
            raise
        os.environ[COPIED] = local


def copy_cache(source: str, local: Path, *, loud: bool, copy: bool = True) -> None:
    """Copy the published generations from ``source`` into ``local`` (made if missing).

    ``copy=False`` (a parent process copied already): only read the manifests, for the verdict.
    """
    from compilecache.cache.manifests import TORCH_SCHEMA
    from compilecache.cache.store import open_store
    from compilecache.frameworks.pytorch.cache import pick_generations
    from compilecache.frameworks.pytorch.store import fetch

    if source.rstrip("/") == str(local).rstrip("/"):
        raise ValueError(f"{TORCH_CACHE_DIR} is the published cache itself ({source}); it must be a local copy")
    store = open_store(source)
    manifests = store.read_manifests()
    torch = sys.modules.get("torch")
    picked = pick_generations(manifests.of(TORCH_SCHEMA), str(getattr(torch, "__version__", "")) or None)
    _state["manifests"] = picked
    _state["problems"] = manifests.problems
    if not copy:
        return
    for line in manifests.problems:  # the other warm-ups are copied: one bad manifest costs only its own
        print(f"compilecache: {line}", file=sys.stderr, flush=True)
    local.mkdir(parents=True, exist_ok=True)
    fetched = fetch(store, picked, local)
    _state["copy"] = {"files": fetched.files, "bytes": fetched.bytes, "seconds": round(fetched.seconds, 3)}
    _state["refused"] = fetched.refused or {}
    if loud or fetched.refused:
        refused = ""
        if fetched.refused:
            named = "; ".join(f"{name}: {why}" for name, why in list(fetched.refused.items())[:3])
            more = f"; +{len(fetched.refused) - 3} more" if len(fetched.refused) > 3 else ""
            refused = f"; {len(fetched.refused)} files refused ({named}{more})"
        found = f"{len(picked)} warm-up(s)" if picked else "no PyTorch warm-up found"
        print(
            f"compilecache: copied {fetched.files} files ({fetched.bytes} bytes) of the PyTorch cache from {source} "
            f"to {local} in {fetched.seconds:.2f}s ({found}){refused}",
            file=sys.stderr,
            flush=True,
        )


def report_at_exit() -> None:
    """Print the verdict and write the termination message (never raises)."""
    from compilecache.training.report import write_termination_message

    try:
        result = current_verdict()
        if _state.get("inherited") and not result["requests"]:
            return  # a worker process that compiled nothing: its parent reports
    except Exception as error:  # a report must never turn a clean run into a traceback
        print(f"compilecache: no report ({type(error).__name__}: {error})", file=sys.stderr, flush=True)
        return
    print(result["summary"], file=sys.stderr, flush=True)
    write_termination_message(result, os.environ.get(TERMINATION_LOG, DEFAULT_TERMINATION_LOG))


def current_verdict() -> dict[str, Any]:
    """This process's counts (torch's counters; none if Dynamo never loaded) against the manifests it copied."""
    from compilecache.frameworks.pytorch.cache import graph_counts

    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None) or {}
    counts = graph_counts({key: dict(value) for key, value in counters.items()})
    here: dict[str, Any] = {}
    if counts["misses"]:
        from compilecache.frameworks.pytorch.cache import current_facts

        here = current_facts()
    return verdict(
        counts,
        here,
        _state.get("manifests") or [],
        _state.get("refused") or {},
        _state.get("copy"),
        copy_error=_state.get("copy_error"),
    )


def verdict(
    counts: Mapping[str, int],
    here: Mapping[str, Any],
    manifests: Sequence[Mapping[str, Any]],
    refused: Mapping[str, str],
    copy: Mapping[str, Any] | None = None,
    *,
    copy_error: str | None = None,
) -> dict[str, Any]:
    """The termination-message JSON (pure), in :data:`compilecache.training.report.SCHEMA`.

    ``copy_error``: why the hook could not copy the cache, if it could not: every miss's reason.
    """
    from compilecache.cache.lastuse import report_fields, use_key
    from compilecache.training.report import SCHEMA, fit, summary_line

    reason = f"{COPY_FAILED}: {copy_error}" if copy_error else miss_reason(here, manifests, refused)
    reasons = [("FX graph", reason)] * int(counts.get("fx_misses", 0)) + [("AOTAutograd entry", reason)] * int(
        counts.get("aot_misses", 0)
    )
    line = summary_line(
        int(counts["requests"]),
        int(counts["hits"]),
        reasons,
        unit="graphs",
        idle="no torch.compile graph reached the cache",
    )
    if copy is not None:
        line += f" (local copy: {copy['files']} files, {copy['bytes']} bytes in {copy['seconds']:.2f}s)"
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "framework": "pytorch",
        "requests": int(counts["requests"]),
        "hits": int(counts["hits"]),
        "misses": int(counts["misses"]),
        "missed": [{"name": name, "reason": why[:300]} for name, why in dict.fromkeys(reasons)],
        "summary": line[:1500],
    }
    if copy is not None:
        result["copy"] = dict(copy)
    if int(counts["hits"]) > 0:
        # Torch's counters do not say which generation a hit came from: each one it copied was in use,
        # and the use keeps it past maxAge (cache.lastuse: the generation by its run id).
        runs = [str(m["run_id"]) for m in manifests if isinstance(m.get("run_id"), str)]
        result |= report_fields(use_key(run) for run in runs)
    return fit(result)


def miss_reason(here: Mapping[str, Any], manifests: Sequence[Mapping[str, Any]], refused: Mapping[str, str]) -> str:
    """Why graphs missed: the first key setting that differs from the warm-up's, damaged files, or another key."""
    from compilecache.frameworks.pytorch.cache import differences

    if not manifests:
        return NOT_WARMED
    newest = max(manifests, key=lambda m: str(m.get("run_id")))
    differing = differences(here, newest.get("facts") or {})
    if differing:
        return differing[0]
    if refused:
        return CORRUPT.format(n=len(refused))
    return KEY_DIFFERS
