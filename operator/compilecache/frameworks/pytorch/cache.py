"""The PyTorch cache format: generations, what gets published, the key settings, which generation a trainer takes.

``torch.compile``'s Inductor writes a tree into ``TORCHINDUCTOR_CACHE_DIR``: FX graph entries
(``fxgraph/``), AOTAutograd entries (``aotautograd/``), compiled kernels (``<2 chars>/c<hash>.so``
with their ``.cpp``, wrapper ``.py`` files, ``triton/`` on a GPU) and, while it runs, ``locks/*.lock``
and ``.<pid>.<tid>.tmp`` files of ``write_atomic``. Unlike JAX's flat ``<key>-cache`` files, one
graph's entries point at each other (an AOTAutograd entry names its FX graph keys; an FX entry loads
a kernel ``.so`` by path), so a cache is only sound as a whole tree from one run.

Publishing therefore works by *generation*: each warm-up run writes its own tree under
``DIR/torch/<run_id>/`` (a local run renames its checked staging folder there, one atomic
``rename`` on the cache's filesystem; a GCS run uploads each file, and an object appears whole or
not at all), and only then stores its manifest (:data:`MANIFEST_SCHEMA`) under
``DIR/.compilecache/manifests/`` — the manifest, written whole or not at all, is the switch: a
generation without a complete manifest is invisible to trainers, and expiry removes it. Two
warm-ups never write one folder, so they never mix (pytorch/pytorch#162432: concurrent writers
corrupted shared caches). Generations rather than per-file renames into one shared tree, because a
shared tree would let a trainer copy an FX entry of one run with the kernels of another.

Pure functions here; the I/O is in :mod:`compilecache.frameworks.pytorch.store`, the torch-reading part
(:func:`current_facts`) imports torch late.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Collection, Iterable, Mapping, Sequence
from importlib import metadata
from typing import Any

# The schema's one definition, with its checker, is compilecache.cache.manifests's.
from compilecache.cache.manifests import TORCH_SCHEMA as MANIFEST_SCHEMA
from compilecache.cache.store import META_DIR
from compilecache.training.report import sides

FRAMEWORK = "pytorch"
GENERATIONS_DIR = "torch"  # DIR/torch/<run_id>/: one warm-up run's whole Inductor tree
LOCKS_DIR = "locks"
# Inductor's write_atomic (torch/_inductor/codecache.py) writes ".<pid>.<thread id>.tmp" then renames.
TMP_SUFFIX = ".tmp"
# Triton's FileCacheManager (triton/runtime/cache.py) writes into "tmp.pid_<pid>_<random>/" and renames
# each file out of it; a killed compile leaves the folder.
TRITON_TMP_PREFIX = "tmp.pid_"
LOCK_SUFFIX = ".lock"
# Generated C++ sources: Inductor compiles each into the ``.so`` beside it and loads the ``.so`` by
# path. A source without its ``.so`` is a compile that never finished (gcc killed): stale.
SOURCE_SUFFIXES = (".cpp", ".h")
COMPILED_SUFFIX = ".so"
# Settings of ours torch does not hash into a key (the cache's location is no part of a key: a
# copy at another path hits, measured with torch 2.13).
NOT_IN_KEY_ENV = frozenset({"TORCHINDUCTOR_CACHE_DIR"})
# The facts a manifest records and a trainer compares, in the order a miss names them.
LABELS = {
    "torch": "torch version",
    "triton": "triton version",
    "cuda": "CUDA version",
    "gpu": "GPU",
    "threads": "thread count",
    "inductor_config": "Inductor config",
    "inductor_env": "TORCHINDUCTOR_* settings",
    "job_id": "TORCH_COMPILE_JOB_ID",
    "visible_devices": "CUDA_VISIBLE_DEVICES",
}


def generation_dir(run_id: str) -> str:
    """``torch/<run_id>``: where a run's tree is published, relative to the cache root."""
    return f"{GENERATIONS_DIR}/{run_id}"


def unpublishable(name: str, present: Collection[str]) -> str | None:
    """Why a file of a warm-up's tree (a path relative to it) must not be published, or None.

    ``present``: every file of the tree, to tell a stale source from one whose ``.so`` is there.
    """
    parts = name.split("/")
    base = parts[-1]
    if parts[0] == LOCKS_DIR or base.endswith(LOCK_SUFFIX):
        return "lock file"
    if base.endswith(TMP_SUFFIX) or any(part.startswith(TRITON_TMP_PREFIX) for part in parts[:-1]):
        return "temporary file of a write never finished"
    if parts[0] == META_DIR:
        return "not Inductor's"
    if base.endswith(SOURCE_SUFFIXES) and not _compiled_sibling(name, present):
        return "stale generated source: its compiled .so is missing"
    return None


def _compiled_sibling(name: str, present: Collection[str]) -> bool:
    stem = name.rsplit(".", 1)[0]
    if name.endswith(".h"):  # headers go with the kernel of the same stem, whatever its suffixes
        return any(other.startswith(stem) and other.endswith(COMPILED_SUFFIX) for other in present)
    return f"{stem}{COMPILED_SUFFIX}" in present


def split_publishable(names: Iterable[str]) -> tuple[list[str], dict[str, str]]:
    """(files to publish, file → why not) for a warm-up's tree."""
    present = set(names)
    keep, drop = [], {}
    for name in sorted(present):
        why = unpublishable(name, present)
        if why is None:
            keep.append(name)
        else:
            drop[name] = why
    return keep, drop


