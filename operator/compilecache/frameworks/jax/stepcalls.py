"""Counting calls of a jitted step function: the one wrapper the warm-up and the trainer share.

JAX has no per-call event: a jitted function that has compiled runs from C++ (``PjitFunction``)
without calling back into Python, and its cache events fire only when it compiles. So both sides
that need to know "how many steps so far" wrap the jitted object instead:

- the exact warm-up (:mod:`compilecache.frameworks.jax.scriptrun`) patches ``jax.jit`` before the entrypoint
  runs (:func:`patch_jit`), to stop it after N steps;
- the trainer (:mod:`compilecache.frameworks.jax.stepcount`) patches it at JAX's backend initialisation,
  which usually comes *after* a module-level ``@jax.jit def train_step`` ran, so it also rebinds
  the jitted functions already bound to module globals (:func:`rebind_globals`), to say at which
  step a miss happened.

The wrapper (:class:`CountingJitted`) calls the original jitted object, so the program, its key and
its cache entry are unchanged; every other attribute (``lower``, ``trace``, ``eval_shape``,
``__wrapped__``...) is the original's. A per-call cost of one Python call and a counter remains
(measured in ``tests/test_step_calls.py``). Imports JAX only inside functions (this module belongs to
the cache format the operator imports).
"""

from __future__ import annotations

import functools
import sys
import sysconfig
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any

# What a patched jax.jit does with each new jitted function: (function given, its name, the jitted
# object) -> what the caller gets (the jitted object itself, or a CountingJitted around it).
Choose = Callable[[Any, "str | None", Any], Any]


def function_name(fun: Any) -> str | None:
    """The name of the function ``jax.jit`` was given, through ``functools.partial`` (lm1b's steps are partials)."""
    while isinstance(fun, functools.partial):
        fun = fun.func
    name = getattr(fun, "__name__", None)
    return name if isinstance(name, str) else None


class CountingJitted:
    """A jitted function that reports its calls; everything else (``lower``…) is the original's."""

    def __init__(
        self,
        jitted: Any,
        *,
        after: Callable[[Any], None],
        before: Callable[[], None] | None = None,
    ) -> None:
        self._jitted, self._before, self._after = jitted, before, after
        functools.update_wrapper(self, jitted)
        # The original's own: code that reaches the plain function (`train_step.__wrapped__(x)`) still does.
        self.__wrapped__ = getattr(jitted, "__wrapped__", jitted)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._before is not None:
            self._before()
        result = self._jitted(*args, **kwargs)
        self._after(result)
        return result

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        # As jax's own jitted functions do: a jitted method binds its instance.
        return self if obj is None else functools.partial(self, obj)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._jitted, name)


def patch_jit(choose: Choose) -> Callable[..., Any]:
    """Replace ``jax.jit`` by one that hands each new jitted function to ``choose``; the original.

    Patched on the module, so ``jax.jit(...)`` and a later ``from jax import jit`` both get it; a
    name bound to the original before (``from jax import jit`` at the top of a module) is not, which
    :func:`rebind_globals` can fix for module globals. Patching twice wraps the patched one.
    """
    import jax

    original: Callable[..., Any] = jax.jit

    @functools.wraps(original)
    def jit(fun: Any = None, *args: Any, **kwargs: Any) -> Any:
        if fun is None:  # jax.jit(donate_argnums=...) used as a decorator factory
            return functools.partial(jit, *args, **kwargs)
        jitted = original(fun, *args, **kwargs)
        return choose(fun, function_name(fun), jitted)

    jax.jit = jit
    return original


def jitted_name(value: Any) -> str | None:
    """The step name of a jitted function object (``PjitFunction``), or None for anything else."""
    if isinstance(value, CountingJitted) or not callable(value):
        return None
    if not (hasattr(value, "lower") and hasattr(value, "trace") and hasattr(value, "__wrapped__")):
        return None
    return function_name(value.__wrapped__)


def own_modules(modules: Mapping[str, ModuleType] | None = None) -> list[ModuleType]:
    """``__main__`` and the modules of the user's own code: not the standard library, not installed
    packages (site-packages), not this package."""
    modules = dict(sys.modules if modules is None else modules)
    paths = sysconfig.get_paths()
    installed = tuple({paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(key)})
    found = [modules["__main__"]] if "__main__" in modules else []
    for name, module in modules.items():
        if name == "__main__" or name.split(".")[0] in ("compilecache", "jax", "jaxlib"):
            continue
        try:
            where = getattr(module, "__file__", None)
        except Exception:  # a module-level __getattr__ that raises
            continue
        if isinstance(where, str) and not where.startswith(installed) and module not in found:
            found.append(module)
    return found


def rebind_globals(modules: Iterable[ModuleType], names: Iterable[str], wrap: Callable[[Any], Any]) -> int:
    """Replace each module global that is a jitted function named in ``names`` by ``wrap(it)``; how many.

    A function that reads the global at call time (``train_step(state, batch)`` in a loop) then
    calls the wrapper. A jitted function held elsewhere (a local, a dict, a closure) is not reached.
    """
    wanted = set(names)
    rebound = 0
    for module in modules:
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for key, value in list(namespace.items()):
            try:
                name = jitted_name(value)
            except Exception:  # a lazy proxy whose attributes raise: not a jitted function of ours
                continue
            if name in wanted:
                namespace[key] = wrap(value)
                rebound += 1
    return rebound
