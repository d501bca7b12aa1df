"""``compilecache expire`` for JAX: the lifecycle policy on a cache of JAX entries (local or ``gs://``).

Lists the cache, reads the manifests, with ``--verify`` checks the bytes of every entry old
enough to delete against the sha256 its manifest recorded, asks
:func:`compilecache.cache.expiry.plan_expiry` what to delete and deletes it (not with
``--dry-run``). The command line, result document, table and termination message are the
shared :mod:`compilecache.jobtools.expirecmd`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from compilecache.cache.entries import ATIME_SUFFIX, ENTRY_SUFFIX
from compilecache.cache.expiry import Plan, Policy, expected_digests, index_manifests, plan_expiry
from compilecache.cache.manifests import JAX_SCHEMA
from compilecache.cache.store import CacheStore, Listing, unsound_entries
from compilecache.jobtools.expirecmd import result_document


def expire(store: CacheStore, policy: Policy, *, dry_run: bool, now: float) -> dict[str, Any]:
    """List, check, plan and (unless ``dry_run``) delete; return the result document."""
    listing = store.scan()
    manifests = store.read_manifests()
    index = index_manifests(manifests.of(JAX_SCHEMA))
    damaged = check_bytes(store, listing, expected_digests(index), policy, now) if policy.verify else {}
    plan = plan_expiry(listing, index, policy, now, damaged)
    if not dry_run:
        apply(store, plan)
    return result_document(
        store.url,
        plan,
        dry_run=dry_run,
        now=now,
        problems=[*listing.notes, *manifests.notes],
        malformed=manifests.malformed,
    )


def check_bytes(
    store: CacheStore, listing: Listing, digests: Mapping[str, str], policy: Policy, now: float
) -> dict[str, str]:
    """Entry name → why its bytes are unsound, for every entry old enough to be deleted."""
    old = [
        item for item in listing.files if item.name.endswith(ENTRY_SUFFIX) and now - item.mtime >= policy.grace_seconds
    ]
    return unsound_entries(store, old, digests)


def apply(store: CacheStore, plan: Plan) -> None:
    """Delete each planned file; an entry's ``-atime`` sidecar goes first."""
    for deletion in plan.deletions:
        if deletion.name.endswith(ENTRY_SUFFIX):
            store.delete(deletion.name[: -len(ENTRY_SUFFIX)] + ATIME_SUFFIX)
        store.delete(deletion.name)
