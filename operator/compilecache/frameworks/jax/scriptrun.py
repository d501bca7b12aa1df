"""Run a user's training entrypoint in this process, counting its cache activity.

``python -m compilecache.frameworks.jax.scriptrun REQUEST.json RESULT.json ENTRY [ARGS...]``:
the parent (``compilecache warm --script``) has already put the cache settings
in the environment; this wrapper only adds the ``jax.monitoring`` listeners
before the entrypoint runs, which a plain ``python PATH`` could not. ``ENTRY`` is
a script path (run as ``__main__``) or ``module:function`` (called with no
arguments, ``sys.argv`` set to ARGS).

The exact warm mode: with ``"steps": N`` in the request, the jitted function
named ``"step_fn"`` (``jax.jit(f)`` with ``f.__name__ == step_fn``) is counted (by the wrapper
the trainer uses too, :mod:`compilecache.frameworks.jax.stepcalls`; the run's manifest records the step
function and the steps, so that a trainer counts the same calls), and once its N-th call has
returned and its result is ready the entrypoint is stopped with :class:`StopWarm` (a
``SystemExit(0)``). Every compile the first N steps needed has then happened, and JAX writes each entry right after
compiling it, before running it — so nothing is lost by stopping; the parent
checks and publishes the staged entries only after this process has exited.

Whole epochs without counting (``"steps": "auto"``, the operator's default for a script): once
the step function's first call has returned (its own compile, minutes on a GPU, is never cut),
the entrypoint runs on until it ends by itself or until ``"budget"`` seconds have passed since,
then stops at the next step-call boundary as above. Whatever the script compiles in that window
(an epoch-end evaluation, a metrics gather every k steps) is cached without anyone counting calls.
Verify reruns it with ``"until_requests"`` (the warm-up's compile requests) and ``"max_calls"``
(the warm-up's calls, when the budget stopped it): it stops at the first boundary at which it
has asked for everything the warm-up compiled, not after a second full budget. The decision is
the pure :func:`stop_reason`.

No silent success: with ``"steps"`` the run fails (exit 2, one line in the result's
``"error"``) when the entrypoint ends before the N-th call (how many of N happened), or when
the step function is not called within ``"step_deadline"`` seconds of the start (naming it and
the functions that were jitted instead; the process is ended at the deadline, so a wrong
``--step-fn`` never runs the whole training). Any run in which no compile reached the cache
fails too: it has nothing to publish.

Side effects stay here: the parent (:func:`run_entrypoint`) starts each run in a fresh scratch
working directory under ``$TMPDIR``, removed afterwards, with ``COMPILECACHE_WARMUP=1`` in its
environment; the caller's working directory stays importable. A resumed run (made when the first
run left something a restart would read) is the one exception: it runs in its first run's
directory, on purpose (:mod:`compilecache.frameworks.jax.resume`).

One process of a multi-host warm-up (``"processes": N`` in the request): the entrypoint joins
its group itself (``jax.distributed.initialize`` from the environment the warmer gives it:
:func:`compilecache.frameworks.jax.multihost.script_env`); this wrapper makes every process write its
own entries, and fails the run if the entrypoint never joined a group of N.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compilecache.frameworks.jax.resume import RESUMED_SUFFIX, ResumePlan
from compilecache.frameworks.jax.stepcalls import CountingJitted, patch_jit
from compilecache.jobtools.entrypoint import AUTO, StopWarm, in_scratch, is_path, run_guarded, set_import_path

# Seconds from the entrypoint's start within which the step function must first be called. Long
# enough for data loading, initialisation and a checkpoint restore before the first step (the
# step's own compile runs inside its call and is not counted); a wrong --step-fn costs this much.
DEFAULT_STEP_DEADLINE = 600.0
# A wrong step name must not run a whole training: once another jitted function has been called this
# many times while no function of the step's name was ever jitted, the loop is running without it.
STEP_PATIENCE_ENV = "COMPILECACHE_STEP_PATIENCE"
DEFAULT_STEP_PATIENCE = 20
# This module, as its parent starts it in a child (run_entrypoint).
CHILD = "compilecache.frameworks.jax.scriptrun"
# A request's keys that bound an auto-mode run (StopRule.from_request).
AUTO_LIMITS = ("budget", "max_calls", "until_requests")


@dataclass(frozen=True)
class StopRule:
    """When a warm-up's run of the entrypoint stops, at a step-call boundary.

    ``steps``: after this many calls (the exact count, ``--steps N``); ``budget``: once this many
    seconds have passed since the first call returned; ``max_calls``: never after more calls than
    this; ``until_requests``: once the run has asked the cache for this many compiles. Unset
    fields never stop it; with none set the entrypoint runs to its end.
    """

    steps: int | None = None
    budget: float | None = None
    max_calls: int | None = None
    until_requests: int | None = None

    @classmethod
    def from_request(cls, request: Mapping[str, Any]) -> StopRule | None:
        """The rule of a scriptrun request; ``None`` when it counts no steps at all."""
        steps = request.get("steps")
        if not steps:
            return None
        if steps == AUTO:

            def number(key: str, kind: Callable[[Any], Any]) -> Any:
                return None if request.get(key) is None else kind(request[key])

            return cls(
                budget=number("budget", float),
                max_calls=number("max_calls", int),
                until_requests=number("until_requests", int),
            )
        return cls(steps=int(steps))

    @property
    def auto(self) -> bool:
        """Whole epochs: the entrypoint may end by itself after its first step."""
        return self.steps is None


def stop_reason(rule: StopRule, calls: int, since_first: float, requests: int) -> str | None:
    """Why the run stops after its ``calls``-th step call, or ``None`` to go on.

    ``since_first``: seconds since the first call returned; ``requests``: compiles asked so far.
    """
    if rule.steps is not None and calls >= rule.steps:
        return "steps"
    if rule.until_requests is not None and requests >= rule.until_requests:
        return "requests"
    if rule.max_calls is not None and calls >= rule.max_calls:
        return "calls"
    if rule.budget is not None and since_first >= rule.budget:
        return "budget"
    return None


class StepCounter:
    """Counts calls of jitted functions named ``step_fn``; stops the process by its :class:`StopRule`."""

    def __init__(
        self, rule: StopRule, step_fn: str, requests: Callable[[], int] = lambda: 0, requested: Any = None
    ) -> None:
        self.rule, self.step_fn, self.calls, self.wrapped = rule, step_fn, 0, 0
        self.requested = requested  # the `steps` the request spelled (N or "auto"), for messages
        self.requests = requests  # compile requests so far (the run's cache events)
        self.started = 0  # calls entered: the deadline is for the first call to begin
        self.first_done: float | None = None  # when the first call's result was ready
        self.stopped: str | None = None  # stop_reason's answer, once it stopped the run
        self.seen: list[str] = []  # names of every function given to jax.jit, first seen first
        self.patience = _patience(os.environ)  # 0: wait for the deadline only
        self.other_calls: dict[str, int] = {}  # calls of other jitted functions while the step is unknown
        self.abandoned: str | None = None  # the function whose calls showed the loop runs without the step

    def install(self) -> None:
        """Wrap ``jax.jit`` so that jitting ``step_fn`` returns a counting function."""
        counter = self

        def choose(_: Any, name: str | None, jitted: Any) -> Any:
            if (name or "<unnamed>") not in counter.seen:
                counter.seen.append(name or "<unnamed>")
            if name != counter.step_fn:
                if counter.wrapped or not counter.patience:
                    return jitted
                return CountingJitted(jitted, after=functools.partial(counter.other_call, name or "<unnamed>"))
            counter.wrapped += 1
            return CountingJitted(jitted, before=counter.before_call, after=counter.after_call)

        # Patched before the entrypoint imports anything, so both `jax.jit(...)` and
        # `from jax import jit` in its code get the counting one.
        patch_jit(choose)

    def stepped(self) -> dict[str, Any]:
        """What the result reports of the step counting (read by :func:`step_failure`)."""
        return {
            "steps": self.rule.steps if self.requested is None else self.requested,
            "step_fn": self.step_fn,
            "ran": self.calls,
            "jitted": self.wrapped,
            "seen": list(self.seen),
            "stopped": self.stopped,  # None: the entrypoint ended by itself
            "abandoned": [self.abandoned, self.other_calls.get(self.abandoned, 0)] if self.abandoned else None,
            "seconds": None if self.first_done is None else round(time.monotonic() - self.first_done, 3),
        }

    def before_call(self, _: Any = None) -> None:
        self.started += 1

    def other_call(self, name: str, _: Any) -> None:
        """Another jitted function ran; stop the entrypoint if its loop plainly runs without the step."""
        if self.wrapped:  # the step was jitted meanwhile: it will be called
            return
        self.other_calls[name] = self.other_calls.get(name, 0) + 1
        if self.other_calls[name] >= self.patience:
            self.abandoned = name
            raise StopWarm("abandoned", self.step_fn)

    def after_call(self, result: Any) -> None:
        """One step ran; when the rule says so, wait for its result and stop the entrypoint."""
        import jax

        self.calls += 1
        if self.first_done is None:
            # The budget counts from a finished first step: its compile and first run are never cut.
            jax.block_until_ready(result)
            self.first_done = time.monotonic()
        reason = stop_reason(self.rule, self.calls, time.monotonic() - self.first_done, self.requests())
        if reason is not None:
            jax.block_until_ready(result)
            self.stopped = reason
            raise StopWarm(reason, self.step_fn)


def main(argv: Sequence[str]) -> int:
    """Child entry point."""
    from compilecache.frameworks.jax import compilehook
    from compilecache.frameworks.jax.compiler import CacheEvents, TargetRun, environment_facts, run_to_dict
    from compilecache.frameworks.jax.keydiff import signature_of_computation
    from compilecache.frameworks.jax.progress import script_progress
    from compilecache.jobtools.childproc import write_result

    request: dict[str, Any] = json.loads(Path(argv[0]).read_text())
    result_path, entry, entry_args = argv[1], argv[2], list(argv[3:])
    shown = str(request.get("shown") or entry)  # the entrypoint as the user spelled it
    run = TargetRun(workload=f"script:{shown}", name=Path(shown).name if is_path(shown) else shown)
    rule = StopRule.from_request(request)
    counter = (
        StepCounter(rule, str(request.get("step_fn") or "train_step"), lambda: run.requests, request.get("steps"))
        if rule is not None
        else None
    )
    if counter is not None:  # recorded in the manifest: the trainer counts the same function's calls
        run.step_fn, run.steps = counter.step_fn, request.get("steps")
    if request.get("resumed"):  # the second run of a pair: its own target, matched by verify's second run
        run.name += RESUMED_SUFFIX
    sys.argv = [entry, *entry_args]
    set_import_path(entry, request.get("origin"))
    processes = int(request.get("processes") or 1)
    if processes > 1:
        from compilecache.cache.errors import WarmError
        from compilecache.frameworks.jax.multihost import install_own_key_writer

        try:
            # Before the entrypoint compiles anything: JAX alone writes process 0's entries only.
            install_own_key_writer()
        except WarmError as refused:
            write_result(result_path, {"error": str(refused), "code": 2})
            return 2
    start = time.perf_counter()
    watch: threading.Timer | None = None
    if counter is not None:
        counter.install()
        deadline = float(request.get("step_deadline") or DEFAULT_STEP_DEADLINE)

        def expired() -> None:
            # The main thread may be inside XLA or a data loader for long: report and end from here.
            # Nothing is lost: the parent publishes nothing from a failed run.
            run.compile_seconds = time.perf_counter() - start
            stepped = counter.stepped()
            failure = step_failure(stepped, deadline=deadline)
            # The parent prints the reason; it reads it from the result.
            write_result(result_path, {"runs": [run_to_dict(run)], "error": failure, "code": 2, "stepped": stepped})
            sys.stdout.flush()
            os._exit(2)

        watch = _watch_first_call(counter, deadline, expired)

    used: dict[str, Any] = {}  # the key settings read at the first compile

    def record(computation: Any) -> None:
        # Every program the entrypoint compiles, by module name: the trainer names a miss against it.
        with contextlib.suppress(Exception):  # private JAX fields may move: explaining never fails a warm-up
            run.add_signature(*signature_of_computation(computation))
        if not used:
            # JAX hashes os.environ's XLA_FLAGS into each key when it computes it (jax/_src/cache_key.py
            # _hash_xla_flags), so what a script set itself is read here, right after that compile in
            # the same thread: the script may restore its environment before the run ends.
            with contextlib.suppress(Exception):
                used.update(environment_facts())

    compilehook.install(record)
    with CacheEvents() as events, events.attribute_to(run), script_progress(shown, run):
        code, error, stop = run_guarded(entry, shown)
        # A wrong step name (abandoned) fails now, not after the whole training.
        stopped = stop is not None and stop.reason != "abandoned"
    if watch is not None:
        watch.cancel()  # the entrypoint is over: its own outcome is the result
    run.compile_seconds = time.perf_counter() - start
    stepped = counter.stepped() if counter is not None else None
    # A resumed run that ends early is what a restart near the end of training does: it ran what
    # remained (maybe nothing). Only a first run must reach its N-th step and compile something.
    first_run = not request.get("resumed")
    if (
        code == 0
        and not stopped
        and stepped is not None
        and first_run
        and (rule is None or not rule.auto or not stepped["ran"])
    ):
        # The entrypoint ended (returned or exited 0) before its N-th step: not what training runs.
        # Whole epochs (auto) may end by themselves, but only after the step ran at least once.
        error, code = step_failure(stepped), 2
    if code == 0 and run.requests == 0 and first_run:
        error, code = f"script {shown} ended without compiling anything through the cache: nothing to publish", 2
    if processes > 1 and code == 0:
        from compilecache.frameworks.jax.multihost import joined_processes, single_process_message

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
        facts = used or environment_facts()
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


def _watch_first_call(counter: StepCounter, deadline: float, expired: Callable[[], None]) -> threading.Timer:
    """Call ``expired`` from a daemon thread if the step function has not been entered by ``deadline``."""

    def check() -> None:
        if counter.started == 0:
            expired()

    timer = threading.Timer(deadline, check)
    timer.daemon = True  # a run that stopped at its N-th step exits without waiting for it
    timer.start()
    return timer


def _patience(environ: Mapping[str, str]) -> int:
    """``COMPILECACHE_STEP_PATIENCE``: calls of another jitted function before a wrong step name fails (0: never)."""
    try:
        return max(0, int(environ.get(STEP_PATIENCE_ENV, DEFAULT_STEP_PATIENCE)))
    except ValueError:
        return DEFAULT_STEP_PATIENCE


def step_failure(stepped: Mapping[str, Any], deadline: float | None = None) -> str:
    """The one-line reason an exact-mode run did not reach its N-th step (for the pool's status).

    ``deadline``: the run was ended because the step function had not been called by then.
    """
    steps, step_fn, ran = stepped["steps"], stepped["step_fn"], stepped["ran"]
    others = [name for name in stepped.get("seen") or [] if name != step_fn]
    listed = ", ".join(others[:12]) + (f" (+{len(others) - 12} more)" if len(others) > 12 else "")
    seen = f"jitted functions seen: {listed}" if others else "no other jax.jit was seen"
    if stepped.get("abandoned"):
        name, calls = stepped["abandoned"]
        return (
            f"--steps {steps}: no function named {step_fn!r} was jitted, while {name!r} was already called "
            f"{calls} times: the training loop runs without it; {seen}; name the step with --step-fn (stepFn)"
        )
    if deadline is not None:
        return (
            f"--steps {steps}: the step function {step_fn!r} was not called within {deadline:g}s of the start "
            f"(--step-deadline); {seen}; name the step with --step-fn (stepFn)"
        )
    if ran == 0:
        jitted = "was jitted but never called" if stepped["jitted"] else "was never called"
        why = (
            "the script ended before its training loop (a missing data file?)"
            if stepped["jitted"]
            else "the script ended before its training loop (a missing data file?) or its step has another "
            "name (--step-fn, stepFn)"
        )
        return f"--steps {steps}: the entrypoint ended and the step function {step_fn!r} {jitted}; {seen}; {why}"
    return (
        f"--steps {steps}: the entrypoint ended after {ran} of {steps} calls of {step_fn!r}: "
        "training would compile what it never reached (is its data or a file it needs missing?)"
    )


def run_entrypoint(
    request: Mapping[str, Any],
    env: Mapping[str, str],
    entry: str,
    entry_args: Sequence[str],
    timeout: float | None = None,
    resume: ResumePlan | None = None,
) -> tuple[int, dict[str, Any], str]:
    """Run the entrypoint in a child (:func:`main`) in a fresh scratch working directory
    (:func:`compilecache.jobtools.entrypoint.in_scratch`).

    With a ``resume`` plan a successful first run may be followed by a resumed one in the same
    directory (:mod:`compilecache.frameworks.jax.resume`), with its arguments added: always, or when
    the first run left something a restart would read. The result says which: ``"resumed_because"``
    (what it found) or ``"resume_skipped"`` (the line to print), and ``"seconds"``: the wall time of
    each run made (``first``, ``resumed``), child start-up included, as the pod spends it.
    """
    from compilecache.frameworks.jax.resume import merge_results, restart_material, skipped_line
    from compilecache.jobtools.childproc import run_child

    with in_scratch(entry, env, request) as launch:
        argv = [launch.target, *entry_args]
        started = time.monotonic()
        first = run_child(CHILD, launch.request, launch.env, argv, timeout=timeout, cwd=launch.cwd)
        seconds = {"first": time.monotonic() - started}
        first[1]["seconds"] = seconds
        if resume is None or first[0] != 0 or first[1].get("write_errors"):  # nothing to add to a failure
            return first
        found = "--resume" if resume.always else restart_material(launch.cwd, resume.when)
        if found is None:
            first[1]["resume_skipped"] = skipped_line(str(launch.request["shown"]), resume.when)
            return first
        # The same directory: the checkpoint the first run wrote at a relative path is restored.
        again = {**launch.request, "resumed": True}
        if again.get("steps") == AUTO:
            # What a restart compiles differently is its first step on the restored state; what comes
            # later (an epoch's evaluation) the first run compiled already: no second budget.
            again = {key: value for key, value in again.items() if key not in AUTO_LIMITS} | {"steps": 1}
        argv = [*argv, *resume.args]
        started = time.monotonic()
        second = run_child(CHILD, again, launch.env, argv, timeout=timeout, cwd=launch.cwd)
        code, merged, stderr = merge_results(first, second)
        merged["seconds"] = {**seconds, "resumed": time.monotonic() - started}
        merged["resumed_because"] = found
        return code, merged, stderr


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
