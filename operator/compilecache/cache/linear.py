"""Patterns matched in time linear in the input: regular expressions and globs on untrusted values.

Python's ``re`` backtracks: ``^([^/]*[.:][^/]*|localhost)/.+`` took 6.2 s on an image of 32,000
dots, holding the interpreter lock (so the operator's event loop) all along. Every pattern the
operator matches against what a cache author, a training pod or a policy pattern brings goes
through here instead: the Rust ``regex`` crate, which pydantic-core already ships as its default
regex engine. The crate documents that "all searches execute in linear time with respect to the
size of the regular expression and search text" (it has no backreferences or look-around, the
features that need backtracking), as Go's RE2 in the API server does.

:func:`regex` takes a pattern in that syntax and :func:`glob` a shell pattern (``fnmatch``'s
``*``, ``?``, ``[...]`` and ``[!...]``, case-sensitive, ``*`` also matching ``/``); both return a
predicate that is true when the pattern matches the *whole* value (``re.fullmatch``). A pattern
the crate cannot compile raises :class:`PatternError` with its reason.

The injected runtime (``images/runtime``) runs ``expire`` on a training image's Python, where
pydantic-core may be missing. There Python's ``re`` stands in: that process matches only the
product's own fixed patterns (:mod:`compilecache.cache.units`) against flags the operator wrote
from a spec it had matched with the linear engine, never a pattern or value of a user's.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

try:
    from pydantic_core import SchemaError, SchemaValidator, core_schema
except ImportError:  # the injected runtime on a training image (see above)
    SchemaValidator = None  # type: ignore[assignment,misc]

Matcher = Callable[[str], bool]


class PatternError(ValueError):
    """A pattern the linear engine cannot compile (e.g. a backreference or look-around)."""


@functools.lru_cache(maxsize=512)
def regex(pattern: str) -> Matcher:
    """A predicate: does ``pattern`` (Rust regex syntax, as RE2's) match the whole value?"""
    # \A and \z anchor the whole text whatever the pattern says; (?:...) keeps its alternatives inside.
    anchored = rf"\A(?:{pattern})\z"
    if SchemaValidator is None:
        return _backtracking(pattern)
    try:
        validator = SchemaValidator(core_schema.str_schema(pattern=anchored, regex_engine="rust-regex"))
    except SchemaError as exc:
        reason = str(exc).strip().splitlines()[-1].strip()
        message = f"{pattern!r} is not a regular expression that can be matched in linear time: {reason}"
        raise PatternError(message) from None
    return validator.isinstance_python


def _backtracking(pattern: str) -> Matcher:
    # Only the runtime's fixed patterns come here (the module's docstring says why that is safe).
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise PatternError(f"{pattern!r} is not a regular expression: {exc}") from None
    return lambda value: compiled.fullmatch(value) is not None


@functools.lru_cache(maxsize=512)
def glob(pattern: str) -> Matcher:
    """A predicate: does the shell pattern match the whole value, as ``fnmatch.fnmatchcase`` says?"""
    return regex(f"(?s){glob_to_regex(pattern)}")


def glob_to_regex(pattern: str) -> str:
    """The regex of a shell pattern, in the syntax :func:`regex` takes (``fnmatch.translate``'s meaning).

    ``fnmatch.translate`` itself is no help: it writes look-aheads and atomic groups, which the
    linear engine has none of. Every character that is not a letter or digit is written as a hex
    escape, so nothing of the pattern can be read as the engine's own syntax.
    """
    out: list[str] = []
    index, end = 0, len(pattern)
    while index < end:
        char = pattern[index]
        index += 1
        if char == "*":
            if not out or out[-1] != ".*":  # a run of stars is one star
                out.append(".*")
        elif char == "?":
            out.append(".")
        elif char == "[":
            close = index + (index < end and pattern[index] == "!")
            close += close < end and pattern[close] == "]"  # a ] first is a member, not the end
            while close < end and pattern[close] != "]":
                close += 1
            if close >= end:  # no closing ]: a literal [
                out.append(_literal("["))
                continue
            out.append(_char_class(pattern[index:close]))
            index = close + 1
        else:
            out.append(_literal(char))
    return "".join(out)


def _char_class(body: str) -> str:
    """``[...]`` of a shell pattern (its inside ``body``): members, ``a-z`` ranges, ``!`` first negates."""
    negate = body.startswith("!")
    if negate:
        body = body[1:]
    members: list[str] = []
    index = 0
    while index < len(body):
        if index + 2 < len(body) and body[index + 1] == "-":
            low, high = body[index], body[index + 2]
            if low <= high:  # fnmatch (3.9+) drops a reversed range: it matches nothing
                members.append(f"{_literal(low)}-{_literal(high)}")
            index += 3
        else:
            members.append(_literal(body[index]))
            index += 1
    if not members:  # only reversed ranges: fnmatch matches nothing, or any character when negated
        return "." if negate else "[^\\x{0}-\\x{10FFFF}]"
    return ("[^" if negate else "[") + "".join(members) + "]"


def _literal(char: str) -> str:
    return char if char.isalnum() else f"\\x{{{ord(char):X}}}"
