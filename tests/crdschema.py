"""Check objects against a CustomResourceDefinition the way the API server would, without one.

No kube-apiserver can run here, so these helpers re-create the parts of its CRD handling that
our tests rely on, in the order the server applies them:

1. defaulting (:func:`apply_defaults`): schema ``default`` values, top-down, so that a defaulted
   object's own fields get their defaults too;
2. OpenAPI v3 validation (:func:`schema_violations`): the schema converted to JSON Schema
   (:func:`to_json_schema`) and checked with ``jsonschema``; unknown fields are errors, as with
   kubectl's default strict field validation;
3. list types (:func:`list_type_violations`): unique keys of ``x-kubernetes-list-type: map``
   and unique items of ``set``;
4. CEL rules (:func:`cel_violations`): each ``x-kubernetes-validations`` rule evaluated with
   cel-python, ``self`` bound to the value at the node where the rule sits.

:func:`structural_violations` and :func:`undescribed_fields` check the schema itself.

Used by tests/test_crd.py and meant for the Helm chart's tests (the chart copies the CRD).
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml
from celpy.adapter import json_to_cel
from celpy.celtypes import BoolType
from celpy.evaluation import CELEvalError

Schema = dict[str, Any]

# The schema keywords that hold sub-schemas, and how a path names the child.
_JUNCTORS = ("allOf", "anyOf", "oneOf", "not")
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


@dataclass(frozen=True)
class Violation:
    """One reason an object is invalid.

    ``path`` is the field in kubectl's notation (``spec.warmup.workloads[0]``), ``kind`` the
    check that failed (a JSON Schema keyword such as ``pattern``, ``listType``, ``cel`` or
    ``celError`` for a rule that could not be evaluated), ``message`` the text a user sees.
    """

    path: str
    kind: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message} [{self.kind}]"


# --- loading -----------------------------------------------------------------------------


def load_crd(path: str | Path) -> dict[str, Any]:
    """Load a CRD manifest (one YAML document)."""
    with open(path, encoding="utf-8") as f:
        crd = yaml.safe_load(f)
    if not isinstance(crd, dict) or crd.get("kind") != "CustomResourceDefinition":
        raise ValueError(f"{path} is not a CustomResourceDefinition")
    return crd


def crd_version(crd: dict[str, Any], name: str) -> dict[str, Any]:
    """Return the ``spec.versions[]`` entry called ``name``."""
    for version in crd["spec"]["versions"]:
        if version["name"] == name:
            return version  # type: ignore[no-any-return]
    raise KeyError(f"CRD has no version {name!r}")


def openapi_schema(crd: dict[str, Any], version: str) -> Schema:
    """Return the ``openAPIV3Schema`` of one version."""
    return crd_version(crd, version)["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


# --- walking the schema ------------------------------------------------------------------


def iter_nodes(schema: Schema, path: str = "") -> Iterator[tuple[str, Schema]]:
    """Yield ``(path, node)`` for every schema node that describes a value.

    Paths use ``.field`` for properties, ``[]`` for array items and ``{}`` for map values, so
    ``spec.warmup.workloads[].name``. Nodes inside ``anyOf`` and friends are not values of their
    own and are not yielded (see :func:`structural_violations`).
    """
    yield path, schema
    for name, child in schema.get("properties", {}).items():
        yield from iter_nodes(child, f"{path}.{name}" if path else name)
    additional = schema.get("additionalProperties")
    if isinstance(additional, dict):
        yield from iter_nodes(additional, f"{path}{{}}")
    items = schema.get("items")
    if isinstance(items, dict):
        yield from iter_nodes(items, f"{path}[]")


def _is_untyped_allowed(node: Schema) -> bool:
    # Kubernetes lets exactly these two kinds of node go without a type.
    return bool(node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields"))


def _int_or_string_junctor(node: Schema) -> bool:
    # The only typed anyOf the structural rules allow: {anyOf: [{type: integer}, {type: string}]}
    # next to x-kubernetes-int-or-string: true (what Kubernetes itself uses for quantities).
    return bool(node.get("x-kubernetes-int-or-string")) and node.get("anyOf") in (
        [{"type": "integer"}, {"type": "string"}],
        [{"type": "string"}, {"type": "integer"}],
    )


def structural_violations(schema: Schema) -> list[str]:
    """Return the ways ``schema`` breaks Kubernetes' structural-schema and list-type rules.

    Checked: every value node has a ``type`` (unless int-or-string or preserve-unknown-fields);
    nothing inside ``allOf``/``anyOf``/``oneOf``/``not`` sets ``type``, ``description``,
    ``default``, ``additionalProperties`` or ``nullable`` (except the int-or-string form);
    ``properties`` and ``additionalProperties`` are not both set; root ``metadata`` restricts at
    most name/generateName; ``required`` names exist; ``x-kubernetes-list-type: map`` lists have
    object items whose key fields are scalar and required or defaulted; defaults are allowed
    only where Kubernetes allows them (not under metadata).
    """
    problems: list[str] = []
    if schema.get("type") != "object":
        problems.append("<root>: type must be object")
    metadata = schema.get("properties", {}).get("metadata")
    if metadata is not None:
        extra = set(metadata) - {"type", "properties"}
        if metadata.get("type") != "object" or extra:
            problems.append(f"metadata: only `type: object` and name/generateName allowed, got {sorted(extra)}")
        for name in metadata.get("properties", {}):
            if name not in ("name", "generateName"):
                problems.append(f"metadata.{name}: only name and generateName may be restricted")
    for path, node in iter_nodes(schema):
        where = path or "<root>"
        if "type" not in node and not _is_untyped_allowed(node):
            problems.append(f"{where}: no type")
        if "properties" in node and "additionalProperties" in node:
            problems.append(f"{where}: both properties and additionalProperties")
        if node.get("type") == "array" and not isinstance(node.get("items"), dict):
            problems.append(f"{where}: array without items")
        for name in node.get("required", []):
            if name not in node.get("properties", {}):
                problems.append(f"{where}: required field {name!r} is not in properties")
        for junctor in _JUNCTORS:
            if junctor in node and not (junctor == "anyOf" and _int_or_string_junctor(node)):
                problems.extend(_junctor_violations(node[junctor], f"{where}.{junctor}"))
        if node.get("x-kubernetes-list-type") == "map":
            problems.extend(_list_map_violations(node, where))
        elif "x-kubernetes-list-map-keys" in node:
            problems.append(f"{where}: list-map-keys without x-kubernetes-list-type: map")
    return problems


def _junctor_violations(value: Any, where: str) -> list[str]:
    forbidden = ("type", "description", "default", "additionalProperties", "nullable")
    problems = []
    for sub in value if isinstance(value, list) else [value]:
        for key in forbidden:
            if key in sub:
                problems.append(f"{where}: {key} is not allowed inside a logical junctor")
    return problems


def _list_map_violations(node: Schema, where: str) -> list[str]:
    items = node.get("items", {})
    keys = node.get("x-kubernetes-list-map-keys", [])
    if items.get("type") != "object":
        return [f"{where}: list-type map needs object items"]
    if not keys:
        return [f"{where}: list-type map needs x-kubernetes-list-map-keys"]
    problems = []
    for key in keys:
        prop = items.get("properties", {}).get(key)
        if prop is None:
            problems.append(f"{where}: map key {key!r} is not a property of the items")
            continue
        if prop.get("type") not in ("string", "integer", "number", "boolean"):
            problems.append(f"{where}: map key {key!r} must be a scalar")
        if key not in items.get("required", []) and "default" not in prop:
            problems.append(f"{where}: map key {key!r} must be required or have a default")
    return problems


def undescribed_fields(schema: Schema, *, skip: frozenset[str] = frozenset({"metadata"})) -> list[str]:
    """Return the paths of schema nodes without a non-empty ``description``.

    Root ``metadata`` is skipped by default: the API server publishes ObjectMeta's own
    documentation there, whatever the CRD says.
    """
    missing = []
    for path, node in iter_nodes(schema):
        if path in skip or any(path.startswith(f"{s}.") for s in skip):
            continue
        text = node.get("description")
        if not isinstance(text, str) or not text.strip():
            missing.append(path or "<root>")
    return missing


def iter_defaults(schema: Schema) -> Iterator[tuple[str, Schema, Any]]:
    """Yield ``(path, node, default)`` for every node that declares a ``default``."""
    for path, node in iter_nodes(schema):
        if "default" in node:
            yield path, node, node["default"]


def iter_rules(schema: Schema) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(path, rule)`` for every ``x-kubernetes-validations`` entry, with its node's path."""
    for path, node in iter_nodes(schema):
        for rule in node.get("x-kubernetes-validations", []):
            yield path, rule


