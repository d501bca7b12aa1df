"""``compilecache expire --framework pytorch``: the lifecycle policy on a PyTorch cache (local or ``gs://``).

Lists the generations (:func:`compilecache.frameworks.pytorch.store.list_generations`) and the staging
and temporary leftovers (the store's own scan), reads the manifests, with ``--verify`` reads every
file old enough to delete and compares its size and sha256 with its manifest, asks
:func:`compilecache.frameworks.pytorch.expiry.plan_torch_expiry` what to delete, and deletes it (not with
``--dry-run``). A whole generation goes before its manifest, so no manifest names a generation
that is half gone for longer than one deletion; a second run finishes an interrupted one. The
result document, table and termination message are :mod:`compilecache.jobtools.expirecmd`'s.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from compilecache.cache.errors import WarmError
from compilecache.cache.expiry import Plan, Policy
from compilecache.cache.manifests import TORCH_SCHEMA
from compilecache.cache.store import CacheStore, StoredFile
from compilecache.frameworks.pytorch.cache import GENERATIONS_DIR, manifest_entries
from compilecache.frameworks.pytorch.expiry import is_generation, plan_torch_expiry, torch_manifests
from compilecache.frameworks.pytorch.store import delete_generation, list_generations


def expire_torch(store: CacheStore, policy: Policy, *, dry_run: bool, now: float) -> dict[str, Any]:
    """List, check, plan and (unless ``dry_run``) delete; return expirecmd's result document."""
    from compilecache.jobtools.expirecmd import result_document

    listing = store.scan()
    generations = list_generations(store)
    read = store.read_manifests()
    manifests = torch_manifests(read.of(TORCH_SCHEMA))
    damaged = check_files(store, generations, manifests, policy, now) if policy.verify else {}
    plan = plan_torch_expiry(listing, generations, manifests, policy, now, damaged)
    if not dry_run:
        apply(store, plan, generations)
    result = result_document(
        store.url,
        plan,
        dry_run=dry_run,
        now=now,
        problems=[*listing.notes, *read.notes],
        malformed=read.malformed,
    )
    result["versions"] = versions_left(plan, generations, manifests)
    return result


def versions_left(
    plan: Plan, generations: Mapping[str, Sequence[StoredFile]], manifests: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Files per build left after the plan, newest first, for ``status.cache.versions``
    (``torch``, ``cuda``, ``backend``, ``deviceKind``, ``entries``: fields of the CRD's schema)."""
    gone = {is_generation(d.name) for d in plan.deletions} | {None}
    dropped = {d.name for d in plan.deletions}
    counts: dict[tuple[str, str, str], int] = {}
    newest: dict[tuple[str, str, str], str] = {}
    for run, files in generations.items():
        if run in gone or run not in manifests:
            continue
        facts = manifests[run].get("facts") or {}
        build = (str(facts.get("torch")), str(facts.get("cuda") or ""), str(facts.get("gpu") or "cpu"))
        counts[build] = counts.get(build, 0) + sum(1 for item in files if item.name not in dropped)
        newest[build] = max(newest.get(build, ""), run)
    return [
        {
            "torch": torch,
            **({"cuda": cuda} if cuda else {}),
            "backend": "cpu" if gpu == "cpu" else "cuda",
            "deviceKind": gpu,
            "entries": counts[(torch, cuda, gpu)],
        }
        for torch, cuda, gpu in sorted(counts, key=lambda build: newest[build], reverse=True)
    ]


def check_files(
    store: CacheStore,
    generations: Mapping[str, Sequence[StoredFile]],
    manifests: Mapping[str, Mapping[str, Any]],
    policy: Policy,
    now: float,
) -> dict[str, str]:
    """File (from the cache root) → why it differs from its manifest, for files old enough to delete."""
    found = {}
    for run, files in generations.items():
        if run not in manifests:
            continue
        listed = manifest_entries(manifests[run])
        prefix = f"{GENERATIONS_DIR}/{run}/"
        for item in files:
            record = listed.get(item.name[len(prefix) :])
            if record is None or now - item.mtime < policy.grace_seconds:
                continue
            if item.size != record.get("size"):
                found[item.name] = f"size {item.size} differs from the manifest's {record.get('size')}"
                continue
            digest = hashlib.sha256()
            try:
                for chunk in store.stream(item.name):  # a piece at a time: kernels reach hundreds of MB
                    digest.update(chunk)
            except (OSError, WarmError):
                continue  # gone meanwhile, or a link: not judged
            if digest.hexdigest() != record.get("sha256"):
                found[item.name] = "checksum differs from the manifest (corrupt)"
    return found


def apply(store: CacheStore, plan: Plan, generations: Mapping[str, Sequence[StoredFile]]) -> None:
    """Delete each planned file, staging dir or whole generation (then its manifest)."""
    from compilecache.cache.store import MANIFESTS_DIR
    from compilecache.jobtools.manifest import manifest_name

    for deletion in plan.deletions:
        run = is_generation(deletion.name)
        if run is None:
            store.delete(deletion.name)
            continue
        delete_generation(store, run, generations.get(run, []))
        store.delete(f"{MANIFESTS_DIR}/{manifest_name(run)}")
