"""Run manifests as a cache holds them: each one parsed totally against its framework's schema.

A manifest is read from storage that others can write (a PVC a pod mounts read-write, a GCS
prefix), so it is untrusted input, like a page a database reads back from disk: a damaged one
is reported and isolated, never fatal to the whole cache. :func:`parse_manifest` turns one
file's bytes into a checked document or a :class:`Malformed` naming the file and its first bad
field; it never raises. A document is checked against its ``schema``, one checker per
framework (:data:`JAX_SCHEMA`: ``compilecache.jobtools.manifest`` writes it; :data:`TORCH_SCHEMA`:
``compilecache.frameworks.pytorch.warm``), for every field a reader uses: its type, a bound (numbers
finite and in range, strings without NUL and encodable as UTF-8), and names that stay inside the
cache (a run id is one plain file name, a JAX entry a plain ``<module>-<sha256>-cache`` name, a
PyTorch file a relative path without ``..``). Readers (expiry of both frameworks, the warmer's
check of what it would reuse, the trainers' verdicts and the PyTorch copy) then read fields
without checking types again. Unknown fields are allowed: a newer warmer may record more.

A malformed manifest is *set aside*: left where it is (no file is deleted for being malformed),
named in every command's output and expiry's termination summary, and unused. Its entries are
then entries in no manifest (docs/faults.md says what that means per framework).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NoReturn

from compilecache.cache.entries import is_entry_name
from compilecache.cache.errors import cut

JAX_SCHEMA = "compilecache.dev/manifest/v1"
TORCH_SCHEMA = "compilecache.dev/torch-manifest/v1"
# A run of thousands of programs writes a few MB; past this a file is no manifest of ours, and
# parsing it would cost the expiry Job its memory (Python's JSON objects take ~10x the text).
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
MAX_TEXT = 64 * 1024  # characters of any one string
MAX_NAME = 255  # bytes of one file name (Linux NAME_MAX)
MAX_IMAGE = 1024  # characters of an image reference (the CRD's bound on warmup.image)
MAX_PATH = 4096  # bytes of a relative path (Linux PATH_MAX)
MAX_COUNT = 2**53 - 1  # the largest integer every JSON reader keeps exactly
MAX_SECONDS = 366 * 24 * 3600.0
MAX_DEPTH = 32  # nesting of free-form values (a run's verify record); json itself stops near 1000
_SHA256 = re.compile(r"[0-9a-f]{64}")
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # manifest.new_run_id's alphabet
_SHOWN_NAME = 120  # characters of a file name in a message


@dataclass(frozen=True)
class Malformed:
    """A manifest file set aside: its name under ``.compilecache/manifests/`` and why."""

    name: str
    reason: str

    def line(self) -> str:
        """``manifest evil.json set aside: entries[0]: expected an object, got a string``."""
        return f"manifest {shown_name(self.name)} set aside: {self.reason}"


@dataclass(frozen=True)
class Manifests:
    """What a cache's manifests folder holds: the checked documents, the files set aside, and notes
    (the folder itself could not be read: a symbolic link)."""

    documents: tuple[Mapping[str, Any], ...] = ()
    malformed: tuple[Malformed, ...] = ()
    notes: tuple[str, ...] = ()

    def of(self, schema: str) -> list[Mapping[str, Any]]:
        """The documents of one framework's schema."""
        return [document for document in self.documents if document["schema"] == schema]

    @property
    def problems(self) -> list[str]:
        """One line per note and per file set aside, for a command's output."""
        return [*self.notes, *(item.line() for item in self.malformed)]


def parse_manifest(name: str, data: bytes) -> Mapping[str, Any] | Malformed:
    """The checked document in ``data``, or why it is no manifest (never raises)."""
    if len(data) > MAX_MANIFEST_BYTES:
        return Malformed(name, f"larger than a manifest's {MAX_MANIFEST_BYTES} bytes")
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        return Malformed(name, f"not JSON ({cut(str(error), 200)})")
    try:
        _check(document)
    except _Invalid as error:
        return Malformed(name, str(error))
    checked: Mapping[str, Any] = document
    return checked


def gathered(read: Iterable[Mapping[str, Any] | Malformed]) -> Manifests:
    """The documents and the files set aside among what a store read, in its order."""
    documents, malformed = [], []
    for item in read:
        if isinstance(item, Malformed):
            malformed.append(item)
        else:
            documents.append(item)
    return Manifests(tuple(documents), tuple(malformed))


SHOWN_IN_SUMMARY = 5  # malformed manifests a termination summary names; the rest are counted


