"""Run a PyTorch training entrypoint in this process for its first optimizer steps, counting its cache lookups.

``python -m compilecache.frameworks.pytorch.run REQUEST.json RESULT.json ENTRY [ARGS...]``, started by
:func:`compilecache.jobtools.entrypoint.run_in_scratch` (fresh scratch working directory,
``COMPILECACHE_WARMUP=1``) with ``TORCHINDUCTOR_CACHE_DIR`` already set by the parent
(:mod:`compilecache.frameworks.pytorch.warm`): the warm-up's staging folder, or verify's copy of it.

A *step* is one optimizer step, counted with ``torch.optim.optimizer.register_optimizer_step_post_hook``
(public, global: every optimizer the script makes): Inductor saves a graph's backward entries only
once backward has run, so a warm-up stops after a whole step, never inside one. After the N-th
step the hook raises :class:`~compilecache.jobtools.entrypoint.StopWarm` (a ``SystemExit(0)``), as
the JAX exact mode does after its N-th step call; Inductor has written each entry before that
step returned. ``"steps": "auto"`` stops at the first step boundary ``"budget"`` seconds after the
first step. No silent success: the run fails (exit 2, one line in ``"error"``) when the entrypoint
ends before its N-th step, or when no FX graph or AOTAutograd lookup happened (nothing compiled).

The result holds torch's own counters (:func:`compilecache.frameworks.pytorch.cache.graph_counts`), the
key settings this process compiled under (:func:`compilecache.frameworks.pytorch.cache.current_facts`,
read after the steps: a script that sets its thread count has set it), and how the run ended.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compilecache.jobtools.entrypoint import AUTO, StopWarm, run_guarded, set_import_path


class StepHook:
    """Counts optimizer steps; stops the entrypoint at the N-th, or at the budget's end (auto)."""

    def __init__(self, steps: int | str | None, budget: float | None) -> None:
        self.steps = steps
        self.budget = budget
        self.ran = 0
        self.first_done: float | None = None
        self.stopped: str | None = None
        self.first_step_seconds: float | None = None
        self._start = time.perf_counter()

    def __call__(self, *_: Any) -> None:
        self.ran += 1
        now = time.perf_counter()
        if self.first_done is None:
            self.first_done = now
            self.first_step_seconds = now - self._start
        if isinstance(self.steps, int) and self.ran >= self.steps:
            self.stopped = "steps"
            raise StopWarm("steps", "optimizer.step")
        if self.steps == AUTO and self.budget is not None and now - self.first_done >= self.budget:
            self.stopped = "budget"
            raise StopWarm("budget", "optimizer.step")

    def stepped(self) -> dict[str, Any]:
        """The record warm.py's ``stepped`` has for JAX: how far the script ran, and why it stopped."""
        return {"steps": self.steps, "step_fn": "optimizer.step", "ran": self.ran, "stopped": self.stopped}


def main(argv: Sequence[str]) -> int:
    """Child entry point."""
    from compilecache.jobtools.childproc import write_result

    request: dict[str, Any] = json.loads(Path(argv[0]).read_text())
    result_path, entry, entry_args = argv[1], argv[2], list(argv[3:])
    shown = str(request.get("shown") or entry)
    sys.argv = [entry, *entry_args]
    set_import_path(entry, request.get("origin"))
    from torch._dynamo.utils import counters
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from compilecache.frameworks.pytorch.cache import current_facts, graph_counts

    steps = request.get("steps") or 1
    hook = StepHook(steps if steps == AUTO else int(steps), request.get("budget"))
    handle = register_optimizer_step_post_hook(hook)
    start = time.perf_counter()
    try:
        code, error, _ = run_guarded(entry, shown)
    finally:
        handle.remove()
    seconds = time.perf_counter() - start
    counts = graph_counts({key: dict(value) for key, value in counters.items()})
    if code == 0 and hook.stopped is None and (hook.steps != AUTO or hook.ran == 0):
        error, code = _step_failure(shown, hook), 2
    if code == 0 and counts["requests"] == 0:
        error, code = (
            (
                f"script {shown} ran {hook.ran} optimizer steps without any torch.compile graph reaching the cache "
                "(no FX graph or AOTAutograd lookup): nothing to publish; is the model wrapped in torch.compile?"
            ),
            2,
        )
    write_result(
        result_path,
        {
            "error": error,
            "code": code,
            "counts": counts,
            "facts": current_facts(),
            "stepped": hook.stepped(),
            "seconds": round(seconds, 3),
            "first_step_seconds": hook.first_step_seconds,
        },
    )
    return code


def _step_failure(shown: str, hook: StepHook) -> str:
    if hook.ran == 0:
        return (
            f"--steps {hook.steps}: the entrypoint {shown} ended before its first optimizer step: training would "
            "compile what the warm-up never reached (a missing data file? an argument?)"
        )
    return (
        f"--steps {hook.steps}: the entrypoint {shown} ended after {hook.ran} of {hook.steps} optimizer steps: "
        "training would compile what it never reached"
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
