"""Where a cache lives, behind a small seam: a local directory now, GCS later.

The warmer never lets JAX write into the live cache: JAX compiles into a local
staging directory, the store checks each new entry and then publishes it
atomically. For a local directory (a mounted PVC) staging sits inside the
cache on the same filesystem, so publishing is a ``rename``. A GCS store
(a later issue) stages under ``$TMPDIR`` and publishes with create-only uploads.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from compilecache.entries import EntryError, check_entry, is_entry_name, sha256_file
from compilecache.errors import WarmError

META_DIR = ".compilecache"


@dataclass(frozen=True)
class StagedEntry:
    """A checked entry in staging, with what the manifest records about it."""

    name: str
    size: int
    sha256: str
    published: bool  # False: another run published the same key first (kept theirs)


class CacheStore(Protocol):
    """The operations the warmer needs from a cache location."""

    url: str

    def jax_dir(self) -> str:
        """The directory string JAX reads when training (and ``--verify``) use the cache."""
        ...

    def prepare(self, run_id: str) -> Path:
        """Create and return this run's local staging dir, seeded so existing entries hit."""
        ...

    def new_entries(self, staging: Path) -> list[str]:
        """Entry files in staging that this run compiled (not seeded from the cache)."""
        ...

    def publish(self, staging: Path, names: list[str]) -> list[StagedEntry]:
        """Check every named entry, then publish them all; nothing if any is unsound."""
        ...

    def write_manifest(self, name: str, data: bytes) -> str:
        """Store a run's manifest under a unique name; return where it went."""
        ...

    def discard(self, staging: Path) -> None:
        """Remove this run's staging dir."""
        ...


def open_store(cache_dir: str) -> CacheStore:
    """The store for ``--cache-dir``: a local path, or (not yet) ``gs://bucket/prefix``."""
    if cache_dir.startswith("gs://"):
        raise WarmError(f"cache dir {cache_dir}: gs:// caches are not supported yet; use a local path")
    if "://" in cache_dir:
        raise WarmError(f"cache dir {cache_dir}: only local paths are supported")
    return LocalStore(Path(cache_dir))


class LocalStore:
    """A cache in a local directory (a PVC mounted at the same path everywhere)."""

    def __init__(self, root: Path) -> None:
        self.root = root.absolute()
        self.url = str(self.root)
        self._seeded: dict[Path, set[str]] = {}

    def jax_dir(self) -> str:
        """The cache directory itself."""
        return str(self.root)

    def prepare(self, run_id: str) -> Path:
        """``DIR/.compilecache/staging/<run_id>/``, hard-linked to every published entry.

        The links let JAX hit what earlier runs published (recorded as hits)
        without ever writing into the live directory.
        """
        staging = self.root / META_DIR / "staging" / run_id
        try:
            staging.mkdir(parents=True)
            (self.root / META_DIR / "manifests").mkdir(exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.root, prefix=".probe-"):
                pass
        except OSError as error:
            raise WarmError(f"cache dir {self.root} is not writable: {error.strerror or error}") from error
        seeded: set[str] = set()
        for path in self.root.iterdir():
            if is_entry_name(path.name) and path.is_file():
                _link_or_symlink(path, staging / path.name)
                seeded.add(path.name)
        self._seeded[staging] = seeded
        return staging

    def new_entries(self, staging: Path) -> list[str]:
        """Entries JAX wrote into staging during this run."""
        seeded = self._seeded.get(staging, set())
        return sorted(
            path.name
            for path in staging.iterdir()
            if is_entry_name(path.name) and path.name not in seeded and path.is_file()
        )

    def publish(self, staging: Path, names: list[str]) -> list[StagedEntry]:
        """Check all, then ``rename`` each into the cache (atomic on one filesystem)."""
        checked: list[tuple[str, int, str]] = []
        bad: list[str] = []
        for name in names:
            path = staging / name
            data = path.read_bytes()
            try:
                check_entry(data)
            except EntryError as error:
                bad.append(f"{name}: {error}")
                continue
            checked.append((name, len(data), sha256_file(path)))
        if bad:
            raise EntryError(f"{len(bad)} unsound entries, nothing published: " + "; ".join(bad))
        result = []
        for name, size, digest in checked:
            target = self.root / name
            # Same key, same program: if a concurrent run published it first, keep
            # theirs rather than replace a file a training process may be reading.
            published = not target.exists()
            if published:
                os.rename(staging / name, target)
            result.append(StagedEntry(name, size, digest, published))
        return result

    def write_manifest(self, name: str, data: bytes) -> str:
        """Write to a temporary name, then rename: readers never see half a manifest."""
        folder = self.root / META_DIR / "manifests"
        folder.mkdir(parents=True, exist_ok=True)
        temporary = folder / f".{name}.tmp"
        temporary.write_bytes(data)
        os.rename(temporary, folder / name)
        return str(folder / name)

    def discard(self, staging: Path) -> None:
        """Remove staging (links and any unpublished entries) and forget it."""
        shutil.rmtree(staging, ignore_errors=True)
        self._seeded.pop(staging, None)


def _link_or_symlink(source: Path, link: Path) -> None:
    # A hard link survives an expiry deleting the entry mid-run; filesystems
    # without hard links get a symlink, which JAX's read_bytes follows.
    try:
        os.link(source, link)
    except OSError:
        link.symlink_to(source)
