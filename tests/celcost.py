"""Kubernetes' static cost estimate of CRD validation rules, re-created for the rules we write.

A real API server refuses a CRD whose ``x-kubernetes-validations`` rule could cost more than
its budget, before any object is validated (issue 9: a 1.36 server rejected our warmup rule
"by factor of 1.7x"). No API server runs here, and neither cel-python nor kubernetes-validate
estimates cost, so this module does, for the CEL forms our CRD uses; anything else raises
:class:`Unsupported` rather than guessing low.

What it follows (Kubernetes master, read with the project's code search):

- ``k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation/validation.go``:
  ``StaticEstimatedCostLimit = 10000000`` per rule and ``StaticEstimatedCRDCostLimit =
  100000000`` for the sum over the CRD; a rule's cost is ``getExpressionCost``: the estimated
  ``MaxCost`` of one evaluation times the max cardinality of the schema node it sits on (the
  product of the ``maxItems``/``maxProperties`` of the lists and maps above it); the message's
  factor is ``cost / limit`` printed ``%.1f``.
- ``k8s.io/apiserver/pkg/cel/common/schemas.go`` (``SchemaDeclType``): the size a path has:
  a string's is ``maxLength * 4`` (bytes, a rune can take 4), else the longest enum value,
  else the 3 MiB request size minus 2; a list's is ``maxItems``, a map's ``maxProperties``
  (else estimated from the request size); scalars' is 0. The resource root also gets
  ``metadata.name``/``generateName`` (strings without maxLength).
- ``github.com/google/cel-go/checker/cost.go`` (``coster``): identifiers and field selection
  cost 1 (selection on an object or map adds 1 to its operand's cost); literals 0; ``has()``
  1 plus its operand; ``&&``/``||`` the sum of both sides; ``?:`` the condition plus the
  costlier branch; ``==``/``!=`` (and string ordering) ``ceil(0.1 * min(size(lhs),
  size(rhs)))`` plus the arguments; ``x in list`` ``size(list)`` plus the arguments;
  ``startsWith``/``endsWith`` ``ceil(0.1 * size(arg))``; ``contains`` and ``matches`` products
  of the two traversals; a list literal 10 plus its items; every other call 1 plus its
  arguments. A comprehension costs its range, init and result once plus
  ``size(range) * (loop condition + loop step)``; for the ``all``/``exists`` macros
  (``parser/macro.go``) the condition is ``@not_strictly_false(@result)`` (2) or
  ``@not_strictly_false(!@result)`` (3), the step ``@result && pred`` / ``@result || pred``
  (1 + pred), the result ``@result`` (1).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from celpy.celparser import CELParser
from lark import Token, Tree

PER_RULE_LIMIT = 10_000_000  # StaticEstimatedCostLimit
CRD_TOTAL_LIMIT = 100_000_000  # StaticEstimatedCRDCostLimit
MAX_REQUEST_SIZE = 3 * 1024 * 1024  # k8s.io/apiserver/pkg/cel/limits.go DefaultMaxRequestSizeBytes

Schema = Mapping[str, Any]

_PASS_THROUGH = {"expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication", "unary"}
_PASS_THROUGH |= {"member", "primary"}
_EQUALITY = {"relation_eq", "relation_ne"}
_ORDERING = {"relation_lt", "relation_le", "relation_gt", "relation_ge"}


class Unsupported(ValueError):
    """A CEL form this estimator does not model: extend it rather than guess."""


class Unbounded(ValueError):
    """A list or map above a rule has no maxItems/maxProperties: its cardinality is a guess."""


@dataclass(frozen=True)
class Value:
    """What the estimator knows about an expression's result: its schema node, else its size."""

    schema: Schema | None = None
    size: int | None = None  # the size of a computed value (a literal, a call's scalar result)
    kind: str = "scalar"  # scalar, string, list, map, object

    @property
    def max_size(self) -> int:
        if self.size is not None:
            return self.size
        if self.schema is not None:
            return schema_size(self.schema)
        return 1  # cel-go's computeTypeSize: scalars have size 1


@dataclass(frozen=True)
class RuleCost:
    """One rule's worst case: one evaluation, how often it runs, and their product."""

    path: str
    rule: str
    per_call: int
    cardinality: int

    @property
    def total(self) -> int:
        return self.per_call * self.cardinality

    @property
    def factor(self) -> float:
        return self.total / PER_RULE_LIMIT