def graph_counts(counters: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """Lookups, hits and misses of the FX graph and AOTAutograd caches from torch's counters.

    ``torch._dynamo.utils.counters``: ``inductor.fxgraph_cache_{hit,miss}`` (torch/_inductor/codecache.py)
    and ``aot_autograd.autograd_cache_{hit,miss}`` (torch/_functorch/_aot_autograd/autograd_cache.py),
    as named in torch 2.13. A *bypass* (a graph the cache cannot hold) is counted apart: no warm-up helps it.
    """
    inductor, aot = counters.get("inductor") or {}, counters.get("aot_autograd") or {}
    hits = int(inductor.get("fxgraph_cache_hit", 0)) + int(aot.get("autograd_cache_hit", 0))
    misses = int(inductor.get("fxgraph_cache_miss", 0)) + int(aot.get("autograd_cache_miss", 0))
    bypass = int(inductor.get("fxgraph_cache_bypass", 0)) + int(aot.get("autograd_cache_bypass", 0))
    return {
        "requests": hits + misses,
        "hits": hits,
        "misses": misses,
        "bypassed": bypass,
        "fx_hits": int(inductor.get("fxgraph_cache_hit", 0)),
        "fx_misses": int(inductor.get("fxgraph_cache_miss", 0)),
        "aot_hits": int(aot.get("autograd_cache_hit", 0)),
        "aot_misses": int(aot.get("autograd_cache_miss", 0)),
    }


def differences(here: Mapping[str, Any], warmed: Mapping[str, Any]) -> list[str]:
    """One line per key setting that differs, ``here`` (training) against the warm-up's, as
    :func:`compilecache.frameworks.jax.keysettings.differences` phrases JAX's: ``thread count differs: 2 in training,
    1 in the warm-up``. Settings either side lacks are skipped."""
    lines = []
    for key, label in LABELS.items():
        if key not in here or key not in warmed or here[key] == warmed[key]:
            continue
        if key == "inductor_env":
            mine, theirs = dict(here[key] or {}), dict(warmed[key] or {})
            changed = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
            shown = ", ".join(f"{k} {sides(mine.get(k, '(unset)'), theirs.get(k, '(unset)'))}" for k in changed[:3])
            lines.append(f"{label} differ: {shown}")
        else:
            lines.append(f"{label} differs: {sides(_shown(here[key]), _shown(warmed[key]))}")
    return lines


def _shown(value: Any) -> str:
    return "(none)" if value is None or value == "" else str(value)


def pick_generations(manifests: Sequence[Mapping[str, Any]], torch_version: str | None) -> list[Mapping[str, Any]]:
    """The generations a trainer copies: per workload, the newest complete PyTorch manifest, preferring
    those of this torch version (another version's entries can never hit, but are still taken when
    no other exists, so that the verdict names the version instead of "not warmed")."""
    complete = [
        m for m in manifests if m.get("schema") == MANIFEST_SCHEMA and m.get("state") == "complete" and m.get("run_id")
    ]
    by_workload: dict[str, list[Mapping[str, Any]]] = {}
    for manifest in complete:
        by_workload.setdefault(str(manifest.get("workload") or ""), []).append(manifest)
    picked = []
    for found in by_workload.values():
        matching = [m for m in found if (m.get("facts") or {}).get("torch") == torch_version] or found
        picked.append(max(matching, key=lambda m: str(m.get("run_id"))))
    return sorted(picked, key=lambda m: str(m.get("run_id")))


def manifest_entries(manifest: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """A manifest's files (relative to its generation) → their record (size, sha256)."""
    found = {}
    for entry in manifest.get("entries") or []:
        if isinstance(entry, Mapping) and isinstance(entry.get("file"), str):
            found[entry["file"]] = entry
    return found


def config_hash(config: Mapping[str, Any]) -> str:
    """A short, stable hash of Inductor's portable config (what its FX graph key hashes)."""
    text = json.dumps({str(k): repr(v) for k, v in config.items()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def inductor_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``TORCHINDUCTOR_*`` settings other than the cache's location: read into Inductor's config."""
    return {k: v for k, v in sorted(environ.items()) if k.startswith("TORCHINDUCTOR_") and k not in NOT_IN_KEY_ENV}


def current_facts() -> dict[str, Any]:
    """This process's key settings (imports torch): versions, GPU, threads, Inductor config, job id.

    The GPU is asked only when CUDA is initialised already (or when asked for here, in a warm-up
    child that compiled on it): initialising CUDA from a report would break a training's forks.
    """
    import torch

    gpu = "cpu"
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        gpu = str(torch.cuda.get_device_name(torch.cuda.current_device()))
    try:
        from torch._inductor import config as inductor_config

        portable = inductor_config.save_config_portable()
        hashed: str | None = config_hash(portable)
    except Exception:  # a private API that may move: the other facts stand
        hashed = None
    return {
        "torch": str(torch.__version__),
        "triton": _installed("triton") or _installed("pytorch-triton"),
        "cuda": torch.version.cuda,
        "gpu": gpu,
        "threads": int(torch.get_num_threads()),
        "inductor_config": hashed,
        "inductor_env": inductor_env(os.environ),
        "job_id": os.environ.get("TORCH_COMPILE_JOB_ID") or None,
        "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES") or None,
    }


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
