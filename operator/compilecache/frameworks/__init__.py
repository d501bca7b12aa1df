"""The frameworks a cache can hold, found by name: the registry of :class:`~.interface.Framework`.

Everything outside a framework's own folder reaches it through :func:`get` (by ``spec.framework``
or ``--framework``), never by importing it: the built-in ones are listed here by module path, and
an installed distribution adds one through the ``compilecache.frameworks`` entry point group
(``name = "package.module:FRAMEWORK"``), as pytest plugins and JAX's PJRT plugins plug in,
without the core naming them. docs/development.md says what a framework implements.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from compilecache.cache.errors import one_line
from compilecache.frameworks.interface import Framework

# name → the module whose FRAMEWORK implements it. The names are spec.framework's values.
BUILT_IN = {
    "jax": "compilecache.frameworks.jax",
    "pytorch": "compilecache.frameworks.pytorch",
}
ENTRY_POINTS = "compilecache.frameworks"
DEFAULT = "jax"


class UnknownFramework(LookupError):
    """A framework name no built-in and no installed entry point provides, or a registration that
    gives none; bad input to every command (:func:`compilecache.cli.errors.guarded`: one line, exit 2)."""


def names() -> tuple[str, ...]:
    """Every framework this installation has: the built-in ones first, then the plugged-in ones."""
    plugged = sorted(point.name for point in entry_points(group=ENTRY_POINTS) if point.name not in BUILT_IN)
    return (*BUILT_IN, *plugged)


def get(name: str) -> Framework:
    """The framework called ``name``, its module loaded now (a light one: see interface.py)."""
    if name in BUILT_IN:
        found = getattr(importlib.import_module(BUILT_IN[name]), "FRAMEWORK", None)
    else:
        points = [point for point in entry_points(group=ENTRY_POINTS) if point.name == name]
        if not points:
            raise UnknownFramework(f"unknown framework {name!r}: this installation has {', '.join(names())}")
        try:
            found = points[0].load()
        except Exception as error:  # a plug-in's import raising (a missing library, its own bug): its fault, not ours
            raise UnknownFramework(
                f"framework {name!r} is registered, but cannot be loaded ({one_line(error)})"
            ) from error
    if not isinstance(found, Framework) or found.name != name:
        raise UnknownFramework(f"framework {name!r} is registered, but its FRAMEWORK is no Framework named {name!r}")
    return found
