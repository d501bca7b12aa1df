"""``compilecache expire``: apply the lifecycle policy to a cache (a local dir or ``gs://``).

The command every framework's expiry runs behind: the flags and the policy they make, the
result document, table and termination message. The work is the framework's ``expire``
(:mod:`compilecache.frameworks.jax.expire`: entries; :mod:`compilecache.frameworks.pytorch.expire`:
whole warm-up generations): it lists the cache once, reads the run manifests, with ``--verify``
(the default) reads every file old enough to be deleted (sha256 against its manifest), plans
what to delete, and deletes it (not with ``--dry-run``); this module prints a table of
deletions and reasons and a summary.

Deleting is idempotent and safe to interrupt: each file is deleted on its own
(a sidecar before its entry, so an interruption never leaves an orphan sidecar),
a file gone already counts as deleted, and a second run finishes the job. Expiry
writes nothing into the cache, so a full disk does not stop it; a deletion the
storage refuses (a GCS quota or error, a read-only disk) ends it with one line
naming the path, in the termination summary too.

``--termination-log PATH`` (the operator's expiry Job passes ``/dev/termination-log``)
also writes a compact JSON summary (at most 4 KiB, what Kubernetes keeps) there,
which the operator reads from the pod's status: the Job needs no API credentials.

Exit codes: 0 done, 2 bad input or an unusable cache.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from compilecache import frameworks
from compilecache.cache import lastuse, units
from compilecache.cache.errors import STORAGE_FULL, WarmError, storage_error
from compilecache.cache.expiry import (
    DEFAULT_GRACE_SECONDS,
    DEFAULT_STAGING_GRACE_SECONDS,
    Plan,
    Policy,
)
from compilecache.cache.manifests import Malformed, summary_fields
from compilecache.cache.store import open_store
from compilecache.cli.errors import whole_number

SUMMARY_SCHEMA = "compilecache.dev/expiry/v1"
TERMINATION_LOG = "/dev/termination-log"
TERMINATION_LIMIT = 4096  # bytes of a container's termination message that Kubernetes keeps


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``compilecache expire``."""
    parser.add_argument("--cache-dir", required=True, help="cache location: a local path or gs://bucket/prefix")
    parser.add_argument(
        "--framework",
        choices=frameworks.names(),
        default=frameworks.DEFAULT,
        help="whose cache: jax (default): JAX entries; pytorch: whole warm-up generations (compilecache.frameworks)",
    )
    parser.add_argument("--max-age", metavar="DURATION", help="drop entries not re-produced within this (7d, 12h)")
    parser.add_argument("--max-size", metavar="QUANTITY", help="drop least recently produced entries down to this")
    parser.add_argument(
        "--keep-versions", type=whole_number, metavar="N", help="keep the N newest builds of each platform"
    )
    parser.add_argument(
        "--verify",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="drop truncated/corrupt/changed entries, orphan -atime files and old staging; reads every entry "
        "old enough to delete (default: on, as spec.lifecycle.verify; --no-verify skips the reads)",
    )
    parser.add_argument(
        "--grace", default=f"{int(DEFAULT_GRACE_SECONDS)}s", metavar="DURATION", help="never delete younger files"
    )
    parser.add_argument(
        "--staging-grace",
        default=f"{int(DEFAULT_STAGING_GRACE_SECONDS)}s",
        metavar="DURATION",
        help="staging dirs of warm runs untouched this long are leftovers",
    )
    parser.add_argument(
        "--used",
        action="append",
        default=[],
        metavar="DAY=KEYS",
        help="training used these entries on DAY (YYYY-MM-DD): keys of compilecache.cache.lastuse, "
        "from status.lastUsed; maxAge and maxSize count from the end of that day",
    )
    parser.add_argument("--dry-run", action="store_true", help="print what would be deleted; delete nothing")
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    parser.add_argument(
        "--termination-log", metavar="PATH", help=f"also write a compact summary here ({TERMINATION_LOG})"
    )


def run(args: argparse.Namespace) -> int:
    """Expire; print a one-line error and return 2 on bad input or an unusable cache."""
    try:
        policy = policy_from_args(args)
        try:
            framework = frameworks.get(args.framework)
            result = framework.expire(open_store(args.cache_dir), policy, args.dry_run, time.time())
        except OSError as error:
            # A refused operation the store did not wrap (each names its own): one line, not a bug.
            if error.errno not in STORAGE_FULL:
                raise
            raise storage_error("delete", str(error.filename or args.cache_dir), error) from None
    except WarmError as error:
        print(f"compilecache expire: error: {error}", file=sys.stderr)
        if args.termination_log:
            _write(args.termination_log, json.dumps({"schema": SUMMARY_SCHEMA, "ok": False, "error": str(error)}))
        return error.exit_code
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(format_table(result))
    if args.termination_log:
        _write(args.termination_log, termination_message(result))
    return 0


