"""Why a compile missed: the first difference between two recorded program signatures.

A JAX cache key is a hash; when a trainer (or verify) misses an entry the warmer
wrote for the same function, the hash says nothing about *what* differed. So the
warmer records, per target, a signature of what it lowered — per argument its
shape/dtype, ``weak_type``, sharding and donation; static arguments; mesh axis
names; the key-relevant settings (``XLA_FLAGS``, x64, …) — and a miss is
explained by comparing two signatures: :func:`first_difference`, a pure function
over JSON-able dicts (tested without JAX).

:func:`signature_of` is the small JAX-side extractor, run on ``jitted.lower(...)``.
:func:`signature_of_computation` reads the same from a program JAX is compiling
(the exact mode's warm-up and the trainer, :mod:`compilecache.frameworks.jax.compilehook`).
It imports JAX only inside the function: this module belongs to the cache
format, which the operator imports too. Users: the warmer and verify
(:mod:`compilecache.jobtools`) and the trainer's own verdict (:mod:`compilecache.frameworks.jax.runtime`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from compilecache.frameworks.jax import keysettings
from compilecache.training.report import sides

Signature = dict[str, Any]


def first_difference(name: str, warmer: Mapping[str, Any], other: Mapping[str, Any]) -> str | None:
    """One line naming the first difference of ``other`` from ``warmer``, or None.

    The order is the order a user fixes things in: settings that change every
    key first, then the arguments one by one (an argument's sharding names its
    mesh axes), then the mesh as a whole, then static args. ``other`` is training's
    side (or verify's fresh run of training's call): values read as
    :func:`compilecache.training.report.sides` puts them, training's first.
    """
    if not warmer or not other:
        return None
    settings = keysettings.differences(other.get("settings") or {}, warmer.get("settings") or {})
    if settings:  # every key differs then: the first thing to tell
        return f"{name}: {settings[0]}"
    mine_args: Sequence[Mapping[str, Any]] = warmer.get("args", [])
    their_args: Sequence[Mapping[str, Any]] = other.get("args", [])
    theirs_by_path = {arg["path"]: arg for arg in their_args}
    for arg in mine_args:
        theirs = theirs_by_path.get(arg["path"])
        if theirs is None:
            label = _label(arg["path"], arg.get("name"))
            return f"{name} arg {label}: present in the warmer only (argument structure differs)"
        for field in ("type", "weak_type", "sharding", "donated"):
            if arg.get(field) != theirs.get(field):
                what = "" if field == "type" else f"{arg.get('type')} {field}="
                label = _label(arg["path"], theirs.get("name") or arg.get("name"))
                return f"{name} arg {label}: {what}{sides(_show(theirs.get(field)), _show(arg.get(field)))}"
    known = {a["path"] for a in mine_args}
    extra = [arg for arg in their_args if arg["path"] not in known]
    if extra:
        label = _label(extra[0]["path"], extra[0].get("name"))
        return f"{name} arg {label}: present in training only (argument structure differs)"
    if warmer.get("mesh_axes") != other.get("mesh_axes"):
        return f"{name}: mesh axis names {sides(_show(other.get('mesh_axes')), _show(warmer.get('mesh_axes')))}"
    static_mine, static_theirs = warmer.get("static", {}), other.get("static", {})
    for position in sorted(set(static_mine) | set(static_theirs)):
        if static_mine.get(position) != static_theirs.get(position):
            values = sides(_show(static_theirs.get(position)), _show(static_mine.get(position)))
            return f"{name} static arg {position}: {values}"
    return None


def signature_of(lowered: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None) -> Signature:
    """The signature of ``jitted.lower(*args, **kwargs)``: see the module docstring.

    Reads ``lowered.args_info`` (public) for shapes, dtypes, weak types and
    donation, and the lowering's ``in_shardings`` (private in jax 0.10; read
    defensively) for what each argument is sharded as.
    """
    import jax

    flat = jax.tree_util.tree_flatten_with_path(lowered.args_info)[0]
    shardings = _in_shardings(lowered, len(flat))
    entries = []
    axes: list[str] = []
    for position, (path, info) in enumerate(flat):
        aval = getattr(info, "_aval", None)
        sharding = shardings[position] if shardings is not None else None
        mesh = getattr(sharding, "mesh", None)
        for axis in getattr(mesh, "axis_names", ()) or ():
            if str(axis) not in axes:
                axes.append(str(axis))
        entries.append(
            {
                "path": jax.tree_util.keystr(path),
                "type": str(aval.str_short()) if aval is not None else "?",
                "weak_type": bool(getattr(aval, "weak_type", False)),
                "sharding": _describe_sharding(sharding),
                "donated": bool(getattr(info, "donated", False)),
            }
        )
    return {
        "args": entries,
        # What the program returns (types only): an argument returned updated is what training donates.
        "outputs": _output_types(lowered),
        "static": _static_args(args, kwargs or {}),
        "mesh_axes": axes,
        "settings": keysettings.current(),
    }


def display_name(module: str) -> str:
    """``jit_train_step`` → ``train_step`` (JAX names a jitted function's module ``jit_<name>``)."""
    return module.removeprefix("jit_") or module


def signature_of_computation(computation: Any) -> tuple[str, Signature]:
    """``(module name, signature)`` of a program JAX is compiling (:mod:`compilecache.frameworks.jax.compilehook`).

    For the exact mode and the trainer, which see the compile request, not the user's call: the
    module name is the one in the cache key (``jit_train_step``), an argument's path comes from
    JAX's own argument names (``state.step`` → ``[0][0].step``: the first parameter, as
    :func:`signature_of` writes it), and settings are left out (a run records them once).
    Reads private jax 0.10 fields defensively: whatever is missing reads as unknown.
    """
    hlo = computation._hlo
    with hlo.context:
        module = str(hlo.operation.attributes["sym_name"].value)
    compile_args = getattr(computation, "compile_args", {}) or {}
    info = compile_args.get("all_args_info")
    avals = list(getattr(info, "in_avals", ()) or ())
    debug = getattr(info, "debug_info", None)
    names = list(debug.safe_arg_names(len(avals))) if debug is not None else [""] * len(avals)
    kept = sorted(compile_args.get("kept_var_idx") or range(len(avals)))
    shardings = list(compile_args.get("in_shardings") or ())
    donated = list(getattr(computation, "_donated_invars", ()) or ())
    by_position = {position: index for index, position in enumerate(kept)}
    tops: list[str] = []
    entries = []
    axes: list[str] = []
    for position, aval in enumerate(avals):
        index = by_position.get(position)
        sharding = shardings[index] if index is not None and index < len(shardings) else None
        for axis in getattr(getattr(sharding, "mesh", None), "axis_names", ()) or ():
            if str(axis) not in axes:
                axes.append(str(axis))
        arg_name = names[position] if position < len(names) else ""
        entries.append(
            {
                "path": _path_of_name(arg_name, position, tops),
                # JAX's own name of the argument (``batch['image']``): a message names the parameter by it.
                **({"name": arg_name} if _path_of_name(arg_name, position, []) != f"[{position}]" else {}),
                "type": str(aval.str_short()) if hasattr(aval, "str_short") else str(aval),
                "weak_type": bool(getattr(aval, "weak_type", False)),
                "sharding": "unused" if index is None else _describe_sharding(sharding),
                "donated": bool(donated[index]) if index is not None and index < len(donated) else False,
            }
        )
    return module, {"args": entries, "static": {}, "mesh_axes": axes, "settings": {}}


def _path_of_name(name: str, position: int, tops: list[str]) -> str:
    """JAX's argument name (``state.params['w']``) as a path ``[0][k]<rest>``, k the parameter's index."""
    match = re.match(r"^([A-Za-z_]\w*)(.*)$", name)
    if match is None:  # no name recorded: the flat position is all there is
        return f"[{position}]"
    top, rest = match[1], match[2]
    if top not in tops:
        tops.append(top)
    return f"[0][{tops.index(top)}]{rest}"


def closest_difference(name: str, recorded: Sequence[Mapping[str, Any]], other: Mapping[str, Any]) -> str | None:
    """:func:`first_difference` from the recorded variant of a function nearest to ``other``.

    A function can be warmed in several variants (a fresh and a resumed ``train_step``): the one
    with the fewest differing arguments is what the user meant to hit.
    """
    best: tuple[int, str] | None = None
    for warmer in recorded:
        found = first_difference(name, warmer, other)
        if found is None:
            return None
        score = _differing_args(warmer, other)
        if best is None or score < best[0]:
            best = (score, found)
    return best[1] if best else None


def _differing_args(warmer: Mapping[str, Any], other: Mapping[str, Any]) -> int:
    mine = {arg["path"]: arg for arg in warmer.get("args", [])}
    theirs = {arg["path"]: arg for arg in other.get("args", [])}
    fields = ("type", "weak_type", "sharding", "donated")
    differing = sum(
        1
        for path in set(mine) | set(theirs)
        if path not in mine or path not in theirs or any(mine[path].get(f) != theirs[path].get(f) for f in fields)
    )
    return differing + (warmer.get("mesh_axes") != other.get("mesh_axes"))


def _output_types(lowered: Any) -> list[str]:
    """``lowered.out_info``'s leaves written as the arguments' types (public in jax 0.10; read defensively)."""
    import jax

    try:
        leaves = jax.tree_util.tree_leaves(lowered.out_info)
    except AttributeError:
        return []
    return [str(jax.core.ShapedArray(leaf.shape, leaf.dtype).str_short()) for leaf in leaves]


def _in_shardings(lowered: Any, count: int) -> list[Any] | None:
    try:
        shardings = list(lowered._lowering.compile_args["in_shardings"])
    except (AttributeError, KeyError, TypeError):
        return None
    return shardings if len(shardings) == count else None


def _describe_sharding(sharding: Any) -> str:
    """``P('data',)`` for a NamedSharding, ``unspecified`` where the caller gave none."""
    if sharding is None:
        return "unknown"
    kind = type(sharding).__name__
    if kind == "UnspecifiedValue":
        return "unspecified"
    spec = getattr(sharding, "spec", None)
    if spec is not None:
        # jax < 0.9 prints PartitionSpec('data',), later ones P('data',): one spelling for both.
        return re.sub(r"^PartitionSpec\(", "P(", str(spec))
    if getattr(sharding, "is_fully_replicated", False):
        return "replicated"
    return kind


def _static_args(args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, str]:
    """Top-level args that are not arrays: what jit treats as static, by repr (positions, then names)."""
    named = [(str(position), value) for position, value in enumerate(args)] + sorted(kwargs.items())
    return {key: repr(value)[:200] for key, value in named if not _is_array_tree(value)}


def _is_array_tree(value: Any) -> bool:
    import jax

    leaves = jax.tree_util.tree_leaves(value)
    return all(hasattr(leaf, "shape") and hasattr(leaf, "dtype") for leaf in leaves)


def arg_label(path: str) -> str:
    """``[0][0]['step']`` (args_info is ``(args, kwargs)``) → ``0 (['step'])``: the index first."""
    group, _, rest = path.partition("]")
    if group in ("[0", "[1") and rest.startswith("[") and "]" in rest:
        head, tail = rest[1:].split("]", 1)
        head = head if group == "[0" else f"kwarg {head}"
        return f"{head} ({tail})" if tail else head
    return path


def _label(path: str, arg_name: Any) -> str:
    """``1 (batch['image'])``: the argument's index and, where JAX named it, the parameter's own name."""
    shown = arg_label(path)
    if not arg_name or not path.startswith("[0]"):  # a keyword argument is named by its path already
        return shown
    return f"{shown.split(' ', 1)[0]} ({arg_name})"


def _show(value: Any) -> str:
    return "unset" if value is None else str(value)
