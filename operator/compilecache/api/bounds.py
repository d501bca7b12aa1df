"""What a CompileCache's status may hold, read from the resource's model: the check before a status patch (pure).

The CRD's status schema is generated from ``api/model.py`` (``Status``, by ``generate.openapi_schema``),
and a real API server refuses a status patch that breaks it, or that is not JSON at all:

* an integer past int64 becomes a float64 in the server's JSON decoder (sigs.k8s.io/json: "falling back
  to float64 on any parse or overflow error"), and kube-openapi's ``validate/type.go`` takes a float as
  an ``integer`` only up to 2^53 (``IsFloat64AJSONInteger``): 422, "must be of type integer";
* ``NaN`` and ``Infinity``, which Python's ``json`` writes for a float that is not finite, are not
  JSON: the apiserver's patch handler answers 400 ("error decoding patch", handlers/patch.go);
* ``enum``, ``maxLength``, ``maxItems``, ``required``, ``format: date-time`` and the unique keys of an
  ``x-kubernetes-list-type: map`` list are checked as for any structural schema: 422.

Either answer fails every pass the same way, so the cache's status would stay frozen. What pods write
into their termination messages (a training pod's verdict, a warm-up's and an expiry's summary) is
not trusted: each report is checked here, against the schema of the status field it feeds, before it
can reach a status (``status.within``), and a pass's whole status once more before it is patched
(:func:`keep_valid`). The model is the one truth of the bounds: none is written again here. Stricter
than the server in two ways, both bounds a real status never reaches: an ``int32`` field is held to
its range (the server checks only int64), and a count read from a report is never negative.
Fields the schema does not know are pruned by the server, not refused, and are not checked, except
that a number anywhere must be finite (else the patch is not JSON).
"""

from __future__ import annotations

import datetime
import functools
import math
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from compilecache.api import generate, model

Schema = Mapping[str, Any]

# The ranges of OpenAPI's integer formats (the server's JSON decoder holds every integer to int64).
INTEGER_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
INT64_MAX = INTEGER_RANGES["int64"][1]
# RFC 3339 date-time, as kube-openapi's strfmt reads it (fractional seconds optional, Z or an offset).
_DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")
# kube-apiserver decodes and stores JSON nested this deep (k8s.io/apimachinery/pkg/util/json's maxDepth
# and Go's encoding/json scanner's maxNestingDepth are both 10000, one level per object or array);
# spec.warmup.podTemplate.spec keeps unknown fields, so a stored CompileCache may be that deep.
JSON_DEPTH = 10000
_JSON_INTEGER_MAX = 2**53 - 1  # the largest float kube-openapi takes as an integer (go-openapi/swag)
_SHOWN = 40  # characters of an offending value in a message: a 1 MB value must not make a 1 MB message


@functools.cache
def status_schema() -> Schema:
    """The CRD's ``status`` schema, as ``make generate`` writes it from the model."""
    return generate.openapi_schema(model.Status)


def field(path: str) -> Schema:
    """The schema of a status field by its path below ``status``: ``consumers``, ``pools[]`` (an item)."""
    node = status_schema()
    for part in path.split("."):
        node = node["properties"][part.removesuffix("[]")]
        if part.endswith("[]"):
            node = node["items"]
    return node


def violations(value: Any, schema: Schema | None = None, path: str = "status") -> list[str]:
    """Why ``value`` breaks ``schema`` (the whole status by default), one line per field: ``path: why``."""
    return list(_violations(value, status_schema() if schema is None else schema, path))


