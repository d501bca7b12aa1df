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
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from compilecache.cache.errors import WarmError

ENTRY_SUFFIX = "-cache"
ATIME_SUFFIX = "-atime"
_ENTRY_NAME = re.compile(r"^(?P<module>.+)-(?P<digest>[0-9a-f]{64})-cache$")
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_TIME_BYTES = 4
# A compile-time header above a week means the bytes are not a JAX header.
_MAX_PLAUSIBLE_COMPILE_SECS = 7 * 24 * 3600


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
    """Return what is in a sound entry or raise :class:`EntryError`.

    Sound: the compressed stream is complete (a truncated zlib/zstd stream fails
    to finish), nothing trails it, and the decompressed header is a plausible
    compile time followed by a non-empty executable.
    """
    if len(data) < 8:
        raise EntryError(f"entry is {len(data)} bytes: truncated")
    if data.startswith(_ZSTD_MAGIC):
        compression, raw = "zstd", _zstd_decompress(data)
    elif data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0:
        compression, raw = "zlib", _zlib_decompress(data)
    else:
        raise EntryError(f"entry starts with {data[:4].hex()}: neither zlib nor zstd")
    if len(raw) <= _TIME_BYTES:
        raise EntryError(f"entry decompresses to {len(raw)} bytes: no executable")
    seconds = int.from_bytes(raw[:_TIME_BYTES], "big")
    if seconds > _MAX_PLAUSIBLE_COMPILE_SECS:
        raise EntryError(f"entry header claims a {seconds} s compile: not a JAX entry")
    return EntryInfo(compression, seconds, len(raw) - _TIME_BYTES)


def entry_problem(data: bytes, expected_sha256: str | None = None) -> str | None:
    """Why an entry's bytes must not be relied on (changed since its manifest, or unsound), else ``None``."""
    if expected_sha256 is not None and hashlib.sha256(data).hexdigest() != expected_sha256:
        return "sha256 differs from the manifest's (changed after it was published)"
    try:
        check_entry(data)
    except EntryError as error:
        return str(error)
    return None


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in chunks (entries reach hundreds of MB)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _zlib_decompress(data: bytes) -> bytes:
    stream = zlib.decompressobj()
    try:
        raw = stream.decompress(data) + stream.flush()
    except zlib.error as error:
        raise EntryError(f"zlib stream is corrupt: {error}") from error
    if not stream.eof:
        raise EntryError("zlib stream ends early: truncated")
    if stream.unused_data:
        raise EntryError(f"{len(stream.unused_data)} bytes after the zlib stream")
    return raw


def _zstd_decompress(data: bytes) -> bytes:
    # JAX picks zstd only when a zstd module is importable in the writing
    # process; the warmer runs in that same image, so the module is here too.
    try:
        from compression import zstd  # Python 3.14+
    except ImportError:
        zstd = None
    try:
        if zstd is not None:
            return bytes(zstd.decompress(data))
        import zstandard

        reader = zstandard.ZstdDecompressor().decompressobj()
        raw = bytes(reader.decompress(data))
        if not reader.eof:
            raise EntryError("zstd stream ends early: truncated")
        return raw
    except ImportError as error:
        raise EntryError("entry is zstd-compressed but no zstd module is importable") from error
    except EntryError:
        raise
    except Exception as error:
        raise EntryError(f"zstd stream is corrupt or truncated: {error}") from error
