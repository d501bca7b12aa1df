"""Where a cache lives: a local directory (a mounted PVC) or a GCS prefix, behind one interface.

The warmer uses a store to stage and publish entries and to write run manifests;
expiry uses it to list entries with their sizes and times, read them, delete
them and read the manifests.

* Local directory: JAX never writes into the live cache. It compiles into a
  staging directory inside the cache (same filesystem), the store checks every
  new entry and publishes it with a ``rename`` (atomic).
* GCS (``gs://bucket/prefix``, through gcsfs, the same path JAX itself takes via
  etils): an object appears whole or not at all, so JAX writes into the prefix
  directly; the store still checks every new entry (and deletes an unsound one).

Layout, identical on both: entries (``<module>-<sha256>-cache``) and JAX's
``-atime`` sidecars at the top, manifests under ``.compilecache/manifests/``,
local staging under ``.compilecache/staging/<run_id>/``.

Faults (docs/faults.md): a warm run checks its entries (:meth:`CacheStore.check`),
records them in a *pending* manifest, and only then publishes them
(:meth:`CacheStore.publish`), so that every published entry has a manifest with its
sha256; a write the storage refuses (disk full, quota) is a one-line
:class:`~compilecache.cache.errors.StorageError` naming the path and errno, and a
refused write leaves no temporary file behind. Temporary files and staging that a
killed process left are listed (:attr:`Listing.temporary`, :attr:`Listing.staging`)
for the next warm or expiry to delete.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import logging
import os
import tempfile
import time
from collections.abc import Collection, Generator, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from compilecache.cache import nofollow
from compilecache.cache.entries import (
    ATIME_SUFFIX,
    CHUNK_BYTES,
    EntryError,
    is_entry_name,
    scan_entry,
    stream_problem,
)
from compilecache.cache.errors import WarmError, one_line, storage_error
from compilecache.cache.manifests import MAX_MANIFEST_BYTES, Malformed, Manifests, gathered, parse_manifest

META_DIR = ".compilecache"
MANIFESTS_DIR = f"{META_DIR}/manifests"
STAGING_DIR = f"{META_DIR}/staging"
PROBE_PREFIX = ".probe-"  # the warmer's writability probe at the top of a local cache
GCS_SCHEME = "gs://"
_READERS = 8  # concurrent entry reads: GCS latency or disk, not CPU, bounds them
# GCS reads an entry in ranges of this size: 8 readers hold at most 64 MiB, and a range is one
# request's worth of latency for 8 MiB of data.
_GCS_RANGE_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class StagedEntry:
    """A checked entry in staging, with what the manifest records about it."""

    name: str
    size: int
    sha256: str
    published: bool  # False: another run published the same key first (kept theirs)


@dataclass(frozen=True)
class StoredFile:
    """One listed file (or staging dir): its name relative to the cache root, size and modification time."""

    name: str
    size: int
    mtime: float  # POSIX seconds


@dataclass(frozen=True)
class Listing:
    """What a scan of the cache found."""

    files: tuple[StoredFile, ...]  # entries and -atime sidecars at the top level
    staging: tuple[StoredFile, ...] = ()  # staging dirs of runs (local stores only)
    notes: tuple[str, ...] = ()  # what the scan left alone and why (symbolic links)
    # Files of a write that never finished: ``.compilecache/manifests/.<name>.tmp`` and
    # the warmer's ``.probe-*`` (local stores only; a GCS object appears whole or not at all).
    temporary: tuple[StoredFile, ...] = ()


class CacheStore(Protocol):
    """The operations the warmer and expiry need from a cache location."""

    url: str
    # True where JAX writes straight into the cache (GCS): another run's entries may
    # appear in the listing meanwhile, so the warmer keeps only the keys it wrote.
    writes_in_place: bool

    def jax_dir(self) -> str:
        """The directory string JAX reads when training (and ``--verify``) use the cache."""
        ...

    def prepare(self, run_id: str) -> str:
        """Get ready for a warm run; return where JAX writes during it (staging or the cache)."""
        ...

    def set_aside(self, workdir: str, damaged: Collection[str]) -> None:
        """Keep damaged published entries out of this run's sight; its fresh ones replace them atomically.

        JAX must not see a damaged entry: it would miss, recompile and, as the file
        exists, never write a sound one (JAX's ``LRUCache.put`` skips existing keys).
        """
        ...

    def new_entries(self, workdir: str) -> list[str]:
        """Entry files in ``workdir`` that this run compiled (not there before it)."""
        ...

    def check(self, workdir: str, names: list[str]) -> list[StagedEntry]:
        """Check every named entry (size, sha256, whether it will be published); raise
        :class:`EntryError` if any is unsound. Nothing new becomes visible."""
        ...

    def publish(self, workdir: str, staged: list[StagedEntry]) -> list[StagedEntry]:
        """Publish checked entries (after their pending manifest is stored); return what was published."""
        ...

    def withdraw(self, names: list[str]) -> None:
        """Take back this run's entries that are live already (GCS) when their manifest cannot be stored."""
        ...

    def write_manifest(self, name: str, data: bytes) -> str:
        """Store a run's manifest under a unique name, whole or not at all; return where it went."""
        ...

    def discard(self, workdir: str) -> None:
        """Remove this run's staging, if any."""
        ...

    def scan(self) -> Listing:
        """Entries and sidecars with size and time (one listing, no per-file round trip), and staging dirs."""
        ...

    def read(self, name: str) -> bytes:
        """The bytes of a listed file."""
        ...

    def stream(self, name: str) -> Generator[bytes, None, None]:
        """The bytes of a listed file, a bounded piece at a time (entries reach hundreds of MB)."""
        ...

    def delete(self, name: str) -> bool:
        """Delete a listed file or staging dir; ``False`` if it was gone already (idempotent)."""
        ...

    def read_manifests(self) -> Manifests:
        """Every run manifest, each checked against its schema; the malformed ones set aside, named."""
        ...


def open_store(cache_dir: str) -> CacheStore:
    """The store for ``--cache-dir``: a local path, or ``gs://bucket/prefix``."""
    if cache_dir.startswith(GCS_SCHEME):
        return GCSStore(cache_dir)
    if "://" in cache_dir:
        raise WarmError(f"cache dir {cache_dir}: only local paths and gs://bucket/prefix are supported")
    return LocalStore(Path(cache_dir))


def is_cache_file(name: str) -> bool:
    """True for what expiry manages at the top of a cache: entries and ``-atime`` sidecars."""
    return is_entry_name(name) or (name.endswith(ATIME_SUFFIX) and is_entry_name(name[: -len(ATIME_SUFFIX)] + "-cache"))


def unsound_entries(store: CacheStore, files: Iterable[StoredFile], digests: Mapping[str, str]) -> dict[str, str]:
    """Entry name → why its bytes cannot be relied on (sha256 against its manifest's, and a full check).

    Each entry is read once, a piece at a time (:func:`compilecache.cache.entries.stream_problem`):
    the readers hold a few MB together, whatever the entries inflate to. An entry gone meanwhile
    (another expiry), or no longer a plain file, is not judged. Reads run concurrently.
    """

    def problem(item: StoredFile) -> str | None:
        try:
            return stream_problem(store.stream(item.name), item.size, digests.get(item.name))
        except (FileNotFoundError, WarmError):
            return None

    files = list(files)
    with ThreadPoolExecutor(max_workers=_READERS) as pool:
        found = dict(zip((item.name for item in files), pool.map(problem, files), strict=True))
    return {name: why for name, why in found.items() if why is not None}


class LocalStore:
    """A cache in a local directory (a PVC mounted at the same path everywhere)."""

    writes_in_place = False

    def __init__(self, root: Path) -> None:
        self.root = root.absolute()
        self.url = str(self.root)
        self._seeded: dict[str, set[str]] = {}
        # Per staging dir: damaged published entries to replace, by the identity of the damaged file.
        self._replace: dict[str, dict[str, tuple[int, int, int, int]]] = {}

    def jax_dir(self) -> str:
        """The cache directory itself."""
        return str(self.root)

    def prepare(self, run_id: str) -> str:
        """``DIR/.compilecache/staging/<run_id>/``, hard-linked to every published entry.

        The links let JAX hit what earlier runs published (recorded as hits)
        without ever writing into the live directory.
        """
        staging = self.root / STAGING_DIR / run_id
        self._check_folder()
        if not self.root.parent.exists():
            # One missing level is made (a fresh cache folder); a missing tree is more likely a
            # typo, or a volume mounted elsewhere, than a wish: never build it silently.
            raise WarmError(
                f"cache dir {self.root}: its parent {self.root.parent} does not exist; create it first "
                "(only the cache folder itself is created)"
            )
        try:
            self.root.mkdir(exist_ok=True)
            # Staging and manifests are written and later deleted by path: a link on the
            # way would take both out of the cache.
            for folder in (META_DIR, STAGING_DIR, MANIFESTS_DIR):
                if nofollow.is_link(self.root, folder):
                    raise WarmError(f"cache dir {self.root}: {folder} is a symbolic link; remove it")
            staging.mkdir(parents=True)
            (self.root / MANIFESTS_DIR).mkdir(exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.root, prefix=PROBE_PREFIX):
                pass
        except OSError as error:
            raise storage_error("cache dir is not writable: prepare", str(error.filename or self.root), error) from None
        seeded: set[str] = set()
        try:
            with os.scandir(self.root) as listing:
                for item in listing:
                    if is_entry_name(item.name) and item.is_file(follow_symlinks=False):
                        _link_or_symlink(self.root / item.name, staging / item.name)
                        seeded.add(item.name)
        except OSError as error:  # a link needs a directory block on ext4: a full disk refuses it
            self.discard(str(staging))
            raise storage_error("link", str(error.filename or staging), error) from None
        self._seeded[str(staging)] = seeded
        return str(staging)

    def _check_folder(self) -> None:
        """A cache dir (or its parent) that is a file, named as such: ``mkdir`` would say only EEXIST."""
        for path in (self.root, self.root.parent):
            if path.exists() and not path.is_dir():
                raise WarmError(
                    f"cache dir {self.root}: {path} is a file, not a folder; give the path of a folder "
                    "(the mounted cache volume, or a new folder to create)"
                )

    def set_aside(self, workdir: str, damaged: Collection[str]) -> None:
        """Remove the damaged entries' links from staging, so that JAX compiles them again there,
        and remember which file each one is: :meth:`publish` renames the fresh entry over it."""
        seeded = self._seeded.get(workdir, set())
        replace = self._replace.setdefault(workdir, {})
        for name in damaged:
            (Path(workdir) / name).unlink(missing_ok=True)
            seeded.discard(name)
            # Deleted meanwhile (an expiry): the fresh entry is simply new.
            with contextlib.suppress(FileNotFoundError):
                replace[name] = _identity(self.root / name)

    def new_entries(self, workdir: str) -> list[str]:
        """Entries JAX wrote into staging during this run."""
        seeded = self._seeded.get(workdir, set())
        return sorted(
            path.name
            for path in Path(workdir).iterdir()
            if is_entry_name(path.name) and path.name not in seeded and path.is_file()
        )

    def check(self, workdir: str, names: list[str]) -> list[StagedEntry]:
        """Check all (nothing is published if one is unsound); ``published`` says whether each would
        replace nothing (or the damaged file found at prepare) if published now."""
        staging = Path(workdir)
        checked: list[StagedEntry] = []
        bad: list[str] = []
        try:
            for name in names:
                with (staging / name).open("rb") as handle:
                    try:
                        scanned = scan_entry(iter(lambda: handle.read(CHUNK_BYTES), b""))
                    except EntryError as error:
                        bad.append(f"{name}: {error}")
                        continue
                checked.append(StagedEntry(name, scanned.size, scanned.sha256, self._publishable(workdir, name)))
        except OSError as error:
            raise storage_error("read", str(error.filename or staging), error) from None
        if bad:
            raise EntryError(f"{len(bad)} unsound entries, nothing published: " + "; ".join(bad) + _full_note(staging))
        return checked

    def publish(self, workdir: str, staged: list[StagedEntry]) -> list[StagedEntry]:
        """``rename`` each checked entry into the cache (atomic on one filesystem)."""
        staging = Path(workdir)
        result = []
        for entry in staged:
            # Decided again at the rename: a concurrent run may have published the key meanwhile.
            published = self._publishable(workdir, entry.name)
            if published:
                try:
                    os.rename(staging / entry.name, self.root / entry.name)
                except OSError as error:  # a new directory entry may need a block: a full disk refuses it
                    raise storage_error("publish", str(self.root / entry.name), error) from None
            result.append(StagedEntry(entry.name, entry.size, entry.sha256, published))
        return result

    def _publishable(self, workdir: str, name: str) -> bool:
        # Same key, same program: if a concurrent run published it first, keep
        # theirs rather than replace a file a training process may be reading;
        # unless it is still the damaged file found at prepare. rename() swaps the
        # directory entry atomically: a reader opens the old file or the new one,
        # never a partial one, and one that has the old file open keeps reading it.
        target = self.root / name
        replace = self._replace.get(workdir, {})
        return not target.exists() or (name in replace and _identity(target) == replace[name])

    def withdraw(self, names: list[str]) -> None:
        """Nothing to take back: entries stay in staging until :meth:`publish`."""

    def write_manifest(self, name: str, data: bytes) -> str:
        """Write to a temporary name, then rename over any earlier version (the run's pending
        manifest): readers see the old manifest or the new one, never half of one. A refused
        write removes its temporary file."""
        path = self.root / MANIFESTS_DIR / name
        try:
            nofollow.write_new(self.root, f"{MANIFESTS_DIR}/{name}", data)
        except OSError as error:
            raise storage_error("write", str(path), error) from None
        return str(path)

    def discard(self, workdir: str) -> None:
        """Remove staging (links and any unpublished entries) and forget it."""
        with contextlib.suppress(OSError, WarmError):
            nofollow.remove_tree(self.root, os.path.relpath(workdir, self.root))
        self._seeded.pop(workdir, None)
        self._replace.pop(workdir, None)

    def scan(self) -> Listing:
        """One ``scandir`` of the top level (its stat is cached per entry) and one of staging.

        Nothing is followed: an entry or a folder that is a symbolic link is not listed
        (so never read or deleted) but named in the listing's notes.
        """
        self._check_folder()
        if not self.root.is_dir():
            raise WarmError(f"cache dir {self.root} does not exist: give the folder the cache lives in")
        files, notes, temporary = [], [], []
        with os.scandir(self.root) as listing:
            for item in listing:
                if item.name.startswith(PROBE_PREFIX) and item.is_file(follow_symlinks=False):
                    temporary.append(StoredFile(item.name, 0, item.stat(follow_symlinks=False).st_mtime))
                if not is_cache_file(item.name):
                    continue
                if item.is_symlink():
                    notes.append(str(nofollow.LinkError(item.name)))
                elif item.is_file(follow_symlinks=False):
                    stat = item.stat(follow_symlinks=False)
                    files.append(StoredFile(item.name, stat.st_size, stat.st_mtime))
        staging = []
        try:
            with nofollow.open_dir(self.root, STAGING_DIR) as folder, os.scandir(folder) as runs:
                for item in runs:
                    name = f"{STAGING_DIR}/{item.name}"
                    if item.is_symlink():
                        notes.append(str(nofollow.LinkError(name)))
                    elif item.is_dir(follow_symlinks=False):
                        # A staging dir's mtime moves with every entry JAX writes into it.
                        staging.append(StoredFile(name, 0, item.stat(follow_symlinks=False).st_mtime))
        except nofollow.LinkError as error:
            notes.append(str(error))
        except (FileNotFoundError, NotADirectoryError):
            pass
        try:
            with nofollow.open_dir(self.root, MANIFESTS_DIR) as folder, os.scandir(folder) as manifests:
                for item in manifests:
                    if nofollow.is_temporary_name(item.name) and item.is_file(follow_symlinks=False):
                        stat = item.stat(follow_symlinks=False)
                        temporary.append(StoredFile(f"{MANIFESTS_DIR}/{item.name}", stat.st_size, stat.st_mtime))
        except nofollow.LinkError:
            pass  # named in the notes by the manifests' own read
        except (FileNotFoundError, NotADirectoryError):
            pass
        return Listing(tuple(files), tuple(staging), tuple(notes), tuple(temporary))

    def read(self, name: str) -> bytes:
        """The file's bytes (a link is not read: :class:`~compilecache.cache.nofollow.LinkError`)."""
        return nofollow.read_bytes(self.root, name)

    def stream(self, name: str) -> Generator[bytes, None, None]:
        """The file's bytes in pieces of :data:`~compilecache.cache.entries.CHUNK_BYTES`, never through a link."""
        with nofollow.open_file(self.root, name) as handle:
            while chunk := handle.read(CHUNK_BYTES):
                yield chunk

    def delete(self, name: str) -> bool:
        """``unlink`` (a reader with the file open keeps reading it) or remove a staging dir.

        Never through a link: a staging dir or a folder above it that became a link since
        the scan is left alone (``False``); an entry that became a link loses the link only.
        """
        try:
            if name.startswith(STAGING_DIR + "/"):
                return nofollow.remove_tree(self.root, name)
            return nofollow.unlink(self.root, name)
        except nofollow.LinkError:
            return False
        except OSError as error:  # e.g. read-only, immutable, or a full copy-on-write disk: one line
            raise storage_error("delete", str(self.root / name), error) from None

    def read_manifests(self) -> Manifests:
        """Every ``*.json`` under ``.compilecache/manifests`` (temporary files start with a dot), each read
        up to the size no manifest reaches; a link, a FIFO or an unreadable file is set aside unread."""
        read: list[Mapping[str, Any] | Malformed] = []
        try:
            with nofollow.open_dir(self.root, MANIFESTS_DIR) as folder:
                names = sorted(n for n in os.listdir(folder) if n.endswith(".json") and not n.startswith("."))
        except nofollow.LinkError as error:
            return Manifests(notes=(f"manifests not read: {error}",))
        except (FileNotFoundError, NotADirectoryError):
            return Manifests()
        for name in names:
            try:
                data = nofollow.read_bytes(self.root, f"{MANIFESTS_DIR}/{name}", MAX_MANIFEST_BYTES + 1)
            except FileNotFoundError:
                continue  # deleted meanwhile (an expiry took its generation)
            except WarmError as error:  # a link, a FIFO: says so itself
                read.append(Malformed(name, str(error)))
                continue
            except OSError as error:
                read.append(Malformed(name, f"not read: {one_line(error)}"))
                continue
            read.append(parse_manifest(name, data))
        return gathered(read)


# A GCS endpoint that accepts connections and never answers would hold gcsfs for its
# aiohttp session's 300 s total timeout per attempt, six attempts (the expiry Job sat
# in Expiring until its 2 h deadline). Every call here gives up once GCS has not
# answered for this long and a request has failed meanwhile: well inside a minute.
GCS_TIMEOUT_ENV = "COMPILECACHE_GCS_TIMEOUT"
DEFAULT_GCS_TIMEOUT_SECONDS = 30.0
_POLL_SECONDS = 0.2


def gcs_timeout(environ: Mapping[str, str]) -> float:
    """Seconds without an answer after which a GCS call fails (``$COMPILECACHE_GCS_TIMEOUT``, default 30)."""
    text = environ.get(GCS_TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_GCS_TIMEOUT_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= 3600:
        raise WarmError(f"${GCS_TIMEOUT_ENV}={text!r}: expected seconds between 0 and 3600")
    return seconds


class _Answers:
    """When GCS last answered, and the first request failure since: fed by aiohttp's trace hooks.

    An answer is a response's status line and headers (``on_request_end``), an error status
    included: GCS is alive then, and gcsfs's own bounded retries decide. A body that takes
    long to download is not a stall: aiohttp's ``sock_read`` timeout (a third of the budget)
    turns a silent socket into a failure, and only failures start the clock.
    """

    def __init__(self) -> None:
        self.answered_at = time.monotonic()
        self.failure: str | None = None

    def reset(self) -> None:
        self.answered_at, self.failure = time.monotonic(), None

    def stalled_for(self, now: float) -> float:
        """Seconds since the last answer if a request failed meanwhile, else 0."""
        return now - self.answered_at if self.failure is not None else 0.0

    def trace_config(self) -> Any:
        import aiohttp

        async def answered(*_: Any) -> None:
            self.answered_at, self.failure = time.monotonic(), None

        async def failed(_session: Any, _context: Any, params: Any) -> None:
            if self.failure is None:
                error = params.exception
                self.failure = f"{type(error).__name__}: {error}".strip().rstrip(":").splitlines()[0]

        config = aiohttp.TraceConfig()
        config.on_request_end.append(answered)
        config.on_request_exception.append(failed)
        return config


class GCSStore:
    """A cache under ``gs://bucket/prefix``, through gcsfs (credentials from the environment)."""

    writes_in_place = True

    def __init__(self, url: str, timeout: float | None = None) -> None:
        rest = url[len(GCS_SCHEME) :].rstrip("/")
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise WarmError(f"cache dir {url}: no bucket (expected gs://bucket/prefix)")
        self.bucket = bucket
        self.root = f"{bucket}/{prefix.strip('/')}" if prefix.strip("/") else bucket
        self.url = f"{GCS_SCHEME}{self.root}"
        self.timeout = gcs_timeout(os.environ) if timeout is None else timeout
        self._seeded: set[str] = set()
        self._fs: Any = None
        self._answers = _Answers()

    @property
    def fs(self) -> Any:
        """The gcsfs filesystem, built on first use (importing gcsfs is slow, and optional)."""
        if self._fs is None:
            try:
                import aiohttp
                import gcsfs
            except ImportError as error:
                raise WarmError("gs:// caches need gcsfs: install compilecache-operator[gcs] in this image") from error
            _require_credentials(self.url, os.environ)
            # gcsfs logs a traceback when a request runs out of retries, then raises the error,
            # which every call here reports in one line: the traceback would only bury it.
            logging.getLogger("gcsfs").addFilter(_quiet_out_of_retries)
            # Per request: connecting and each socket read wait at most a third of the budget
            # (no total: a large entry downloads as long as bytes keep coming).
            socket_seconds = self.timeout / 3
            self._fs = gcsfs.GCSFileSystem(
                requests_timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=socket_seconds, sock_read=socket_seconds
                ),
                session_kwargs={"trace_configs": [self._answers.trace_config()]},
                skip_instance_cache=True,
            )
        return self._fs

    def jax_dir(self) -> str:
        """The ``gs://`` URL: JAX reads (and writes) it through etils."""
        return self.url

    def prepare(self, run_id: str) -> str:
        """Check the bucket is reachable and remember what is there; JAX writes into the prefix."""
        self._seeded = {item.name for item in self.scan().files}
        return self.url

    def set_aside(self, workdir: str, damaged: Collection[str]) -> None:
        """Delete the damaged objects: JAX then uploads fresh ones, each whole (a GCS object
        appears whole or not at all), and a reader meanwhile misses as it would on the damaged one."""
        for name in damaged:
            self.delete(name)
            self._seeded.discard(name)

    def new_entries(self, workdir: str) -> list[str]:
        """Entries listed now that were not listed when the run started."""
        return sorted(
            item.name for item in self.scan().files if is_entry_name(item.name) and item.name not in self._seeded
        )

    def check(self, workdir: str, names: list[str]) -> list[StagedEntry]:
        """Check what JAX wrote; delete an unsound object (it is live already) and fail the run."""
        result, bad = [], []
        for name in names:
            try:
                scanned = scan_entry(self.stream(name))
            except EntryError as error:
                bad.append(f"{name}: {error}")
                self.delete(name)
                continue
            result.append(StagedEntry(name, scanned.size, scanned.sha256, True))
        if bad:
            raise EntryError(f"{len(bad)} unsound entries written to {self.url}, deleted: " + "; ".join(bad))
        return result

    def publish(self, workdir: str, staged: list[StagedEntry]) -> list[StagedEntry]:
        """Nothing to do: JAX wrote the objects in place, and :meth:`check` found them sound."""
        return list(staged)

    def withdraw(self, names: list[str]) -> None:
        """Delete this run's objects (best effort): without their manifest they would lose their sha256.

        If GCS refuses this too, they stay as entries in no manifest, which expiry still checks byte
        by byte (a full decompression) and drops when unsound.
        """
        for name in names:
            with contextlib.suppress(WarmError):
                self.delete(name)

    def write_manifest(self, name: str, data: bytes) -> str:
        """One upload: a GCS object appears whole or not at all (a later one replaces the pending one)."""
        path = f"{self.root}/{MANIFESTS_DIR}/{name}"
        self._call(f"write manifest {name}", self.fs._pipe_file, path, data)
        return f"{GCS_SCHEME}{path}"

    def discard(self, workdir: str) -> None:
        """Nothing staged on GCS."""

    def scan(self) -> Listing:
        """One paginated object listing of the prefix (1000 objects a request), metadata included."""
        items = self._call("list", self.fs._ls, self.root, detail=True, refresh=True)
        files = []
        for item in items:
            name = item["name"].rsplit("/", 1)[-1]
            if item.get("type") == "file" and is_cache_file(name):
                files.append(StoredFile(name, int(item.get("size") or 0), _gcs_time(item)))
        return Listing(tuple(files))

    def read(self, name: str) -> bytes:
        """Download one object."""
        data: bytes = self._call(f"read {name}", self.fs._cat_file, f"{self.root}/{name}")
        return data

    def stream(self, name: str) -> Generator[bytes, None, None]:
        """Download one object in ranges, each of the generation listed first: a replacement uploaded
        meanwhile is never read half from the old object and half from the new one."""
        path = f"{self.root}/{name}"
        try:
            info = self._call(f"read {name}", self.fs._info, path)
        except _NotFound:
            raise FileNotFoundError(path) from None
        size = int(info.get("size") or 0)
        pinned = {"generation": info["generation"]} if info.get("generation") else {}
        for start in range(0, size, _GCS_RANGE_BYTES):
            end = min(size, start + _GCS_RANGE_BYTES)
            yield self._call(f"read {name}", self.fs._cat_file, path, start=start, end=end, **pinned)

    def delete(self, name: str) -> bool:
        """Delete one object; ``False`` when it is gone already."""
        try:
            self._call(f"delete {name}", self.fs._rm_file, f"{self.root}/{name}")
        except _NotFound:
            return False
        finally:
            self.fs.invalidate_cache(self.root)
        return True

    def read_manifests(self) -> Manifests:
        """List the manifests with their sizes, then fetch the ones of a manifest's size together (gcsfs
        runs the downloads concurrently); one that cannot be fetched is set aside, the others stand."""
        folder = f"{self.root}/{MANIFESTS_DIR}"
        try:
            listed = self._call("list manifests", self.fs._ls, folder, detail=True, refresh=True)
        except _NotFound:
            return Manifests()
        read: list[Mapping[str, Any] | Malformed] = []
        paths = []
        for item in sorted(listed, key=lambda item: str(item["name"])):
            name = str(item["name"]).rsplit("/", 1)[-1]
            if item.get("type") != "file" or not name.endswith(".json"):
                continue
            if int(item.get("size") or 0) > MAX_MANIFEST_BYTES:
                read.append(Malformed(name, f"larger than a manifest's {MAX_MANIFEST_BYTES} bytes"))
            else:
                paths.append(str(item["name"]))
        if paths:
            contents = self._call("read manifests", self.fs._cat, paths, on_error="return")
            for path in paths:
                name, data = path.rsplit("/", 1)[-1], contents.get(path)
                if isinstance(data, FileNotFoundError):
                    continue  # deleted meanwhile
                if isinstance(data, BaseException):
                    read.append(Malformed(name, f"not read: {one_line(data)}"))
                elif isinstance(data, bytes):
                    read.append(parse_manifest(name, data))
        return gathered(read)

    def write(self, name: str, data: bytes) -> None:
        """Upload one object under the prefix (a PyTorch generation's file): whole or not at all."""
        self._call(f"write {name}", self.fs._pipe_file, f"{self.root}/{name}", data)

    def find(self, folder: str) -> list[StoredFile]:
        """Every object under ``folder`` (relative to the prefix), named relative to the prefix."""
        try:
            found = self._call(f"list {folder}", self.fs._find, f"{self.root}/{folder}", detail=True)
        except _NotFound:
            return []
        start = len(self.root) + 1
        return [
            StoredFile(path[start:], int(item.get("size") or 0), _gcs_time(item))
            for path, item in sorted(found.items())
            if item.get("type") == "file"
        ]

    def _call(self, what: str, function: Any, *args: Any, **kwargs: Any) -> Any:
        """Run one gcsfs coroutine on gcsfs's loop and wait for it, within the timeout.

        One-line errors (missing bucket, no credentials, no answer) instead of a gcsfs traceback.
        """
        fs = self.fs
        self._answers.reset()
        began = time.monotonic()
        future = asyncio.run_coroutine_threadsafe(function(*args, **kwargs), fs.loop)
        while not future.done():
            concurrent.futures.wait([future], timeout=_POLL_SECONDS)
            now = time.monotonic()
            if not future.done() and self._answers.stalled_for(now) > self.timeout:
                future.cancel()
                # The limit counts from the first failed request; the user waited since the call
                # began: both, measured, so that the message never says 30 s after 47 s.
                raise WarmError(
                    f"{self.url}: {what}: GCS did not answer within {self.timeout:g}s of a failed request; "
                    f"gave up after {now - began:.1f}s ({self._answers.failure})"
                )
        try:
            return future.result()
        except FileNotFoundError as error:
            if what == "list":
                if not self._call("check the bucket", fs._exists, self.bucket):
                    raise WarmError(f"{self.url}: bucket {self.bucket} does not exist or is not readable") from error
                return []
            raise _NotFound(f"{self.url}: {what}: not found") from error
        except Exception as error:
            # OSError, ValueError, and aiohttp and google-auth errors that gcsfs passes on after its retries.
            raise WarmError(f"{self.url}: {what} failed: {one_line(error, limit=None)}") from error


# gcsfs (core.py) talks to the emulator this names, with no credentials.
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"


def _require_credentials(url: str, environ: Mapping[str, str]) -> None:
    """Fail at once, in one line, where no Google credentials can be found.

    Without any, gcsfs falls back to anonymous access (gcsfs ``credentials.py`` ``connect``: the
    last method, ``anon``, always succeeds), says "credentials not found" only in a library
    warning, and the first request then fails: measured, 46 s later with a DNS error on a machine
    without network. ``google.auth.default()`` is the lookup gcsfs itself tries first: a key file
    (``GOOGLE_APPLICATION_CREDENTIALS``), gcloud's application-default credentials, or the metadata
    server (GKE Workload Identity, a GCE VM). It answered in 0.1 s here either way; where the
    metadata address drops packets, google-auth's probe waits out its own bound (3 tries of
    ``GCE_METADATA_TIMEOUT``, 3 s: ``google/auth/compute_engine/_metadata.py``).
    """
    if environ.get(EMULATOR_ENV, "") not in ("", "default"):
        return
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        google.auth.default()
    except DefaultCredentialsError:
        raise WarmError(
            f"{url}: no Google Cloud credentials found. On GKE, run the pod as a Kubernetes ServiceAccount "
            "bound to a Google service account (Workload Identity: spec.storage.gcs.serviceAccountName); "
            "elsewhere set GOOGLE_APPLICATION_CREDENTIALS to a key file or run `gcloud auth application-default "
            f"login`; for an emulator set {EMULATOR_ENV}"
        ) from None


def _quiet_out_of_retries(record: logging.LogRecord) -> bool:
    return "out of retries" not in record.getMessage()


class _NotFound(WarmError):
    """An object or folder that is not there (``delete`` and the manifests treat it as done)."""


def _gcs_time(item: dict[str, Any]) -> float:
    # gcsfs parses `updated` into `mtime`; fall back to the raw RFC 3339 text.
    value = item.get("mtime") or item.get("updated")
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, str):
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return 0.0


def _full_note(folder: Path) -> str:
    """``; <folder>: [Errno 28] ENOSPC ...`` when its filesystem is (nearly) full: JAX's plain writes were
    cut short there, and JAX only warns about it."""
    try:
        stat = os.statvfs(folder)
    except OSError:
        return ""
    if stat.f_bavail * stat.f_frsize >= _FULL_BYTES:
        return ""
    free = stat.f_bavail * stat.f_frsize
    full = f"[Errno {errno.ENOSPC}] ENOSPC: the disk is full ({free} bytes free)"
    return f"; JAX's write into {folder} was cut short: {full}"


_FULL_BYTES = 64 * 1024


def _identity(path: Path) -> tuple[int, int, int, int]:
    """Which file a path names now: device, inode, size, modification time (ns)."""
    stat = path.stat(follow_symlinks=False)
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def _link_or_symlink(source: Path, link: Path) -> None:
    # A hard link survives an expiry deleting the entry mid-run; filesystems
    # without hard links get a symlink, which JAX's read_bytes follows.
    try:
        os.link(source, link)
    except OSError:
        link.symlink_to(source)
