"""JAX cache entry files: recognise them, check them, hash them.

jax 0.10.2 (``jax/_src/compilation_cache.py``, ``lru_cache.py``) stores each
executable as ``<module>-<sha256 hex>-cache`` containing
``compress(compile_seconds as 4-byte big-endian int + serialized executable)``,
compressed with zstd when ``compression.zstd``/``zstandard`` is importable,
else zlib. It writes with a plain ``write_bytes`` and never repairs a short
file, so we check every staged entry before it is published.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from compilecache.cache.errors import WarmError

ENTRY_SUFFIX = "-cache"
ATIME_SUFFIX = "-atime"
_ENTRY_NAME = re.compile(r"^(?P<module>.+)-(?P<digest>[0-9a-f]{64})-cache$")
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_TIME_BYTES = 4
# A compile-time header above a week means the bytes are not a JAX header.
_MAX_PLAUSIBLE_COMPILE_SECS = 7 * 24 * 3600
# Inflation is bounded: an entry may inflate to 64 MiB whatever its ratio, and beyond that to at
# most 100 times its stored size. Measured: JAX's CPU entries inflate 2-3.5x (zlib); anything far
# past 100x is a bomb (zlib reaches ~1000x, zstd far more), which JAX itself would inflate whole
# into a training process's memory.
MAX_INFLATION_RATIO = 100
INFLATION_FLOOR = 64 * 1024 * 1024
CHUNK_BYTES = 1024 * 1024  # read and inflated at a time: verify holds a few of these per reader
_ZSTD_SLICE = 256  # input bytes per call of zstandard's unbounded decompressobj (see _zstd_pieces)


class EntryError(WarmError):
    """A cache entry that must not be published (truncated, corrupt, unknown format)."""

    exit_code = 4


@dataclass(frozen=True)
class EntryInfo:
    """What the check learned about a sound entry."""

    compression: str
    compile_seconds: int
    executable_bytes: int


def is_entry_name(name: str) -> bool:
    """True for JAX entry file names (``<module>-<64 hex>-cache``)."""
    return _ENTRY_NAME.match(name) is not None


def entry_module(name: str) -> str:
    """The module name part of an entry file name (``jit_train_step``)."""
    match = _ENTRY_NAME.match(name)
    return match["module"] if match else name


def entry_name(cache_key: str) -> str:
    """The file name JAX uses for a cache key."""
    return f"{cache_key}{ENTRY_SUFFIX}"


def check_entry(data: bytes) -> EntryInfo:
    """Return what is in a sound entry or raise :class:`EntryError` (see :func:`scan_entry`)."""
    return scan_entry([data], len(data)).info


def entry_problem(data: bytes, expected_sha256: str | None = None) -> str | None:
    """Why an entry's bytes must not be relied on (changed since its manifest, or unsound), else ``None``."""
    return stream_problem([data], len(data), expected_sha256)


def stream_problem(chunks: Iterable[bytes], size: int, expected_sha256: str | None = None) -> str | None:
    """:func:`entry_problem` for an entry read in pieces (``size``: its listed size): one pass, bounded memory.

    An unsound stream (a bomb, corrupt) is inflated no further; the rest of its stored bytes are
    only hashed, so that an entry changed since its manifest is still named as changed.
    """
    reading = _Reading(chunks)
    try:
        _inspect(reading, size)
        problem = None
    except EntryError as error:
        problem = str(error)
        reading.drain()
    if expected_sha256 is not None and reading.digest.hexdigest() != expected_sha256:
        return "sha256 differs from the manifest's (changed after it was published)"
    return problem


@dataclass(frozen=True)
class Scanned:
    """An entry read whole: what is in it, its sha256 and its size."""

    info: EntryInfo
    sha256: str
    size: int


def inflation_limit(stored: int) -> int:
    """The most bytes a sound entry of ``stored`` bytes may inflate to."""
    return max(INFLATION_FLOOR, MAX_INFLATION_RATIO * stored)


def scan_entry(chunks: Iterable[bytes], size: int = 0) -> Scanned:
    """Read an entry's bytes once, hashing them and inflating them a piece at a time; raise
    :class:`EntryError` if it is unsound.

    Sound: the compressed stream is complete (a truncated zlib/zstd stream fails to finish),
    nothing trails it, the decompressed header is a plausible compile time followed by a
    non-empty executable, and it inflates to at most :func:`inflation_limit` of its size (of
    ``size``, or of the bytes read, whichever is more). No more than :data:`CHUNK_BYTES` of
    inflated output is held at once, whatever the stream claims: a bomb costs time up to the
    limit, never memory.
    """
    reading = _Reading(chunks)
    info = _inspect(reading, size)
    return Scanned(info, reading.digest.hexdigest(), reading.size)


