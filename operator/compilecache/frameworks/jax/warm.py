"""``compilecache warm`` for JAX: compile workloads into a cache, publish atomically, verify.

JAX's warm-up (the default ``--framework``), reached through :mod:`compilecache.frameworks.jax`
from the shared command (:mod:`compilecache.jobtools.warm`: its flags, report and termination
summary). Steps, each able to stop the run with a one-line error before anything reaches the
live cache:

1. open the cache (``--cache-dir``: a local path or ``gs://bucket/prefix``,
   :mod:`compilecache.cache.store`); a local cache gets a staging dir for this run,
   seeded with links to what is already published (JAX writes a GCS prefix
   directly: an object appears whole or not at all);
2. set JAX's cache options (from :mod:`compilecache.cache.cacheenv`) pointing at
   staging *before* JAX is imported, import each ``--workload`` and compile its
   targets (``--jobs`` at a time), and/or run ``--script`` under the same env;
3. check every new entry (all or nothing; on GCS an unsound object is deleted and
   the run fails), store the run's manifest as *pending* (its entries with their
   sha256), then rename the entries into the cache: every published entry is
   recorded, whatever fails later. A published entry this run could hit whose
   bytes are damaged (truncated, corrupt, or not the sha256 its manifest recorded)
   is kept out of the run's sight in step 1 and replaced here by the fresh one,
   atomically (``rename`` over it; on GCS, deleted first); so is one whose bytes look sound but
   that JAX could not read (it missed a key whose entry was there), after one more compile pass;
4. with ``--verify``: in a fresh process, compile every target again against
   the published cache and require a hit;
5. replace the pending manifest with the complete one, write the ``--report`` JSON.

A write the storage refuses (disk full, quota: :data:`~compilecache.cache.errors.STORAGE_FULL`,
or a GCS error) ends the run with one line naming the path and errno, in the termination
summary too; the cache is left as it was (nothing published) or complete with its manifest
(docs/faults.md). Step 1 also deletes what killed runs left (staging, temporary files).

With ``--num-processes N`` (or ``$COMPILECACHE_NUM_PROCESSES``) above 1 this process is one of
a group (a multi-host warm-up Job, one pod per process): every process does every step for its
own cache keys, and no process goes on to the next step before all agree that the previous one
succeeded (:mod:`compilecache.frameworks.jax.multihost`; docs/multihost.md).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from compilecache.cache import cacheenv
from compilecache.cache.entries import entry_module, entry_name, is_entry_name
from compilecache.cache.errors import VerifyError, WarmError
from compilecache.frameworks.jax.compiler import SETUP_TARGET, WriteFailed, effective_jobs
from compilecache.frameworks.jax.env import CACHE_DIR, jax_cache_env
from compilecache.frameworks.jax.resume import RESUMED_SUFFIX, ResumePlan, resume_plan
from compilecache.jobtools.entrypoint import AUTO, DEFAULT_BUDGET, entry_problem
from compilecache.jobtools.warm import (
    ENV_MIN_SIZE,
    ENV_MIN_TIME,
    ENV_STEP_DEADLINE,
    ENV_STEP_FN,
    delete_leftovers,
    group_fields,
    report_failure,
    script_arguments,
    steps_from_env,
    write_termination_summary,
)

if TYPE_CHECKING:
    from compilecache.cache.manifests import Manifests
    from compilecache.cache.store import CacheStore, Listing
    from compilecache.frameworks.jax.multihost import Coordination, Group

T = TypeVar("T")

# A group compiles in every process (see _compile).
_ENV_SHARE_BINARY = "JAX_SHARE_BINARY_BETWEEN_HOSTS"
# Why an entry JAX missed although it was there is replaced (see unreadable_entries).
UNREADABLE = "entry corrupt: JAX could not read it (the executable does not parse) and compiled it again"


def warm(args: argparse.Namespace) -> dict[str, Any]:
    """The whole run; returns the report or raises :class:`WarmError`."""
    from compilecache.frameworks.jax.multihost import group_from

    script_args = script_arguments(args)
    base_env = dict(os.environ)  # without the trainer's report: the warm command turned it off
    _exact_mode_from_env(args, base_env)
    _check_args(args, script_args)
    group = args.group = group_from(args.num_processes, args.process_id, args.coordinator, base_env)
    if group is not None and args.steps == AUTO:
        # Each process would stop at its own step when its own clock runs out, and the others
        # would wait in the step's collectives for it forever: a group stops at a count.
        raise WarmError("--steps auto stops by time, which the processes of a group cannot agree on: give --steps N")
    if group is None:
        return _warm(args, script_args, base_env, None, None)
    from compilecache.frameworks.jax.multihost import Coordination, GroupFailed

    if args.termination_log:
        # JAX's coordination client ends a process whose peer died at once (no Python runs): this
        # summary stands until the run's own outcome replaces it.
        write_termination_summary(
            args.termination_log,
            {
                "ok": False,
                "targets": [],
                "entries": 0,
                "bytes": 0,
                **group_fields(group),
                "error": f"{group.describe()} ended abruptly: another process of the warm-up group died or "
                "stopped answering, or this one was killed (see the pod logs)",
            },
        )
    print(f"compilecache warm: {group.describe()}, coordinator {group.address(0)}", flush=True)
    coordination = Coordination(group)
    coordination.connect()

    # One outcome per process: the first of the watcher (another process failed) and the main
    # thread (this one did) reports it; the other one only leaves. Leaving the JAX group from the
    # watcher fails whatever the main thread was doing with it, with an error that is no cause.
    outcome = threading.Lock()

    def abort(why: str) -> None:
        # Another process failed while this one works (the main thread may be inside XLA):
        # report it and end now; nothing of this process has been published before the agreement.
        if not outcome.acquire(blocking=False):
            return  # the main thread reports this process's own failure
        report_failure(args, GroupFailed(why))
        coordination.abandon()
        _exit_now(GroupFailed.exit_code)

    coordination.watch(abort)
    try:
        report = _warm(args, script_args, base_env, group, coordination)
    except BaseException as error:
        if not outcome.acquire(blocking=False):
            coordination.abandon()  # the watcher reported and leaves: wait for it, end as it does
            _exit_now(GroupFailed.exit_code)
        # Report first: a process that dies before it leaves (a kill, the heartbeat bound) has
        # said why.
        if isinstance(error, WarmError):
            report_failure(args, error)
        else:
            traceback.print_exc()
        coordination.fail(error)  # the others stop at once, with this reason
        coordination.abandon()
        _exit_now(error.exit_code if isinstance(error, WarmError) else 1)
    coordination.close()
    return report


def _exit_now(code: int) -> NoReturn:
    """End a member of a group now, its report written: JAX's exit hook would leave its
    ``jax.distributed`` group with a barrier a failed peer never reaches."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _warm(
    args: argparse.Namespace,
    script_args: Sequence[str],
    base_env: Mapping[str, str],
    group: Group | None,
    coordination: Coordination | None,
) -> dict[str, Any]:
    """Steps 1-5; with a group, each ends in an agreement of all its processes."""
    from compilecache.cache.store import StagedEntry, open_store
    from compilecache.frameworks.jax.manifest import build_manifest, build_report
    from compilecache.jobtools.manifest import PENDING, dumps, manifest_name, new_run_id, utc_now

    def agreed(phase: str, work: Callable[[], T]) -> T:
        return coordination.agree(phase, work) if coordination is not None else work()

    store = agreed("opened", lambda: open_store(args.cache_dir))
    options = _cache_options(args, base_env)
    placed: dict[str, Any] | None = None  # the manifest's "group"
    if coordination is not None and group is not None:
        # One run id for the group (process 0's), and a staging dir and manifest per process.
        shared = coordination.share("run-id", new_run_id() if group.process_id == 0 else None)
        run_id = f"{shared}-p{group.process_id}"
        placed = {"run_id": shared, **group_fields(group)}
    else:
        run_id = new_run_id()
    started = utc_now()
    workloads = [*args.workload, *([f"script:{args.script}"] if args.script else [])]
    workdir = store.prepare(run_id)
    try:
        listing = store.scan()
        delete_leftovers(store, listing)
        manifests = store.read_manifests()
        for line in manifests.problems:  # never this run's to fail on: expiry names them in the status
            print(f"  note: {line}")
        damaged = _damaged_entries(store, listing, manifests)
        store.set_aside(workdir, damaged)
        for name, why in sorted(damaged.items()):
            print(f"  replacing damaged entry {name}: {why}")
        staging_env = jax_cache_env(workdir, **options)
        # Nothing is published before every process has compiled.
        compiling = time.monotonic()
        try:
            runs, facts = agreed("compiled", lambda: _compile(args, script_args, base_env, staging_env, group))
            unreadable = unreadable_entries(listing, runs, damaged)
            if unreadable and group is None:
                # JAX never overwrites an entry it could not read: set it aside and compile once more,
                # so that JAX writes the fresh one. Only the first pass is recorded (its compile times;
                # the second hits everything else). A group re-forming its JAX group is not done yet.
                store.set_aside(workdir, unreadable)
                for name, why in sorted(unreadable.items()):
                    print(f"  replacing damaged entry {name}: {why}")
                _forget_compiled()
                _compile(args, script_args, base_env, staging_env, group)
                damaged = {**damaged, **unreadable}
        except WriteFailed as failed:
            # GCS: the entries JAX did write are live already; without a manifest they would lose their sha256.
            # Best effort: the refused write is the run's error, whatever else GCS refuses now.
            with contextlib.suppress(WarmError):
                store.withdraw(_own_entries(store, workdir, failed.runs))
            raise
        compiled = time.monotonic() - compiling
        if coordination is not None:
            if args.workload:
                coordination.leave_compile_group()  # every process has compiled: the compile group ends now
            coordination.settle()

        # What both of this run's manifests record: the pending one, then the complete one.
        record = functools.partial(
            build_manifest,
            run_id=run_id,
            cache_dir=store.url,
            facts=facts,
            runs=runs,
            started_at=started,
            workloads=workloads,
            repaired=damaged,
            group=placed,
            image=os.environ.get(cacheenv.IMAGE),
        )

        def publish() -> list[StagedEntry]:
            # Recorded before visible: a fault after this leaves every published entry in a manifest.
            checked = store.check(workdir, _own_entries(store, workdir, runs))
            pending = record(staged=checked, finished_at=utc_now(), state=PENDING)
            try:
                store.write_manifest(manifest_name(run_id), dumps(pending))
            except WarmError:
                store.withdraw([entry.name for entry in checked])  # GCS: JAX wrote them in place
                raise
            return store.publish(workdir, checked)

        staged = agreed("published", publish)
    finally:
        store.discard(workdir)

    verify_result: dict[str, Any] | None = None
    problems: list[str] = []
    verified: float | None = None
    if args.verify:
        verify_env_ = jax_cache_env(store.jax_dir(), **options)
        verifying = time.monotonic()
        verify_result, problems = _verify(args, script_args, base_env, verify_env_, runs, group, coordination)
        verified = time.monotonic() - verifying
    if coordination is not None:
        coordination.post("verified", f"failed: {_verify_error(problems)}" if problems else "ok")
    manifest = record(staged=staged, finished_at=utc_now(), verify=verify_result)
    manifest_path = store.write_manifest(manifest_name(run_id), dumps(manifest))
    error = _verify_error(problems) if problems else None
    if coordination is not None and error is None:
        try:
            coordination.wait("verified")  # a run is sound only if every process hit
        except WarmError as failed:
            error = str(failed)
    report = build_report(manifest, manifest_path, error)
    report["malformedManifests"] = [{"name": item.name, "reason": item.reason} for item in manifests.malformed]
    resumed = (getattr(args, "script_seconds", None) or {}).get("resumed")
    report["runs"] = run_seconds(compiled, resumed, verified)
    stepped = getattr(args, "script_stepped", None)
    if stepped:  # how far the entrypoint ran: the pool's status tells the user (status.pools[].steps)
        report["stepped"] = {
            "script": args.script,
            "step_fn": stepped["step_fn"],
            "ran": stepped["ran"],
            "stopped": stepped.get("stopped") or "end",
        }
    _print_summary(report)
    if error:
        failure = VerifyError(error)
        failure.report = report  # type: ignore[attr-defined]
        raise failure
    return report


