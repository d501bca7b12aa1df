"""The lifecycle policy on PyTorch generations: listing + manifests + policy + ``now`` → deletions (pure).

The PyTorch counterpart of :func:`compilecache.cache.expiry.plan_expiry`, with its
:class:`~compilecache.cache.expiry.Policy`, :class:`~compilecache.cache.expiry.Deletion`,
:class:`~compilecache.cache.expiry.Plan` and rule names, so ``compilecache expire`` prints and
reports both frameworks alike. The unit is a *generation* (one warm-up run's tree,
:mod:`compilecache.frameworks.pytorch.cache`): its files point at each other, so age, size and versions
take or keep a generation whole. Rules, in order (a generation or file is taken once):

1. ``integrity``: what killed runs left (:func:`compilecache.cache.expiry.leftovers`: staging,
   temporary manifests); a generation with no complete manifest (its publish never finished) once
   untouched for the staging grace; inside a generation, lock files, ``*.tmp`` files, stale
   generated sources and files its manifest does not list; with ``verify``, files whose size or
   sha256 differs from the manifest (found by the caller: ``damaged``), one by one — a trainer's
   copy then lacks that file and compiles that graph again instead of loading damaged bytes;
2. ``keepVersions``: per platform (GPU name, or cpu) the generations of all but the N most recently
   warmed builds (torch, CUDA, triton); and always a generation superseded by a newer one of the
   same workload and settings (trainers take the newest only) once the newer one is older than the
   grace period, so that a trainer copying the older one meanwhile finishes;
3. ``maxAge``: generations whose warm-up finished, and that no trainer used since
   (``Policy.used``, keyed by run id: :mod:`compilecache.cache.lastuse`), longer ago than the age;
4. ``maxSize``: the oldest generations first, until the rest fits.

Nothing younger than the grace period is deleted.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from compilecache.cache.expiry import (
    INTEGRITY,
    KEEP_VERSIONS,
    MAX_AGE,
    MAX_SIZE,
    Deletion,
    Plan,
    Policy,
    _age,  # one phrasing of ages for both frameworks
    leftovers,
)
from compilecache.cache.lastuse import used_at
from compilecache.cache.store import Listing, StoredFile
from compilecache.frameworks.pytorch.cache import GENERATIONS_DIR, MANIFEST_SCHEMA, manifest_entries, unpublishable


def torch_manifests(manifests: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """run id → its complete PyTorch manifest."""
    return {
        str(m["run_id"]): m
        for m in manifests
        if m.get("schema") == MANIFEST_SCHEMA and m.get("state") == "complete" and m.get("run_id")
    }


def plan_torch_expiry(
    listing: Listing,
    generations: Mapping[str, Sequence[StoredFile]],
    manifests: Mapping[str, Mapping[str, Any]],
    policy: Policy,
    now: float,
    damaged: Mapping[str, str] | None = None,
) -> Plan:
    """What to delete and why; ``damaged``: file (named from the cache root) → why its bytes differ."""
    damaged = damaged or {}
    deletions: list[Deletion] = list(leftovers(listing, policy, now))
    gone: set[str] = set()  # run ids taken whole
    size = {run: sum(item.size for item in files) for run, files in generations.items()}
    finished = {run: _time(manifests[run].get("finished_at")) for run in generations if run in manifests}

    def take(run: str, rule: str, reason: str) -> None:
        gone.add(run)
        deletions.append(Deletion(f"{GENERATIONS_DIR}/{run}", size[run], rule, reason))

    def young(run: str) -> bool:
        return now - finished[run] < policy.grace_seconds

    # 1. integrity
    for run, files in sorted(generations.items()):
        if run not in manifests:
            touched = max((item.mtime for item in files), default=0.0)
            if now - touched >= policy.staging_grace_seconds:
                take(run, INTEGRITY, "generation with no complete manifest: its publish never finished")
            continue
        listed = manifest_entries(manifests[run])
        prefix = f"{GENERATIONS_DIR}/{run}/"
        present = {item.name[len(prefix) :] for item in files}
        for item in files:
            inner = item.name[len(prefix) :]
            why = unpublishable(inner, present)
            if why is None and inner not in listed:
                why = "not in its generation's manifest"
            if why is None and item.name in damaged:
                why = damaged[item.name]
            if why is not None and (now - item.mtime >= policy.grace_seconds or item.name in damaged):
                deletions.append(Deletion(item.name, item.size, INTEGRITY, why))
    alive = [run for run in sorted(finished) if run not in gone and not young(run)]

    # 2. keepVersions (per platform) and superseded generations
    if policy.keep_versions:
        newest: dict[str, dict[tuple[str, ...], float]] = defaultdict(dict)
        for run in finished:
            platform, build = _platform(manifests[run]), _build(manifests[run])
            newest[platform][build] = max(newest[platform].get(build, 0.0), finished[run])
        kept = {
            (platform, build)
            for platform, builds in newest.items()
            for build in sorted(builds, key=lambda b: (builds[b], b), reverse=True)[: policy.keep_versions]
        }
        for run in list(alive):
            if (_platform(manifests[run]), _build(manifests[run])) not in kept:
                facts = manifests[run].get("facts") or {}
                take(
                    run,
                    KEEP_VERSIONS,
                    f"build torch {facts.get('torch')} (CUDA {facts.get('cuda')}) is not among the "
                    f"{policy.keep_versions} newest on {_platform(manifests[run])}",
                )
    for run in [r for r in alive if r not in gone]:
        newer = [
            other
            for other in finished
            if other != run and finished[other] > finished[run] and _same_kind(manifests[other], manifests[run])
        ]
        settled = [other for other in newer if not young(other)]
        if settled:
            take(
                run, KEEP_VERSIONS, f"superseded by the newer warm-up {max(settled)} of the same workload and settings"
            )

    # 3. maxAge: from the warm-up's end, or a trainer's later use of the generation (lastuse: its run id)
    if policy.max_age_seconds is not None:
        used = dict(used_at(finished, policy.used))
        for run in [r for r in alive if r not in gone]:
            last = max(finished[run], min(used.get(run, 0.0), now))
            if now - last > policy.max_age_seconds:
                what = "used by training" if last > finished[run] else "warmed"
                take(run, MAX_AGE, f"{what} {_age(now - last)} ago, older than maxAge")

    # 4. maxSize: oldest first
    if policy.max_size_bytes is not None:
        total = sum(size[run] for run in generations if run not in gone)
        for run in sorted((r for r in alive if r not in gone), key=lambda r: finished[r]):
            if total <= policy.max_size_bytes:
                break
            take(run, MAX_SIZE, f"oldest generation while the cache ({total} bytes) exceeds maxSize")
            total -= size[run]

    # A file deletion inside a generation taken whole is redundant: the generation goes.
    deletions = [d for d in deletions if not any(d.name.startswith(f"{GENERATIONS_DIR}/{run}/") for run in gone)]
    files_before = sum(len(files) for files in generations.values())
    bytes_before = sum(size.values())
    dropped_files = {d.name for d in deletions}
    left = [
        item
        for run, files in generations.items()
        if run not in gone
        for item in files
        if item.name not in dropped_files
    ]
    return Plan(
        deletions=tuple(deletions),
        entries_before=files_before,
        bytes_before=bytes_before,
        entries_after=len(left),
        bytes_after=sum(item.size for item in left),
        versions=(),
    )


def is_generation(name: str) -> str | None:
    """The run id when ``name`` is a whole generation (``torch/<run_id>``), else None."""
    parts = name.split("/")
    return parts[1] if len(parts) == 2 and parts[0] == GENERATIONS_DIR else None


def _platform(manifest: Mapping[str, Any]) -> str:
    return str((manifest.get("facts") or {}).get("gpu") or "cpu")


def _build(manifest: Mapping[str, Any]) -> tuple[str, ...]:
    facts = manifest.get("facts") or {}
    return tuple(str(facts.get(key)) for key in ("torch", "cuda", "triton"))


def _same_kind(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return a.get("workload") == b.get("workload") and (a.get("facts") or {}) == (b.get("facts") or {})


def _time(text: Any) -> float:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