def summary_fields(malformed: Sequence[Mapping[str, str]]) -> dict[str, Any]:
    """What a termination summary (4 KiB in all) says of the manifests set aside (``{name, reason}`` each):
    ``malformedManifests``, the first :data:`SHOWN_IN_SUMMARY` with name and reason cut short, and
    ``malformedOmitted``, how many more. ``expire``'s and ``warm``'s summaries alike."""
    fields: dict[str, Any] = {
        "malformedManifests": [
            {"name": shown_name(item["name"]), "reason": cut(item["reason"], 200)}
            for item in malformed[:SHOWN_IN_SUMMARY]
        ]
    }
    if len(malformed) > SHOWN_IN_SUMMARY:
        fields["malformedOmitted"] = len(malformed) - SHOWN_IN_SUMMARY
    return fields


def _check(document: Any) -> None:
    """Raise :class:`_Invalid` naming the first field of ``document`` its schema does not allow."""
    if not isinstance(document, dict):
        _fail(None, f"expected a JSON object, got {_kind(document)}")
    schema = document.get("schema")
    checker = CHECKERS.get(schema) if isinstance(schema, str) else None
    if checker is None:
        _fail((None, "schema"), f"expected {' or '.join(sorted(CHECKERS))}, got {_shown_value(schema)}")
    checker(document, None)


def shown_name(name: str) -> str:
    """A file name as a message shows it: cut, and quoted where it holds anything unprintable."""
    name = cut(name, _SHOWN_NAME)
    return name if name.isprintable() and " " not in name else ascii(name)


# The checkers: each takes a value and where it is, and raises _Invalid. Where: None for the
# document, else (where its container is, its key): a field name, a list index, or a 1-tuple
# holding a free-form key. Written out (``entries[3].file``) only for the message of a failure:
# a 100 000-entry cache's manifests are checked in a few tenths of a second.

Where = tuple[Any, Any] | None


class _Invalid(ValueError):
    """What is wrong with a document: the path of the first bad field and why."""


Check = Callable[[Any, Where], None]


def _fail(where: Where, why: str) -> NoReturn:
    keys = []
    while where is not None:
        where, key = where
        keys.append(key)
    path = ""
    for key in reversed(keys):
        if isinstance(key, int):
            path += f"[{key}]"
        elif isinstance(key, tuple):
            path += f"[{cut(ascii(key[0]), 40)}]"
        else:
            path += f".{key}" if path else key
    raise _Invalid(f"{path}: {why}" if path else why)


def _kind(value: Any) -> str:
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return "a number"
    return kinds.get(type(value), type(value).__name__)


def _shown_value(value: Any) -> str:
    return cut(ascii(value), 60) if isinstance(value, str) else _kind(value)


def _object(fields: Mapping[str, Check], required: Collection[str] = ()) -> Check:
    def check(value: Any, where: Where) -> None:
        if not isinstance(value, dict):
            _fail(where, f"expected an object, got {_kind(value)}")
        for key in required:
            if key not in value:
                _fail((where, key), "missing")
        for key, item in value.items():  # the document's fields, usually fewer than the schema's
            field = fields.get(key)
            if field is not None:
                field(item, (where, key))

    return check


def _mapping(values: Check) -> Check:
    """An object whose keys are any text and whose values all pass ``values``."""

    def check(value: Any, where: Where) -> None:
        if not isinstance(value, dict):
            _fail(where, f"expected an object, got {_kind(value)}")
        for key, item in value.items():
            _TEXT(key, where)
            values(item, (where, (key,)))

    return check


def _list(items: Check) -> Check:
    def check(value: Any, where: Where) -> None:
        if not isinstance(value, list):
            _fail(where, f"expected a list, got {_kind(value)}")
        for index, item in enumerate(value):
            items(item, (where, index))

    return check


def _nullable(inner: Check) -> Check:
    def check(value: Any, where: Where) -> None:
        if value is not None:
            inner(value, where)

    return check


def _either(*checks: Check) -> Check:
    def check(value: Any, where: Where) -> None:
        errors = []
        for inner in checks:
            try:
                inner(value, where)
                return
            except _Invalid as error:
                errors.append(str(error))
        raise _Invalid(errors[0])

    return check


def _text(limit: int = MAX_TEXT) -> Check:
    def check(value: Any, where: Where) -> None:
        if not isinstance(value, str):
            _fail(where, f"expected a string, got {_kind(value)}")
        if len(value) > limit:
            _fail(where, f"{len(value)} characters, more than {limit}")
        if "\x00" in value:
            _fail(where, "holds a NUL character")
        if not value.isascii():
            try:
                value.encode()
            except UnicodeEncodeError:  # a lone surrogate (json accepts "\ud800"): no output could print it
                _fail(where, "not valid UTF-8 text")

    return check