def policy_from_args(args: argparse.Namespace) -> Policy:
    """The policy from the flags, with :mod:`compilecache.cache.units`' parsers; a bad value is a :class:`WarmError`."""

    def parse(flag: str, function: Any, text: str | None) -> Any:
        if text is None:
            return None
        try:
            return function(text)
        except ValueError as error:
            raise WarmError(f"{flag}: {error}") from error

    if len(args.used) > lastuse.MAX_DAYS:
        raise WarmError(f"--used: at most {lastuse.MAX_DAYS} days, got {len(args.used)}")
    days = [parse("--used", lastuse.parse_item, text) for text in args.used]
    if sum(len(keys) for _, keys in days) > lastuse.MAX_RECORD:
        raise WarmError(f"--used: at most {lastuse.MAX_RECORD} keys in all")
    if args.keep_versions is not None and args.keep_versions < 1:
        raise WarmError(f"--keep-versions must be at least 1, got {args.keep_versions}")
    return Policy(
        max_age_seconds=parse("--max-age", units.parse_duration, args.max_age),
        max_size_bytes=parse("--max-size", units.parse_bytes, args.max_size),
        keep_versions=args.keep_versions,
        verify=args.verify,
        grace_seconds=parse("--grace", units.parse_duration, args.grace),
        staging_grace_seconds=parse("--staging-grace", units.parse_duration, args.staging_grace),
        used=lastuse.last_used(days),
    )


MAX_IMAGES = 16  # status.images' bound: the images the operator can record


def result_document(
    url: str,
    plan: Plan,
    *,
    dry_run: bool,
    now: float,
    problems: Sequence[str] = (),
    malformed: Sequence[Malformed] = (),
) -> dict[str, Any]:
    """The ``--json`` document: totals, deletions with reasons, versions left, the manifests set aside, notes."""
    return {
        "schema": SUMMARY_SCHEMA,
        "ok": True,
        "cacheDir": url,
        "dryRun": dry_run,
        "at": datetime.fromtimestamp(now, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "before": {"entries": plan.entries_before, "bytes": plan.bytes_before},
        "after": {"entries": plan.entries_after, "bytes": plan.bytes_after},
        "deleted": plan.deleted_by_rule(),
        "deletedBytes": sum(deletion.size for deletion in plan.deletions),
        "deletions": [{"name": d.name, "bytes": d.size, "rule": d.rule, "reason": d.reason} for d in plan.deletions],
        "versions": [
            {
                "jax": v.build.jax,
                "jaxlib": v.build.jaxlib,
                "backend": v.build.backend,
                "deviceKind": v.build.device_kind,
                "entries": v.entries,
            }
            for v in plan.versions
        ],
        # The images whose entries are left, the most recently warmed first (status.images drops the others).
        "images": [{"image": image, "entries": count} for image, count in plan.images[:MAX_IMAGES]],
        # The images known to be gone (their runs recorded them, and none of their entries is left): only these
        # leave status.images; an image whose runs recorded none (an older warmer's) is not known to be gone.
        "imagesGone": list(plan.images_gone[:MAX_IMAGES]),
        # Manifest files that are no manifest: left where they are, unused, named until removed.
        "malformedManifests": [{"name": item.name, "reason": item.reason} for item in malformed],
        "notes": [*plan.notes, *problems, *(item.line() for item in malformed)],
    }


def termination_message(result: Mapping[str, Any]) -> str:
    """The result without the per-file list, in at most 4 KiB: the first malformed manifests
    (:func:`compilecache.cache.manifests.summary_fields`), and the versions, which are dropped from
    the end to fit."""
    compact = {key: value for key, value in result.items() if key not in ("deletions", "notes")}
    compact["versions"] = list(result.get("versions") or [])
    compact |= summary_fields(list(result.get("malformedManifests") or []))
    text = json.dumps(compact, separators=(",", ":"), sort_keys=True)
    while len(text.encode()) > TERMINATION_LIMIT and compact["versions"]:
        compact["versions"].pop()
        compact["versionsTruncated"] = True
        text = json.dumps(compact, separators=(",", ":"), sort_keys=True)
    if len(text.encode()) > TERMINATION_LIMIT and ("images" in compact or "imagesGone" in compact):
        # All of them or none: without the lists the operator forgets no image.
        compact.pop("images", None)
        compact.pop("imagesGone", None)
        text = json.dumps(compact, separators=(",", ":"), sort_keys=True)
    return text


def format_table(result: Mapping[str, Any]) -> str:
    """A table of deletions (rule, size, file, reason) and the summary lines."""
    rows = [(d["rule"], units.format_bytes(d["bytes"]), d["name"], d["reason"]) for d in result["deletions"]]
    lines = []
    if rows:
        header = ("RULE", "SIZE", "FILE", "REASON")
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(3)]
        for row in [header, *rows]:
            lines.append(
                "  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True)) + "  " + row[3]
            )
    before, after = result["before"], result["after"]
    verb = "would delete" if result["dryRun"] else "deleted"
    counts = ", ".join(f"{rule} {count}" for rule, count in result["deleted"].items() if count)
    lines.append(
        f"{verb} {len(rows)} files ({units.format_bytes(result['deletedBytes'])}){f': {counts}' if counts else ''}; "
        f"{result['cacheDir']}: {before['entries']} entries ({units.format_bytes(before['bytes'])}) → "
        f"{after['entries']} entries ({units.format_bytes(after['bytes'])})"
    )
    lines += [f"note: {note}" for note in result["notes"]]
    return "\n".join(lines)


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text)
    except OSError as error:
        print(f"compilecache expire: cannot write {path}: {error}", file=sys.stderr)