def keep_valid(new: Mapping[str, Any], old: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``new`` with each top-level field that breaks the schema set back to its ``old`` value (dropped if
    that breaks it too), and why: a status that the API server would refuse is never patched."""
    result = dict(new)
    found: list[str] = []
    schema = status_schema()
    for key, value in new.items():
        problems = violations({key: value}, schema)
        if not problems:
            continue
        found += problems
        before = old.get(key)
        if before is not None and not violations({key: before}, schema):
            result[key] = before
        else:
            result.pop(key)
    return result, found


def fit(value: Any, schema: Schema | None = None) -> Any:
    """``value`` (the whole status by default) with each string longer than its field's ``maxLength`` cut to it.

    The status's strings are the operator's own text, messages that may quote what pods wrote: too long
    is the one way they can break the schema, and a cut message still says what it says first. Everything
    else is left as it is, for :func:`keep_valid` to judge.
    """
    schema = status_schema() if schema is None else schema
    if isinstance(value, str):
        limit = schema.get("maxLength")
        return value if limit is None or len(value) <= limit else value[: limit - 3] + "..."
    if isinstance(value, Mapping):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        fitted = {}
        for key, item in value.items():
            child = properties.get(key, extra if isinstance(extra, Mapping) else None)
            fitted[key] = fit(item, child) if child is not None else item
        return fitted
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [fit(item, schema["items"]) for item in value]
    return value


def read_json_as_deep_as_the_api_server() -> None:
    """Let this process parse, write, copy and compare JSON as deep as kube-apiserver stores it.

    CPython counts each nested object or array against the recursion limit (1000 by default):
    ``json.loads`` and ``json.dumps`` once, ``copy.deepcopy`` twice (two Python frames), and ``==``
    once, so one deep CompileCache ended kopf's watch stream (``RecursionError``) and every read of
    it. Measured on CPython 3.11 (x86-64): 20002 levels need a limit of 40008 for all four, two per
    level; three per level leaves a third for the frames below. The C stack is no limit there: 20002
    levels pass in a thread with a 2 MiB stack, 80000 overflow an 8 MiB one. Call it before threads
    and watches start; it only ever raises the limit.
    """
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 3 * JSON_DEPTH))


def show(value: Any) -> str:
    """A value as a message shows it: its JSON-like text, cut to a few dozen characters."""
    try:
        text = repr(value) if not isinstance(value, str) else f'"{value}"'
    except ValueError:  # an int past Python's 4300-digit conversion limit (sys.set_int_max_str_digits)
        text = "a number of more than 4300 digits"
    return text if len(text) <= _SHOWN else f"{text[: _SHOWN - 3]}..."


def _violations(value: Any, schema: Schema, path: str) -> Iterator[str]:
    if value is None:  # the API server prunes a null that is not nullable (and a merge patch deletes it)
        return
    if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
        yield from _non_finite(value, path)
        return
    kind = schema.get("type")
    if isinstance(value, float) and not math.isfinite(value):
        yield f"{path}: {show(value)} is not finite"
        return
    if not _of_type(value, kind):
        yield f"{path}: {show(value)} is not {'an' if kind == 'integer' else 'a'} {kind}"
        return
    if "enum" in schema and value not in schema["enum"]:
        yield f"{path}: {show(value)} is not one of {', '.join(map(str, schema['enum']))}"
    if kind == "integer":
        low, high = INTEGER_RANGES.get(str(schema.get("format")), INTEGER_RANGES["int64"])
        if not low <= int(value) <= high:
            yield f"{path}: {show(value)} is out of the {schema.get('format', 'int64')} range"
    elif kind == "string":
        yield from _string(value, schema, path)
    elif kind == "array":
        yield from _array(value, schema, path)
    elif kind == "object":
        yield from _object(value, schema, path)


def _of_type(value: Any, kind: Any) -> bool:
    """Whether ``value`` is of the schema's ``type`` as the server decodes JSON (a bool is no number)."""
    if isinstance(value, bool):
        return kind in (None, "boolean")
    if kind == "integer":
        return isinstance(value, int) or (isinstance(value, float) and _json_integer(value))
    if kind == "number":
        return isinstance(value, int | float)
    checks = {"string": str, "boolean": bool, "array": list, "object": Mapping}
    expected = checks.get(str(kind))
    return expected is None or isinstance(value, expected)


def _json_integer(value: float) -> bool:
    """A float the server takes as an integer: whole, within 2^53 (kube-openapi, ``IsFloat64AJSONInteger``)."""
    return math.isfinite(value) and value.is_integer() and abs(value) <= _JSON_INTEGER_MAX


def _string(value: str, schema: Schema, path: str) -> Iterator[str]:
    limit = schema.get("maxLength")
    if limit is not None and len(value) > limit:  # the server counts characters (runes), as len() does
        yield f"{path}: {len(value)} characters, more than {limit}"
    if schema.get("format") == "date-time" and not _is_date_time(value):
        yield f"{path}: {show(value)} is not an RFC 3339 date-time"


def _is_date_time(value: str) -> bool:
    if not _DATE_TIME.fullmatch(value):
        return False
    try:
        datetime.datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
    except ValueError:  # 2026-02-30T...: the shape of a time, not a time
        return False
    return True


def _array(value: Sequence[Any], schema: Schema, path: str) -> Iterator[str]:
    limit = schema.get("maxItems")
    if limit is not None and len(value) > limit:
        yield f"{path}: {len(value)} items, more than {limit}"
        return  # each item of a list far past its bound is not worth checking
    items = schema.get("items") or {}
    for index, item in enumerate(value):
        yield from _violations(item, items, f"{path}[{index}]")
    keys = schema.get("x-kubernetes-list-map-keys")
    if schema.get("x-kubernetes-list-type") == "map" and keys:
        seen: set[tuple[Any, ...]] = set()
        for index, item in enumerate(value):
            if not isinstance(item, Mapping):
                continue
            # A key the item leaves out takes its default (pools[].hosts: 1), as the server defaults it.
            key = tuple(
                repr(item.get(name, (items.get("properties") or {}).get(name, {}).get("default"))) for name in keys
            )
            if key in seen:
                yield f"{path}[{index}]: duplicate {', '.join(keys)} {', '.join(key)}"
            seen.add(key)


def _object(value: Mapping[str, Any], schema: Schema, path: str) -> Iterator[str]:
    for name in schema.get("required") or []:
        if value.get(name) is None:
            yield f"{path}.{name}: required"
    properties: Mapping[str, Schema] = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    for key, item in value.items():
        where = f"{path}.{key}"
        if key in properties:
            yield from _violations(item, properties[key], where)
        elif isinstance(extra, Mapping):
            yield from _violations(item, extra, where)
        else:  # pruned by the server, but a number in it must still be JSON
            yield from _non_finite(item, where)


def _non_finite(value: Any, path: str) -> Iterator[str]:
    if isinstance(value, float) and not math.isfinite(value):
        yield f"{path}: {show(value)} is not finite"
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _non_finite(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _non_finite(item, f"{path}[{index}]")