def _kind(schema: Schema) -> str:
    kind = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        return "string"
    if kind == "array":
        return "list"
    if kind == "object":
        return "map" if isinstance(schema.get("additionalProperties"), dict) else "object"
    if kind == "string":
        return "string"
    return "scalar"


def schema_size(schema: Schema) -> int:
    """The size the API server assumes for a value of ``schema`` (``DeclType.MaxElements``)."""
    kind = _kind(schema)
    if kind == "string":
        if "maxLength" in schema:
            return int(schema["maxLength"]) * 4
        if schema.get("enum") and not schema.get("x-kubernetes-int-or-string"):
            return max(len(str(value)) for value in schema["enum"])
        return MAX_REQUEST_SIZE - 2
    if kind == "list":
        if "maxItems" in schema:
            return int(schema["maxItems"])
        return (MAX_REQUEST_SIZE - 2) // (_min_serialized_size(schema["items"]) + 1)
    if kind == "map":
        if "maxProperties" in schema:
            return int(schema["maxProperties"])
        return (MAX_REQUEST_SIZE - 2) // (_min_serialized_size(schema["additionalProperties"]) + 6)
    return 0  # scalars and objects: DeclType.MaxElements is never set for them


def _min_serialized_size(schema: Schema) -> int:
    # schemas.go: "" is 2, true 4, 0 1, {} 2 plus each required property without a default.
    kind = _kind(schema)
    if kind == "string":
        return 2
    if schema.get("type") == "boolean":
        return 4
    if kind == "object":
        required = set(schema.get("required", []))
        size = 2
        for name, prop in schema.get("properties", {}).items():
            if name in required and "default" not in prop:
                size += len(name) + _min_serialized_size(prop) + 4
        return size
    return 2 if kind in ("list", "map") else 1


def _with_object_meta(root: Schema) -> Schema:
    # schemas.go WithTypeAndObjectMeta: root rules may read metadata.name and generateName.
    properties = dict(root.get("properties", {}))
    meta = dict(properties.get("metadata", {"type": "object"}))
    meta_props = dict(meta.get("properties", {}))
    meta_props.setdefault("name", {"type": "string"})
    meta_props.setdefault("generateName", {"type": "string"})
    meta["properties"] = meta_props
    properties["metadata"] = meta
    properties.setdefault("kind", {"type": "string"})
    properties.setdefault("apiVersion", {"type": "string"})
    return {**root, "properties": properties}


# --- the estimate of one evaluation --------------------------------------------------------


_PARSER = CELParser()


def estimate(rule: str, self_schema: Schema, *, root: bool = False) -> int:
    """The worst-case cost of one evaluation of ``rule`` with ``self`` of ``self_schema``."""
    return _estimate(rule, self_schema, root=root)[0]


def touched(rule: str, self_schema: Schema, *, root: bool = False) -> list[Schema]:
    """The schema nodes of the strings, lists and maps ``rule`` reads (``self`` included)."""
    return _estimate(rule, self_schema, root=root)[1]


def _estimate(rule: str, self_schema: Schema, *, root: bool) -> tuple[int, list[Schema]]:
    schema = _with_object_meta(self_schema) if root else self_schema
    # A transition rule's oldSelf is the same node of the stored object: same schema, same bounds.
    value = Value(schema=schema, kind=_kind(schema))
    coster = _Coster({"self": value, "oldSelf": value})
    cost, _ = coster.cost(_PARSER.parse(rule))
    return cost, coster.touched


