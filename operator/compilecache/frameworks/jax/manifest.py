"""JAX's run manifests (stored in the cache) and reports (``--report``): pure functions.

One manifest per run, under ``DIR/.compilecache/manifests/<run_id>.json``
(:func:`compilecache.jobtools.manifest.manifest_name`), in :data:`~compilecache.cache.manifests.JAX_SCHEMA`:
what each target compiled, hit and wrote, with each entry's size and sha256, and the facts of
the build. The expiry reads ``entries`` (what a run wrote) and ``hits`` (what it re-produced)
together; the trainer's verdict reads the signatures and key settings to name a miss.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from compilecache.cache.manifests import JAX_SCHEMA as MANIFEST_SCHEMA
from compilecache.cache.store import StagedEntry
from compilecache.frameworks.jax import keysettings
from compilecache.frameworks.jax.compiler import TargetRun
from compilecache.jobtools.manifest import COMPLETE, REPORT_SCHEMA


def target_record(run: TargetRun, sizes: Mapping[str, int]) -> dict[str, Any]:
    """The report's view of one target: timing, counts and the entry files it added."""
    written = [f"{key}-cache" for key in run.keys_written if f"{key}-cache" in sizes]
    return {
        "name": run.name,
        "workload": run.workload,
        "compile_seconds": round(run.compile_seconds, 4),
        "requests": run.requests,
        "hits": run.hits,
        "misses": run.misses,
        "hit": run.hit,
        "entries_written": written,
        "bytes": sum(sizes[name] for name in written),
        "cache_keys": sorted(set(run.keys_hit) | set(run.keys_missed) | set(run.keys_written)),
        "key_components": dict(run.key_components),
        # What was lowered: verify and trainers name the first difference from it on a miss.
        "signature": dict(run.signature),
        # Exact mode: each program the entrypoint compiled (by module name), for the trainer's miss reasons.
        **({"signatures": dict(run.signatures)} if run.signatures else {}),
        # Exact mode: which function's calls are the steps, and how many the warm-up ran ("auto": a budget).
        **({"step_fn": run.step_fn, "steps": run.steps} if run.step_fn else {}),
    }


def build_manifest(
    *,
    run_id: str,
    cache_dir: str,
    facts: Mapping[str, Any],
    runs: Sequence[TargetRun],
    staged: Sequence[StagedEntry],
    started_at: str,
    finished_at: str,
    workloads: Sequence[str],
    verify: Mapping[str, Any] | None = None,
    repaired: Mapping[str, str] | None = None,
    group: Mapping[str, Any] | None = None,
    state: str = COMPLETE,
    image: str | None = None,
) -> dict[str, Any]:
    """Every entry this run wrote (size, sha256, versions, device, workload, target,
    compile seconds, time) and every entry it hit, plus the per-target records. ``image``: the
    image the warm-up Job ran (``cacheenv.IMAGE``), which expiry ranks for keepVersions."""
    sizes = {entry.name: entry.size for entry in staged}
    owner = _entry_owners(runs)
    entries = []
    for entry in staged:
        run = owner.get(entry.name)
        entries.append(
            {
                "file": entry.name,
                "size": entry.size,
                "sha256": entry.sha256,
                "published": entry.published,
                **_versions(facts),
                "workload": run.workload if run else "",
                "target": run.name if run else "",
                "compile_seconds": round(run.compile_seconds, 4) if run else None,
                "written_at": finished_at,
            }
        )
    # A member of a multi-host group: {"run_id": the group's, "process": k, "processes": N}.
    placed = {} if group is None else {"group": dict(group)}
    return {
        "schema": MANIFEST_SCHEMA,
        "run_id": run_id,
        "state": state,
        **placed,
        "cache_dir": cache_dir,
        "started_at": started_at,
        "finished_at": finished_at,
        "workloads": list(workloads),
        **({"image": image} if image else {}),
        **_versions(facts),
        # The key-relevant settings the run compiled under (compilecache.frameworks.jax.keysettings.current).
        "settings": dict(facts.get("settings") or {}),
        "entries": entries,
        "hits": list(_hit_records(runs, finished_at)),
        "targets": [target_record(run, sizes) for run in runs],
        "verify": dict(verify) if verify is not None else None,
        # Damaged published entries this run found and replaced with its own (listed under entries).
        "repaired": [{"file": name, "reason": why} for name, why in sorted((repaired or {}).items())],
    }


def build_report(manifest: Mapping[str, Any], manifest_path: str | None, error: str | None) -> dict[str, Any]:
    """The ``--report`` JSON: per-target records, totals, versions and the outcome."""
    entries = manifest.get("entries", [])
    return {
        "schema": REPORT_SCHEMA,
        "ok": error is None,
        "error": error,
        "run_id": manifest.get("run_id"),
        "cache_dir": manifest.get("cache_dir"),
        "manifest": manifest_path,
        **{key: manifest.get(key) for key in ("jax", "jaxlib", "backend", "device_kind", "device_count")},
        # The PJRT plugin and platform version are in the key too (keysettings): the report names them.
        **{key: (manifest.get("settings") or {}).get(key) for key in ("pjrt_plugins", "platform_version")},
        "targets": list(manifest.get("targets", [])),
        "entries": len(entries),
        "bytes": sum(int(entry["size"]) for entry in entries),
        "hits": len(manifest.get("hits", [])),
        "verify": manifest.get("verify"),
        "repaired": list(manifest.get("repaired", [])),
        "started_at": manifest.get("started_at"),
        "finished_at": manifest.get("finished_at"),
        **{key: value for key, value in (manifest.get("group") or {}).items() if key in ("process", "processes")},
    }


def _versions(facts: Mapping[str, Any]) -> dict[str, Any]:
    return {key: facts.get(key) for key in keysettings.PLATFORM}


def _entry_owners(runs: Iterable[TargetRun]) -> dict[str, TargetRun]:
    owners: dict[str, TargetRun] = {}
    for run in runs:
        for key in run.keys_written:
            owners.setdefault(f"{key}-cache", run)
    return owners


def _hit_records(runs: Iterable[TargetRun], at: str) -> Iterable[dict[str, Any]]:
    # A hit re-produces an entry as surely as a write: expiry keeps both alive.
    for run in runs:
        for key in dict.fromkeys(run.keys_hit):
            yield {"file": f"{key}-cache", "workload": run.workload, "target": run.name, "at": at}
