"""A small real filesystem for fault tests: a tmpfs of a few pages, filled to leave an exact free space.

tmpfs counts data in whole pages and nothing else (directories, links and empty files take
none), so "N pages free" means exactly that the writes needing more than N pages in all fail
with ENOSPC, as on a full PVC. Mounting needs root (we are root here and in CI); without it
the tests skip, saying why.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

PAGE = os.sysconf("SC_PAGE_SIZE")
FILLER = "filler"  # at the top of the disk, beside the cache: never a cache file


def pages(size: int) -> int:
    """Pages a file of ``size`` bytes takes on a tmpfs."""
    return -(-size // PAGE)


def free_bytes(disk: Path) -> int:
    """What the disk still accepts."""
    stat = os.statvfs(disk)
    return stat.f_bavail * stat.f_frsize


@contextlib.contextmanager
def mounted(disk: Path, size: int) -> Iterator[Path]:
    """A tmpfs of ``size`` bytes at ``disk`` for the block; the test skips where mounting is refused."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    disk.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True, check=False, timeout=30)


def fill(disk: Path, leave_pages: int) -> None:
    """Fill the disk so that exactly ``leave_pages`` pages stay free."""
    extra = free_bytes(disk) - leave_pages * PAGE
    assert extra >= 0, f"the disk has {free_bytes(disk)} bytes free, fewer than the {leave_pages} pages to leave"
    (disk / FILLER).write_bytes(b"\0" * extra)
    assert free_bytes(disk) == leave_pages * PAGE, f"filled to {free_bytes(disk)} bytes free, not {leave_pages} pages"


def free(disk: Path) -> None:
    """Give the space back (the operator's answer to a full disk: a bigger claim, or room made)."""
    (disk / FILLER).unlink()