def run_seconds(compiled: float, resumed: float | None, verified: float | None) -> dict[str, float]:
    """The report's ``runs``: wall seconds of each run this warm-up made, rounded to 0.1 s (pure).

    ``first`` is the compile step without the resumed run (the workloads compiled here and the
    script's first run, its start-up included), ``resumed`` the script's resumed run, ``verify``
    the verify step (all its fresh processes). A run that did not happen is absent: the operator
    splits a pool's GPU-seconds by these (docs/warmer.md, "What a warm-up runs").
    """
    runs = {"first": max(0.0, compiled - (resumed or 0.0))}
    if resumed is not None:
        runs["resumed"] = resumed
    if verified is not None:
        runs["verify"] = verified
    return {name: round(seconds, 1) for name, seconds in runs.items()}


def _damaged_entries(store: CacheStore, listing: Listing, manifests: Manifests) -> dict[str, str]:
    """Published entries this run could hit whose bytes are damaged: name → why.

    JAX keeps a damaged entry forever (it misses, recompiles and never overwrites an
    existing file), so the warmer checks what it would reuse: each entry's bytes against
    the sha256 its manifest recorded, and a full decompression. Entries recorded for
    another jax/jaxlib build are skipped: this image's keys can never name them.
    """
    from compilecache.cache.expiry import expected_digests, index_manifests
    from compilecache.cache.manifests import JAX_SCHEMA
    from compilecache.cache.store import unsound_entries

    index = index_manifests(manifests.of(JAX_SCHEMA))
    installed = _installed_versions()
    if installed not in {(build.jax, build.jaxlib) for build in index.builds_seen}:
        installed = None  # no run of this build recorded (or versions read differently): check all
    files = []
    for item in listing.files:
        record = index.entries.get(item.name)
        build = record.build if record else None
        if is_entry_name(item.name) and (installed is None or build is None or (build.jax, build.jaxlib) == installed):
            files.append(item)
    return unsound_entries(store, files, expected_digests(index))


