"""What a workload returns: the programs to compile, as training calls them.

No JAX import here: the operator imports the package (for :class:`Target`'s
name in docs and type hints) and must not load JAX.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from compilecache.cache.errors import WarmError


@dataclass(frozen=True)
class Target:
    """One program to compile into the cache.

    ``fn`` is a ``jax.jit``-wrapped function carrying the same ``in_shardings``,
    ``out_shardings``, ``donate_argnums`` and static arguments as training;
    ``args``/``kwargs`` are arrays or ``jax.ShapeDtypeStruct``s (with shardings
    where training shards). The warmer calls ``fn.lower(*args, **kwargs).compile()``.

    ``training_args`` is optional: a function with no arguments that returns the
    positional arguments exactly as the training loop passes them (real arrays
    from its own input pipeline and initialiser). ``--verify`` then lowers from
    those instead of ``args``, so a warmer that describes the inputs differently
    from training (sharding, mesh axis names, dtype) fails loudly before any
    training pod starts rather than recompiling in every pod.
    """

    name: str
    fn: Any
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    training_args: Callable[[], Sequence[Any]] | None = None
    training_fn: Any = None

    @property
    def checks_training(self) -> bool:
        """Whether verify compares against training's side (its inputs or its function)."""
        return self.training_args is not None or self.training_fn is not None


def check_target(value: object, workload: str) -> Target:
    """Return ``value`` as a :class:`Target` or raise a one-line :class:`WarmError`."""
    if not isinstance(value, Target):
        raise WarmError(f"workload {workload} returned {type(value).__name__!s}, expected compilecache.Target")
    if not value.name:
        raise WarmError(f"workload {workload} returned a Target with an empty name")
    # A plain function has no .lower; a jax.jit-wrapped one does. Compiling an
    # un-jitted function would need a second jit whose key training never uses.
    if not callable(getattr(value.fn, "lower", None)):
        raise WarmError(
            f"target {value.name!r} of workload {workload}: fn {_describe(value.fn)} is not "
            "jax.jit-wrapped (it has no .lower); wrap it exactly as training does"
        )
    if isinstance(value.args, str | bytes) or not isinstance(value.args, Sequence):
        raise WarmError(f"target {value.name!r} of workload {workload}: args must be a tuple or list")
    if not isinstance(value.kwargs, Mapping):
        raise WarmError(f"target {value.name!r} of workload {workload}: kwargs must be a mapping")
    if value.training_args is not None and not callable(value.training_args):
        raise WarmError(f"target {value.name!r} of workload {workload}: training_args must be callable")
    if value.training_fn is not None and not callable(getattr(value.training_fn, "lower", None)):
        raise WarmError(
            f"target {value.name!r} of workload {workload}: training_fn {_describe(value.training_fn)} "
            "is not jax.jit-wrapped (it has no .lower)"
        )
    return value


def check_unique(targets: Sequence[tuple[str, Target]]) -> None:
    """Reject two targets with the same (workload, name): reports key on that pair."""
    seen: set[tuple[str, str]] = set()
    for workload, target in targets:
        key = (workload, target.name)
        if key in seen:
            raise WarmError(f"workload {workload} returned two targets named {target.name!r}")
        seen.add(key)


def abstract(tree: Any) -> Any:
    """``tree`` with every array replaced by a ``jax.ShapeDtypeStruct`` that keeps what the
    cache key depends on: shape, dtype, ``weak_type`` and sharding.

    The obvious ``ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)`` drops
    ``weak_type`` (a Python-scalar-born ``step`` counter is weakly typed), and a
    program lowered from it misses training's entry. Leaves without a shape
    (Python scalars, None) are kept as they are: jit treats them by value.
    """
    import jax

    def one(leaf: Any) -> Any:
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
            return leaf
        aval = getattr(leaf, "aval", None)
        weak = bool(getattr(aval, "weak_type", getattr(leaf, "weak_type", False)))
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=getattr(leaf, "sharding", None), weak_type=weak)

    return jax.tree_util.tree_map(one, tree)


def _describe(fn: object) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return repr(name) if name else type(fn).__name__
