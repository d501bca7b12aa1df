"""Expiry and the warmer never follow a symbolic link below the cache root, at any level.

Each case puts a link somewhere in a real cache directory, pointing out of the cache or back
into it, next to real (fake-JAX) entries and an "outside" directory whose files are old
enough for every rule; then runs ``compilecache expire --verify`` with no grace at all.
The outside stays whole, the link stays, and the run names it in its notes.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from compilecache.cache import nofollow
from compilecache.cache.manifests import JAX_SCHEMA
from compilecache.cli.main import main

OLD = time.time() - 30 * 86400


def entry_name(key: str) -> str:
    return f"jit_{key}-{hashlib.sha256(key.encode()).hexdigest()}-cache"


def sound(payload: bytes = b"executable" * 20) -> bytes:
    return zlib.compress((1).to_bytes(4, "big") + payload)


def age(*paths: Path) -> None:
    for path in paths:
        os.utime(path, (OLD, OLD), follow_symlinks=False)


def tree(root: Path) -> dict[str, bytes | None]:
    """Every file (bytes) and directory (None) under ``root``, links included as their target text."""
    found: dict[str, bytes | None] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            key = str(path.relative_to(root))
            found[key] = (
                os.readlink(path).encode() if path.is_symlink() else (None if path.is_dir() else path.read_bytes())
            )
    return found


def make_outside(outside: Path) -> None:
    """Old things that expiry would delete if they were in the cache."""
    (outside / "old-run").mkdir(parents=True)
    (outside / "old-run" / "precious.txt").write_text("not the cache's")
    (outside / "staging" / "old-run").mkdir(parents=True)
    (outside / "manifests").mkdir()
    (outside / entry_name("out")).write_bytes(b"\x78\x9c truncated")  # looks like a damaged entry
    age(outside / "old-run", outside / "staging" / "old-run", outside / entry_name("out"))


def link_meta(cache: Path, outside: Path) -> str:
    (cache / ".compilecache").symlink_to(outside, target_is_directory=True)
    return ".compilecache"


def link_staging(cache: Path, outside: Path) -> str:
    (cache / ".compilecache").mkdir()
    (cache / ".compilecache" / "staging").symlink_to(outside, target_is_directory=True)
    return ".compilecache/staging"


def link_run(cache: Path, outside: Path) -> str:
    (cache / ".compilecache" / "staging").mkdir(parents=True)
    (cache / ".compilecache" / "staging" / "run-x").symlink_to(outside / "old-run", target_is_directory=True)
    return ".compilecache/staging/run-x"


def link_manifests(cache: Path, outside: Path) -> str:
    # A manifest out there claims another sha256 for the cache's sound entry: read, it would delete it.
    document = {
        "schema": JAX_SCHEMA,
        "run_id": "run",
        "jax": "0",
        "jaxlib": "0",
        "backend": "cpu",
        "device_kind": "cpu",
        "finished_at": "2025-01-01T00:00:00Z",
    }
    document["entries"] = [{"file": entry_name("sound"), "sha256": "0" * 64, "written_at": "2025-01-01T00:00:00Z"}]
    (outside / "manifests" / "run.json").write_text(json.dumps(document))
    (cache / ".compilecache").mkdir()
    (cache / ".compilecache" / "manifests").symlink_to(outside / "manifests", target_is_directory=True)
    return ".compilecache/manifests"


def link_entry(cache: Path, outside: Path) -> str:
    (cache / entry_name("out")).symlink_to(outside / entry_name("out"))
    return entry_name("out")


def link_sidecar(cache: Path, outside: Path) -> str:
    sidecar = entry_name("gone").replace("-cache", "-atime")
    (cache / sidecar).symlink_to(outside / "old-run" / "precious.txt")
    return sidecar


def link_staging_to_root(cache: Path, outside: Path) -> str:
    # Inside the cache: followed, the cache's own entries and manifests would look like old staging.
    (cache / ".compilecache").mkdir()
    (cache / ".compilecache" / "staging").symlink_to("..", target_is_directory=True)
    return ".compilecache/staging"


def link_run_to_root(cache: Path, outside: Path) -> str:
    (cache / ".compilecache" / "staging").mkdir(parents=True)
    (cache / ".compilecache" / "staging" / "run-y").symlink_to(cache, target_is_directory=True)
    return ".compilecache/staging/run-y"


def link_entry_to_entry(cache: Path, outside: Path) -> str:
    # A link to the cache's own damaged entry: the entry goes by its own name, the link is left.
    (cache / entry_name("alias")).symlink_to(cache / entry_name("short"))
    return entry_name("alias")


CASES: dict[str, Callable[[Path, Path], str]] = {
    "meta dir": link_meta,
    "staging dir": link_staging,
    "a run's staging dir": link_run,
    "manifests dir": link_manifests,
    "entry": link_entry,
    "-atime sidecar": link_sidecar,
    "staging dir into the cache root": link_staging_to_root,
    "run dir to the cache root": link_run_to_root,
    "entry to another entry": link_entry_to_entry,
}


@pytest.mark.parametrize("case", list(CASES))
def test_expire_never_follows_a_link(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str) -> None:
    cache, outside = tmp_path / "cache", tmp_path / "outside"
    cache.mkdir()
    make_outside(outside)
    (cache / entry_name("sound")).write_bytes(sound())
    (cache / entry_name("short")).write_bytes(sound()[:-6])
    link = CASES[case](cache, outside)
    age(*(p for p in cache.iterdir() if not p.is_symlink()))
    outside_before = tree(outside)
    link_target = os.readlink(cache / link)

    argv = ["expire", "--cache-dir", str(cache), "--verify", "--grace", "0s", "--staging-grace", "0s", "--json"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)

    assert tree(outside) == outside_before, "deleted or changed outside the cache"
    assert os.readlink(cache / link) == link_target, "the link itself was removed or changed"
    assert any(f"{link} is a symbolic link" in note for note in result["notes"]), result["notes"]
    deleted = {d["name"] for d in result["deletions"]}
    assert deleted == {entry_name("short")}, deleted  # the cache's own damaged entry, nothing else
    assert (cache / entry_name("sound")).read_bytes() == sound()


def test_warm_refuses_to_stage_through_a_link(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache, outside = tmp_path / "cache", tmp_path / "outside"
    cache.mkdir()
    make_outside(outside)
    link_staging(cache, outside)
    before = tree(outside)
    assert main(["warm", "--cache-dir", str(cache), "--workload", "never.imported:targets"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert ".compilecache/staging is a symbolic link" in line
    assert tree(outside) == before


def test_the_primitives_refuse_links_and_unlink_only_the_link(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "file").write_bytes(b"x")
    (tmp_path / "dirlink").symlink_to(tmp_path / "real", target_is_directory=True)
    (tmp_path / "filelink").symlink_to(tmp_path / "real" / "file")
    with pytest.raises(nofollow.LinkError, match="dirlink is a symbolic link"):
        nofollow.read_bytes(tmp_path, "dirlink/file")
    with pytest.raises(nofollow.LinkError, match="filelink is a symbolic link"):
        nofollow.read_bytes(tmp_path, "filelink")
    with pytest.raises(nofollow.LinkError):
        nofollow.remove_tree(tmp_path, "dirlink")
    with pytest.raises(nofollow.LinkError):
        nofollow.unlink(tmp_path, "dirlink/file")
    assert nofollow.unlink(tmp_path, "filelink") and not nofollow.unlink(tmp_path, "filelink")
    assert (tmp_path / "real" / "file").read_bytes() == b"x"
    assert nofollow.remove_tree(tmp_path, "real") and not nofollow.remove_tree(tmp_path, "real")
    assert nofollow.is_link(tmp_path, "dirlink") and nofollow.is_link(tmp_path, "dirlink/anything")
    assert not nofollow.is_link(tmp_path, "missing/x")


def test_remove_tree_unlinks_links_inside_and_reaches_below_the_recursion_limit(tmp_path: Path) -> None:
    """Inside the tree a link is removed, never entered; a tree deeper than Python's recursion limit
    goes whole (the walk is by descriptor with a stack: Python 3.10's rmtree has no ``dir_fd``)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_bytes(b"k")
    root = tmp_path / "root"
    deep = root / "tree"
    deep.mkdir(parents=True)
    (deep / "to-outside").symlink_to(outside)
    (deep / "file-link").symlink_to(outside / "keep")
    os.mkfifo(deep / "fifo")
    fd = os.open(deep, os.O_RDONLY | os.O_DIRECTORY)
    # Past CPython's default recursion limit (1000), where a recursive walk fails; not past
    # sys.getrecursionlimit(), which the operator raises for deep JSON (bounds.py) when a test before ran it.
    for _ in range(1100):  # by descriptor: paths this long resolve slowly
        os.mkdir("d", dir_fd=fd)
        below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = below
    os.close(os.open("leaf", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    os.close(fd)
    assert nofollow.remove_tree(root, "tree")
    assert not deep.exists() and os.listdir(root) == []
    assert (outside / "keep").read_bytes() == b"k"
