"""The one error type the warmer reports as a one-line message and a non-zero exit."""

from __future__ import annotations


class WarmError(Exception):
    """A problem with the input or the environment, explained in one line.

    ``compilecache warm`` prints ``error: <message>`` and exits with
    :data:`exit_code` instead of a traceback; every raise site says what to fix.
    """

    exit_code = 2


class VerifyError(WarmError):
    """A published target did not hit the cache in a fresh process."""

    exit_code = 3