class _Coster:
    def __init__(self, variables: Mapping[str, Value]) -> None:
        self.variables = dict(variables)
        self.touched: list[Schema] = [v.schema for v in variables.values() if v.schema is not None]

    def cost(self, node: Any) -> tuple[int, Value]:
        node = _strip(node)
        if isinstance(node, Token):
            raise Unsupported(f"bare token {node!r}")
        method = getattr(self, f"_{node.data}", None)
        if method is None:
            raise Unsupported(f"CEL form {node.data!r} is not modelled")
        result: tuple[int, Value] = method(node)
        return result

    # leaves

    def _literal(self, node: Tree) -> tuple[int, Value]:
        token = node.children[0]
        if token.type in ("STRING_LIT", "MLSTRING_LIT"):
            text = token.value.lstrip("rRbB")
            quote = 3 if text[:3] in ('"""', "'''") else 1
            return 0, Value(size=len(text) - 2 * quote, kind="string")
        return 0, Value(size=1)

    def _ident(self, node: Tree) -> tuple[int, Value]:
        name = node.children[0].value
        if name not in self.variables:
            raise Unsupported(f"unknown identifier {name!r}")
        return 1, self.variables[name]

    def _paren_expr(self, node: Tree) -> tuple[int, Value]:
        return self.cost(node.children[0])

    def _list_lit(self, node: Tree) -> tuple[int, Value]:
        items = _exprlist(node.children[0]) if node.children else []
        return 10 + sum(self.cost(item)[0] for item in items), Value(size=len(items), kind="list")

    # selection

    def _member_dot(self, node: Tree) -> tuple[int, Value]:
        operand, field = node.children
        cost, value = self.cost(operand)
        if value.kind in ("object", "map"):
            cost += 1
        child = _field(value, field.value)
        if child.schema is not None:
            self.touched.append(child.schema)
        return cost, child

    def _ident_arg(self, node: Tree) -> tuple[int, Value]:
        name = node.children[0].value
        args = _exprlist(node.children[1]) if len(node.children) > 1 else []
        if name == "has":
            operand, _field_name = _strip(args[0]).children
            return 1 + self.cost(operand)[0], Value(size=1)
        return 1 + sum(self.cost(arg)[0] for arg in args), Value(size=1)

    def _member_dot_arg(self, node: Tree) -> tuple[int, Value]:
        target, method = node.children[0], node.children[1].value
        args = _exprlist(node.children[2]) if len(node.children) > 2 else []
        if method in ("all", "exists"):
            return self._comprehension(target, method, args)
        target_cost, target_value = self.cost(target)
        arg_costs = [self.cost(arg) for arg in args]
        arguments = target_cost + sum(cost for cost, _ in arg_costs)
        if method in ("startsWith", "endsWith"):
            return arguments + math.ceil(arg_costs[0][1].max_size * 0.1), Value(size=1)
        if method == "contains":
            product = math.ceil(target_value.max_size * 0.1) * math.ceil(arg_costs[0][1].max_size * 0.1)
            return arguments + product, Value(size=1)
        if method == "matches":
            product = math.ceil((target_value.max_size + 1) * 0.1) * math.ceil(arg_costs[0][1].max_size * 0.25)
            return arguments + product, Value(size=1)
        if method == "size":
            return arguments + 1, Value(size=1)
        raise Unsupported(f"method {method!r} is not modelled")

    def _comprehension(self, target: Any, macro: str, args: list[Any]) -> tuple[int, Value]:
        range_cost, range_value = self.cost(target)
        variable = _strip(args[0]).children[0].value
        saved = self.variables.get(variable)
        element = self.variables[variable] = _element(range_value)
        if element.schema is not None:
            self.touched.append(element.schema)
        try:
            predicate, _ = self.cost(args[1])
        finally:
            if saved is None:
                self.variables.pop(variable)
            else:
                self.variables[variable] = saved
        condition = 2 if macro == "all" else 3
        step = 1 + predicate
        result = 1
        return range_cost + result + range_value.max_size * (condition + step), Value(size=1)

    # operators

    def _conditionalor(self, node: Tree) -> tuple[int, Value]:
        return self.cost(node.children[0])[0] + self.cost(node.children[1])[0], Value(size=1)

    _conditionaland = _conditionalor

    def _unary(self, node: Tree) -> tuple[int, Value]:
        operator, operand = node.children
        if _strip(operator).data not in ("unary_not", "unary_neg"):
            raise Unsupported(f"unary {operator!r}")
        return 1 + self.cost(operand)[0], Value(size=1)

    def _expr(self, node: Tree) -> tuple[int, Value]:  # the ternary: cond ? a : b
        condition, if_true, if_false = node.children
        return self.cost(condition)[0] + max(self.cost(if_true)[0], self.cost(if_false)[0]), Value(size=1)

    def _relation(self, node: Tree) -> tuple[int, Value]:
        left_tree, right = node.children
        operator = _strip(left_tree)
        left_cost, left = self.cost(operator.children[0])
        right_cost, right_value = self.cost(right)
        arguments = left_cost + right_cost
        if operator.data == "relation_in":
            if right_value.kind == "map":
                return arguments + 1, Value(size=1)
            return arguments + right_value.max_size, Value(size=1)
        if operator.data in _EQUALITY or (operator.data in _ORDERING and left.kind == "string"):
            return arguments + math.ceil(min(left.max_size, right_value.max_size) * 0.1), Value(size=1)
        if operator.data in _ORDERING:
            return arguments + 1, Value(size=1)
        raise Unsupported(f"relation {operator.data!r}")


