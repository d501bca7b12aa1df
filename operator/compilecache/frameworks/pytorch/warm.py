"""``compilecache warm --framework pytorch``: warm ``torch.compile``'s caches, verify, publish a generation.

The PyTorch counterpart of :mod:`compilecache.jobtools.warm` (whose flags, progress lines, exit
codes, ``--report`` and termination summary it keeps). Steps, each able to stop the run with one
line before anything reaches the live cache:

1. open the cache (:func:`compilecache.cache.store.open_store`: a local path or ``gs://``) and
   delete what killed runs left; make a fresh staging folder (local: inside the cache, so that
   publishing is a ``rename``; GCS: under ``$TMPDIR``);
2. run the entrypoint in a fresh process (:mod:`compilecache.frameworks.pytorch.run`) with
   ``TORCHINDUCTOR_CACHE_DIR`` = staging (:func:`compilecache.frameworks.pytorch.env.torch_cache_env`)
   and the Job's own environment otherwise, so the settings that enter torch's key (thread count,
   visible devices, ``TORCHINDUCTOR_*``, ``TORCH_COMPILE_JOB_ID``) are training's; stop after the
   N-th optimizer step; fail if it ended before, or compiled nothing;
3. drop what must never be published (locks, ``*.tmp``, stale generated sources:
   :func:`compilecache.frameworks.pytorch.cache.split_publishable`);
4. with ``--verify`` (default): copy the rest into a fresh folder and run the entrypoint again in
   another fresh process on the copy (so at another path, as a trainer's local copy is): every FX
   graph and AOTAutograd lookup must hit, else exit 3 and nothing is published;
5. publish the tree as the generation ``torch/<run_id>`` (:mod:`compilecache.frameworks.pytorch.store`),
   then store the manifest (versions, GPU, threads, Inductor config hash, job id, each file's size
   and sha256): the manifest is what makes the generation visible to trainers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from compilecache.cache.errors import VerifyError, WarmError
from compilecache.frameworks.pytorch.env import torch_cache_env
from compilecache.jobtools.entrypoint import AUTO, DEFAULT_BUDGET

TORCHRUN = "compilecache.frameworks.pytorch.run"
DEFAULT_STEPS = 2  # a second step compiles what the first step's state changes (optimizer state, LR)


def check_args(args: argparse.Namespace) -> None:
    """The flags a PyTorch warm-up takes; JAX-only ones are refused, not ignored."""
    if args.workload or not args.script:
        raise WarmError("--framework pytorch warms a training entrypoint: give --script PATH (no --workload)")
    for flag, value in (
        ("--num-processes", args.num_processes),
        ("--coordinator", args.coordinator),
        ("--step-fn", args.step_fn),
        ("--resume-arg", args.resume_arg or None),
        ("--resume-when", getattr(args, "resume_when", None)),
    ):
        if value:
            raise WarmError(f"{flag} is for JAX warm-ups; --framework pytorch counts optimizer steps")
    if args.steps is not None and args.steps != AUTO and args.steps < 1:
        raise WarmError(f"--steps must be at least 1 (or auto), got {args.steps}")
    if args.budget is not None and (args.steps != AUTO or not args.budget > 0):
        raise WarmError(f"--budget needs --steps auto and a positive number of seconds, got {args.budget}")
    from compilecache.jobtools.entrypoint import entry_problem

    problem = entry_problem(args.script, os.getcwd())
    if problem:
        raise WarmError(problem)


def warm_torch(args: argparse.Namespace, script_args: Sequence[str], base_env: Mapping[str, str]) -> dict[str, Any]:
    """The whole run; returns the report or raises :class:`WarmError`."""
    from compilecache.cache.store import LocalStore, open_store
    from compilecache.frameworks.pytorch.cache import FRAMEWORK, MANIFEST_SCHEMA, generation_dir, split_publishable
    from compilecache.frameworks.pytorch.store import file_records, list_tree, publish
    from compilecache.jobtools.manifest import REPORT_SCHEMA, dumps, manifest_name, new_run_id, utc_now
    from compilecache.jobtools.warm import delete_leftovers

    check_args(args)
    store = open_store(args.cache_dir)
    run_id = new_run_id()
    started = utc_now()
    request: dict[str, Any] = {"steps": args.steps or DEFAULT_STEPS}
    if request["steps"] == AUTO:
        request["budget"] = args.budget if args.budget is not None else DEFAULT_BUDGET
    local = isinstance(store, LocalStore)
    staging = Path(store.prepare(run_id) if local else tempfile.mkdtemp(prefix="compilecache-torch-"))
    try:
        if local:
            delete_leftovers(store, store.scan())
        print(f"compilecache warm: pytorch {args.script}: compiling into staging {staging}", flush=True)
        started_run = time.monotonic()
        warmed = _run(args, script_args, base_env, staging, request, "warm-up")
        runs = {"first": time.monotonic() - started_run}
        counts, stepped = warmed["counts"], warmed["stepped"]
        print(
            f"  {args.script}: {_many(counts['requests'], 'graph lookup')} "
            f"({_many(counts['fx_misses'], 'FX graph')} and "
            f"{_many(counts['aot_misses'], 'AOTAutograd entry', 'AOTAutograd entries')} compiled, "
            f"{counts['hits']} hit), stopped after {_many(stepped['ran'], 'optimizer step')}; "
            f"first step {_seconds(warmed.get('first_step_seconds'))}",
            flush=True,
        )
        keep, drop = split_publishable(list_tree(staging))
        for why in sorted(set(drop.values())):
            print(f"  not published: {sum(1 for w in drop.values() if w == why)} files ({why})")
        records = file_records(staging, keep)
        verify: dict[str, Any] | None = None
        if args.verify:
            started_run = time.monotonic()
            verify = _verify(args, script_args, base_env, staging, keep, request)
            runs["verify"] = time.monotonic() - started_run
        location = publish(store, staging, run_id, keep, drop)
    finally:
        if local:
            store.discard(str(staging))
        else:
            shutil.rmtree(staging, ignore_errors=True)
    total = sum(int(record["size"]) for record in records)
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "framework": FRAMEWORK,
        "state": "complete",
        "run_id": run_id,
        "cache_dir": store.url,
        "generation": generation_dir(run_id),
        "workload": f"script:{args.script}",
        "started_at": started,
        "finished_at": utc_now(),
        "facts": warmed.get("facts") or {},
        "counts": counts,
        "stepped": stepped,
        "first_step_seconds": warmed.get("first_step_seconds"),
        "verify": verify,
        "entries": [{**record, "written_at": started} for record in records],
        "bytes": total,
    }
    manifest_path = store.write_manifest(manifest_name(run_id), dumps(manifest))
    report = {
        "schema": REPORT_SCHEMA,
        "framework": FRAMEWORK,
        "ok": True,
        "error": None,
        "run_id": run_id,
        "cache_dir": store.url,
        "manifest": manifest_path,
        "generation": location,
        **{key: (warmed.get("facts") or {}).get(key) for key in ("torch", "triton", "cuda", "gpu", "threads")},
        "targets": [
            {
                "name": Path(args.script).name,
                "workload": f"script:{args.script}",
                "compile_seconds": float(warmed.get("seconds") or 0.0),
                "requests": counts["requests"],
                "hits": counts["hits"],
                "misses": counts["misses"],
                "entries_written": [record["file"] for record in records],
                "bytes": total,
            }
        ],
        "entries": len(records),
        "bytes": total,
        "verify": verify,
        "stepped": {"script": args.script, **stepped, "stopped": stepped.get("stopped") or "end"},
        "first_step_seconds": warmed.get("first_step_seconds"),
        # Wall seconds of each run (no resumed run here): what the operator splits GPU-seconds by.
        "runs": {name: round(seconds, 1) for name, seconds in runs.items()},
        "started_at": started,
        "finished_at": manifest["finished_at"],
    }
    checked = "verify skipped" if verify is None else f"verify: {verify['hits']}/{verify['requests']} graphs hit"
    print(
        f"published {len(records)} files ({total} bytes) as {location}; {checked} in a fresh process; "
        f"manifest {manifest_path}",
        flush=True,
    )
    return report


def _run(
    args: argparse.Namespace,
    script_args: Sequence[str],
    base_env: Mapping[str, str],
    cache_dir: Path,
    request: Mapping[str, Any],
    what: str,
) -> dict[str, Any]:
    from compilecache.jobtools.entrypoint import run_in_scratch

    env = {**base_env, **torch_cache_env(str(cache_dir))}
    code, result, stderr = run_in_scratch(TORCHRUN, request, env, args.script, script_args)
    if code != 0 or "counts" not in result:
        reason = result.get("error") or f"{what}: script {args.script} exited with status {code}"
        last = stderr.strip().splitlines()[-1:] if stderr.strip() else []
        raise WarmError(f"{reason}{': ' + last[0] if last and last[0] not in reason else ''}")
    return result


def _verify(
    args: argparse.Namespace,
    script_args: Sequence[str],
    base_env: Mapping[str, str],
    staging: Path,
    keep: Sequence[str],
    request: Mapping[str, Any],
) -> dict[str, Any]:
    """Run again in a fresh process on a copy of what would be published; every lookup must hit."""
    with tempfile.TemporaryDirectory(prefix="compilecache-torch-verify-") as folder:
        copy = Path(folder)
        for name in keep:
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(staging / name, copy / name)
        result = _run(args, script_args, base_env, copy, request, "verify")
    counts = result["counts"]
    summary = {
        "ok": counts["misses"] == 0 and counts["requests"] > 0,
        "requests": counts["requests"],
        "hits": counts["hits"],
        "fx_hits": counts["fx_hits"],
        "aot_hits": counts["aot_hits"],
        "first_step_seconds": result.get("first_step_seconds"),
    }
    print(
        f"  verify: {counts['hits']}/{counts['requests']} graphs hit in a fresh process on a copy; "
        f"first step {_seconds(result.get('first_step_seconds'))}",
        flush=True,
    )
    if not summary["ok"]:
        raise VerifyError(
            f"verify failed, training would recompile: {counts['misses']} of {counts['requests']} graph lookups "
            f"missed ({_many(counts['fx_misses'], 'FX graph')}, "
            f"{_many(counts['aot_misses'], 'AOTAutograd entry', 'AOTAutograd entries')}) in a fresh "
            "process on a copy of the warm-up's cache; nothing published"
        )
    return summary


def _seconds(value: Any) -> str:
    return "?" if value is None else f"{float(value):.2f}s"


def _many(count: int, word: str, plural: str | None = None) -> str:
    """``1 FX graph``, ``2 FX graphs``, ``2 AOTAutograd entries`` (``plural`` where ``s`` is wrong)."""
    return f"{count} {word if count == 1 else plural or word + 's'}"