def resolve(schema: Schema, json_path: str) -> Schema | None:
    """Return the schema node a printer column's simple JSONPath (``.status.cache.entries``) names."""
    node: Schema | None = schema
    for part in json_path.lstrip(".").split("."):
        if node is None:
            return None
        node = node.get("properties", {}).get(part)
    return node


# --- OpenAPI v3 -> JSON Schema -----------------------------------------------------------


def to_json_schema(node: Schema, *, strict: bool = True) -> Schema:
    """Convert a CRD OpenAPI v3 schema node to a JSON Schema ``jsonschema`` can check.

    ``x-kubernetes-*`` keys are dropped; ``x-kubernetes-int-or-string`` becomes
    ``type: [integer, string]``; ``nullable`` adds ``null`` to the type. With ``strict``, objects
    with ``properties`` reject unknown fields (``additionalProperties: false``) unless they
    preserve unknown fields: the API server would prune such a field silently, and kubectl's
    default strict validation rejects it, so in a sample it is always a mistake.
    """
    out: Schema = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key in ("description", "nullable"):
            continue
        if key == "properties":
            out[key] = {name: to_json_schema(child, strict=strict) for name, child in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = to_json_schema(value, strict=strict)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [to_json_schema(child, strict=strict) for child in value]
        else:
            out[key] = copy.deepcopy(value)
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
        out.pop("anyOf", None)
    if node.get("nullable") and "type" in out:
        types = out["type"] if isinstance(out["type"], list) else [out["type"]]
        out["type"] = [*types, "null"]
    if (
        strict
        and "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def _format_checker() -> jsonschema.FormatChecker:
    # Kubernetes' formats; jsonschema's own date-time check needs an extra package, and it knows
    # nothing of int32/int64.
    checker = jsonschema.FormatChecker(formats=())

    def _date_time(value: object) -> bool:
        if not isinstance(value, str):
            return True
        if not _RFC3339.match(value):
            return False
        datetime.fromisoformat(value.replace("z", "Z").replace("t", "T"))
        return True

    def _int32(value: object) -> bool:
        return not isinstance(value, int) or -(2**31) <= value < 2**31

    def _int64(value: object) -> bool:
        return not isinstance(value, int) or -(2**63) <= value < 2**63

    checker.checks("date-time", raises=ValueError)(_date_time)
    checker.checks("int32")(_int32)
    checker.checks("int64")(_int64)
    return checker


def _path(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def schema_violations(schema: Schema, obj: Any, *, base: str = "") -> list[Violation]:
    """Validate ``obj`` against the OpenAPI ``schema`` (converted with :func:`to_json_schema`)."""
    validator = jsonschema.Draft202012Validator(to_json_schema(schema), format_checker=_format_checker())
    prefix = [base] if base else []
    return [
        Violation(_path([*prefix, *error.absolute_path]), str(error.validator), error.message)
        for error in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    ]


# --- defaulting --------------------------------------------------------------------------


def apply_defaults(schema: Schema, obj: Any) -> Any:
    """Return a copy of ``obj`` with schema defaults filled in, as the API server does.

    Top-down: a missing field with a default gets a deep copy of it, and that value is then
    defaulted in turn (so ``lifecycle: {default: {}}`` yields ``lifecycle.verify: true``).
    """
    obj = copy.deepcopy(obj)
    _default_in_place(schema, obj)
    return obj


def _default_in_place(schema: Schema, obj: Any) -> None:
    if isinstance(obj, dict):
        for name, child in schema.get("properties", {}).items():
            if name not in obj and "default" in child:
                obj[name] = copy.deepcopy(child["default"])
            if name in obj:
                _default_in_place(child, obj[name])
        additional = schema.get("additionalProperties")
        if isinstance(additional, dict):
            for key, value in obj.items():
                if key not in schema.get("properties", {}):
                    _default_in_place(additional, value)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for item in obj:
            _default_in_place(schema["items"], item)


# --- list types --------------------------------------------------------------------------


def list_type_violations(schema: Schema, obj: Any, path: str = "") -> list[Violation]:
    """Return duplicate keys in ``x-kubernetes-list-type: map`` lists and duplicates in ``set`` lists."""
    found: list[Violation] = []
    for child_path, child_schema, value in _iter_values(schema, obj, path):
        list_type = child_schema.get("x-kubernetes-list-type")
        if not isinstance(value, list) or list_type not in ("map", "set"):
            continue
        seen: set[Any] = set()
        for index, item in enumerate(value):
            key: Any
            if list_type == "map":
                keys = child_schema.get("x-kubernetes-list-map-keys", [])
                key = tuple(item.get(k) for k in keys) if isinstance(item, dict) else (item,)
            else:
                key = yaml.safe_dump(item, sort_keys=True)
            if key in seen:
                found.append(Violation(f"{child_path}[{index}]", "listType", f"Duplicate value: {key!r}"))
            seen.add(key)
    return found


def _iter_values(schema: Schema, obj: Any, path: str) -> Iterator[tuple[str, Schema, Any]]:
    # Every (path, schema node, value) pair present in the object, outermost first.
    yield path or "<root>", schema, obj
    if isinstance(obj, dict):
        props = schema.get("properties", {})
        additional = schema.get("additionalProperties")
        for key, value in obj.items():
            if key in props:
                yield from _iter_values(props[key], value, f"{path}.{key}" if path else key)
            elif isinstance(additional, dict):
                yield from _iter_values(additional, value, f"{path}[{key}]")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(obj):
            yield from _iter_values(schema["items"], item, f"{path}[{index}]")


# --- CEL ---------------------------------------------------------------------------------


@functools.cache
def compile_rule(rule: str) -> celpy.Runner:
    """Compile one CEL rule with cel-python (cached: the same rule text runs many times)."""
    env = celpy.Environment()
    return env.program(env.compile(rule))


def is_transition_rule(rule: str) -> bool:
    """Whether ``rule`` compares with the stored object (reads ``oldSelf``)."""
    return re.search(r"\boldSelf\b", rule) is not None


def update_violations(schema: Schema, old: Any, new: Any) -> list[Violation]:
    """The transition rules an update from ``old`` to ``new`` (both defaulted) breaks.

    kube-apiserver binds ``oldSelf`` to the stored value at the rule's node and skips the rule
    where the stored object has no value there (Kubernetes docs, "Transition rules").
    """
    before = {where: value for where, _, value in _iter_values(schema, old, "")}
    found: list[Violation] = []
    for where, node, value in _iter_values(schema, new, ""):
        for rule in node.get("x-kubernetes-validations", []):
            if not is_transition_rule(rule["rule"]) or where not in before:
                continue
            bound = {"self": json_to_cel(value), "oldSelf": json_to_cel(before[where])}
            result = compile_rule(rule["rule"]).evaluate(bound)
            if not (isinstance(result, BoolType) and bool(result)):
                message = rule.get("message") or f"failed rule: {rule['rule']}"
                found.append(Violation(where, "cel", " ".join(message.split())))
    return found


def eval_rule(rule: str, value: Any) -> bool:
    """Evaluate ``rule`` with ``self`` bound to ``value`` (JSON data).

    Raises :class:`CELEvalError` when the rule cannot be evaluated (e.g. it reads an
    absent field without ``has()``) or does not yield a bool; the API server rejects the
    object in that case too.
    """
    result = compile_rule(rule).evaluate({"self": json_to_cel(value)})
    # cel-python sometimes returns an error value instead of raising it.
    if isinstance(result, CELEvalError):
        raise result
    if not isinstance(result, BoolType):
        raise CELEvalError(f"rule did not return a bool: {result!r}")
    return bool(result)


def cel_violations(schema: Schema, obj: Any, path: str = "") -> list[Violation]:
    """Evaluate every ``x-kubernetes-validations`` rule that applies to ``obj``.

    A rule runs once for each value present at its node (once per item for a rule on
    ``items``); ``obj`` should already be defaulted, as it is when the API server validates.
    """
    found: list[Violation] = []
    for where, node, value in _iter_values(schema, obj, path):
        for rule in node.get("x-kubernetes-validations", []):
            if is_transition_rule(rule["rule"]):
                # Validation here is of a creation: kube-apiserver runs a rule that reads oldSelf only on
                # an update, when the old object has a value there ("Transition rules", Kubernetes docs:
                # "CustomResourceDefinition ... Validation rules ... Transition rules").
                continue
            try:
                ok = eval_rule(rule["rule"], value)
            except CELEvalError as error:
                found.append(Violation(where, "celError", f"{rule['rule']!r} could not run: {error}"))
                continue
            if not ok:
                message = rule.get("message") or f"failed rule: {rule['rule']}"
                found.append(Violation(where, "cel", " ".join(message.split())))
    return found


# --- all together ------------------------------------------------------------------------


def validate(schema: Schema, obj: Any) -> list[Violation]:
    """Default ``obj``, then return every schema, list-type and CEL violation, as the API server would.

    CEL rules only run when the object passes the OpenAPI schema. The server skips them only
    after errors that would make a rule unsafe (wrong types); skipping after any error keeps
    each bad sample failing for one reason, and the rules may rely on enums and patterns.
    """
    defaulted = apply_defaults(schema, obj)
    found = schema_violations(schema, defaulted) + list_type_violations(schema, defaulted)
    if found:
        return found
    return cel_violations(schema, defaulted)
