"""``compilecache warm``: the command every framework's warm-up runs behind, and what they share.

Runs inside every warm-up Job (and by hand). This module owns the command line (every
framework's flags, ``--framework`` choosing among :func:`compilecache.frameworks.names`), the
one-line errors, the ``--report`` JSON and the termination summary the operator reads into
``status.pools[]``; the run itself is the framework's ``warm``
(:mod:`compilecache.frameworks.jax.warm`, :mod:`compilecache.frameworks.pytorch.warm`). What
those share lives here too: the leftovers of killed runs (:func:`delete_leftovers`), ``--steps``
from the environment (:func:`steps_from_env`) and the script's arguments.

Exit codes: 0 ok, 1 crash (a bug: traceback), 2 bad input or environment (a full disk included),
3 verify found a miss, 4 an unsound entry (nothing published), 130 interrupted
(:mod:`compilecache.cli.errors`). Progress lines go to stdout (:mod:`compilecache.frameworks.jax.progress`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from compilecache import frameworks
from compilecache.cache.cacheenv import REPORT
from compilecache.cache.errors import STORAGE_FULL, WarmError, storage_error
from compilecache.cache.manifests import summary_fields
from compilecache.cli.errors import number, whole_number
from compilecache.jobtools.entrypoint import AUTO, DEFAULT_BUDGET

if TYPE_CHECKING:
    from compilecache.cache.store import CacheStore, Listing


class GroupMember(Protocol):
    """A process of a multi-process warm-up (JAX's ``multihost.Group``): which one, of how many."""

    @property
    def process_id(self) -> int: ...

    @property
    def processes(self) -> int: ...


# Options the Job's environment may already carry (set by the operator from the framework's
# warmup_env); command-line flags win, our defaults apply when neither is set.
ENV_MIN_TIME = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
ENV_MIN_SIZE = "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"
# The exact mode from the environment: a CompileCache workload's `env` reaches the
# warm-up container, so a `script` workload can ask for it without new flags.
ENV_STEPS = "COMPILECACHE_WARM_STEPS"
ENV_STEP_FN = "COMPILECACHE_STEP_FN"
ENV_STEP_DEADLINE = "COMPILECACHE_STEP_DEADLINE"
ENV_BUDGET = "COMPILECACHE_WARM_BUDGET"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``compilecache warm``."""
    parser.add_argument(
        "--cache-dir",
        required=True,
        help="cache location: a local path (made if missing; its parent must exist) or gs://bucket/prefix",
    )
    parser.add_argument(
        "--framework",
        choices=frameworks.names(),
        default=frameworks.DEFAULT,
        help="whose cache: jax (default): JAX's persistent cache; pytorch: torch.compile's Inductor caches, "
        "warmed by running --script for --steps optimizer steps (compilecache.frameworks)",
    )
    parser.add_argument(
        "--workload",
        action="append",
        default=[],
        metavar="MODULE:FUNC",
        help="function returning compilecache.Target objects (repeatable)",
    )
    parser.add_argument(
        "--script",
        metavar="PATH|MODULE:FUNC",
        help="run the training entrypoint (a script, or a function called with no arguments) under the cache env",
    )
    parser.add_argument(
        "--steps",
        type=_steps_value,
        default=None,
        metavar="N|auto",
        help=f"exact mode: stop --script after N calls of its jitted step function; auto: run whole epochs, "
        f"stopping at a step boundary once --budget seconds passed after the first step (default: ${ENV_STEPS})",
    )
    parser.add_argument(
        "--budget",
        type=number,
        default=None,
        metavar="SECONDS",
        help=f"--steps auto: seconds the script runs on after its first step returned "
        f"(default: ${ENV_BUDGET} or {DEFAULT_BUDGET:g})",
    )
    parser.add_argument(
        "--step-fn",
        default=None,
        metavar="NAME",
        help=f"name of the function training jits as its step (default: ${ENV_STEP_FN} or train_step)",
    )
    parser.add_argument(
        "--step-deadline",
        type=number,
        default=None,
        metavar="SECONDS",
        help=f"exact mode: fail if the step function is not called within SECONDS of the start "
        f"(default: ${ENV_STEP_DEADLINE} or 600)",
    )
    parser.add_argument(
        "--resume",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="exact mode: run the script a second time in the first run's working directory, so that it "
        "restores the checkpoint it wrote and compiles what a restarted training compiles: --resume always, "
        "--no-resume never; by default (or $COMPILECACHE_WARM_RESUME) only when the first run wrote a file in "
        "its working directory or left the --resume-when path",
    )
    parser.add_argument(
        "--resume-when",
        default=None,
        metavar="PATH",
        help="exact mode: the checkpoint a restart reads (relative to the script's working directory, or "
        "absolute): the resumed run happens when the first run left it (default: $COMPILECACHE_RESUME_WHEN)",
    )
    parser.add_argument(
        "--resume-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an argument added to the resumed run only, for a script that restores when asked "
        "(repeatable; write --resume-arg=--restore; default: $COMPILECACHE_RESUME_ARGS)",
    )
    parser.add_argument("--jobs", type=whole_number, default=1, metavar="N", help="targets compiled concurrently")
    parser.add_argument("--report", metavar="FILE.json", help="write the run's report here")
    parser.add_argument(
        "--termination-log",
        metavar="PATH",
        help="also write a compact summary (at most 4 KiB of JSON) here: the warm-up Job passes /dev/termination-log",
    )
    parser.add_argument(
        "--verify",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="check in a fresh process that every target hits the published cache (default: on)",
    )
    parser.add_argument("--min-compile-time-secs", type=number, default=None, help=f"default: ${ENV_MIN_TIME} or 0")
    parser.add_argument(
        "--min-entry-size-bytes", type=whole_number, default=None, help=f"default: ${ENV_MIN_SIZE} or 0"
    )
    parser.add_argument(
        "--num-processes",
        type=whole_number,
        default=None,
        metavar="N",
        help="processes of the multi-host group this warmer is one of (default: $COMPILECACHE_NUM_PROCESSES or 1)",
    )
    parser.add_argument(
        "--process-id",
        type=whole_number,
        default=None,
        metavar="K",
        help="this process's index in the group (default: $COMPILECACHE_PROCESS_ID, else $JOB_COMPLETION_INDEX)",
    )
    parser.add_argument(
        "--coordinator",
        default=None,
        metavar="HOST:PORT",
        help="process 0's address; the group uses PORT..PORT+3 (default: $JAX_COORDINATOR_ADDRESS)",
    )
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="after --: arguments of --script")


def run(args: argparse.Namespace) -> int:
    """Run the warmer; print a one-line error and return non-zero on failure."""
    from compilecache.jobtools.manifest import dumps

    # A warm-up is no trainer, whatever its framework: never its own verdict (a shell that ran
    # `eval "$(compilecache env)"` carries COMPILECACHE_REPORT=1), neither in this process, which may
    # load the framework, nor in the children the framework's warm starts with this environment.
    os.environ[REPORT] = "0"
    try:
        try:
            report = frameworks.get(args.framework).warm(args)
        except OSError as error:
            # A refused write the steps did not wrap (each names its own): still one line, not a bug.
            if error.errno not in STORAGE_FULL:
                raise
            raise storage_error("write", str(error.filename or args.cache_dir), error) from None
    except WarmError as error:
        report_failure(args, error)
        return error.exit_code
    if args.report:
        _write_report(args.report, dumps(report))
    if args.termination_log:
        write_termination_summary(args.termination_log, report)
    return 0


def report_failure(args: argparse.Namespace, error: WarmError) -> None:
    """The one-line error on stderr, and the failed report and termination summary."""
    from compilecache.jobtools.manifest import dumps

    print(f"compilecache warm: error: {error}", file=sys.stderr)
    place = group_fields(getattr(args, "group", None))
    if args.report:
        failure = getattr(error, "report", None) or {"ok": False, "targets": [], "entries": 0, "bytes": 0, **place}
        failure["ok"], failure["error"] = False, str(error)
        _write_report(args.report, dumps(failure))
    if args.termination_log:
        summary = getattr(error, "report", None) or {"targets": [], "entries": 0, "bytes": 0, **place}
        write_termination_summary(args.termination_log, {**summary, "ok": False, "error": str(error)})


def group_fields(group: GroupMember | None) -> dict[str, int]:
    """``{"process": k, "processes": N}`` for a member of a group; nothing for a lone warmer."""
    return {} if group is None else {"process": group.process_id, "processes": group.processes}


def delete_leftovers(store: CacheStore, listing: Listing) -> None:
    """Delete the staging and temporary files killed runs left (expiry's rule, with its default grace)."""
    from compilecache.cache.expiry import Policy, leftovers

    for leftover in leftovers(listing, Policy(), time.time()):
        try:
            store.delete(leftover.name)
        except WarmError as error:  # not this run's to fail on: the next warm or expiry tries again
            print(f"  note: {error}")
        else:
            print(f"  deleted {leftover.name}: {leftover.reason}")


def steps_from_env(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    """``--steps`` and ``--budget`` from the environment where the flags are not given (a script's run)."""
    if args.steps is None and env.get(ENV_STEPS):
        try:
            args.steps = _steps_value(env[ENV_STEPS])
        except argparse.ArgumentTypeError as error:
            raise WarmError(f"{ENV_STEPS} must be a whole number or auto, got {env[ENV_STEPS]!r}") from error
    if args.budget is None and args.steps == AUTO and env.get(ENV_BUDGET):
        try:
            args.budget = float(env[ENV_BUDGET])
        except ValueError as error:
            raise WarmError(f"{ENV_BUDGET} must be a number of seconds, got {env[ENV_BUDGET]!r}") from error


def _steps_value(text: str) -> int | str:
    """``--steps``: a whole number, or ``auto`` (whole epochs within a time budget)."""
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number of steps or {AUTO}, got {text!r} (e.g. --steps 2)"
        ) from None


def script_arguments(args: argparse.Namespace) -> list[str]:
    rest = list(args.script_args or [])
    return rest[1:] if rest[:1] == ["--"] else rest


def _write_report(path: str, data: bytes) -> None:
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(data)
    except OSError as error:
        print(f"compilecache warm: error: cannot write report {path}: {error}", file=sys.stderr)


# --- The termination summary: how a warm-up pod's report reaches the operator (status.pools[]).
TERMINATION_SCHEMA = "compilecache.dev/warm/v1"
TERMINATION_LIMIT = 4096  # bytes of a termination message the kubelet keeps (it cuts the rest)
# The runs a warm-up may make, as the report's and the summary's "runs" name them (seconds of each).
RUNS = ("first", "resumed", "verify")
_ERROR_CHARS = 1000


def termination_summary(report: Mapping[str, Any]) -> str:
    """The report as compact JSON of at most :data:`TERMINATION_LIMIT` bytes, always whole.

    Totals first; per-target detail (name, compile seconds, entries, bytes) is dropped from the
    end until it fits (``targetsOmitted`` counts what went), so the kubelet never cuts the JSON.
    """
    verify = report.get("verify") or None
    targets: list[dict[str, Any]] = [
        {
            "name": str(target.get("name")),
            "seconds": round(float(target.get("compile_seconds") or 0.0), 3),
            "entries": len(target.get("entries_written") or []),
            "bytes": int(target.get("bytes") or 0),
        }
        for target in report.get("targets") or []
    ]
    summary: dict[str, Any] = {
        "schema": TERMINATION_SCHEMA,
        "ok": bool(report.get("ok", True)),
        "entries": int(report.get("entries") or 0),
        "bytes": int(report.get("bytes") or 0),
        "compileSeconds": round(sum(target["seconds"] for target in targets), 3),
        "verify": None if verify is None else {"hits": verify.get("hits"), "requests": verify.get("requests")},
        "targets": targets,
    }
    runs = report.get("runs")
    if isinstance(runs, Mapping):  # wall seconds of each run made (first, resumed, verify): the pool's GPU-seconds
        summary["runs"] = {name: round(float(runs[name]), 1) for name in RUNS if runs.get(name) is not None}
    stepped = report.get("stepped")
    if isinstance(stepped, Mapping):  # an entrypoint's run: how many step calls, and what stopped it
        summary["steps"] = {
            "script": str(stepped.get("script"))[: _ERROR_CHARS // 4],
            "stepFn": str(stepped.get("step_fn")),
            "calls": int(stepped.get("ran") or 0),
            "stoppedBy": str(stepped.get("stopped") or "end"),
        }
    for field in ("process", "processes"):  # a member of a multi-host group says which one it is
        if report.get(field) is not None:
            summary[field] = int(report[field])
    if report.get("error"):
        summary["error"] = str(report["error"])[:_ERROR_CHARS]
    malformed = list(report.get("malformedManifests") or [])
    if malformed:  # in full in the output and --report; here the first few
        summary |= summary_fields(malformed)
    text = json.dumps(summary, separators=(",", ":"))
    while len(text.encode()) > TERMINATION_LIMIT and summary["targets"]:
        dropped = max(1, len(summary["targets"]) // 2)  # halve: a few dumps even for thousands of targets
        summary["targets"] = summary["targets"][:-dropped]
        summary["targetsOmitted"] = len(targets) - len(summary["targets"])
        text = json.dumps(summary, separators=(",", ":"))
    return text


def write_termination_summary(path: str, report: Mapping[str, Any]) -> None:
    """Write :func:`termination_summary`; a file that cannot be written is said, not fatal."""
    try:
        Path(path).write_text(termination_summary(report))
    except OSError as error:
        print(f"compilecache warm: cannot write {path}: {error}", file=sys.stderr)
