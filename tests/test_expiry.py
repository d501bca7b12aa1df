"""The lifecycle policy (pure, table-driven) and ``compilecache expire`` on real directories."""

from __future__ import annotations

import hashlib
import json
import os
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from compilecache.cache.errors import WarmError
from compilecache.cache.expiry import (
    DEFAULT_GRACE_SECONDS,
    Build,
    Policy,
    index_manifests,
    newest_builds,
    plan_expiry,
)
from compilecache.cache.store import Listing, LocalStore, StoredFile
from compilecache.cli.main import main
from compilecache.jobtools.expirecmd import TERMINATION_LIMIT, termination_message

DAY = 86400.0
NOW = 1_800_000_000.0
OLD = Build("0.4.30", "0.4.30", "gpu", "H100")
NEW = Build("0.10.2", "0.10.2", "gpu", "H100")
A100 = Build("0.4.30", "0.4.30", "gpu", "A100")


def name(key: str) -> str:
    return f"jit_{key}-{hashlib.sha256(key.encode()).hexdigest()}-cache"


def iso(seconds: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def manifest(
    build: Build, at: float, written: dict[str, str] | None = None, hits: tuple[str, ...] = ()
) -> dict[str, Any]:
    """A run manifest of ``build`` finished at ``at``: ``written`` maps keys to sha256, ``hits`` lists keys."""
    versions = {"jax": build.jax, "jaxlib": build.jaxlib, "backend": build.backend, "device_kind": build.device_kind}
    return {
        **versions,
        "finished_at": iso(at),
        "entries": [
            {"file": name(k), "sha256": digest, "size": 1, "written_at": iso(at), **versions}
            for k, digest in (written or {}).items()
        ],
        "hits": [{"file": name(k), "at": iso(at)} for k in hits],
    }


def files(**ages_and_sizes: tuple[float, int]) -> list[StoredFile]:
    """Entries ``key=(age in days, size)``."""
    return [StoredFile(name(key), size, NOW - age * DAY) for key, (age, size) in ages_and_sizes.items()]


def plan(listing: list[StoredFile], manifests: list[dict[str, Any]], policy: Policy, **kw: Any) -> dict[str, str]:
    result = plan_expiry(
        Listing(tuple(listing), tuple(kw.pop("staging", ())), temporary=tuple(kw.pop("temporary", ()))),
        index_manifests(manifests),
        policy,
        NOW,
        **kw,
    )
    return {d.name: d.rule for d in result.deletions}


CASES: list[tuple[str, list[StoredFile], list[dict[str, Any]], Policy, dict[str, Any], dict[str, str]]] = [
    (
        "no policy deletes nothing",
        files(a=(30, 10), b=(1, 10)),
        [],
        Policy(),
        {},
        {},
    ),
    (
        "maxAge drops entries not written within the age; unlisted ones too",
        files(a=(10, 10), b=(1, 10), u=(9, 10)),
        [manifest(NEW, NOW - 10 * DAY, {"a": "x"})],
        Policy(max_age_seconds=7 * DAY),
        {},
        {name("a"): "maxAge", name("u"): "maxAge"},
    ),
    (
        "maxAge: a hit in a later run re-produces the entry",
        files(a=(10, 10), b=(10, 10)),
        [manifest(NEW, NOW - 10 * DAY, {"a": "x", "b": "y"}), manifest(NEW, NOW - DAY, hits=("a",))],
        Policy(max_age_seconds=7 * DAY),
        {},
        {name("b"): "maxAge"},
    ),
    (
        "maxSize drops least recently produced first until it fits",
        files(a=(5, 40), b=(3, 40), c=(2, 40)),
        [manifest(NEW, NOW - 5 * DAY, {"a": "x"}), manifest(NEW, NOW - 1 * DAY, hits=("a",))],
        Policy(max_size_bytes=80),
        {},
        {name("b"): "maxSize"},
    ),
    (
        "keepVersions keeps the N newest builds per platform; unlisted entries stay",
        files(o=(20, 1), n=(2, 1), g=(20, 1), u=(30, 1)),
        [
            manifest(OLD, NOW - 20 * DAY, {"o": "x"}),
            manifest(NEW, NOW - 2 * DAY, {"n": "x"}),
            manifest(A100, NOW - 20 * DAY, {"g": "x"}),
        ],
        Policy(keep_versions=1),
        {},
        {name("o"): "keepVersions"},
    ),
    (
        "integrity only with verify",
        files(a=(2, 10)),
        [],
        Policy(verify=False),
        {"damaged": {name("a"): "truncated"}},
        {},
    ),
    (
        "integrity wins over the other rules as the reason",
        files(a=(20, 10), b=(20, 10)),
        [manifest(OLD, NOW - 20 * DAY, {"a": "x"}), manifest(NEW, NOW - DAY)],
        Policy(verify=True, keep_versions=1, max_age_seconds=7 * DAY),
        {"damaged": {name("a"): "sha256 differs"}},
        {name("a"): "integrity", name("b"): "maxAge"},
    ),
    (
        "grace: nothing younger is deleted by any rule",
        [StoredFile(name("a"), 100, NOW - 60)],
        [manifest(OLD, NOW - 20 * DAY, {"a": "x"}), manifest(NEW, NOW - DAY)],
        Policy(verify=True, keep_versions=1, max_age_seconds=1, max_size_bytes=0),
        {"damaged": {name("a"): "truncated"}},
        {},
    ),
    (
        "orphan -atime and old staging go under verify; young staging stays",
        [
            StoredFile(name("a").replace("-cache", "-atime"), 8, NOW - DAY),
            StoredFile(name("b"), 8, NOW - DAY),
            StoredFile(name("b").replace("-cache", "-atime"), 8, NOW - DAY),
        ],
        [],
        Policy(verify=True),
        {
            "staging": [
                StoredFile(".compilecache/staging/old", 0, NOW - DAY),
                StoredFile(".compilecache/staging/live", 0, NOW - 60),
            ]
        },
        {name("a").replace("-cache", "-atime"): "integrity", ".compilecache/staging/old": "integrity"},
    ),
    (
        "what killed runs left goes without verify too: old staging and temporary files, not young ones",
        [StoredFile(name("b"), 8, NOW - DAY)],
        [],
        Policy(verify=False),
        {
            "staging": [
                StoredFile(".compilecache/staging/old", 0, NOW - DAY),
                StoredFile(".compilecache/staging/live", 0, NOW - 60),
            ],
            "temporary": [
                StoredFile(".compilecache/manifests/.old.json.tmp", 9, NOW - 3600),
                StoredFile(".compilecache/manifests/.writing.json.tmp", 9, NOW - 5),
                StoredFile(".probe-old", 0, NOW - 3600),
            ],
        },
        {
            ".compilecache/staging/old": "integrity",
            ".compilecache/manifests/.old.json.tmp": "integrity",
            ".probe-old": "integrity",
        },
    ),
]


@pytest.mark.parametrize(
    ("listing", "manifests", "policy", "extra", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_policy(
    listing: list[StoredFile],
    manifests: list[dict[str, Any]],
    policy: Policy,
    extra: dict[str, Any],
    expected: dict[str, str],
) -> None:
    assert plan(listing, manifests, policy, **extra) == expected


def test_max_size_counts_sidecars_and_reports_what_grace_keeps() -> None:
    listing = [
        *files(a=(3, 50), b=(2, 50)),
        StoredFile(name("a").replace("-cache", "-atime"), 10, NOW - DAY),
        StoredFile(name("y"), 100, NOW - 10),  # young: kept even though the cache stays too big
    ]
    result = plan_expiry(Listing(tuple(listing)), index_manifests([]), Policy(max_size_bytes=90), NOW)
    assert [(d.name, d.size, d.rule) for d in result.deletions] == [
        (name("a"), 60, "maxSize"),
        (name("b"), 50, "maxSize"),
    ]
    assert (result.bytes_before, result.bytes_after, result.entries_after) == (210, 100, 1)
    assert result.notes and "grace" in result.notes[0]


def test_versions_left_newest_first_and_sha_of_the_latest_publishing_write() -> None:
    index = index_manifests(
        [
            manifest(OLD, NOW - 9 * DAY, {"o": "old"}),
            manifest(NEW, NOW - 2 * DAY, {"n": "first"}),
            {
                **manifest(NEW, NOW - DAY, {"n": "second"}),
                "entries": [{**manifest(NEW, NOW - DAY, {"n": "second"})["entries"][0], "published": False}],
            },
        ]
    )
    assert index.entries[name("n")].sha256 == "first"  # the unpublished duplicate is not the file
    result = plan_expiry(Listing(tuple(files(o=(9, 5), n=(2, 7)))), index, Policy(), NOW)
    assert [(v.build, v.entries, v.bytes) for v in result.versions] == [(NEW, 1, 7), (OLD, 1, 5)]


def test_newest_builds_ranks_within_each_platform() -> None:
    seen = {OLD: 1.0, NEW: 2.0, A100: 0.5}
    assert newest_builds(seen, 1) == {NEW, A100}
    assert newest_builds(seen, 2) == {OLD, NEW, A100}


def test_termination_message_fits_in_4_kib() -> None:
    version = {
        "jax": "0.10.2",
        "jaxlib": "0.10.2",
        "backend": "gpu",
        "deviceKind": "NVIDIA H100 80GB HBM3",
        "entries": 1,
    }
    result = {"schema": "s", "ok": True, "deletions": [{"name": "x" * 100}] * 100, "versions": [version] * 200}
    text = termination_message(result)
    decoded = json.loads(text)
    assert len(text.encode()) <= TERMINATION_LIMIT and decoded["versionsTruncated"] and "deletions" not in decoded
    assert 0 < len(decoded["versions"]) < 200


# ---- the command on a real directory (fake entries; the real-JAX tests are in test_expiry_jax.py) ----


def _entry(payload: bytes = b"executable" * 30) -> bytes:
    return zlib.compress((1).to_bytes(4, "big") + payload)


def _fill(cache: Path, ages: dict[str, float]) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    for key, age in ages.items():
        path = cache / name(key)
        path.write_bytes(_entry())
        when = time.time() - age * DAY
        os.utime(path, (when, when))


def test_expire_command_dry_run_table_json_and_idempotence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = tmp_path / "cache"
    _fill(cache, {"a": 10, "b": 1})
    (cache / name("c")).write_bytes(_entry()[:-5])  # truncated, but young: the grace period keeps it
    assert main(["expire", "--cache-dir", str(cache), "--max-age", "7d", "--dry-run"]) == 0
    table = capsys.readouterr().out
    assert "would delete 1 files" in table and name("a") in table and "maxAge" in table
    assert sorted(p.name for p in cache.iterdir()) == sorted(name(k) for k in "abc")

    log = tmp_path / "termination-log"
    argv = ["expire", "--cache-dir", str(cache), "--max-age", "7d", "--verify", "--grace", "0s", "--json"]
    assert main([*argv, "--termination-log", str(log)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {d["name"]: d["rule"] for d in result["deletions"]} == {name("a"): "maxAge", name("c"): "integrity"}
    assert (result["before"]["entries"], result["after"]["entries"]) == (3, 1)
    assert json.loads(log.read_text())["after"] == result["after"]
    assert sorted(p.name for p in cache.iterdir()) == [name("b")]
    assert main(argv) == 0  # again: nothing left to do, no error
    assert json.loads(capsys.readouterr().out)["deletions"] == []


@pytest.mark.parametrize(("flags", "checked"), [([], True), (["--verify"], True), (["--no-verify"], False)])
def test_expire_verifies_unless_told_not_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], checked: bool
) -> None:
    # Regression: verify defaulted to off, although the README documents it as on by default.
    cache = tmp_path / "cache"
    _fill(cache, {"sound": 1, "short": 1})
    short = cache / name("short")
    short.write_bytes(_entry()[:-5])
    os.utime(short, (time.time() - DAY, time.time() - DAY))
    assert main(["expire", "--cache-dir", str(cache), "--json", *flags]) == 0
    deletions = json.loads(capsys.readouterr().out)["deletions"]
    assert [(d["name"], d["rule"]) for d in deletions] == ([(short.name, "integrity")] if checked else [])
    assert short.exists() is not checked


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-age", "7 days"], "--max-age: not a duration"),
        (["--max-size", "100GB"], "--max-size: not a quantity"),
        (["--keep-versions", "0"], "--keep-versions must be at least 1"),
        (["--grace=1 hour"], "--grace: not a duration"),
    ],
)
def test_expire_command_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    assert main(["expire", "--cache-dir", str(tmp_path), *flags]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("compilecache expire: error:") and message in line


def test_expire_command_missing_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "log"
    assert main(["expire", "--cache-dir", str(tmp_path / "nope"), "--termination-log", str(log)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert json.loads(log.read_text()) == {**json.loads(log.read_text()), "ok": False}


def test_local_store_scan_and_delete_are_idempotent(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    (tmp_path / name("a")).write_bytes(b"12345")
    (tmp_path / "unrelated.txt").write_text("x")
    (tmp_path / ".compilecache" / "staging" / "run-1").mkdir(parents=True)
    listing = store.scan()
    assert [(f.name, f.size) for f in listing.files] == [(name("a"), 5)]
    assert [s.name for s in listing.staging] == [".compilecache/staging/run-1"]
    assert store.delete(name("a")) and not store.delete(name("a"))
    assert store.delete(".compilecache/staging/run-1") and not store.delete(".compilecache/staging/run-1")
    assert DEFAULT_GRACE_SECONDS > 0


def test_local_store_lists_what_interrupted_writes_left_and_only_that(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    manifests = tmp_path / ".compilecache" / "manifests"
    manifests.mkdir(parents=True)
    (manifests / ".run-1.json.tmp").write_text("{")
    (manifests / "run-2.json").write_text("{}")
    (manifests / ".notes").write_text("not ours")  # not a name the store writes
    (tmp_path / ".probe-x1").touch()
    (manifests / ".linked.json.tmp").symlink_to(tmp_path / "outside")  # never listed, never followed
    listing = store.scan()
    assert sorted(item.name for item in listing.temporary) == [".compilecache/manifests/.run-1.json.tmp", ".probe-x1"]
    assert store.delete(".compilecache/manifests/.run-1.json.tmp") and store.delete(".probe-x1")
    assert store.scan().temporary == ()


def test_a_delete_the_file_system_refuses_is_a_warm_error_not_a_traceback(tmp_path: Path) -> None:
    """expire turns a WarmError into one line and exit 1 (its termination message says why), as on GCS.

    The whole path, with an entry made immutable, runs in tests/test_e2e.py (it needs root and chattr).
    """
    stuck = tmp_path / name("stuck")
    stuck.mkdir()  # unlink() refuses a directory (EISDIR): an OSError that needs no root to provoke
    (stuck / "x").write_text("x")
    with pytest.raises(WarmError, match=rf"delete \S*/{name('stuck')} failed: \[Errno 21\] EISDIR"):
        LocalStore(tmp_path).delete(name("stuck"))


@pytest.mark.parametrize(
    ("schedule", "slot"),
    [
        ("0 3 * * *", "2026-11-21T03:00"),
        ("*/15 * * * *", "2026-11-21T14:30"),
        ("0 9 * * mon-fri", "2026-11-20T09:00"),  # the 21st is a Saturday
        ("0 12 13 * fri", "2026-11-20T12:00"),  # day-of-month OR day-of-week, as cron does
        ("0 0 29 2 *", "2024-02-29T00:00"),
        ("0 0 30 2 *", None),
    ],
)
def test_cron_slot_is_the_latest_scheduled_time_that_has_come(schedule: str, slot: str | None) -> None:
    from datetime import UTC, datetime

    from compilecache.cache.units import cron_slot

    found = cron_slot(schedule, datetime(2026, 11, 21, 14, 34, 59, tzinfo=UTC))
    assert (found.strftime("%Y-%m-%dT%H:%M") if found else None) == slot


def test_expiry_outcome_reads_the_newest_terminated_pod() -> None:
    from compilecache.controller.expiryjob import outcome

    def pod(at: str, message: str) -> dict[str, Any]:
        terminated = {"finishedAt": at, "message": message}
        return {"status": {"containerStatuses": [{"name": "expire", "state": {"terminated": terminated}}]}}

    done = {"status": {"conditions": [{"type": "Complete", "status": "True"}], "completionTime": "t9"}}
    summary = {"schema": "s", "after": {"entries": 2, "bytes": 2048}, "deleted": {"maxAge": 3}}
    result = outcome(done, [pod("t1", "Traceback...\nboom"), pod("t2", json.dumps(summary))])
    assert (result.phase, result.summary, result.finished_at) == ("Ready", summary, "t9")
    assert "3 by maxAge" in result.message and "2 entries (2Ki)" in result.message
    failed = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}}
    assert outcome(failed, [pod("t1", "line\nPermissionError: denied")]).message == (
        "expiry failed: PermissionError: denied"  # FallbackToLogsOnError: the log's last line
    )
    assert outcome(None, []).phase == "Expiring"