def unreadable_entries(listing: Listing, runs: Sequence[Any], damaged: Mapping[str, str]) -> dict[str, str]:
    """Published entries JAX missed although they were there: name → why (pure).

    JAX logs a miss for a key whose entry exists only when reading it failed (jax/_src/compiler.py
    ``_cache_read`` warns "Error reading persistent compilation cache entry" and compiles): an
    executable that decompresses but does not parse, which the byte check of
    :func:`_damaged_entries` cannot see. Listed in a manifest or not.
    """
    present = {item.name for item in listing.files if is_entry_name(item.name)}
    missed = {entry_name(key) for run in runs for key in run.keys_missed}
    return {name: UNREADABLE for name in sorted(missed & present) if name not in damaged}


def _forget_compiled() -> None:
    """Drop JAX's in-memory executables (if this process imported JAX): a compile asks the cache again."""
    jax = sys.modules.get("jax")
    if jax is not None:
        jax.clear_caches()


def _installed_versions() -> tuple[str, str] | None:
    """jax and jaxlib versions of this image, without importing JAX (options must be set first)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jax"), version("jaxlib")
    except PackageNotFoundError:
        return None


def _own_entries(store: CacheStore, workdir: str, runs: Sequence[Any]) -> list[str]:
    """The new entries this run compiled; where JAX writes in place (GCS), only the keys it wrote,
    so that a concurrent run's entries are not recorded under this run's versions."""
    names = store.new_entries(workdir)
    if not store.writes_in_place:
        return names
    written = {entry_name(key) for run in runs for key in run.keys_written}
    return [name for name in names if name in written]


def _compile(
    args: argparse.Namespace,
    script_args: Sequence[str],
    base_env: Mapping[str, str],
    staging_env: Mapping[str, str],
    group: Group | None = None,
) -> tuple[list[Any], dict[str, Any]]:
    """Compile the workloads in this process and/or run the script in a child."""
    from compilecache.frameworks.jax.compiler import TargetRun

    runs: list[TargetRun] = []
    facts: dict[str, Any] = {}
    if group is not None:
        # Process 0 would otherwise compile alone and hand its executable to the others, which
        # then never write their own keys (jax/_src/compiler.py _compile_and_share_module).
        staging_env = {**staging_env, _ENV_SHARE_BINARY: "false"}
    if args.workload:
        runs, facts = _compile_workloads(args.workload, args.jobs, staging_env, group)
    if args.script:
        script_runs, script_facts = _run_script(args, script_args, {**base_env, **staging_env}, group)
        runs += script_runs
        facts = facts or script_facts
    return runs, facts


def _compile_workloads(
    specs: Sequence[str], jobs: int, staging_env: Mapping[str, str], group: Group | None = None
) -> tuple[list[Any], dict[str, Any]]:
    # The options must be in place before JAX reads them: the environment for
    # anything JAX has not imported yet, jax.config for anything it has.
    os.environ.update(staging_env)
    from compilecache.frameworks.jax.compiler import CacheEvents, TargetRun, compile_targets, environment_facts
    from compilecache.frameworks.jax.progress import Progress, local_entry_bytes
    from compilecache.frameworks.jax.runtime import apply_env
    from compilecache.frameworks.jax.target import Target, check_unique
    from compilecache.frameworks.jax.workload import load_targets

    apply_env(dict(staging_env))
    if group is not None:
        from compilecache.frameworks.jax.multihost import COMPILE_PORT, group_request, join_jax

        # Before any workload runs: its devices (and so its keys) must be the whole group's.
        join_jax(group_request(group, COMPILE_PORT, ordered_leave=True))
    runs: list[TargetRun] = []
    progress = Progress(entry_bytes=local_entry_bytes(staging_env[CACHE_DIR]))
    with CacheEvents() as events, progress:
        items: list[tuple[str, Target]] = []
        for spec in specs:
            # Importing or calling a workload may compile (parameter init):
            # those entries are published too, attributed to its "(setup)".
            setup = TargetRun(spec, SETUP_TARGET)
            progress.begin((SETUP_TARGET, spec), f"{spec} {SETUP_TARGET}: importing it and calling it for its targets")
            start = time.perf_counter()
            with events.attribute_to(setup):
                items.extend((spec, target) for target in load_targets(spec))
            setup.compile_seconds = time.perf_counter() - start
            progress.end(
                (SETUP_TARGET, spec),
                outcome=f"{setup.requests} programs",
                keys_written=setup.keys_written,
                counted=False,
            )
            if setup.requests:
                runs.append(setup)
        check_unique(items)
        runs += compile_targets(items, events, jobs=jobs, progress=progress)
    print(f"compiled {progress.totals('targets')}", flush=True)
    if events.write_errors:
        raise WriteFailed(staging_env[CACHE_DIR], events.write_errors, runs)
    return runs, environment_facts()


def _script_request(
    args: argparse.Namespace, group: Group | None = None, warmed: tuple[Mapping[str, Any], int] | None = None
) -> dict[str, Any]:
    """What scriptrun needs besides the entrypoint: the exact mode's step count or budget, if any,
    and the group size the entrypoint must join.

    ``warmed``: verify's rerun of an auto-mode warm-up, with the warm run's ``stepped`` and its
    compile requests. It stops once it asked for as many compiles (all hits, when sound), and never
    after more step calls than the warm-up made when the budget stopped that one: a second full
    budget would prove nothing more.
    """
    request: dict[str, Any] = {"steps": args.steps, "step_fn": args.step_fn} if args.steps else {}
    if args.steps == AUTO:
        if warmed is None:
            request["budget"] = args.budget if args.budget is not None else DEFAULT_BUDGET
        else:
            stepped, requests = warmed
            request["until_requests"] = requests
            if stepped.get("stopped"):
                request["max_calls"] = int(stepped["ran"])
    if args.steps and args.step_deadline:
        request["step_deadline"] = args.step_deadline
    if group is not None:
        request["processes"] = group.processes
    return request


def _resume_plan(args: argparse.Namespace, group: Group | None) -> ResumePlan | None:
    """The resumed run's plan (exact mode, one process), or None: no resumed run.

    A multi-host group runs no resumed run yet: its second run would have to form the group again.
    """
    found: ResumePlan | None = getattr(args, "resume_plan", None)
    return None if group is not None else found


def _child_timeout(group: Group | None) -> float | None:
    """A child of a group member is bounded: a peer's child that died could leave it waiting."""
    return None if group is None else float(group.timeouts.phase)


