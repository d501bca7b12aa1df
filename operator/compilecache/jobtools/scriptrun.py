"""Run a user's script as ``__main__`` in this process, counting its cache activity.

``python -m compilecache.jobtools.scriptrun REQUEST.json RESULT.json PATH [ARGS...]``:
the parent (``compilecache warm --script``) has already put the cache settings
in the environment; this wrapper only adds the ``jax.monitoring`` listeners
before the script runs, which a plain ``python PATH`` could not.
"""

from __future__ import annotations

import runpy
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str]) -> int:
    """Child entry point."""
    from compilecache.jobtools.childproc import run_to_dict, write_result
    from compilecache.jobtools.compiler import CacheEvents, TargetRun, one_line

    result_path, script, script_args = argv[1], argv[2], list(argv[3:])
    run = TargetRun(workload=f"script:{script}", name=Path(script).name)
    code = 0
    error = None
    sys.argv = [script, *script_args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    start = time.perf_counter()
    with CacheEvents() as events, events.attribute_to(run):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
            if code:
                error = f"script {script} exited with status {code}"
        except BaseException as raised:
            traceback.print_exc()
            code, error = 1, f"script {script} raised {one_line(raised)}"
    run.compile_seconds = time.perf_counter() - start
    facts = None
    if "jax" in sys.modules:
        from compilecache.jobtools.compiler import environment_facts

        facts = environment_facts()
    write_result(result_path, {"runs": [run_to_dict(run)], "error": error, "code": code, "facts": facts})
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
