"""Run a user's training entrypoint in this process, counting its cache activity.

``python -m compilecache.jobtools.scriptrun REQUEST.json RESULT.json ENTRY [ARGS...]``:
the parent (``compilecache warm --script``) has already put the cache settings
in the environment; this wrapper only adds the ``jax.monitoring`` listeners
before the entrypoint runs, which a plain ``python PATH`` could not. ``ENTRY`` is
a script path (run as ``__main__``) or ``module:function`` (called with no
arguments, ``sys.argv`` set to ARGS).

The exact warm mode: with ``"steps": N`` in the request, the jitted function
named ``"step_fn"`` (``jax.jit(f)`` with ``f.__name__ == step_fn``) is counted,
and once its N-th call has returned and its result is ready the entrypoint is
stopped with :class:`StopWarm` (a ``SystemExit(0)``). Every compile the first N
steps needed has then happened, and JAX writes each entry right after
compiling it, before running it — so nothing is lost by stopping; the parent
checks and publishes the staged entries only after this process has exited.

One process of a multi-host warm-up (``"processes": N`` in the request): the entrypoint joins
its group itself (``jax.distributed.initialize`` from the environment the warmer gives it:
:func:`compilecache.jobtools.multihost.script_env`); this wrapper makes every process write its
own entries, and fails the run if the entrypoint never joined a group of N.
"""

from __future__ import annotations

import functools
import importlib
import json
import runpy
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compilecache.jobtools.workload import parse_spec


class StopWarm(SystemExit):
    """Raised inside the training loop after its N-th step: the warm-up has what it needs."""

    def __init__(self, steps: int, step_fn: str) -> None:
        super().__init__(0)
        self.steps, self.step_fn = steps, step_fn


class StepCounter:
    """Counts calls of jitted functions named ``step_fn``; stops the process after ``steps``."""

    def __init__(self, steps: int, step_fn: str) -> None:
        self.steps, self.step_fn, self.calls, self.wrapped = steps, step_fn, 0, 0

    def install(self) -> None:
        """Wrap ``jax.jit`` so that jitting ``step_fn`` returns a counting function."""
        import jax

        original = jax.jit
        counter = self

        @functools.wraps(original)
        def jit(fun: Any = None, *args: Any, **kwargs: Any) -> Any:
            if fun is None:  # jax.jit(donate_argnums=...) used as a decorator factory
                return functools.partial(jit, *args, **kwargs)
            jitted = original(fun, *args, **kwargs)
            if _function_name(fun) != counter.step_fn:
                return jitted
            counter.wrapped += 1
            return _CountingJitted(jitted, counter)

        # Patched on the module before the entrypoint imports anything, so both
        # `jax.jit(...)` and `from jax import jit` in its code get the counting one.
        # The jitted function itself is the original: same program, same cache key.
        jax.jit = jit

    def after_call(self, result: Any) -> None:
        """One step ran; at the N-th, wait for its result and stop the entrypoint."""
        self.calls += 1
        if self.calls >= self.steps:
            import jax

            jax.block_until_ready(result)
            raise StopWarm(self.steps, self.step_fn)


def _function_name(fun: Any) -> str | None:
    """The name of the function ``jax.jit`` was given, through ``functools.partial`` (lm1b's steps are partials)."""
    while isinstance(fun, functools.partial):
        fun = fun.func
    name = getattr(fun, "__name__", None)
    return name if isinstance(name, str) else None


class _CountingJitted:
    """A jitted function that counts its calls; everything else (``lower``…) is the original's."""

    def __init__(self, jitted: Any, counter: StepCounter) -> None:
        self._jitted, self._counter = jitted, counter
        functools.update_wrapper(self, jitted)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = self._jitted(*args, **kwargs)
        self._counter.after_call(result)
        return result

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        # As jax's own jitted functions do: a jitted method binds its instance.
        return self if obj is None else functools.partial(self, obj)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._jitted, name)


def main(argv: Sequence[str]) -> int:
    """Child entry point."""
    from compilecache.jobtools.childproc import run_to_dict, write_result
    from compilecache.jobtools.compiler import CacheEvents, TargetRun, one_line

    request: dict[str, Any] = json.loads(Path(argv[0]).read_text())
    result_path, entry, entry_args = argv[1], argv[2], list(argv[3:])
    steps = request.get("steps")
    counter = StepCounter(int(steps), str(request.get("step_fn") or "train_step")) if steps else None
    run = TargetRun(workload=f"script:{entry}", name=Path(entry).name if _is_path(entry) else entry)
    code = 0
    error = None
    sys.argv = [entry, *entry_args]
    if _is_path(entry):
        sys.path.insert(0, str(Path(entry).resolve().parent))
    processes = int(request.get("processes") or 1)
    if processes > 1:
        from compilecache.cache.errors import WarmError
        from compilecache.jobtools.multihost import install_own_key_writer

        try:
            # Before the entrypoint compiles anything: JAX alone writes process 0's entries only.
            install_own_key_writer()
        except WarmError as refused:
            write_result(result_path, {"error": str(refused), "code": 2})
            return 2
    start = time.perf_counter()
    if counter is not None:
        counter.install()
    with CacheEvents() as events, events.attribute_to(run):
        try:
            _run_entry(entry)
        except StopWarm:
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
            if code:
                error = f"script {entry} exited with status {code}"
        except BaseException as raised:
            traceback.print_exc()
            code, error = 1, f"script {entry} raised {one_line(raised)}"
    run.compile_seconds = time.perf_counter() - start
    if processes > 1 and code == 0:
        from compilecache.jobtools.multihost import joined_processes, single_process_message

        joined = joined_processes()
        if joined != processes:
            code = 2
            error = (
                single_process_message(processes)
                if joined == 1
                else f"the script joined a group of {joined} processes, but {processes} were asked"
            )
    facts = None
    if "jax" in sys.modules:
        from compilecache.jobtools.compiler import environment_facts

        facts = environment_facts()
    stepped = None
    if counter is not None:
        stepped = {"steps": counter.steps, "step_fn": counter.step_fn, "ran": counter.calls, "jitted": counter.wrapped}
    write_result(
        result_path,
        {
            "runs": [run_to_dict(run)],
            "error": error,
            "code": code,
            "facts": facts,
            "stepped": stepped,
            "write_errors": events.write_errors,
        },
    )
    return code


def _is_path(entry: str) -> bool:
    return entry.endswith(".py") or "/" in entry or Path(entry).is_file()


def _run_entry(entry: str) -> None:
    if _is_path(entry):
        runpy.run_path(entry, run_name="__main__")
        return
    module_name, attr = parse_spec(entry)
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    obj()


def steps_note(stepped: dict[str, Any] | None) -> str | None:
    """A warning when ``--steps`` could not stop the entrypoint where asked, else None."""
    if not stepped:
        return None
    if not stepped["jitted"]:
        return (
            f"--steps {stepped['steps']}: no jax.jit of a function named {stepped['step_fn']!r} was seen "
            "(name the step with --step-fn); the entrypoint ran to its end"
        )
    if stepped["ran"] < stepped["steps"]:
        return (
            f"--steps {stepped['steps']}: the entrypoint ended after {stepped['ran']} call(s) of "
            f"{stepped['step_fn']!r}; everything it ran was warmed"
        )
    return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