_TEXT = _text()
_NAME_TEXT = _text(MAX_NAME)
_PATH_TEXT = _text(MAX_PATH)
_TIME_TEXT = _text(64)


def _choice(*allowed: str) -> Check:
    def check(value: Any, where: Where) -> None:
        if value not in allowed:
            _fail(where, f"expected {' or '.join(allowed)}, got {_shown_value(value)}")

    return check


def _flag(value: Any, where: Where) -> None:
    if not isinstance(value, bool):
        _fail(where, f"expected true or false, got {_kind(value)}")


def _count(value: Any, where: Where) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        _fail(where, f"expected a whole number, got {_kind(value)}")
    if not 0 <= value <= MAX_COUNT:
        _fail(where, f"{cut(str(value), 40)} is out of range (0 to {MAX_COUNT})")


def _seconds(value: Any, where: Where) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        _fail(where, f"expected seconds, got {_kind(value)}")
    if not (math.isfinite(value) and 0 <= value <= MAX_SECONDS):
        _fail(where, f"{cut(str(value), 40)} seconds is out of range (0 to {MAX_SECONDS:g})")


def _time(value: Any, where: Where) -> None:
    _TIME_TEXT(value, where)
    try:
        datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        _fail(where, f"expected an RFC 3339 time, got {_shown_value(value)}")


def _sha256(value: Any, where: Where) -> None:
    if not isinstance(value, str) or _SHA256.fullmatch(value) is None:
        _fail(where, f"expected 64 lowercase hex digits, got {_shown_value(value)}")


def _run_id(value: Any, where: Where) -> None:
    _NAME_TEXT(value, where)
    if _RUN_ID.fullmatch(value) is None:
        _fail(where, f"{_shown_value(value)} is not a run id (letters, digits, '.', '_', '-')")


def _entry_file(value: Any, where: Where) -> None:
    """A JAX entry: one plain name at the top of the cache."""
    _NAME_TEXT(value, where)
    if "/" in value or not is_entry_name(value):
        _fail(where, f"{_shown_value(value)} is not a cache entry name (<module>-<sha256>-cache)")


def _relative_file(value: Any, where: Where) -> None:
    """A file of a PyTorch generation: a path below it that cannot leave it."""
    _PATH_TEXT(value, where)
    parts = value.split("/")
    if value.startswith("/") or any(part in ("", ".", "..") for part in parts):
        _fail(where, f"{_shown_value(value)} leaves its generation (absolute, empty or '..' parts)")
    if any(len(part.encode()) > MAX_NAME for part in parts):
        _fail(where, f"a part of {_shown_value(value)} is longer than {MAX_NAME} bytes")


