"""The error types the warmer and expiry report as a one-line message and a non-zero exit."""

from __future__ import annotations

import errno


class WarmError(Exception):
    """A problem with the input or the environment, explained in one line.

    ``compilecache warm`` prints ``error: <message>`` and exits with
    :data:`exit_code` instead of a traceback; every raise site says what to fix.
    """

    exit_code = 2


class VerifyError(WarmError):
    """A published target did not hit the cache in a fresh process."""

    exit_code = 3


# A full disk, an exhausted quota, a file over the size limit: the storage refused a write.
# Not a bug of the warmer: the run ends with one line and the next pass heals what is left.
STORAGE_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class StorageError(WarmError):
    """A write to the cache (or its removal) that the storage refused: disk full, quota, I/O error."""


def storage_error(action: str, path: str, error: OSError) -> StorageError:
    """``write /cache/x failed: [Errno 28] ENOSPC: No space left on device``: the path and the errno, on one line."""
    code = error.errno
    reason = error.strerror or str(error) or type(error).__name__
    number = f"[Errno {code}] {errno.errorcode.get(code, '?')}: " if code is not None else ""
    return StorageError(f"{action} {path} failed: {number}{reason}")


def cut(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its first ``limit - 1`` and ``…``."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def one_line(error: BaseException, limit: int | None = 400) -> str:
    """``Type: message`` on one line, for errors shown to users (a message over ``limit`` is cut).

    Whitespace runs, newlines included, become one space: gcsfs puts GCS's own reason on a
    second line (``Forbidden: <url>\n<quota message>``), which stays.
    """
    text = " ".join(str(error).split())
    if limit is not None and len(text) > limit:
        text = text[:limit] + " …"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
