"""The trainer's step count: how many calls of the step function had returned when a compile missed.

A program that runs only after the warmed steps (an epoch-end evaluation, a metrics gather every
k steps) misses in training. To say *when* (``eval_step (not warmed, first compiled at step 17)``)
the trainer's verdict (:mod:`compilecache.frameworks.jax.verdict`) counts calls of the function the
exact warm-up counted: the manifests record its name and the steps it ran (``step_fn``, ``steps``;
:func:`warmed_steps`). The count uses the warm-up's own wrapper (:mod:`compilecache.frameworks.jax.stepcalls`):

- ``jax.jit`` is patched, so a step function jitted after JAX's backends started is counted;
- JAX calls the verdict at backend initialisation, usually *after* a module-level
  ``@jax.jit def train_step`` ran, so the jitted functions of that name already bound to globals of
  ``__main__`` and of the script's own modules (not installed packages) are rebound to counting
  wrappers, and so are names bound to the original ``jax.jit`` (``from jax import jit``).

A step function out of reach (jitted before the backends started and held in a local or a dict)
is never called through a wrapper: :attr:`StepCount.counted` stays False and the report leaves
steps out rather than guess. Everything here is called from the verdict's install, which never
raises into user code.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from compilecache.frameworks.jax.stepcalls import (
    CountingJitted,
    jitted_name,
    own_modules,
    patch_jit,
    rebind_globals,
)


def warmed_steps(manifests: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Step function name → the steps the newest exact warm-up that counted it asked (N or ``"auto"``)."""
    found: dict[str, Any] = {}
    ordered = sorted(manifests, key=lambda m: str(m.get("finished_at") or m.get("run_id") or ""), reverse=True)
    for manifest in ordered:
        for target in manifest.get("targets") or []:
            if isinstance(target, Mapping) and isinstance(target.get("step_fn"), str) and target["step_fn"]:
                # The first target is the first run; a resumed run after it asked for one step only.
                found.setdefault(target["step_fn"], target.get("steps"))
    return found


class StepCount:
    """Calls of jitted functions named in ``names`` that have returned."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = frozenset(names)
        self.calls = 0
        self.called: list[str] = []  # the step function names actually called, first first
        self.wrapped = 0  # jitted objects wrapped (newly jitted or rebound)
        self.rebound = 0

    @property
    def counted(self) -> bool:
        """Whether any step function call was counted: only then is a miss's step known."""
        return self.calls > 0

    def wrap(self, jitted: Any, name: str) -> CountingJitted:
        """A counting wrapper around one jitted step function."""
        self.wrapped += 1

        def after(_: Any) -> None:
            # On every step: one increment (and a list check, until the name is in).
            self.calls += 1
            if name not in self.called:
                self.called.append(name)

        return CountingJitted(jitted, after=after)

    def install(self) -> None:
        """Patch ``jax.jit`` and rebind the jitted step functions already bound to the script's globals."""
        import jax

        names = self.names

        def choose(_: Any, name: str | None, jitted: Any) -> Any:
            return self.wrap(jitted, name) if name in names else jitted

        original = patch_jit(choose)
        modules = own_modules()
        self.rebound = rebind_globals(modules, names, lambda jitted: self.wrap(jitted, str(jitted_name(jitted))))
        # `from jax import jit` ran before the patch: those names still hold the original.
        for module in modules:
            namespace = getattr(module, "__dict__", {})
            for key, value in list(namespace.items()):
                if value is original:
                    namespace[key] = jax.jit