def _json(value: Any, where: Where, depth: int = 0) -> None:
    """Any JSON value, bounded: finite numbers, checked strings, nesting at most :data:`MAX_DEPTH`."""
    if depth > MAX_DEPTH:
        _fail(where, f"nested deeper than {MAX_DEPTH}")
    if isinstance(value, dict):
        for key, item in value.items():
            _TEXT(key, where)
            _json(item, where, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _json(item, where, depth + 1)
    elif isinstance(value, str):
        _TEXT(value, where)
    elif isinstance(value, float) and not math.isfinite(value):
        _fail(where, f"{value} is not a finite number")
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_COUNT:
        _fail(where, f"{cut(str(value), 40)} is out of range")


def _scalar(value: Any, where: Where) -> None:
    if isinstance(value, (dict, list)):
        _fail(where, f"expected a string, number, boolean or null, got {_kind(value)}")
    _json(value, where)


_NAME = _text(MAX_NAME)
_OPTIONAL_TEXT = _nullable(_TEXT)
_PLATFORM = {
    "jax": _OPTIONAL_TEXT,
    "jaxlib": _OPTIONAL_TEXT,
    "backend": _OPTIONAL_TEXT,
    "device_kind": _OPTIONAL_TEXT,
    "device_count": _nullable(_count),
}

# What keydiff compares: each argument by its path (keydiff reads arg["path"] unguarded).
_SIGNATURE = _object(
    {
        "args": _list(
            _object(
                {
                    "path": _TEXT,
                    "name": _TEXT,
                    "type": _TEXT,
                    "weak_type": _flag,
                    "sharding": _TEXT,
                    "donated": _flag,
                },
                required=("path",),
            )
        ),
        "outputs": _list(_TEXT),
        "static": _mapping(_TEXT),
        "mesh_axes": _list(_TEXT),
        "settings": _mapping(_scalar),
    }
)

_JAX_MANIFEST = _object(
    {
        "schema": _TEXT,
        "run_id": _run_id,
        "state": _choice("pending", "complete"),
        "group": _object({"run_id": _run_id, "process": _count, "processes": _count}),
        "cache_dir": _TEXT,
        "started_at": _nullable(_time),
        "finished_at": _nullable(_time),
        "workloads": _list(_TEXT),
        "image": _text(MAX_IMAGE),
        **_PLATFORM,
        "settings": _mapping(_scalar),
        "entries": _list(
            _object(
                {
                    "file": _entry_file,
                    "size": _count,
                    "sha256": _nullable(_sha256),
                    "published": _flag,
                    **_PLATFORM,
                    "workload": _TEXT,
                    "target": _TEXT,
                    "compile_seconds": _nullable(_seconds),
                    "written_at": _nullable(_time),
                },
                required=("file",),
            )
        ),
        "hits": _list(
            _object(
                {"file": _entry_file, "workload": _TEXT, "target": _TEXT, "at": _nullable(_time)},
                required=("file",),
            )
        ),
        "targets": _list(
            _object(
                {
                    "name": _TEXT,
                    "workload": _TEXT,
                    "compile_seconds": _nullable(_seconds),
                    "requests": _count,
                    "hits": _count,
                    "misses": _count,
                    "hit": _flag,
                    "entries_written": _list(_entry_file),
                    "bytes": _count,
                    "cache_keys": _list(_NAME),
                    "key_components": _mapping(_TEXT),
                    "signature": _SIGNATURE,
                    "signatures": _mapping(_list(_SIGNATURE)),
                    "step_fn": _TEXT,
                    "steps": _nullable(_either(_count, _choice("auto"))),
                }
            )
        ),
        "verify": _json,
        "repaired": _list(_object({"file": _entry_file, "reason": _TEXT})),
    },
    required=("schema", "run_id"),
)

_FACTS = _object(
    {
        "torch": _OPTIONAL_TEXT,
        "triton": _OPTIONAL_TEXT,
        "cuda": _OPTIONAL_TEXT,
        "gpu": _OPTIONAL_TEXT,
        "threads": _nullable(_count),
        "inductor_config": _OPTIONAL_TEXT,
        "inductor_env": _mapping(_TEXT),
        "job_id": _OPTIONAL_TEXT,
        "visible_devices": _OPTIONAL_TEXT,
    }
)


_TORCH_FILE_LIST = _list(
    _object(
        {"file": _relative_file, "size": _count, "sha256": _sha256, "written_at": _nullable(_time)},
        required=("file", "sha256"),
    )
)


def _torch_files(value: Any, where: Where) -> None:
    """A generation's files: each a safe relative path, none both a file and a folder (no tree holds that)."""
    _TORCH_FILE_LIST(value, where)
    # A tree of the paths' parts, walked once per path: joining every prefix instead cost the square of a
    # path's parts (2048 in a 4 KiB path), 3 s for a 1 MiB manifest.
    tree: dict[str, Any] = {}
    files: set[int] = set()  # the tree nodes where a file ends
    for entry in value:
        node = tree
        for part in entry["file"].split("/"):
            node = node.setdefault(part, {})
        files.add(id(node))
    for index, entry in enumerate(value):
        node = tree
        for part in entry["file"].split("/")[:-1]:
            node = node[part]
            if id(node) in files:
                _fail(((where, index), "file"), f"{_shown_value(entry['file'])} is below another entry's file")


_TORCH_MANIFEST = _object(
    {
        "schema": _TEXT,
        "framework": _choice("pytorch"),
        "state": _choice("pending", "complete"),
        "run_id": _run_id,
        "cache_dir": _TEXT,
        "generation": _TEXT,
        "workload": _TEXT,
        "started_at": _nullable(_time),
        "finished_at": _nullable(_time),
        "facts": _FACTS,
        "counts": _mapping(_count),
        "stepped": _json,
        "first_step_seconds": _nullable(_seconds),
        "verify": _json,
        "entries": _torch_files,
        "bytes": _count,
    },
    required=("schema", "run_id"),
)

# One checker per framework, by the schema a manifest names.
CHECKERS: dict[str, Check] = {JAX_SCHEMA: _JAX_MANIFEST, TORCH_SCHEMA: _TORCH_MANIFEST}
