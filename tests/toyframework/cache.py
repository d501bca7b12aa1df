"""The toy's warm-up and expiry, on a local cache folder, built from the shared modules only.

Layout: published entries in ``toy/`` (``<program>-<key>.toy``, :mod:`.runtime`), one manifest per
warm-up in ``toy/manifests/<run_id>.json`` (its entries' sizes and sha256), staging where the
shared store keeps it (``.compilecache/staging/<run_id>``, which expiry's leftover rule knows).
The toy's manifests stay out of ``.compilecache/manifests``: that folder's reader checks each
document against the built-in frameworks' schemas only, and would set a toy manifest aside.

Warm (:func:`warm`): run the script in a fresh process on the staging folder (the shared
:func:`~compilecache.jobtools.entrypoint.run_in_scratch` with :mod:`.run`), with ``--verify`` again
on a copy, read-only (every program must hit), then rename each file into ``toy/`` and write
the manifest. Expire (:func:`expire`): list ``toy/``, check the old files' bytes against the
manifests (``--verify``), plan (:func:`plan_expiry`, pure: integrity, then ``maxAge``, and the
shared leftovers) and delete; the result is the shared document
(:func:`compilecache.jobtools.expirecmd.result_document`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from compilecache.cache import nofollow
from compilecache.cache.errors import VerifyError, WarmError, storage_error
from compilecache.cache.expiry import INTEGRITY, MAX_AGE, Deletion, Plan, Policy, leftovers
from compilecache.cache.manifests import MAX_MANIFEST_BYTES, Malformed
from compilecache.cache.store import CacheStore, LocalStore, StoredFile, open_store
from compilecache.jobtools.entrypoint import AUTO, entry_problem, run_in_scratch
from compilecache.jobtools.expirecmd import result_document
from compilecache.jobtools.manifest import REPORT_SCHEMA, dumps, new_run_id, utc_now
from compilecache.jobtools.warm import delete_leftovers, script_arguments, steps_from_env
from toyframework import ENTRIES_DIR, NAME, cache_env
from toyframework.runtime import ENTRY

MANIFESTS_DIR = f"{ENTRIES_DIR}/manifests"
SCHEMA = "toy.example/manifest/v1"
RUN_TIMEOUT = 120.0  # seconds a toy script may run: a toy compiles nothing real
_SHA256 = re.compile(r"[0-9a-f]{64}")


def warm(args: argparse.Namespace) -> dict[str, Any]:
    """``compilecache warm --framework toy``: the report, or :class:`WarmError` with one line."""
    steps_from_env(args, os.environ)
    _check_args(args)
    store = _local(open_store(args.cache_dir))
    run_id, started = new_run_id(), utc_now()
    staging = Path(store.prepare(run_id))
    try:
        delete_leftovers(store, store.scan())
        base = dict(os.environ)  # without the trainer's report: the warm command turned it off
        warmed = _run(args, {**base, **cache_env(str(staging), read_only=False)}, "warm-up")
        files = sorted(item.name for item in staging.iterdir() if ENTRY.fullmatch(item.name) and _plain(item))
        records = [_record(staging / name) for name in files]
        verify = _verify(args, base, staging, files) if args.verify else None
        _publish(store, staging, run_id, records, started)
    finally:
        store.discard(str(staging))
    total = sum(record["size"] for record in records)
    counts = warmed["counts"]
    print(f"published {len(records)} toy programs ({total} bytes) into {store.root / ENTRIES_DIR}", flush=True)
    return {
        "schema": REPORT_SCHEMA,
        "framework": NAME,
        "ok": True,
        "error": None,
        "run_id": run_id,
        "cache_dir": store.url,
        "targets": [
            {
                "name": Path(args.script).name,
                "compile_seconds": 0.0,
                **counts,
                "entries_written": files,
                "bytes": total,
            }
        ],
        "entries": len(records),
        "bytes": total,
        "verify": verify,
        "stepped": {"script": args.script, **warmed["stepped"], "stopped": warmed["stepped"]["stopped"] or "end"},
        "started_at": started,
        "finished_at": utc_now(),
    }


def _check_args(args: argparse.Namespace) -> None:
    if args.workload or not args.script:
        raise WarmError("--framework toy warms a training script: give --script PATH (no --workload)")
    if args.num_processes or args.coordinator or args.step_fn or args.resume_arg:
        raise WarmError("--num-processes, --coordinator, --step-fn and --resume-arg are JAX's; --framework toy")
    if args.steps == AUTO:
        args.steps = None  # whole runs: the script runs to its end
    if args.steps is not None and args.steps < 1:
        raise WarmError(f"--steps must be at least 1, got {args.steps}")
    problem = entry_problem(args.script, os.getcwd())
    if problem:
        raise WarmError(problem)


def _local(store: CacheStore) -> LocalStore:
    if not isinstance(store, LocalStore):
        raise WarmError(f"cache {store.url}: --framework toy keeps its cache in a local folder only")
    return store


def _plain(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def _run(args: argparse.Namespace, env: Mapping[str, str], what: str) -> dict[str, Any]:
    request = {"steps": args.steps}
    code, result, stderr = run_in_scratch(
        "toyframework.run", request, env, args.script, script_arguments(args), timeout=RUN_TIMEOUT
    )
    if code != 0 or "counts" not in result:
        last = stderr.strip().splitlines()[-1:] or [""]
        raise WarmError(result.get("error") or f"{what}: script {args.script} exited with status {code}: {last[0]}")
    return result


def _record(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    return {"file": path.name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _verify(args: argparse.Namespace, base: Mapping[str, str], staging: Path, files: Sequence[str]) -> dict[str, Any]:
    """Run again in a fresh process on a read-only copy of what would be published: everything must hit."""
    with tempfile.TemporaryDirectory(prefix="toy-verify-") as folder:
        for name in files:
            shutil.copy2(staging / name, Path(folder) / name)
        counts = _run(args, {**base, **cache_env(folder, read_only=True)}, "verify")["counts"]
    if counts["misses"] or not counts["requests"]:
        raise VerifyError(
            f"verify failed: {counts['misses']} of {counts['requests']} toy programs missed in a fresh process "
            "on a copy of the warm-up's cache; nothing published"
        )
    return {"ok": True, "hits": counts["hits"], "requests": counts["requests"]}


def _publish(store: LocalStore, staging: Path, run_id: str, records: Sequence[Mapping[str, Any]], started: str) -> None:
    """Each file by ``rename`` (atomic, one filesystem), then the manifest that records them."""
    try:
        for folder in (ENTRIES_DIR, MANIFESTS_DIR):
            if nofollow.is_link(store.root, folder):
                raise WarmError(f"cache dir {store.root}: {folder} is a symbolic link; remove it")
            (store.root / folder).mkdir(exist_ok=True)
        for record in records:
            os.rename(staging / record["file"], store.root / ENTRIES_DIR / record["file"])
        manifest = {"schema": SCHEMA, "run_id": run_id, "written_at": started, "entries": list(records)}
        nofollow.write_new(store.root, f"{MANIFESTS_DIR}/{run_id}.json", dumps(manifest))
    except OSError as error:
        raise storage_error("publish", str(error.filename or store.root), error) from None


def expire(store: CacheStore, policy: Policy, *, dry_run: bool, now: float) -> dict[str, Any]:
    """``compilecache expire --framework toy``: list, check, plan, delete (not with ``dry_run``)."""
    local = _local(store)
    entries, notes = _entries(local.root)
    digests, malformed = _manifests(local.root)
    damaged = _damaged(local, entries, digests, policy, now) if policy.verify else {}
    plan = plan_expiry(entries, policy, now, damaged, leftovers(local.scan(), policy, now))
    if not dry_run:
        for deletion in plan.deletions:
            local.delete(deletion.name)
    return result_document(local.url, plan, dry_run=dry_run, now=now, problems=notes, malformed=malformed)


def plan_expiry(
    entries: Iterable[StoredFile],
    policy: Policy,
    now: float,
    damaged: Mapping[str, str],
    leftover: Sequence[Deletion] = (),
) -> Plan:
    """What to delete (pure): damaged files, then files older than ``maxAge``; nothing within the grace period."""
    deletions, kept, before = list(leftover), [], list(entries)
    for item in sorted(before, key=lambda item: item.name):
        age = now - item.mtime
        if age < policy.grace_seconds:
            kept.append(item)
        elif item.name in damaged:
            deletions.append(Deletion(item.name, item.size, INTEGRITY, damaged[item.name]))
        elif policy.max_age_seconds is not None and age > policy.max_age_seconds:
            why = f"written {int(age)}s ago, maxAge {int(policy.max_age_seconds)}s"
            deletions.append(Deletion(item.name, item.size, MAX_AGE, why))
        else:
            kept.append(item)
    notes = tuple(
        f"{name} is not applied to a toy cache"
        for name, value in (("maxSize", policy.max_size_bytes), ("keepVersions", policy.keep_versions))
        if value is not None
    )
    return Plan(
        deletions=tuple(deletions),
        entries_before=len(before),
        bytes_before=sum(item.size for item in before),
        entries_after=len(kept),
        bytes_after=sum(item.size for item in kept),
        versions=(),
        notes=notes,
    )


def _entries(root: Path) -> tuple[list[StoredFile], list[str]]:
    """The entries in ``toy/`` (links are named in the notes, never followed)."""
    found, notes = [], []
    try:
        with nofollow.open_dir(root, ENTRIES_DIR) as folder:
            for item in os.scandir(folder):
                if not ENTRY.fullmatch(item.name):
                    continue
                if item.is_file(follow_symlinks=False):
                    stat = item.stat(follow_symlinks=False)
                    found.append(StoredFile(f"{ENTRIES_DIR}/{item.name}", stat.st_size, stat.st_mtime))
                else:
                    notes.append(f"{ENTRIES_DIR}/{item.name} is no plain file: left alone")
    except nofollow.LinkError as error:
        notes.append(str(error))
    except (FileNotFoundError, NotADirectoryError):
        pass
    return found, notes


def _manifests(root: Path) -> tuple[dict[str, str], list[Malformed]]:
    """Entry (from the cache root) → the sha256 its newest manifest recorded; the files set aside, and why."""
    digests: dict[str, tuple[str, str]] = {}
    malformed = []
    try:
        with nofollow.open_dir(root, MANIFESTS_DIR) as folder:
            names = sorted(name for name in os.listdir(folder) if name.endswith(".json") and not name.startswith("."))
    except (nofollow.LinkError, FileNotFoundError, NotADirectoryError):
        names = []
    for name in names:
        try:
            document = json.loads(nofollow.read_bytes(root, f"{MANIFESTS_DIR}/{name}", MAX_MANIFEST_BYTES + 1))
            problem = _problem(document)
        except (OSError, WarmError, ValueError, RecursionError) as error:
            problem = f"not read: {type(error).__name__}"
        if problem:
            malformed.append(Malformed(name, problem))
            continue
        for entry in document["entries"]:
            key = f"{ENTRIES_DIR}/{entry['file']}"
            if document["written_at"] >= digests.get(key, ("", ""))[0]:
                digests[key] = (document["written_at"], entry["sha256"])
    return {key: digest for key, (_, digest) in digests.items()}, malformed


def _problem(document: Any) -> str | None:
    """Why a manifest (untrusted: anyone who can write the cache wrote it) is no toy manifest, or ``None``."""
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        return f"schema: expected {SCHEMA}"
    if not isinstance(document.get("written_at"), str) or not isinstance(document.get("entries"), list):
        return "written_at and entries: expected a time and a list"
    for index, entry in enumerate(document["entries"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("file"), str) or not ENTRY.fullmatch(entry["file"]):
            return f"entries[{index}].file: expected a toy entry name"
        if not isinstance(entry.get("sha256"), str) or not _SHA256.fullmatch(entry["sha256"]):
            return f"entries[{index}].sha256: expected 64 lowercase hex digits"
    return None


def _damaged(
    store: LocalStore, entries: Sequence[StoredFile], digests: Mapping[str, str], policy: Policy, now: float
) -> dict[str, str]:
    """Entries old enough to delete whose bytes differ from their manifest (read a piece at a time)."""
    found = {}
    for item in entries:
        if item.name not in digests or now - item.mtime < policy.grace_seconds:
            continue
        digest = hashlib.sha256()
        try:
            for chunk in store.stream(item.name):
                digest.update(chunk)
        except (OSError, WarmError):
            continue  # gone meanwhile, or a link: not judged
        if digest.hexdigest() != digests[item.name]:
            found[item.name] = "checksum differs from the manifest (corrupt)"
    return found