def _run_script(
    args: argparse.Namespace, script_args: Sequence[str], env: Mapping[str, str], group: Group | None = None
) -> tuple[list[Any], dict[str, Any]]:
    from compilecache.frameworks.jax.compiler import run_from_dict
    from compilecache.frameworks.jax.scriptrun import run_entrypoint

    script = args.script
    request = _script_request(args, group)
    if group is not None:
        from compilecache.frameworks.jax.multihost import script_env

        env = {**env, **script_env(group)}
        if getattr(args, "resume_plan", None) is not None:
            print("  note: a multi-host group runs no resumed run of the script (--resume: docs/multihost.md)")
    plan = _resume_plan(args, group)
    code, result, stderr = run_entrypoint(request, env, script, script_args, timeout=_child_timeout(group), resume=plan)
    if code != 0 or "runs" not in result:
        reason = result.get("error") or f"script {script} exited with status {code}"
        last = stderr.strip().splitlines()[-1:] if stderr.strip() else []
        raise WarmError(f"{reason}{': ' + last[0] if last and last[0] not in reason else ''}")
    runs = [run_from_dict(run) for run in result["runs"]]
    if result.get("write_errors"):
        raise WriteFailed(env[CACHE_DIR], result["write_errors"], runs)
    stepped = result.get("stepped")
    args.script_stepped = stepped  # verify's rerun of an auto-mode run stops where this one did
    if stepped:  # scriptrun fails a run that ended before its N-th step: here it reached them
        print(f"  {stepped_line(script, stepped)}")
    args.script_seconds = result.get("seconds") or {}
    # Verify repeats the resumed run only if this one made it (its own directory has the checkpoint again).
    args.script_resumed = "resumed_because" in result
    resumed = result.get("resumed_stepped")
    if resumed:
        from compilecache.frameworks.jax.resume import describe

        how = "stopped" if resumed["ran"] >= resumed["steps"] else "ran to its end:"  # a restart near the end
        print(f"  {how} its {describe(plan)} after {resumed['ran']} calls ({result['resumed_because']})")
    if result.get("resume_skipped"):
        print(f"  {result['resume_skipped']}")
    return runs, result.get("facts") or {}