def _strip(node: Any) -> Any:
    while isinstance(node, Tree) and node.data in _PASS_THROUGH and len(node.children) == 1:
        node = node.children[0]
    return node


def _exprlist(node: Any) -> list[Any]:
    node = _strip(node)
    if isinstance(node, Tree) and node.data == "exprlist":
        return list(node.children)
    return [node]


def _field(value: Value, name: str) -> Value:
    schema = value.schema
    if schema is None:
        raise Unsupported(f"select .{name} on a computed value")
    if value.kind == "map":
        child = schema["additionalProperties"]
    else:
        child = schema.get("properties", {}).get(name)
        if child is None:
            raise Unsupported(f"no field {name!r} in the schema")
    return Value(schema=child, kind=_kind(child))


def _element(value: Value) -> Value:
    if value.schema is None:
        return Value(size=1)
    if value.kind == "list":
        items = value.schema["items"]
        return Value(schema=items, kind=_kind(items))
    if value.kind == "map":  # iterating a map yields its keys: strings of unknown size
        return Value(size=MAX_REQUEST_SIZE - 2, kind="string")
    raise Unsupported("comprehension over a scalar")


# --- every rule of a schema ----------------------------------------------------------------


def iter_rule_sites(schema: Schema, path: str = "", cardinality: int = 1) -> Iterator[tuple[str, Schema, int]]:
    """Yield ``(path, node, cardinality)`` for every node that carries rules.

    Raises :class:`Unbounded` for a rule under a list or map without a bound: the API server
    would then guess from the request size, and so do we not.
    """
    if schema.get("x-kubernetes-validations"):
        if cardinality < 0:
            raise Unbounded(f"{path or '<root>'}: a list or map above this rule has no maxItems/maxProperties")
        yield path, schema, cardinality
    for name, child in schema.get("properties", {}).items():
        yield from iter_rule_sites(child, f"{path}.{name}" if path else name, cardinality)
    for key, bound, suffix in (("items", "maxItems", "[]"), ("additionalProperties", "maxProperties", "{}")):
        child = schema.get(key)
        if isinstance(child, dict):
            limit = schema.get(bound)
            below = -1 if limit is None or cardinality < 0 else cardinality * int(limit)
            yield from iter_rule_sites(child, f"{path}{suffix}", below)


def unbounded_reads(root: Schema) -> list[str]:
    """Rules that read a string, list or map of the CRD without maxLength/maxItems/maxProperties.

    Fields the API server adds itself (``metadata.name`` at the root) are left out: the CRD
    cannot bound them.
    """
    found = []
    for path, node, _ in iter_rule_sites(root):
        for rule in node["x-kubernetes-validations"]:
            for read in touched(rule["rule"], node, root=path == ""):
                kind = _kind(read)
                bound = {"string": ("maxLength", "enum"), "list": ("maxItems",), "map": ("maxProperties",)}.get(kind)
                if bound and not any(key in read for key in bound) and _in_crd(root, read):
                    found.append(f"{path or '<root>'}: {rule['rule']!r} reads a {kind} without {bound[0]}")
    return found


def _in_crd(root: Schema, node: Schema) -> bool:
    stack: list[Any] = [root]
    while stack:
        current = stack.pop()
        if current is node:
            return True
        if isinstance(current, dict):
            stack.extend(current.values())
        elif isinstance(current, list):
            stack.extend(current)
    return False


def rule_costs(root: Schema) -> list[RuleCost]:
    """The worst-case cost of every ``x-kubernetes-validations`` rule under ``root``."""
    found = []
    for path, node, cardinality in iter_rule_sites(root):
        for rule in node["x-kubernetes-validations"]:
            per_call = estimate(rule["rule"], node, root=path == "")
            found.append(RuleCost(path or "<root>", " ".join(rule["rule"].split()), per_call, cardinality))
    return found
