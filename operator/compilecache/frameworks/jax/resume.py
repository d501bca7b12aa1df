"""The resumed run of an exact-mode warm-up: what a restarted training process compiles.

A restart restores its state from a checkpoint, and a restored state is typed differently from a
fresh one: Flax's ``TrainState.step`` is the Python int 0 when created (traced weak-typed) but a
numpy ``int32`` when restored (strong-typed). Where the step meets other dtypes the program differs,
so a warm-up that only ever starts fresh never compiles what every requeued job asks for (issue 20:
Flax lm1b's ``train_step`` recompiled, 27.6 s instead of 6 s).

So ``compilecache warm --script`` (:func:`compilecache.frameworks.jax.scriptrun.run_entrypoint`) runs the
entrypoint twice in one scratch working directory: the first run writes its checkpoint at a relative
path as training does, the second finds and restores it, again for N step calls (``--resume``, the
default; ``--no-resume`` for a script that never restores). A script that restores only when asked
gets its restart arguments added to the second run (``--resume-arg``). Both runs' compiles are
staged and published together, and verify repeats the pair in its own fresh directory, so a missed
restart fails the warm-up instead of reaching training. The resumed run may end before its N-th
step (a script whose total is near N restores close to its end and trains what remains): that is
what its restart does, so it is no failure; the first run is held to N steps.

Pure helpers here (tested without JAX); the runs themselves are :mod:`scriptrun`'s.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

# The second run's target name: ``train.py (resumed)``. Verify's second run has the same name, so
# each run is checked against its own warm-up counterpart (compilecache.frameworks.jax.verify.miss_messages).
RESUMED_SUFFIX = " (resumed)"
# The environment a CompileCache workload can set instead of the flags (as COMPILECACHE_WARM_STEPS).
ENV_RESUME = "COMPILECACHE_WARM_RESUME"
ENV_RESUME_ARGS = "COMPILECACHE_RESUME_ARGS"
_FALSE = ("0", "false", "no", "off")

Outcome = tuple[int, dict[str, Any], str]


def resume_args(enabled: bool | None, extra: Sequence[str], env: Mapping[str, str]) -> list[str] | None:
    """The arguments the resumed run adds, or None when there is no resumed run.

    Flags win over the environment: ``enabled`` is ``--resume``/``--no-resume`` (None: not given,
    then ``$COMPILECACHE_WARM_RESUME``, default on); ``extra`` is ``--resume-arg`` (none given:
    ``$COMPILECACHE_RESUME_ARGS``, split as a shell would, never run by one).
    """
    if enabled is None:
        enabled = env.get(ENV_RESUME, "").strip().lower() not in _FALSE
    if not enabled:
        return None
    return list(extra) if extra else shlex.split(env.get(ENV_RESUME_ARGS, ""))


def merge_results(first: Outcome, second: Outcome) -> Outcome:
    """One outcome of the pair of runs: both runs' targets, or the resumed run's failure named as such."""
    code, result, stderr = second
    if code != 0 or "runs" not in result:
        reason = result.get("error") or f"exited with status {code}"
        failed = {**result, "error": f"the resumed run (again in the first run's working directory): {reason}"}
        return code or 2, failed, stderr
    _, before, _ = first
    merged = {
        **before,
        "runs": [*before.get("runs", []), *result["runs"]],
        "write_errors": [*(before.get("write_errors") or []), *(result.get("write_errors") or [])],
        "resumed_stepped": result.get("stepped"),
    }
    return 0, merged, stderr


def describe(args: Sequence[str] | None) -> str:
    """``resumed run`` / ``resumed run with --restore``: for the warm's printed lines."""
    if args is None:
        return "no resumed run (--no-resume)"
    return "resumed run" + (f" with {shlex.join(args)}" if args else "")