def stepped_line(script: str, stepped: Mapping[str, Any]) -> str:
    """How the entrypoint's run ended, for the log: after how many step calls, and why."""
    calls = f"{stepped['ran']} calls of {stepped['step_fn']}"
    why = {
        "steps": f"stopped {script} after {calls} (--steps)",
        "budget": f"stopped {script} after {calls}: its budget ran out {stepped.get('seconds')}s after the first "
        "step (--steps auto --budget); a longer budget caches what training compiles later",
        "requests": f"stopped {script} after {calls}: it had asked for every compile the warm-up made",
        "calls": f"stopped {script} after {calls}, as many as the warm-up made",
    }
    return why.get(str(stepped.get("stopped")), f"{script} ended by itself after {calls} (--steps auto)")


def _verify(
    args: argparse.Namespace,
    script_args: Sequence[str],
    base_env: Mapping[str, str],
    jax_env: Mapping[str, str],
    runs: Sequence[Any],
    group: Group | None = None,
    coordination: Coordination | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Compile again in fresh processes against the published cache; list the misses.

    In a group, each fresh process joins a group of the same N on the verify port.
    """
    from compilecache.frameworks.jax.compiler import run_from_dict
    from compilecache.frameworks.jax.scriptrun import run_entrypoint
    from compilecache.frameworks.jax.verify import miss_messages, self_consistency_only, verify_env
    from compilecache.jobtools.childproc import run_child

    env = verify_env(base_env, jax_env)
    fresh: list[Any] = []
    timeout = _child_timeout(group)
    if args.workload:
        request: dict[str, Any] = {"workloads": args.workload, "jobs": 1}
        if group is not None:
            from compilecache.frameworks.jax.multihost import VERIFY_PORT, group_request

            request["group"] = group_request(group, VERIFY_PORT)
        code, result, stderr = run_child("compilecache.frameworks.jax.verify", request, env, timeout=timeout)
        if code != 0 or "runs" not in result:
            raise WarmError(f"verify: {result.get('error') or 'fresh process failed'}: {stderr[-400:]}")
        fresh += [run_from_dict(run) for run in result["runs"]]
        if args.script and coordination is not None:
            # The script's verify group takes the same port: only once every workload verify ended.
            coordination.agree("verified-workloads", lambda: None)
    if args.script:
        script_env_ = env
        if group is not None:
            from compilecache.frameworks.jax.multihost import verify_script_env

            script_env_ = {**env, **verify_script_env(group)}
        # The same entrypoint, the same arguments, stopped at the same step: it must hit every compile.
        warmed = None
        if args.steps == AUTO:
            # The first run's compiles: the resumed run's are matched by verify's own resumed run.
            requests = sum(
                run.requests
                for run in runs
                if run.workload == f"script:{args.script}" and not run.name.endswith(RESUMED_SUFFIX)
            )
            warmed = (getattr(args, "script_stepped", None) or {}, requests)
        plan = _resume_plan(args, group)
        code, result, _ = run_entrypoint(
            _script_request(args, group, warmed),
            script_env_,
            args.script,
            script_args,
            timeout,
            # The runs the warm-up made, no others: its resumed run again only if it happened.
            resume=ResumePlan(args=plan.args, always=True) if plan and getattr(args, "script_resumed", False) else None,
        )
        if code != 0 or "runs" not in result:
            raise WarmError(f"verify: {result.get('error') or f'script {args.script} failed on the second run'}")
        fresh += [run_from_dict(run) for run in result["runs"]]
        script_stepped = result.get("stepped")
    else:
        script_stepped = None
    problems = miss_messages(list(runs), fresh)
    summary = {
        "ok": not problems,
        "targets": len([run for run in fresh if run.requests]),
        "hits": sum(run.hits for run in fresh),
        "requests": sum(run.requests for run in fresh),
        "problems": problems,
        # Targets checked against nothing from training: their hit proves only self-consistency.
        "self_consistency_only": self_consistency_only(fresh),
    }
    if script_stepped:
        summary["script_steps"] = script_stepped["ran"]  # how far verify's rerun went
    return summary, problems


def _verify_error(problems: Sequence[str]) -> str:
    return f"verify failed, training would recompile: {problems[0]}" + (
        f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    )


def _check_args(args: argparse.Namespace, script_args: Sequence[str]) -> None:
    if not args.workload and not args.script:
        raise WarmError("nothing to warm: give --workload MODULE:FUNC and/or --script PATH")
    if args.jobs < 1:
        raise WarmError(f"--jobs must be at least 1, got {args.jobs}")
    threads = effective_jobs(args.jobs)
    if threads < args.jobs:  # say it: a silent cap looks like a bug
        print(
            f"compilecache warm: --jobs {args.jobs} runs {threads} compile thread(s) on {os.cpu_count()} CPU cores: "
            "XLA's CPU compiler keeps about 1.5 cores busy per compile (2 threads measured 0.78x on 2 cores)",
            file=sys.stderr,
        )
    if script_args and not args.script:
        raise WarmError(f"unexpected arguments {' '.join(script_args)!r} (arguments after -- need --script)")
    if args.script:
        problem = entry_problem(args.script, os.getcwd())
        if problem:
            raise WarmError(problem)
    if args.steps is not None and (not args.script or (args.steps != AUTO and args.steps < 1)):
        raise WarmError("--steps N needs --script and N of at least 1 (or auto)")
    if args.budget is not None and (args.steps != AUTO or not args.budget > 0):
        raise WarmError(f"--budget needs --steps auto and a positive number of seconds, got {args.budget}")
    resume_when = getattr(args, "resume_when", None)
    if (args.resume_arg or args.resume or resume_when) and not args.steps:
        raise WarmError(
            "--resume, --resume-arg and --resume-when need the exact mode (--script with --steps N or auto)"
        )
    if resume_when is not None and (args.resume is False or not resume_when.strip()):
        raise WarmError(f"--resume-when names the path a restart reads (not with --no-resume), got {resume_when!r}")
    if args.step_deadline is not None and not args.step_deadline > 0:
        raise WarmError(f"--step-deadline must be a positive number of seconds, got {args.step_deadline}")


def _exact_mode_from_env(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    """``--steps``/``--step-fn``/``--resume`` from the environment where the flags are not given (scripts only)."""
    args.step_fn = args.step_fn or env.get(ENV_STEP_FN) or "train_step"
    if args.script:
        steps_from_env(args, env)
    when = getattr(args, "resume_when", None)
    args.resume_plan = resume_plan(args.resume, args.resume_arg, when, env) if args.steps else None
    if args.step_deadline is None and env.get(ENV_STEP_DEADLINE):
        try:
            args.step_deadline = float(env[ENV_STEP_DEADLINE])
        except ValueError as error:
            raise WarmError(
                f"{ENV_STEP_DEADLINE} must be a number of seconds, got {env[ENV_STEP_DEADLINE]!r}"
            ) from error


def _cache_options(args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    """Keyword options of :func:`jax_cache_env` from flags, else the environment, else 0."""
    try:
        min_time = args.min_compile_time_secs
        if min_time is None:
            min_time = float(env.get(ENV_MIN_TIME) or 0)
        min_size = args.min_entry_size_bytes
        if min_size is None:
            min_size = int(env.get(ENV_MIN_SIZE) or 0)
    except ValueError as error:
        raise WarmError(f"bad cache option in the environment: {error}") from error
    return {
        "min_compile_time_secs": min_time,
        "min_entry_size_bytes": min_size,
        "xla_flags": env.get("XLA_FLAGS") or None,
    }


def _print_summary(report: Mapping[str, Any]) -> None:
    for target in report["targets"]:
        if target["name"] == SETUP_TARGET:
            # Importing and calling a workload compiles its own small programs (init, constants): a
            # first run writes them, which is no "miss" a user must act on. Name them instead.
            print(f"  {target['workload']} setup: {_setup_summary(target)}")
            continue
        # In a warm-up a miss is the work itself: the program was compiled and written.
        state = "hit" if target["hit"] else f"{target['misses']}/{target['requests']} compiled"
        print(
            f"  {target['workload']} {target['name']}: {target['compile_seconds']:.2f}s {state}, "
            f"{len(target['entries_written'])} entries, {target['bytes']} bytes"
        )
    verify = report.get("verify")
    checked = (
        "verify skipped" if verify is None else f"verify: {verify['hits']}/{verify['requests']} hits in a fresh process"
    )
    only_self = (verify or {}).get("self_consistency_only") or []
    if only_self:
        print(
            f"  note: verify proved only self-consistency for {', '.join(only_self)}: it compiled the warmer's own "
            "function and arguments again; give Target(training_args=..., training_fn=...) or warm the real "
            "entrypoint (--script ... --steps N) to check what training calls"
        )
    print(
        f"published {report['entries']} entries ({report['bytes']} bytes) to {report['cache_dir']}; "
        f"{checked}; manifest {report['manifest']}"
    )


def _setup_summary(target: Mapping[str, Any]) -> str:
    """``0.41s, 5 programs (init, broadcast_in_dim, +3): 3 written, 2 hit, 4 entries, 1024 bytes``."""
    names = list(dict.fromkeys(entry_module(name).removeprefix("jit_") for name in target["entries_written"]))
    shown = ", ".join(names[:3]) + (f", +{len(names) - 3}" if len(names) > 3 else "")
    written = target["requests"] - target["hits"]
    return (
        f"{target['compile_seconds']:.2f}s, {target['requests']} programs"
        + (f" ({shown})" if shown else "")
        + f": {written} compiled, {target['hits']} hit, {len(target['entries_written'])} entries, "
        + f"{target['bytes']} bytes"
    )