class _Reading:
    """An entry's stored bytes as they are read, hashed and counted on the way."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self.digest = hashlib.sha256()
        self.size = 0

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        chunk = next(self._chunks)
        self.digest.update(chunk)
        self.size += len(chunk)
        return chunk

    def drain(self) -> None:
        for _ in self:
            pass


def _inspect(reading: _Reading, size: int) -> EntryInfo:
    head = b""
    for chunk in reading:
        head += chunk
        if len(head) >= 8:
            break
    if len(head) < 8:
        raise EntryError(f"entry is {len(head)} bytes: truncated")
    if head.startswith(_ZSTD_MAGIC):
        compression, inflate = "zstd", _zstd_pieces
    elif head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0:
        compression, inflate = "zlib", _zlib_pieces
    else:
        raise EntryError(f"entry starts with {head[:4].hex()}: neither zlib nor zstd")
    header, inflated = b"", 0
    for piece in inflate(itertools.chain([head], reading)):
        if len(header) < _TIME_BYTES:
            header += piece[: _TIME_BYTES - len(header)]
        inflated += len(piece)
        limit = inflation_limit(max(size, reading.size))
        if inflated > limit:
            raise EntryError(
                f"entry of {max(size, reading.size)} bytes inflates past {limit} (a sound one inflates at most "
                f"{MAX_INFLATION_RATIO}x, or to {INFLATION_FLOOR >> 20} MiB): a compression bomb, not a JAX entry"
            )
    if inflated <= _TIME_BYTES:
        raise EntryError(f"entry decompresses to {inflated} bytes: no executable")
    seconds = int.from_bytes(header, "big")
    if seconds > _MAX_PLAUSIBLE_COMPILE_SECS:
        raise EntryError(f"entry header claims a {seconds} s compile: not a JAX entry")
    return EntryInfo(compression, seconds, inflated - _TIME_BYTES)


def _zlib_pieces(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The inflated stream in pieces of at most :data:`CHUNK_BYTES` (``max_length`` bounds each call)."""
    stream = zlib.decompressobj()
    try:
        for chunk in chunks:
            if stream.eof:
                raise EntryError(f"{len(stream.unused_data) + len(chunk)} bytes after the zlib stream")
            pending = chunk
            while True:
                piece = stream.decompress(pending, CHUNK_BYTES)
                if piece:
                    yield piece
                pending = stream.unconsumed_tail
                # A full piece may leave output inside zlib with no input left: ask again with none.
                if not pending and len(piece) < CHUNK_BYTES:
                    break
        if stream.unused_data:
            raise EntryError(f"{len(stream.unused_data)} bytes after the zlib stream")
    except zlib.error as error:
        raise EntryError(f"zlib stream is corrupt: {error}") from error
    if not stream.eof:
        raise EntryError("zlib stream ends early: truncated")


def _zstd_pieces(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The inflated zstd stream in bounded pieces.

    JAX picks zstd only when a zstd module is importable in the writing process (jax 0.10
    ``compilation_cache.py``: ``compression.zstd`` on Python 3.14+, else ``zstandard``); the warmer
    runs in that same image, so the module is here too. ``compression.zstd`` bounds each call's
    output (``max_length``, as zlib); ``zstandard``'s ``decompressobj`` cannot, so it is fed
    :data:`_ZSTD_SLICE` bytes at a time: a zstd block inflates to at most 128 KiB and takes at
    least 4 bytes (RFC 8878, 3.1.1.2), so one call yields at most 65 blocks, ~8 MiB.
    """
    try:
        from compression import zstd  # type: ignore[import-not-found,unused-ignore]  # Python 3.14+
    except ImportError:
        zstd = None
    try:
        if zstd is not None:
            yield from _bounded_pieces(zstd.ZstdDecompressor(), chunks)
            return
        import zstandard  # type: ignore[import-not-found,unused-ignore]

        stream = zstandard.ZstdDecompressor().decompressobj()
        for chunk in chunks:
            view = memoryview(chunk)
            for start in range(0, len(view), _ZSTD_SLICE):
                if stream.eof:
                    raise EntryError("bytes after the zstd stream")
                piece = stream.decompress(view[start : start + _ZSTD_SLICE])
                if piece:
                    yield piece
        if stream.unused_data:
            raise EntryError(f"{len(stream.unused_data)} bytes after the zstd stream")
        if not stream.eof:
            raise EntryError("zstd stream ends early: truncated")
    except ImportError as error:
        raise EntryError("entry is zstd-compressed but no zstd module is importable") from error
    except EntryError:
        raise
    except Exception as error:
        raise EntryError(f"zstd stream is corrupt or truncated: {error}") from error


def _bounded_pieces(stream: Any, chunks: Iterable[bytes]) -> Iterator[bytes]:
    """A ``compression.zstd.ZstdDecompressor``'s output (one frame), at most :data:`CHUNK_BYTES` a call."""
    for chunk in chunks:
        if stream.eof:
            raise EntryError("bytes after the zstd stream")
        pending = chunk
        while True:
            piece = stream.decompress(pending, CHUNK_BYTES)
            pending = b""
            if piece:
                yield piece
            if stream.eof or stream.needs_input:
                break
        if stream.eof and stream.unused_data:
            raise EntryError(f"{len(stream.unused_data)} bytes after the zstd stream")
    if not stream.eof:
        raise EntryError("zstd stream ends early: truncated")
