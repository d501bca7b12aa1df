"""File operations below a cache root that never follow a symbolic link.

:class:`compilecache.cache.store.LocalStore` deletes, reads and lists through these.
The cache root itself is opened once, following links (it is a mount path the user
chose); every name below it is opened relative to its parent's descriptor with
``O_NOFOLLOW``, so a link anywhere below the root (``.compilecache`` itself, its
``staging`` or ``manifests`` folder, a run's staging folder, an entry) is reported
as :class:`LinkError` and never crossed, whatever it points at (inside the cache or
out of it). Descriptors, not paths: a link swapped in between a check and the
operation is not followed either.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from compilecache.cache.errors import WarmError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_TEMPORARY_SUFFIX = ".tmp"


class NotAFile(WarmError):
    """Something other than a regular file (a FIFO, a device, a folder) where the cache keeps a file."""

    def __init__(self, relative: str) -> None:
        super().__init__(f"{relative} is not a regular file: not read, left alone")
        self.relative = relative


class LinkError(WarmError):
    """A symbolic link where the cache keeps a file or a directory: left alone, never followed."""

    def __init__(self, relative: str) -> None:
        super().__init__(f"{relative} is a symbolic link: not followed, left alone")
        self.relative = relative


@contextlib.contextmanager
def open_dir(root: Path, relative: str = "") -> Iterator[int]:
    """A descriptor of ``root/relative``, each component below ``root`` opened without following links.

    Raises :class:`LinkError` naming the first component that is a link, ``FileNotFoundError``
    when one is missing, ``NotADirectoryError`` when one is a plain file.
    """
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        walked: list[str] = []
        for part in [p for p in relative.split("/") if p]:
            if part in (".", ".."):
                raise WarmError(f"{relative}: '.' and '..' are not cache names")
            walked.append(part)
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as error:
                _raise_if_link(error, fd, part, "/".join(walked))
                raise
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def is_link(root: Path, relative: str) -> bool:
    """True when ``relative`` (below ``root``) or one of its parents is a symbolic link."""
    parent, name = _split(relative)
    try:
        with open_dir(root, parent) as fd:
            return stat.S_ISLNK(os.lstat(name, dir_fd=fd).st_mode)
    except LinkError:
        return True
    except (FileNotFoundError, NotADirectoryError):
        return False


def read_bytes(root: Path, relative: str, limit: int = -1) -> bytes:
    """The bytes of a plain file below ``root`` (at most ``limit`` of them when it is not negative);
    :class:`LinkError` if it or a parent is a link, :class:`NotAFile` if it is no regular file."""
    with open_file(root, relative) as handle:
        return handle.read(limit)


@contextlib.contextmanager
def open_file(root: Path, relative: str) -> Iterator[BinaryIO]:
    """A regular file below ``root``, open for reading; :class:`LinkError` if it or a parent is a link.

    Opened non-blocking, then checked: a FIFO put where a file was listed would otherwise hold the
    reader forever (``open`` of a FIFO waits for a writer), a device would read without end. A
    regular file's reads ignore ``O_NONBLOCK`` (open(2)).
    """
    parent, name = _split(relative)
    with open_dir(root, parent) as folder:
        try:
            fd = os.open(name, _FILE_FLAGS | os.O_NONBLOCK, dir_fd=folder)
        except OSError as error:
            _raise_if_link(error, folder, name, relative)
            raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotAFile(relative)
    with os.fdopen(fd, "rb") as handle:
        yield handle


def unlink(root: Path, relative: str) -> bool:
    """Remove one file (a link: the link alone; ``unlink`` never follows the last name);
    ``False`` when it is gone. :class:`LinkError` if a parent is a link."""
    parent, name = _split(relative)
    try:
        with open_dir(root, parent) as folder:
            os.unlink(name, dir_fd=folder)
    except FileNotFoundError:
        return False
    return True


def remove_tree(root: Path, relative: str) -> bool:
    """Remove a directory and what is in it; ``False`` when it is gone.

    :class:`LinkError` if it or a parent is a link: nothing is removed then. Inside it,
    :func:`_remove_at` walks by descriptor and unlinks links without following them.
    """
    parent, name = _split(relative)
    try:
        with open_dir(root, parent) as folder:
            mode = os.lstat(name, dir_fd=folder).st_mode
            if stat.S_ISLNK(mode):
                raise LinkError(relative)
            if not stat.S_ISDIR(mode):
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", relative)
            _remove_at(folder, name)
            return True
    except FileNotFoundError:
        return False


def _remove_at(folder: int, name: str) -> None:
    """Remove ``name`` in the directory open as ``folder`` and all below it, as far as it can.

    What ``shutil.rmtree(name, dir_fd=folder, ignore_errors=True)`` does from Python 3.11 on;
    the warm-up also runs on a training image's Python 3.10, whose rmtree has no ``dir_fd``.
    Each folder is opened with ``O_NOFOLLOW`` from its parent's descriptor, so a link (or a
    folder swapped for one) is unlinked, never entered. A stack, not recursion: a workload's
    scratch tree may be deeper than Python's recursion limit.
    """
    # (parent descriptor, name, its own descriptor or None before it is opened)
    stack: list[tuple[int, str, int | None]] = [(folder, name, None)]
    try:
        while stack:
            parent, child, fd = stack.pop()
            if fd is not None:  # its contents are gone (or could not go): the folder itself
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.rmdir(child, dir_fd=parent)
                continue
            try:
                fd = os.open(child, _DIR_FLAGS, dir_fd=parent)
            except OSError:  # a file, a link (ELOOP/ENOTDIR) or gone
                with contextlib.suppress(OSError):
                    os.unlink(child, dir_fd=parent)
                continue
            stack.append((parent, child, fd))
            with contextlib.suppress(OSError), os.scandir(fd) as entries:
                stack += [(fd, entry.name, None) for entry in entries]
    finally:
        for _, _, fd in stack:
            if fd is not None:
                os.close(fd)


def temporary_name(name: str) -> str:
    """The name :func:`write_new` writes ``name`` under before renaming it: ``.<name>.tmp``."""
    return f".{name}{_TEMPORARY_SUFFIX}"


def is_temporary_name(name: str) -> bool:
    """True for a name :func:`temporary_name` makes (what a killed writer may leave behind)."""
    return name.startswith(".") and name.endswith(_TEMPORARY_SUFFIX) and len(name) > len(_TEMPORARY_SUFFIX) + 1


def write_new(root: Path, relative: str, data: bytes) -> None:
    """Write a file under a temporary name in its folder, flush it to the disk, then rename it into
    place (readers see the old file or the new one, never half of it); the folder is reached without
    following links. A refused write (disk full, quota) removes the temporary file and raises."""
    parent, name = _split(relative)
    temporary = temporary_name(name)
    with open_dir(root, parent) as folder:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644, dir_fd=folder)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                # Before the rename: after a crash the name must not point at blocks never written.
                os.fsync(handle.fileno())
            os.rename(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            # Removing a file needs no free space: nothing of a refused write is left.
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=folder)
            raise


def _split(relative: str) -> tuple[str, str]:
    parent, _, name = relative.strip("/").rpartition("/")
    if not name or name in (".", ".."):
        raise WarmError(f"{relative!r} is not a cache file name")
    return parent, name


def _raise_if_link(error: OSError, folder: int, name: str, relative: str) -> None:
    # O_NOFOLLOW on a link fails with ELOOP; O_DIRECTORY|O_NOFOLLOW may say ENOTDIR instead.
    if error.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        with contextlib.suppress(OSError):
            if stat.S_ISLNK(os.lstat(name, dir_fd=folder).st_mode):
                raise LinkError(relative) from None
