"""PyTorch generations in a cache store (a local directory or ``gs://``): publish, list, fetch, delete.

The layout and the rules are :mod:`compilecache.frameworks.pytorch.cache`'s; this module does the I/O on
top of :mod:`compilecache.cache.store` (the same stores, manifests and no-follow file access as
JAX's entries). Used by the warm-up (:mod:`compilecache.frameworks.pytorch.warm`), expiry
(:mod:`compilecache.frameworks.pytorch.expire`) and the training hook (:mod:`compilecache.frameworks.pytorch.hook`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compilecache.cache import nofollow
from compilecache.cache.errors import WarmError, one_line, storage_error
from compilecache.cache.store import CacheStore, GCSStore, LocalStore, StoredFile
from compilecache.frameworks.pytorch.cache import GENERATIONS_DIR, generation_dir, manifest_entries

_READERS = 8  # concurrent reads: GCS latency, not CPU, bounds a fetch


def list_tree(root: Path) -> list[str]:
    """Every regular file under ``root``, relative to it; links are neither followed nor listed."""
    found = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        base = Path(folder)
        dirs[:] = [d for d in dirs if not (base / d).is_symlink()]
        for name in files:
            path = base / name
            if path.is_file() and not path.is_symlink():
                found.append(path.relative_to(root).as_posix())
    return sorted(found)


def file_records(root: Path, names: Iterable[str]) -> list[dict[str, Any]]:
    """``{file, size, sha256}`` of each named file under ``root``: what a manifest records."""
    records = []
    for name in names:
        data = (root / name).read_bytes()
        records.append({"file": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    return records


def publish(store: CacheStore, tree: Path, run_id: str, names: Sequence[str], drop: Iterable[str]) -> str:
    """Make ``tree`` (a checked warm-up tree) the generation ``torch/<run_id>``; return its location.

    Local: ``tree`` is the run's staging folder inside the cache; what must not be published is
    deleted from it, then one ``rename`` moves it into place (same filesystem: atomic, and a
    reader sees the whole folder or none). GCS: each file is uploaded (an object appears whole or
    not at all); the generation is used only once its manifest is stored, after this.
    """
    target = generation_dir(run_id)
    if isinstance(store, LocalStore):
        for name in drop:
            (tree / name).unlink(missing_ok=True)
        _remove_empty_dirs(tree)
        try:
            if nofollow.is_link(store.root, GENERATIONS_DIR):
                raise WarmError(f"cache dir {store.root}: {GENERATIONS_DIR} is a symbolic link; remove it")
            (store.root / GENERATIONS_DIR).mkdir(exist_ok=True)
            os.rename(tree, store.root / target)
        except OSError as error:
            raise storage_error("publish", str(store.root / target), error) from None
        return str(store.root / target)
    if isinstance(store, GCSStore):

        def upload(name: str) -> None:
            store.write(f"{target}/{name}", (tree / name).read_bytes())

        with ThreadPoolExecutor(max_workers=_READERS) as pool:
            list(pool.map(upload, names))
        return f"{store.url}/{target}"
    raise WarmError(f"cache {store.url}: PyTorch caches need a local directory or gs://")


def _remove_empty_dirs(tree: Path) -> None:
    for folder, _, _ in sorted(os.walk(tree), key=lambda item: -len(item[0])):
        if Path(folder) != tree:
            with contextlib.suppress(OSError):  # not empty: it holds published files
                os.rmdir(folder)


def list_generations(store: CacheStore) -> dict[str, list[StoredFile]]:
    """run id → the files of its generation (named relative to the cache root)."""
    files: list[StoredFile] = []
    if isinstance(store, LocalStore):
        root = store.root / GENERATIONS_DIR
        if nofollow.is_link(store.root, GENERATIONS_DIR) or not root.is_dir():
            return {}
        for name in list_tree(root):
            stat = (root / name).stat()
            files.append(StoredFile(f"{GENERATIONS_DIR}/{name}", stat.st_size, stat.st_mtime))
        # A generation may be empty (nothing publishable): its folder still counts.
        found: dict[str, list[StoredFile]] = {
            item.name: [] for item in os.scandir(root) if item.is_dir(follow_symlinks=False)
        }
    elif isinstance(store, GCSStore):
        files = store.find(GENERATIONS_DIR)
        found = {}
    else:
        raise WarmError(f"cache {store.url}: PyTorch caches need a local directory or gs://")
    for item in files:
        parts = item.name.split("/", 2)
        if len(parts) == 3:
            found.setdefault(parts[1], []).append(item)
    return found


def delete_generation(store: CacheStore, run_id: str, files: Sequence[StoredFile]) -> None:
    """Remove a whole generation (its manifest goes after it, so no manifest names missing files)."""
    if isinstance(store, LocalStore):
        try:
            nofollow.remove_tree(store.root, generation_dir(run_id))
        except nofollow.LinkError:
            return
        except OSError as error:
            raise storage_error("delete", str(store.root / generation_dir(run_id)), error) from None
        return
    for item in files:
        store.delete(item.name)


@dataclass
class Fetched:
    """What a trainer copied: files, bytes, seconds, and the files it refused (``torch/<run>/<file>`` → why)."""

    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    generations: list[str] | None = None
    refused: dict[str, str] | None = None


def fetch(store: CacheStore, manifests: Sequence[Mapping[str, Any]], dest: Path) -> Fetched:
    """Copy each manifest's generation into ``dest`` (a trainer's writable ``TORCHINDUCTOR_CACHE_DIR``).

    ``manifests``: as the store read them (:mod:`compilecache.cache.manifests` checked each: run
    ids and file names cannot leave the cache or ``dest``). Only the files a manifest lists are
    read, each checked against its sha256: a file that differs is not copied (its graph then
    compiles again, never loads damaged bytes). No link is followed (the store's reads refuse
    them). Later generations overwrite earlier ones' files of the same name, which are the same
    kernel (Inductor names a kernel by the hash of its source). One file that cannot be read or
    written (a name one generation has as a file and another as a folder, a full disk) is
    refused and named; every other file is still copied.
    """
    began = time.perf_counter()
    result = Fetched(generations=[], refused={})
    jobs: list[tuple[str, str, Mapping[str, Any]]] = []
    for manifest in manifests:
        run_id = str(manifest["run_id"])
        result.generations.append(run_id)  # type: ignore[union-attr]
        for name, record in manifest_entries(manifest).items():
            jobs.append((name, f"{generation_dir(run_id)}/{name}", record))

    def copy(job: tuple[int, str, str, Mapping[str, Any]]) -> tuple[str, int, str | None]:
        index, name, stored, record = job
        return stored, *_copy(store, stored, record, dest / name, index)

    with ThreadPoolExecutor(max_workers=_READERS) as pool:
        for stored, size, why in pool.map(copy, [(index, *job) for index, job in enumerate(jobs)]):
            if why is not None:
                result.refused[stored] = why  # type: ignore[index]
                continue
            result.files += 1
            result.bytes += size
    result.seconds = time.perf_counter() - began
    return result


def _copy(store: CacheStore, stored: str, record: Mapping[str, Any], path: Path, index: int) -> tuple[int, str | None]:
    """Stream ``stored`` into ``path`` while hashing it: (bytes, ``None``) once it is in place, else (0, why).

    A piece at a time (``store.stream``), never more than the manifest's ``size`` (a file larger than
    its record is refused as soon as it is, whatever it holds), into a temporary file beside ``path``
    that is renamed into place only when its sha256 is the manifest's: a process that already loads
    from this folder (a sibling that copied first) sees the old file or the new one, never half of
    one, nor damaged bytes. The temporary name is the job's own: two generations may list the same
    file (the same kernel), and they are copied at once.
    """
    limit = record.get("size")
    temporary = path.with_name(f".{path.name}.{index}.compilecache.tmp")
    digest, size = hashlib.sha256(), 0
    try:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle = temporary.open("wb")
        except OSError as error:
            return 0, f"not copied: {one_line(error)}"
        chunks = store.stream(stored)
        with handle, contextlib.closing(chunks):  # a file refused half-read is closed at once
            while True:
                try:
                    chunk = next(chunks, None)
                except (OSError, WarmError) as error:  # the store's: a link, a missing file, GCS
                    return 0, f"unreadable: {one_line(error)}"
                if chunk is None:
                    break
                size += len(chunk)
                if isinstance(limit, int) and size > limit:
                    return 0, f"larger than the {limit} bytes its manifest says"
                digest.update(chunk)
                try:
                    handle.write(chunk)
                except OSError as error:  # the copy's: a full disk
                    return 0, f"not copied: {one_line(error)}"
        if digest.hexdigest() != record.get("sha256"):
            return 0, "checksum differs from the manifest"
        try:
            os.replace(temporary, path)
        except OSError as error:
            return 0, f"not copied: {one_line(error)}"
        return size, None
    finally:
        with contextlib.suppress(OSError):
            temporary.unlink()
