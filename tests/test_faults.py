"""Faults leave nothing half-done: a full disk at each write of a real warm-up, and at expiry.

A dry run of the smallest real warm-up (two targets, real JAX on the CPU) on a tmpfs counts
its writes and their pages: JAX's two entries (into staging), the pending manifest, the
complete manifest (written while the pending one still exists). For each write k, a fresh
tmpfs is filled to leave exactly the pages of the writes before k, so write k is the first
the disk refuses (the error must name it). Then: one line on stderr and in the termination
summary, naming the path and errno; the cache as it was or complete with its manifest;
nothing temporary; ``expire --verify`` (on the still full disk) deletes nothing; with the
space back, the next warm succeeds and verifies.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import smalldisk
from compilecache.cache.store import LocalStore
from compilecache.jobtools.manifest import COMPLETE, PENDING
from jaxhelpers import clean_env, entry_files, run_cli, write_module

# Named functions: JAX names each entry (and its write error) after the function's module.
TWO_ENTRIES = """
import jax, jax.numpy as jnp
from compilecache import Target

def first(x):
    return jnp.cos(x) * 2.0

def second(x):
    return jnp.tanh(x) + 1.0

def targets():
    spec = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    return [Target("first", jax.jit(first), (spec,)), Target("second", jax.jit(second), (spec,))]
"""
DISK_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Write:
    """One write of the warm-up: what the error names when it fails, and the pages it takes."""

    label: str
    named: str  # a text the one-line error contains when this write is the first refused
    pages: int


@pytest.fixture(scope="module")
def modules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_module(tmp_path_factory.mktemp("mods"), "two", TWO_ENTRIES)


@pytest.fixture(scope="module")
def writes(tmp_path_factory: pytest.TempPathFactory, modules: Path) -> list[Write]:
    """The dry run, shared by every case: the warm-up's writes in order, with their pages."""
    disk = tmp_path_factory.mktemp("dry") / "disk"
    with smalldisk.mounted(disk, DISK_BYTES):
        done = warm(disk / "cache", modules, disk.parent / "term.json")
        assert done.returncode == 0, done.stderr
        cache = disk / "cache"
        entries = sorted((cache / name for name in entry_files(cache)), key=lambda p: p.stat().st_mtime_ns)
        [manifest] = (cache / ".compilecache" / "manifests").iterdir()
        modules_in_order = [path.name.split("-", 1)[0] for path in entries]
        assert modules_in_order == ["jit_first", "jit_second"], f"expected two entries, got {modules_in_order}"
        manifests = "/cache/.compilecache/manifests/"
        # The pending manifest is the complete one less the verify record: never more pages.
        size = smalldisk.pages(manifest.stat().st_size)
        return [
            *(
                Write(f"entry {m}", f"'{m}'", smalldisk.pages(p.stat().st_size))
                for m, p in zip(modules_in_order, entries, strict=True)
            ),
            Write("pending manifest", manifests, size),
            Write("complete manifest", manifests, size),
        ]


def warm(cache: Path, modules: Path, termination: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return run_cli(
        ["warm", "--cache-dir", str(cache), "--workload", "two:targets", "--termination-log", str(termination), *flags],
        clean_env(pythonpath=[modules]),
    )


def expire_verify(cache: Path) -> dict[str, Any]:
    """``expire --verify`` with no grace: every entry's bytes checked against its manifest."""
    done = run_cli(["expire", "--cache-dir", str(cache), "--verify", "--grace", "0s", "--json"], clean_env())
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def one_line_error(done: subprocess.CompletedProcess[str], command: str) -> str:
    """The run's error: non-zero, no traceback, and its last stderr line the one error line."""
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith(f"compilecache {command}: error: ")]
    assert errors == lines[-1:], done.stderr
    return lines[-1].removeprefix(f"compilecache {command}: error: ")


def manifests(cache: Path) -> list[dict[str, Any]]:
    folder = cache / ".compilecache" / "manifests"
    return [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))] if folder.is_dir() else []


def assert_consistent(cache: Path) -> None:
    """Every entry is recorded with its sha256 in a manifest, and nothing temporary is left."""
    recorded = {
        entry["file"]: entry["sha256"]
        for manifest in manifests(cache)
        for entry in manifest["entries"]
        if entry["published"]
    }
    for name in entry_files(cache):
        digest = hashlib.sha256((cache / name).read_bytes()).hexdigest()
        assert recorded.get(name) == digest, f"{name} is published without its manifest's sha256"
    assert_nothing_temporary(cache)


def assert_nothing_temporary(cache: Path) -> None:
    meta = cache / ".compilecache"
    assert not [p.name for p in cache.iterdir() if p.name.startswith(".probe-")]
    assert not [p.name for p in (meta / "manifests").iterdir() if p.name.startswith(".")] if meta.is_dir() else True
    staging = meta / "staging"
    assert not (staging.is_dir() and list(staging.iterdir())), f"staging left: {list(staging.iterdir())}"


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with smalldisk.mounted(tmp_path / "disk", DISK_BYTES) as mounted:
        yield mounted


