"""Run a toy training script for its first steps, counting its lookups: the warm-up's child process.

``python -m toyframework.run REQUEST.json RESULT.json SCRIPT [ARGS...]``, started by the shared
:func:`compilecache.jobtools.entrypoint.run_in_scratch` (fresh scratch working directory, a
timeout, ``COMPILECACHE_WARMUP=1``) with ``TOY_CACHE_DIR`` set by :mod:`.cache`. With
``"steps": N`` the script is stopped after its N-th :func:`~toyframework.runtime.step` by the
shared :class:`~compilecache.jobtools.entrypoint.StopWarm`; it fails (exit 2) when it ended
before, or asked for no program at all (nothing to publish).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compilecache.jobtools.childproc import write_result
from compilecache.jobtools.entrypoint import StopWarm, run_guarded
from toyframework import runtime


def main(argv: Sequence[str]) -> int:
    request: dict[str, Any] = json.loads(Path(argv[0]).read_text())
    result_path, script, script_args = argv[1], argv[2], list(argv[3:])
    shown = str(request.get("shown") or script)
    steps = request.get("steps")
    ran = 0

    def stop_at_steps() -> None:
        nonlocal ran
        ran += 1
        if isinstance(steps, int) and ran >= steps:
            raise StopWarm("steps", "toyframework.runtime.step")

    runtime.on_step = stop_at_steps
    sys.argv = [script, *script_args]
    code, error, stop = run_guarded(script, shown)
    if code == 0 and isinstance(steps, int) and stop is None:
        code, error = 2, f"--steps {steps}: the script {shown} ended after {ran} of {steps} steps"
    if code == 0 and runtime.requests == 0:
        code, error = 2, f"script {shown} asked for no toy program: nothing to publish"
    counts = {"requests": runtime.requests, "hits": runtime.hits, "misses": runtime.requests - runtime.hits}
    stepped = {
        "steps": steps,
        "step_fn": "toyframework.runtime.step",
        "ran": ran,
        "stopped": None if stop is None else "steps",
    }
    write_result(result_path, {"error": error, "code": code, "counts": counts, "stepped": stepped})
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
