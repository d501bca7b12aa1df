"""The resumed run of an exact-mode warm-up: what a restarted training process compiles.

A restart restores its state from a checkpoint, and a restored state is typed differently from a
fresh one: Flax's ``TrainState.step`` is the Python int 0 when created (traced weak-typed) but a
numpy ``int32`` when restored (strong-typed). Where the step meets other dtypes the program differs,
so a warm-up that only ever starts fresh never compiles what every requeued job asks for (issue 20:
Flax lm1b's ``train_step`` recompiled, 27.6 s instead of 6 s).

So ``compilecache warm --script`` (:func:`compilecache.frameworks.jax.scriptrun.run_entrypoint`) may run
the entrypoint twice in one scratch working directory: the first run writes its checkpoint at a relative
path as training does, the second finds and restores it, again for N step calls. A resumed run is worth
its start-up (on a GPU, seconds of its first step at least) only when the first run left something a
restart would read, so by default it runs only when (:func:`restart_material`) the first run wrote a file
in its working directory (a fresh scratch directory: whatever is there, the script wrote), or left the
path the user named (``--resume-when PATH``, a workload's ``resumeWhen``: a checkpoint kept outside the
working directory). Otherwise it is skipped with one line saying why (:func:`skipped_line`).
``--resume`` (``resume: true``) runs it whatever the first run left; ``--no-resume`` (``resume: false``)
never. A script that restores only when asked gets its restart arguments added to the second run
(``--resume-arg``). Both runs' compiles are staged and published together, and verify repeats the runs
that happened, in its own fresh directory, so a missed restart fails the warm-up instead of reaching
training. The resumed run may end before its N-th step (a script whose total is near N restores close
to its end and trains what remains): that is what its restart does, so it is no failure; the first run
is held to N steps.

Pure helpers here (tested without JAX); the runs themselves are :mod:`scriptrun`'s.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The second run's target name: ``train.py (resumed)``. Verify's second run has the same name, so
# each run is checked against its own warm-up counterpart (compilecache.frameworks.jax.verify.miss_messages).
RESUMED_SUFFIX = " (resumed)"
# The environment a CompileCache workload can set instead of the flags (as COMPILECACHE_WARM_STEPS).
ENV_RESUME = "COMPILECACHE_WARM_RESUME"
ENV_RESUME_ARGS = "COMPILECACHE_RESUME_ARGS"
ENV_RESUME_WHEN = "COMPILECACHE_RESUME_WHEN"
_FALSE = ("0", "false", "no", "off")
_TRUE = ("1", "true", "yes", "on")
# Entries of the working directory looked at before deciding that the first run wrote no file in it: a
# script that writes thousands of directories and no file is rare, and the run then happens anyway.
WALK_LIMIT = 10000

Outcome = tuple[int, dict[str, Any], str]


@dataclass(frozen=True)
class ResumePlan:
    """The resumed run a warm-up may make: the arguments it adds, and when it happens.

    ``always``: whatever the first run left (``--resume``, and verify's repeat of a resumed run that
    happened); else only when :func:`restart_material` finds something. ``when``: the path a restart
    reads, relative to the working directory or absolute (``--resume-when``).
    """

    args: tuple[str, ...] = ()
    when: str | None = None
    always: bool = False


def resume_plan(
    enabled: bool | None, extra: Sequence[str], when: str | None, env: Mapping[str, str]
) -> ResumePlan | None:
    """The resumed run's plan, or None when there is none.

    Flags win over the environment: ``enabled`` is ``--resume``/``--no-resume`` (None: not given,
    then ``$COMPILECACHE_WARM_RESUME``; unset: when the first run left something); ``extra`` is
    ``--resume-arg`` (none given: ``$COMPILECACHE_RESUME_ARGS``, split as a shell would, never run by
    one); ``when`` is ``--resume-when`` (else ``$COMPILECACHE_RESUME_WHEN``).
    """
    if enabled is None:
        setting = env.get(ENV_RESUME, "").strip().lower()
        if setting in _FALSE:
            return None
        enabled = True if setting in _TRUE else None
    if enabled is False:
        return None
    args = list(extra) if extra else shlex.split(env.get(ENV_RESUME_ARGS, ""))
    return ResumePlan(args=tuple(args), when=when or env.get(ENV_RESUME_WHEN) or None, always=enabled is True)


def restart_material(workdir: str, when: str | None) -> str | None:
    """What the first run left that a restart would read (``it left ckpt/state in its working
    directory``, for the log); None: nothing.

    The path the user named (``when``, relative to ``workdir``), else the first file (anything not a
    directory) found under ``workdir``: the warmer made it empty for this script, so the script
    wrote it. Symbolic links are not followed into (a link is itself something the script wrote).
    """
    if when is not None and os.path.lexists(Path(workdir, when)):
        return f"it left {when} (--resume-when)"
    seen = 0
    for folder, folders, files in os.walk(workdir):
        if files:
            return f"it left {Path(folder, sorted(files)[0]).relative_to(workdir)} in its working directory"
        # os.walk lists a link to a directory among the folders (and does not enter it): count it.
        links = sorted(name for name in folders if os.path.islink(os.path.join(folder, name)))
        if links:
            return f"it left {Path(folder, links[0]).relative_to(workdir)} in its working directory"
        seen += len(folders)
        if seen > WALK_LIMIT:
            return f"it left more than {WALK_LIMIT} directories in its working directory"
        folders.sort()
    return None


def skipped_line(script: str, when: str | None) -> str:
    """The one line a skipped resumed run prints: why, and how to have it."""
    left = f" and left no {when}" if when is not None else ""
    return (
        f"skipped the resumed run: {script} wrote nothing in its working directory{left} that a restart would "
        "read (name the checkpoint a restart restores with resumeWhen / --resume-when, or always run it "
        "with resume: true / --resume)"
    )


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


def describe(plan: ResumePlan | None) -> str:
    """``resumed run`` / ``resumed run with --restore``: for the warm's printed lines."""
    if plan is None:
        return "no resumed run (--no-resume)"
    return "resumed run" + (f" with {shlex.join(plan.args)}" if plan.args else "")