pytestmark = [pytest.mark.slow, pytest.mark.jax]


@pytest.mark.parametrize("k", range(4), ids=["entry-1", "entry-2", "pending-manifest", "complete-manifest"])
def test_a_full_disk_at_each_write_of_a_warm_up_leaves_a_cache_that_verifies_and_warms_again(
    k: int, writes: list[Write], modules: Path, disk: Path, tmp_path: Path
) -> None:
    cache, termination = disk / "cache", tmp_path / "termination.json"
    smalldisk.fill(disk, sum(write.pages for write in writes[:k]))

    failed = warm(cache, modules, termination)
    error = one_line_error(failed, "warm")
    assert writes[k].named in error and "[Errno 28]" in error, f"{writes[k].label} should fail first: {error}"
    summary = json.loads(termination.read_text())
    assert summary["ok"] is False and summary["error"] == error

    # As it was (nothing) or complete with its manifest: the last write fails after the entries are recorded.
    published = entry_files(cache)
    states = [manifest["state"] for manifest in manifests(cache)]
    if writes[k].label == "complete manifest":
        assert len(published) == 2 and states == [PENDING], (published, states)
    else:
        assert published == [] and states == [], (published, states)
    assert_consistent(cache)
    checked = expire_verify(cache)  # on the still full disk: expiry writes nothing into the cache
    assert checked["deletions"] == [] and checked["after"]["entries"] == len(published)

    smalldisk.free(disk)
    again = warm(cache, modules, termination)
    assert again.returncode == 0, again.stderr
    summary = json.loads(termination.read_text())
    assert summary["ok"] and summary["verify"] == {"hits": 2, "requests": 2}
    assert len(entry_files(cache)) == 2 and manifests(cache)[-1]["state"] == COMPLETE
    assert_consistent(cache)
    assert expire_verify(cache)["deletions"] == []


SCRIPT = """
import jax, jax.numpy as jnp

@jax.jit
def train_step(x):
    return jnp.cos(x) * 2.0

x = jnp.zeros((8, 8))
for _ in range(2):
    x = train_step(x)
"""


def test_a_full_disk_under_an_exact_mode_warm_up_is_one_line_naming_the_errno(disk: Path, tmp_path: Path) -> None:
    # The script runs in a child process: JAX's refused writes there must reach the warmer's error too.
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    smalldisk.fill(disk, 0)
    command = ["warm", "--cache-dir", str(disk / "cache"), "--script", str(script), "--steps", "2"]
    error = one_line_error(run_cli(command, clean_env()), "warm")
    assert error.startswith(f"JAX could not write into {disk / 'cache'}/.compilecache/staging/"), error
    assert "Error writing persistent compilation cache entry" in error and "[Errno 28]" in error, error
    assert_consistent(disk / "cache")
    assert entry_files(disk / "cache") == []


def test_what_a_killed_run_left_goes_at_the_next_warm_and_expire(modules: Path, disk: Path, tmp_path: Path) -> None:
    cache = disk / "cache"

    def leave_leftovers() -> None:
        # What a killed warmer leaves: its staging (a partial entry in it), a temporary manifest, a probe.
        staging = cache / ".compilecache" / "staging" / "killed-run"
        staging.mkdir(parents=True, exist_ok=True)
        (staging / f"jit_x-{'a' * 64}-cache").write_bytes(b"\x28\xb5\x2f")
        (cache / ".compilecache" / "manifests").mkdir(exist_ok=True)
        temporary = cache / ".compilecache" / "manifests" / ".killed-run.json.tmp"
        temporary.write_text('{"half": ')
        probe = cache / ".probe-killed"
        probe.touch()
        old = os.stat(cache).st_mtime - 3 * 3600  # past both grace periods (10 min, 2 h)
        for path in (staging, temporary, probe):
            os.utime(path, (old, old))

    leave_leftovers()
    done = warm(cache, modules, tmp_path / "term.json", "--no-verify")
    assert done.returncode == 0, done.stderr
    assert_consistent(cache)

    leave_leftovers()
    result = expire_verify(cache)
    assert sorted(d["name"] for d in result["deletions"]) == [
        ".compilecache/manifests/.killed-run.json.tmp",
        ".compilecache/staging/killed-run",
        ".probe-killed",
    ]
    assert_consistent(cache)


def test_a_manifest_the_disk_refuses_names_its_path_and_errno_and_leaves_no_temporary_file(disk: Path) -> None:
    store = LocalStore(disk / "cache")
    store.prepare("run-1")
    smalldisk.fill(disk, 0)
    with pytest.raises(Exception, match=r"write \S+/run-1\.json failed: \[Errno 28\] ENOSPC") as refused:
        store.write_manifest("run-1.json", b"{}" * smalldisk.PAGE)
    assert type(refused.value).__name__ == "StorageError"
    assert list((disk / "cache" / ".compilecache" / "manifests").iterdir()) == []
    assert store.scan().temporary == ()
