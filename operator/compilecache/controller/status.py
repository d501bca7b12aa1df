"""The CompileCache status, computed from what is observed (pure functions, no I/O).

The status is the operator's record: a Job may be gone (``ttlSecondsAfterFinished``)
while its outcome still stands, so a finished pool's state is kept as long as its
Job name (and so its spec hash) is the current one.
"""

from __future__ import annotations

import datetime
import json
import math
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compilecache.api import bounds
from compilecache.cache import units
from compilecache.controller import podstate
from compilecache.controller.api import SINGLE_HOST, Topology
from compilecache.controller.pools import Pool

# Phases of a cache.
PENDING = "Pending"
WARMING = "Warming"
EXPIRING = "Expiring"
READY = "Ready"
DEGRADED = "Degraded"
FAILED = "Failed"
PHASES = (PENDING, WARMING, EXPIRING, READY, DEGRADED, FAILED)  # every phase (the metrics' 0/1 series)

# States of a pool.
POOL_PENDING = "Pending"
POOL_RUNNING = "Running"
POOL_SUCCEEDED = "Succeeded"
POOL_FAILED = "Failed"
# No node, and no way to ask for one: the GPUs per pod are not declared (they are in the cache key).
POOL_NO_NODES = "NoNodes"
# Read from records of earlier versions only: a multi-host pool with fewer nodes than hosts now gets
# its Job, whose pods ask for the missing nodes (an autoscaler adds them, or capacityTimeout ends it).
POOL_TOO_FEW_NODES = "TooFewNodes"
FINISHED = (POOL_SUCCEEDED, POOL_FAILED)
# States in which a pool × topology will not warm this spec (the phase counts them as failed).
NOT_WARMED = (POOL_FAILED, POOL_TOO_FEW_NODES)
# The pod annotation (and, from Kubernetes 1.28, label) with an Indexed Job pod's index.
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"

# What a warm-up pod's `compilecache warm --termination-log` writes (jobtools/warm.py: termination_summary).
WARM_SCHEMA = "compilecache.dev/warm/v1"
REPORT_FIELDS = (
    "entries",
    "bytes",
    "compileSeconds",
    "verifyHits",
    "verifyRequests",
    "targets",
    "targetsOmitted",
    "steps",
)
STATUS_TARGETS_MAX = 32  # per-target detail kept in status.pools[].targets (the CRD's maxItems)
# The reason of a pool whose warm-up pod was ended by a disruption (spot reclaim, drain, preemption), while
# its Job makes the retry; ``status.pools[].disruptions`` counts them.
PREEMPTED = "Preempted"
QUEUED = "Queued"  # a pool whose Job waits for Kueue's admission (queueing.py)
# A multi-host warm-up failed by a disruption runs again as a new Job at most this many times (each
# run restarts its activeDeadlineSeconds: an unbounded loop on a pool that keeps losing nodes).
REGROUP_MAX = 5
REGROUP = "regroup"  # in a pool entry of this pass only (plan deletes the Job, and drops the key)
# The reason of a pool, or of the Expired condition, whose pod's report was refused (``BadReport``).
REPORT_REFUSED = "ReportRefused"
# What a finished warm-up's pods cost, from their own start and end (``pool_cost``): ``status.pools[]``
# keeps it as long as its Job name, like the report.
COST_FIELDS = ("gpuSeconds", "gpuPods")
RUNS = ("first", "resumed", "verify")  # the runs a warm-up summary's ``runs`` may time (jobtools/warm.py)
OTHER_RUN = "other"  # what a pod ran besides them: start-up, publish, listing, and any run it did not time
TOTAL = "total"

# Condition types.
READY_CONDITION = "Ready"
STORAGE_READY = "StorageReady"
POOLS_WARMED = "PoolsWarmed"

WARNING_PHASES = (DEGRADED, FAILED)


class BadReport(ValueError):
    """A pod's report with a value of the wrong type, or out of what the status may hold: refused whole.

    ``field`` names the value in the report (``entries``, ``targets[2].bytes``, ``after.bytes``).
    """

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field}: {why}")
        self.field = field
        self.why = why


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post about the cache."""

    type: str  # Normal | Warning
    reason: str
    message: str


def job_state(job: Mapping[str, Any]) -> dict[str, Any]:
    """The pool fields (state, reason, message, startedAt, finishedAt) that a Job's status tells."""
    status = job.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    fields: dict[str, Any] = {"startedAt": status.get("startTime")}
    if "Complete" in conditions or "SuccessCriteriaMet" in conditions:
        done = conditions.get("Complete") or conditions["SuccessCriteriaMet"]
        fields |= {"state": POOL_SUCCEEDED, "reason": "JobSucceeded", "message": "the warm-up Job succeeded"}
        fields["finishedAt"] = status.get("completionTime") or done.get("lastTransitionTime")
    elif "Failed" in conditions or "FailureTarget" in conditions:
        failed = conditions.get("Failed") or conditions["FailureTarget"]
        reason = failed.get("reason") or "JobFailed"
        fields |= {
            "state": POOL_FAILED,
            "reason": reason,
            "message": failed.get("message") or "the warm-up Job failed",
        }
        fields["finishedAt"] = failed.get("lastTransitionTime")
    elif (status.get("active") or 0) > 0:
        fields |= {"state": POOL_RUNNING, "reason": "JobRunning", "message": "the warm-up pod is running"}
    else:
        fields |= {
            "state": POOL_PENDING,
            "reason": "JobPending",
            "message": "the warm-up pod is not running yet",
        }
    return {key: value for key, value in fields.items() if value is not None}


def termination_message(pods: Sequence[Mapping[str, Any]], container: str | None = None) -> str | None:
    """The termination message of the newest terminated container (of that name) with one; a Job may retry.

    With ``container`` ``None``, the newest failed container of any name, init containers included
    (a warm-up pod runs each script in an init container).
    """
    found: list[tuple[str, str]] = []
    for _, name, terminated in terminated_containers(pods):
        if not terminated.get("message"):
            continue
        if container is None and terminated.get("exitCode") in (0, None):
            continue
        if container is None or name == container:
            found.append((str(terminated.get("finishedAt") or ""), str(terminated["message"])))
    return max(found)[1] if found else None


def terminated_containers(pods: Sequence[Mapping[str, Any]]) -> Iterator[tuple[Mapping[str, Any], str, dict[str, Any]]]:
    """(pod, container name, its ``state.terminated``: empty while it has not ended) of every container, init first."""
    for pod in pods:
        pod_status = pod.get("status") or {}
        for state in [*(pod_status.get("initContainerStatuses") or []), *(pod_status.get("containerStatuses") or [])]:
            yield pod, str(state.get("name")), (state.get("state") or {}).get("terminated") or {}


def last_line(message: str | None, limit: int = 300) -> str:
    """The last non-empty line of a message or a log tail, at most ``limit`` characters."""
    lines = [line for line in (message or "").strip().splitlines() if line.strip()]
    return lines[-1][:limit] if lines else ""


def pool_status(
    pool: Pool,
    job_name: str,
    job: Mapping[str, Any] | None,
    previous: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]] = (),
    topology: Topology = SINGLE_HOST,
    now: str | None = None,
    *,
    events: podstate.Events | None = None,
    capacity_seconds: float = podstate.STUCK_DEADLINE_SECONDS,
) -> dict[str, Any]:
    """The ``status.pools[]`` entry of one pool × topology; ``pods`` are its Job's pods.

    A running Job's pods tell what it is stuck on (``podstate.problem``, with the autoscaler's
    ``events`` on a pod that waits for a node): the pool says the pod's reason and message instead of
    "running", and fails once that lasted past its deadline at ``now`` (``capacity_seconds`` for a node).

    A pool with no node gets its Job all the same when its GPUs per pod are declared: that pod is what
    makes an autoscaler add a node (Cluster Autoscaler and Karpenter act on a pending pod whose requests
    and selectors a node group fits). Without them it is ``NoNodes``: the count is part of the cache key.
    """
    entry: dict[str, Any] = {
        "name": pool.name,
        "hosts": topology.hosts,
        "nodes": pool.nodes,
        "gpusPerNode": pool.gpus_per_node,
        "gpusPerPod": pool.gpus_per_pod,
    }
    if pool.nodes == 0 and pool.declared_gpus is None:
        selector = ",".join(f"{key}={value}" for key, value in sorted(pool.node_selector.items()))
        message = (
            f"no schedulable node matches {selector or 'the pool'}; to warm it before one exists "
            "(an autoscaled pool), declare gpusPerPod"
        )
        return entry | {"state": POOL_NO_NODES, "reason": "NoMatchingNodes", "message": message}
    unschedulable = unschedulable_reason(pool)
    if unschedulable:
        return entry | {"state": POOL_FAILED, "reason": "TooManyGPUs", "message": unschedulable}
    entry["job"] = job_name
    same_job = previous is not None and previous.get("job") == job_name
    # The report read in an earlier pass stands (the pods are read once, then may be gone), and so
    # does a refusal of it: the next pass reads no pod, and must not forget why nothing was counted.
    reported = {key: previous[key] for key in REPORT_FIELDS if key in previous} if same_job and previous else {}
    if same_job and previous and previous.get("reason") == REPORT_REFUSED:
        reported = {key: previous[key] for key in ("reason", "message") if key in previous}
    if job is not None:
        state = job_state(job)
        if state["state"] == POOL_FAILED:
            said = failure(pods, topology)
            if said:  # what the command said beats "BackoffLimitExceeded", which stays the reason
                state["message"] = f"{said[:300]} ({state['message']})"
            oom = podstate.oom_killed(pods)
            if oom is not None:  # killed for memory: that is the cause, whatever the Job controller says
                state |= {"reason": oom.reason, "message": f"{oom.message} ({state['message']})"}
        elif state["state"] != POOL_SUCCEEDED:
            state |= stuck(pods, now, events, capacity_seconds)
        state |= preempted(pods, previous if same_job else None, state)
        if state["state"] == POOL_FAILED and topology.multi_host:
            state |= regrouped(pods, previous if same_job else None, state)
        if state["state"] == POOL_SUCCEEDED:
            try:
                reported = warm_report(pods) or reported
            except BadReport as exc:
                message = f"the warm-up's report was refused, nothing of it is counted: {exc}"
                reported = {"reason": REPORT_REFUSED, "message": message}
        return entry | state | reported | pool_cost(pods, pool.gpus_per_pod, previous if same_job else None, state)
    if same_job and previous is not None and previous.get("state") in FINISHED:
        kept = ("state", "reason", "message", "startedAt", "finishedAt", "disruptions", "lastDisruption")
        cost = {key: previous[key] for key in COST_FIELDS if key in previous}
        return entry | {key: previous[key] for key in kept if key in previous} | reported | cost
    # A Job made again (a disrupted multi-host group) keeps the count of its name's disruptions.
    carried = (
        {key: previous[key] for key in ("disruptions", "lastDisruption") if key in previous}
        if same_job and previous and previous.get("disruptions")
        else {}
    )
    return entry | {"state": POOL_PENDING, "reason": "JobCreated", "message": "the warm-up Job was created"} | carried


def preempted(
    pods: Sequence[Mapping[str, Any]], previous: Mapping[str, Any] | None, state: Mapping[str, Any]
) -> dict[str, Any]:
    """The pool fields a disruption of the Job's pods changes: ``disruptions`` (counted as seen: the pods
    of a reclaimed node may be collected before a pass sees them), and while the Job waits for its
    retry, the reason ``Preempted`` with what ended the pod. The Job's podFailurePolicy
    (``jobs.POD_FAILURE_POLICY``) retries such a pod without counting it against backoffLimit."""
    found = podstate.disruptions(pods)
    fields = counted(found, previous)
    count = _int(fields.get("disruptions"))
    if not count:
        return {}
    if not found or state.get("state") not in (POOL_PENDING, POOL_RUNNING) or _newest_runs(pods):
        return fields
    last = found[-1]
    times = "once" if count == 1 else f"{count} times"
    said = f"preempted {times}, retrying (not counted against backoffLimit); last: {last.reason}, {last.message}"
    if state.get("reason") in podstate.REASONS:  # the retry is stuck (e.g. waits for a new node): that stays the reason
        return fields | {"message": f"{said}; now: {state.get('message', '')}"[:1024]}
    return fields | {"state": POOL_PENDING, "reason": PREEMPTED, "message": said[:1024]}


def regrouped(
    pods: Sequence[Mapping[str, Any]], previous: Mapping[str, Any] | None, state: Mapping[str, Any]
) -> dict[str, Any]:
    """The pool fields of a failed multi-host Job that a disruption failed: Pending, ``Preempted``, to run again.

    The podFailurePolicy retries the disrupted pod, but its process group cannot take a newcomer: the
    other processes fail on the lost member, and the Job with them (``backoffLimit: 0``). The whole group
    starts again in a new Job of the same name (``plan`` deletes this one), at most
    :data:`REGROUP_MAX` times, each counted in ``disruptions``; a failure with no disruption stays one.
    A disruption before this Job started is an earlier Job's (its pods carry the same ``job-name`` until
    the garbage collector deletes them): counted already, it makes no new group.
    """
    started = str(state.get("startedAt") or "")
    found = [problem for problem in podstate.disruptions(pods) if str(problem.since or "") >= started]
    if not found:
        return {}
    if previous and previous.get("reason") == PREEMPTED and previous.get("startedAt") == state.get("startedAt"):
        # The same failed Job again (its deletion not seen yet): counted already, deleted again (a no-op).
        kept = ("state", "reason", "message", "disruptions", "lastDisruption")
        return {key: previous[key] for key in kept if key in previous} | {REGROUP: True}
    if _int((previous or {}).get("disruptions")) >= REGROUP_MAX:
        return {}
    fields = counted(podstate.disruptions(pods), previous)  # seen while the group ran: counted then, not again
    last = found[-1]
    said = f"preempted ({fields['disruptions']} so far): the group starts again in a new Job; last: {last.reason}"
    said += f", {last.message}"
    return {"state": POOL_PENDING, "reason": PREEMPTED, "message": said[:1024], **fields, REGROUP: True}


def counted(found: Sequence[podstate.Problem], previous: Mapping[str, Any] | None) -> dict[str, Any]:
    """``disruptions`` and ``lastDisruption`` with the disruptions ``found`` (oldest first) on the Job's pods now.

    The pods go (PodGC deletes those of a Node that is gone, Failed ones too: a reclaimed spot node's), so
    the count is the record's plus those found later than its ``lastDisruption``. Two pods disrupted in one
    second, seen in two passes, count once (the condition's time has whole seconds). A record of an earlier
    version has a count and no time: the larger of it and what is found, as that version counted.
    """
    before = _int((previous or {}).get("disruptions"))
    last = str((previous or {}).get("lastDisruption") or "")
    if before and not last:
        count = max(before, len(found))
    else:
        count = before + sum(1 for problem in found if str(problem.since or "") > last)
    newest = max([last, *(str(problem.since or "") for problem in found)])
    return ({"disruptions": count} if count else {}) | ({"lastDisruption": newest} if newest and count else {})


def _newest_runs(pods: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the Job's newest pod runs: its retry after a disruption has started."""
    newest = max(pods, key=lambda pod: str((pod.get("metadata") or {}).get("creationTimestamp") or ""), default=None)
    return newest is not None and (newest.get("status") or {}).get("phase") == "Running"


def stuck(
    pods: Sequence[Mapping[str, Any]],
    now: str | None,
    events: podstate.Events | None = None,
    capacity_seconds: float = podstate.STUCK_DEADLINE_SECONDS,
) -> dict[str, Any]:
    """The pool fields a running Job's stuck pod changes (``{}``: none stuck): its reason and message, and
    the state: Pending while its pod cannot start, Failed once that lasted past its deadline
    (``podstate.deadline_seconds``: ``capacity_seconds`` for a pod that waits for a node)."""
    found = podstate.problem(pods, events)
    return {} if found is None else problem_fields(found, now, capacity_seconds)


def problem_fields(
    found: podstate.Problem, now: str | None, capacity_seconds: float = podstate.STUCK_DEADLINE_SECONDS
) -> dict[str, Any]:
    """The pool fields of what a Job waits on (a stuck pod, a ProvisioningRequest): its reason and message,
    Pending, and Failed once it lasted past its deadline (``podstate.deadline_seconds``)."""
    fields: dict[str, Any] = {"reason": found.reason, "message": found.message}
    if found.reason != podstate.OOM_KILLED:  # an earlier attempt's OOM kill: the Job's retry may run
        fields["state"] = POOL_PENDING
    if now is not None and podstate.past_deadline(found, now, capacity_seconds):
        waited = f"{podstate.deadline_seconds(found, capacity_seconds) / 60:g} min"
        bound = " (capacityTimeout)" if found.reason in podstate.CAPACITY else ""
        fields |= {"state": POOL_FAILED, "message": f"{found.message} (for more than {waited}{bound})"}
    return fields


def failure(pods: Sequence[Mapping[str, Any]], topology: Topology = SINGLE_HOST) -> str:
    """What a failed warm-up Job's command said: its summary's error, else its log's last line ("" if nothing).

    One host: the newest failed container (a Job may retry). Several: the first process that
    failed, named (``process 1 of 2: ...``): the others' failures follow from it (the group lost a
    member, or the Job controller stopped them), so the earliest one is the cause.
    """
    if not topology.multi_host:
        told = termination_message(pods)
        return str((parse_warm_summary(told) or {}).get("error") or "") or last_line(told)
    found: list[tuple[str, int, int, str]] = []  # (finishedAt, no summary, process, what it said)
    for pod, _, terminated in terminated_containers(pods):
        if terminated.get("exitCode") in (0, None) or not terminated.get("message"):
            continue
        summary = parse_warm_summary(terminated["message"])
        said = str((summary or {}).get("error") or "") or last_line(terminated["message"])
        if said:
            process = process_of(pod, summary)
            rank = process if process is not None else topology.hosts
            when = str(terminated.get("finishedAt") or "~")  # "~" sorts after any time: a known one wins
            found.append((when, summary is None, rank, said))
    if not found:
        return ""
    _, _, process, said = min(found)
    where = f"process {process} of {topology.hosts}" if process < topology.hosts else "a process"
    return f"{where}: {said}"


def process_of(pod: Mapping[str, Any], summary: Mapping[str, Any] | None) -> int | None:
    """The JAX process a warm-up pod ran: its summary's ``process``, else its Indexed Job index (``None``: one host)."""
    candidates = [(summary or {}).get("process")]
    meta = pod.get("metadata") or {}
    for where in ("annotations", "labels"):
        candidates.append((meta.get(where) or {}).get(COMPLETION_INDEX))
    for value in candidates:
        # A count, or its digits (an annotation): never a float (Infinity) nor a bool, as a summary may say.
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 18:
            return int(value)
    return None


def parse_report(message: str | None, schema: str | None = None) -> dict[str, Any] | None:
    """A container's JSON report in its termination message (of ``schema``, if given), or ``None``.

    With ``FallbackToLogsOnError`` a failed container that wrote nothing leaves a log tail: not JSON.
    """
    if not message:
        return None
    try:
        report = json.loads(message)
    except (ValueError, RecursionError):  # nested deeper than the parser goes: not a report either
        return None
    if not isinstance(report, dict) or "schema" not in report:
        return None
    return report if schema is None or report["schema"] == schema else None


def parse_warm_summary(message: str | None) -> dict[str, Any] | None:
    """A warm-up container's summary (``compilecache warm --termination-log``), or ``None`` for anything else."""
    return parse_report(message, WARM_SCHEMA)


def warm_report(pods: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The ``status.pools[]`` report fields from a succeeded warm-up Job's pods, or ``None`` without a summary.

    A pod runs one ``compilecache warm`` per container (scripts in init containers): their
    summaries add up. Of a container retried in several pods (a Job's retries) the newest
    summary counts, once. A multi-host Job's pods are its processes (``process_of``), each
    with its own summaries: entries, bytes and verify counts add up over the processes (each
    publishes and verifies the entries of its own keys), compile seconds are the slowest process's
    (they compile side by side), and the per-target detail is the lowest process's.

    The warm-up runs the cache author's script, which can write its own summary: a value of the
    wrong type, or a report the status cannot hold (``bounds``: past int64, not finite), raises
    :class:`BadReport`, and none of the report is used.
    """
    newest: dict[tuple[int, str], tuple[str, dict[str, Any]]] = {}
    for pod, name, terminated in terminated_containers(pods):
        summary = parse_warm_summary(terminated.get("message"))
        if summary is None or terminated.get("exitCode") not in (0, None):
            continue
        when = str(terminated.get("finishedAt") or "")
        process = process_of(pod, summary)
        key = (-1 if process is None else process, name)
        if key not in newest or when >= newest[key][0]:
            newest[key] = (when, summary)
    if not newest:
        return None
    by_process: dict[int, list[dict[str, Any]]] = {}
    for process, name in sorted(newest):
        by_process.setdefault(process, []).append(newest[(process, name)][1])
    every = [summary for summaries in by_process.values() for summary in summaries]
    first = by_process[min(by_process)]  # the per-target detail: one process's, not N copies of it
    targets = [
        mapping(target, f"targets[{index}]")
        for summary in first
        for index, target in enumerate(listed(summary.get("targets"), "targets"))
    ]
    omitted = sum(count(summary.get("targetsOmitted"), "targetsOmitted") for summary in first)
    omitted += max(0, len(targets) - STATUS_TARGETS_MAX)
    verified = [mapping(summary["verify"], "verify") for summary in every if summary.get("verify") is not None]
    seconds = max(
        sum(number(summary.get("compileSeconds"), "compileSeconds") for summary in group)
        for group in by_process.values()
    )
    report: dict[str, Any] = {
        "entries": sum(count(summary.get("entries"), "entries") for summary in every),
        "bytes": sum(count(summary.get("bytes"), "bytes") for summary in every),
        "compileSeconds": round(seconds, 3),
        "targets": [
            {
                "name": text(target.get("name"), f"targets[{index}].name")[:253],
                "seconds": round(number(target.get("seconds"), f"targets[{index}].seconds"), 3),
                "entries": count(target.get("entries"), f"targets[{index}].entries"),
                "bytes": count(target.get("bytes"), f"targets[{index}].bytes"),
            }
            for index, target in enumerate(targets[:STATUS_TARGETS_MAX])
        ],
    }
    steps = [mapping(summary["steps"], "steps") for summary in first if summary.get("steps") is not None]
    if steps:
        report["steps"] = [script_steps(item) for item in steps[:STATUS_TARGETS_MAX]]
    if verified:
        report["verifyHits"] = sum(count(verify.get("hits"), "verify.hits") for verify in verified)
        report["verifyRequests"] = sum(count(verify.get("requests"), "verify.requests") for verify in verified)
    if omitted:
        report["targetsOmitted"] = omitted
    return within(report, "pools[]")


def script_steps(steps: Mapping[str, Any]) -> dict[str, Any]:
    """One ``status.pools[].steps`` item: how far a script's warm-up ran, and what that leaves out.

    ``stoppedBy``: ``steps`` (its count), ``budget`` (``steps: auto`` ran out of time: what training
    compiles later, a later evaluation, is not cached) or ``end`` (the script ended by itself:
    everything it compiles is cached).
    """
    stopped = text(steps.get("stoppedBy"), "steps.stoppedBy") or "end"
    calls = count(steps.get("calls"), "steps.calls")
    step_fn = (text(steps.get("stepFn"), "steps.stepFn") or "train_step")[:128]
    said = {
        "steps": f"stopped after {calls} calls of {step_fn} (steps): what training compiles later is not cached "
        "(steps: auto runs whole epochs on one host)",
        "budget": f"stopped after {calls} calls of {step_fn}: the budget ran out; programs training compiles "
        "later are not cached (raise budget)",
        "end": f"the script ended by itself after {calls} calls of {step_fn}: everything it compiles is cached",
    }
    return {
        "script": text(steps.get("script"), "steps.script")[:253],
        "calls": calls,
        "stoppedBy": stopped if stopped in said else "end",
        "message": said.get(stopped, said["end"]),
    }


def count(value: Any, field: str) -> int:
    """A count in a pod's report (absent: 0): a non-negative integer, else :class:`BadReport` naming ``field``."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadReport(field, f"{bounds.show(value)} is not a count")
    if value > bounds.INT64_MAX:  # what no status holds, and what float() (a size's formatting) cannot take
        raise BadReport(field, f"{bounds.show(value)} is out of the int64 range")
    return value


def number(value: Any, field: str) -> float:
    """Seconds in a pod's report (absent: 0): a finite non-negative number, else :class:`BadReport`."""
    if value is None:
        return 0.0
    # An int is compared as an int (float() of 10**400 raises): past what a float holds, no number of seconds.
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= sys.float_info.max:
        raise BadReport(field, f"{bounds.show(value)} is not a finite number of seconds")
    return float(value)


def text(value: Any, field: str) -> str:
    """A string in a pod's report (absent: ``""``), else :class:`BadReport`."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadReport(field, f"{bounds.show(value)} is not a string")
    return value


def mapping(value: Any, field: str) -> Mapping[str, Any]:
    """An object in a pod's report (absent: empty), else :class:`BadReport`."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise BadReport(field, f"{bounds.show(value)} is not an object")
    return value


def listed(value: Any, field: str) -> list[Any]:
    """A list in a pod's report (absent: empty), else :class:`BadReport`."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadReport(field, f"{bounds.show(value)} is not a list")
    return value


def within(fragment: dict[str, Any], where: str) -> dict[str, Any]:
    """``fragment`` (fields of the status at ``where``: ``pools[]``, ``cache``, ``consumers``) if the status
    can hold each of them (``bounds``: the model's types and bounds), else :class:`BadReport` on the first."""
    schema = {key: value for key, value in bounds.field(where).items() if key != "required"}  # a part of the item
    problems = bounds.violations(fragment, schema, where)
    if problems:
        field, _, why = problems[0].partition(": ")
        raise BadReport(field, why)
    return fragment


def needs_report(job: Mapping[str, Any], pools: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a pass must read this warm-up Job's pods: it failed (what its command said), or it
    succeeded and its report is not in the status yet. Running Jobs and recorded ones (a refused
    report is recorded too) need no read."""
    state = job_state(job)["state"]
    if state == POOL_FAILED:
        return True
    if state != POOL_SUCCEEDED:
        return False
    name = (job.get("metadata") or {}).get("name")
    return not any(
        pool.get("job") == name and ("entries" in pool or pool.get("reason") == REPORT_REFUSED) for pool in pools
    )


def cache_from_pools(pools: Sequence[Mapping[str, Any]], previous: Mapping[str, Any]) -> dict[str, Any]:
    """``status.cache`` as soon as a warm-up reported, before any expiry counted the cache.

    Once an expiry has counted the cache (its counts are the truth: older entries, deletions),
    a new warm-up does not overwrite them; the next expiry does.
    """
    result = dict(previous)
    if previous.get("lastExpired"):
        return result
    reported = [pool for pool in pools if pool.get("state") == POOL_SUCCEEDED and "entries" in pool]
    if reported:
        size = sum(_int(pool.get("bytes")) for pool in reported)
        result |= {
            "entries": sum(_int(pool.get("entries")) for pool in reported),
            "bytes": size,
            "size": units.format_bytes(size),
        }
    return result


# --- Cost: the GPU-seconds of a pool's warm-up pods (``status.pools[].gpuSeconds``, ``status.cost``).


def pool_cost(
    pods: Sequence[Mapping[str, Any]],
    gpus: int,
    previous: Mapping[str, Any] | None,
    state: Mapping[str, Any],
) -> dict[str, Any]:
    """``gpuSeconds`` and ``gpuPods`` of a finished warm-up Job from its ``pods`` (``{}`` while it runs).

    Every finished pod of the Job counts, a retry after a preemption too (its GPUs were used), each its
    ``gpus`` × its run time (:func:`pod_cost`). ``gpus``: what each pod requested, the pool's
    ``gpusPerPod``, which the operator's Job gives each of its containers as the GPU resource's limit
    (``jobs.container_resources``; the scheduler counts a pod's containers, or its largest init
    container, so that is the pod's). The pods are read as passes hold them (``indexes.slim_pod``:
    their status, not their containers' resources). ``previous``: the record of the same Job, which stands
    unless the pods read now say more: the pods go (PodGC, the Job's TTL) and a succeeded Job's pods
    are read once, while a failed one's are read in every pass; a record never shrinks, so the metric
    (``metrics.py``, which counts what a record adds) never counts a pod twice.
    """
    kept = {key: previous[key] for key in COST_FIELDS if key in previous} if previous else {}
    if state.get("state") not in FINISHED:
        return kept
    costs = [cost for pod in pods if (cost := pod_cost(pod, gpus)) is not None]
    if not costs:
        return kept
    summed = {part: sum(cost[part] for cost in costs) for part in (TOTAL, *RUNS, OTHER_RUN)}
    seconds = rounded(summed)
    before = mapping_or_empty(kept.get("gpuSeconds"))
    return kept if _float(before.get(TOTAL)) > seconds[TOTAL] else {"gpuSeconds": seconds, "gpuPods": len(costs)}


def pod_cost(pod: Mapping[str, Any], gpus: int) -> dict[str, float] | None:
    """A finished pod's GPU-seconds: ``total`` (its ``gpus`` × its run time), split into the runs its warm-up
    summaries timed and ``other``, so that the parts add up to the total; ``None`` for a pod not finished
    or with no container that ran.

    The times are the kubelet's (each container's ``state.terminated.startedAt``/``finishedAt``, which
    the kubelet sets from the container runtime's status: pkg/kubelet/kuberuntime's
    ``toKubeContainerStatus``), the GPUs the pod's request: neither is the pod's to write. The
    ``runs`` the pod reports are bounded by them (:func:`bounded_runs`).
    """
    if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
        return None
    seconds = pod_seconds(pod)
    if seconds is None:
        return None
    reported: dict[str, float] = dict.fromkeys(RUNS, 0.0)
    for _, _, terminated in terminated_containers([pod]):
        for run, value in warm_runs(parse_warm_summary(terminated.get("message"))).items():
            reported[run] += value
    runs = bounded_runs(reported, seconds)
    cost = {run: gpus * value for run, value in runs.items()}
    total = gpus * seconds
    return {TOTAL: total, **cost, OTHER_RUN: max(0.0, total - sum(cost.values()))}


def pod_seconds(pod: Mapping[str, Any]) -> float | None:
    """How long a pod's containers ran: from the first one's start to the last one's end (init containers
    run first, one at a time, so the pod held its GPUs all along), or ``None`` when none ran."""
    starts: list[datetime.datetime] = []
    ends: list[datetime.datetime] = []
    for _, _, terminated in terminated_containers([pod]):
        start, end = _instant(terminated.get("startedAt")), _instant(terminated.get("finishedAt"))
        # A container that never started has the zero time as its start (the kubelet's StartError): not a run.
        if start is not None and end is not None and start.timestamp() > 0 and end >= start:
            starts.append(start)
            ends.append(end)
    if not starts:
        return None
    return (max(ends) - min(starts)).total_seconds()


def _instant(value: Any) -> datetime.datetime | None:
    """An RFC 3339 time as the API server writes it, or ``None``."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        when = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=datetime.UTC)


def warm_runs(summary: Mapping[str, Any] | None) -> dict[str, float]:
    """The wall seconds of each run a warm-up summary's ``runs`` times (``first``, ``resumed``, ``verify``).

    The pod writes it, so anything else is left out, not refused: an absent field (an older image, an
    expiry summary), a run this operator does not know, and a value that is not a finite non-negative
    number. The cost's total comes from the kubelet's times and stands whatever the pod says.
    """
    runs = (summary or {}).get("runs")
    if not isinstance(runs, Mapping):
        return {}
    found: dict[str, float] = {}
    for run in RUNS:
        value = runs.get(run)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        # An int is compared as an int (float() of ±10**400 raises): past what a float holds, no seconds.
        if isinstance(value, int) and not 0 <= value <= sys.float_info.max:
            continue
        if math.isfinite(value) and value >= 0:
            found[run] = float(value)
    return found


def bounded_runs(runs: Mapping[str, float], seconds: float) -> dict[str, float]:
    """The runs' seconds bounded by the pod's run time: each at most ``seconds``, and together too (scaled
    down alike when they say more: the kubelet's times have whole seconds, and the pod may lie)."""
    clipped = {run: min(max(0.0, runs.get(run, 0.0)), seconds) for run in RUNS}
    said = sum(clipped.values())
    if said <= seconds or said <= 0:
        return clipped
    return {run: value * seconds / said for run, value in clipped.items()}


def rounded(parts: Mapping[str, float]) -> dict[str, float]:
    """GPU-seconds for the status, to the millisecond; ``other`` is what the rounded runs leave of the total,
    so that the parts still add up to it."""
    total = round(parts[TOTAL], 3)
    runs = {run: round(parts[run], 3) for run in RUNS}
    runs = {run: min(value, total) for run, value in runs.items()}
    return {TOTAL: total, **runs, OTHER_RUN: round(max(0.0, total - sum(runs.values())), 3)}


def mapping_or_empty(value: Any) -> Mapping[str, Any]:
    """``value`` if it is an object, else empty (a record of another version, or edited by hand)."""
    return value if isinstance(value, Mapping) else {}


def cache_cost(pools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``status.cost``: the GPU-seconds of the pools' recorded warm-ups (their current Jobs), summed per run,
    and how many pools and pods they count. Expiry Jobs request no GPU, so nothing of theirs is in it."""
    costs = [mapping_or_empty(pool.get("gpuSeconds")) for pool in pools if "gpuSeconds" in pool]
    summed = {part: sum(_float(cost.get(part)) for cost in costs) for part in (TOTAL, *RUNS, OTHER_RUN)}
    return {
        "gpuSeconds": rounded(summed),
        "pools": len(costs),
        "pods": sum(_int(pool.get("gpuPods")) for pool in pools if "gpuSeconds" in pool),
    }


def _int(value: Any) -> int:
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


def _float(value: Any) -> float:
    try:
        return max(0.0, float(value or 0.0))
    except (TypeError, ValueError):
        return 0.0


def unschedulable_reason(pool: Pool) -> str | None:
    """Why no warm-up pod of the pool can ever be scheduled on its nodes, or ``None`` (no node: none to judge)."""
    if pool.nodes > 0 and pool.gpus_per_pod > pool.gpus_per_node:
        return (
            f"gpusPerPod={pool.gpus_per_pod} but the pool's nodes have {pool.gpus_per_node} "
            f"allocatable {pool.gpu_resource}"
        )
    return None


# Phases in which training pods may start on the cache: Ready, and Degraded, whose warm-up has
# settled (the pools that warmed are served and expired; a pod of a failed pool would wait in vain).
SERVING = (READY, DEGRADED)


def phase_of(pools: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """The cache's phase and message from its pools' states (before expiry)."""
    active = [pool for pool in pools if pool.get("state") != POOL_NO_NODES]
    if not active:
        return PENDING, "no schedulable node matches any pool; waiting for nodes"
    warming = [_with_reason(pool) for pool in active if pool.get("state") not in (*FINISHED, *NOT_WARMED)]
    failed = [label(pool) for pool in active if pool.get("state") in NOT_WARMED]
    if warming:
        done = len(active) - len(warming)
        return (
            WARMING,
            f"warming {len(warming)} of {len(active)} pools ({done} finished): {', '.join(warming)}",
        )
    if not failed:
        return READY, f"all {len(active)} pools warmed"
    if len(failed) < len(active):
        return DEGRADED, f"warm-up failed on {len(failed)} of {len(active)} pools: {', '.join(failed)}"
    return FAILED, f"warm-up failed on every pool: {', '.join(failed)}"


def settled(status: Mapping[str, Any]) -> bool:
    """Whether a Failed status is the warm-up's end: it has pools and every one that could run has failed.

    Training is not held for such a cache (``gates.CACHE_FAILED``): nothing will warm until the spec or
    the cluster changes (a pool whose node never came failed at its capacityTimeout). A Failed status
    without pools (bad input, the policy, a pass's error) holds training until its ``gateTimeout``, as before.
    """
    pools = [pool for pool in status.get("pools") or [] if pool.get("state") != POOL_NO_NODES]
    return status.get("phase") == FAILED and bool(pools) and all(pool.get("state") in NOT_WARMED for pool in pools)


def is_stuck(pool: Mapping[str, Any]) -> bool:
    """Whether a ``status.pools[]`` entry says its Job's pod is stuck now (``podstate``)."""
    # A finished pool's OOM kill is history; a live Job's pod is stuck now (a pool failed past the deadline too).
    live = pool.get("state") in (POOL_PENDING, POOL_RUNNING)
    return pool.get("reason") in podstate.REASONS and (live or pool.get("reason") in podstate.STUCK)


def stuck_reasons(status: Mapping[str, Any]) -> list[str]:
    """The reason of every stuck pod a status records: the pools', and the expiry's (its ``Expired`` condition)."""
    reasons = [str(pool["reason"]) for pool in status.get("pools") or [] if is_stuck(pool)]
    expired = _condition_of(status, "Expired")
    if expired.get("reason") in podstate.REASONS:
        reasons.append(str(expired["reason"]))
    return reasons


def with_reason(status: Mapping[str, Any]) -> dict[str, Any]:
    """``status`` with its ``reason`` (the printer column): what a pod is stuck on, else what a failed
    pool's pod died of (``OOMKilled``), else the Ready condition's reason where it says more than the
    phase (``InvalidSpec``...); no ``reason`` otherwise."""
    result = {key: value for key, value in status.items() if key != "reason"}
    stuck = stuck_reasons(status)
    ready = _condition_of(status, READY_CONDITION)
    # A pool that failed on its pod (OOMKilled) says more than the phase Failed or Degraded.
    killed = [pool["reason"] for pool in status.get("pools") or [] if _pod_failure(pool)]
    reason = (stuck or killed or [ready.get("reason")])[0]
    if reason and reason != status.get("phase"):
        result["reason"] = str(reason)
    return result


def _pod_failure(pool: Mapping[str, Any]) -> bool:
    return pool.get("state") == POOL_FAILED and pool.get("reason") in podstate.REASONS


def _with_reason(pool: Mapping[str, Any]) -> str:
    """A warming pool's label, with the reason its pod is stuck on (so `kubectl get cc -o wide` shows it)."""
    reason = pool.get("reason")
    return f"{label(pool)} ({reason})" if reason in (*podstate.REASONS, QUEUED) else label(pool)


def label(pool: Mapping[str, Any]) -> str:
    """A ``status.pools[]`` entry for humans: its pool's name, and its topology when multi-host."""
    hosts = _int(pool.get("hosts")) or 1
    return str(pool.get("name")) if hosts == 1 else f"{pool.get('name')} ({hosts} hosts)"


def key(pool: Mapping[str, Any]) -> tuple[str, int]:
    """What identifies a ``status.pools[]`` entry: (pool, hosts); a record from before topologies is 1 host."""
    return str(pool.get("name")), _int(pool.get("hosts")) or 1


def keeps_serving(old: Mapping[str, Any], spec_hash: str, phase: str) -> bool:
    """Whether a Ready cache stays Ready while this pass re-warms or re-expires it.

    A scheduled re-warm, a lifecycle-only change or a new pool does not make the published
    entries wrong: training pods keep using them (and are not gated) while the refresh runs.
    A change of what is compiled (a new spec hash) does, and the cache is not Ready until
    the new warm-up is done.
    """
    return old.get("phase") == READY and old.get("specHash") == spec_hash and phase in (WARMING, EXPIRING)


def pools_ready(pools: Sequence[Mapping[str, Any]]) -> str:
    """``READY/TOTAL`` over the pools that have nodes, for the printer column."""
    active = [pool for pool in pools if pool.get("state") != POOL_NO_NODES]
    ready = [pool for pool in active if pool.get("state") == POOL_SUCCEEDED]
    return f"{len(ready)}/{len(active)}"


def condition(
    type_: str,
    status: bool,
    reason: str,
    message: str,
    *,
    now: str,
    generation: int | None,
    previous: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A condition; ``lastTransitionTime`` moves only when its status changes."""
    value = "True" if status else "False"
    old = next((c for c in previous if c.get("type") == type_), None)
    since = old["lastTransitionTime"] if old and old.get("status") == value and old.get("lastTransitionTime") else now
    result: dict[str, Any] = {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
    }
    if generation is not None:
        result["observedGeneration"] = generation
    return result


NAMED = 10  # names a message lists; the rest are counted


def some_of(names: Sequence[str], limit: int = NAMED) -> str:
    """``a, b, c`` for a few names, ``a, ..., j and 3 more`` past ``limit``: a message stays short."""
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def transitions(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Event]:
    """The Events that moving from status ``old`` to ``new`` deserves: phase and pool state changes."""
    troubles: list[Event] = []  # a pool's stuck pod or refused report: its own Event, after the states
    old_pools = {key(pool): pool for pool in old.get("pools") or []}
    # Pools that changed to the same state for the same reason share one Event ("pools a, b: Pending
    # (...)"): a new cache of 3 pools posts one, not 3; a thousand caches, a thousand (each is a write).
    changed: dict[tuple[str, str, str], list[str]] = {}
    for pool in new.get("pools") or []:
        before = old_pools.get(key(pool), {})
        if (before.get("state"), before.get("job")) != (pool.get("state"), pool.get("job")):
            type_ = "Warning" if pool.get("state") in NOT_WARMED else "Normal"
            changed.setdefault((type_, str(pool.get("state")), str(pool.get("message", ""))), []).append(label(pool))
        if pool.get("reason") in podstate.REASONS and _family(before) != _family(pool):
            message = f"pool {label(pool)}: {pool.get('message', '')}"
            troubles.append(Event("Warning", str(pool["reason"]), message))
        if _int(pool.get("disruptions")) > _int(before.get("disruptions")) and before.get("job") == pool.get("job"):
            said = f"the warm-up pod was disrupted ({pool['disruptions']} so far); the Job retries it"
            message = pool.get("message", "") if pool.get("reason") == PREEMPTED else said
            troubles.append(Event("Warning", PREEMPTED, f"pool {label(pool)}: {message}"))
        if pool.get("reason") == REPORT_REFUSED and before.get("reason") != REPORT_REFUSED:
            troubles.append(Event("Warning", REPORT_REFUSED, f"pool {label(pool)}: {pool.get('message', '')}"))
    events = [
        Event(type_, f"Pool{state}", f"pool{'s' if len(labels) > 1 else ''} {some_of(labels)}: {state} ({why})")
        for (type_, state, why), labels in changed.items()
    ] + troubles
    expired = [_condition_of(status_, "Expired") for status_ in (old, new)]
    if expired[1].get("reason") == REPORT_REFUSED and expired[0].get("reason") != REPORT_REFUSED:
        events.append(Event("Warning", REPORT_REFUSED, f"expiry: {expired[1].get('message', '')}"))
    if (old.get("phase"), old.get("message")) != (new.get("phase"), new.get("message")) and (
        old.get("phase") != new.get("phase") or new.get("phase") == FAILED
    ):
        type_ = "Warning" if new.get("phase") in WARNING_PHASES else "Normal"
        reason = _failure_reason(new) if new.get("phase") == FAILED else str(new.get("phase"))
        events.append(Event(type_, reason, str(new.get("message", ""))))
    return events


def _condition_of(status_: Mapping[str, Any], type_: str) -> Mapping[str, Any]:
    found: Mapping[str, Any] = next((c for c in status_.get("conditions") or [] if c.get("type") == type_), {})
    return found


def _family(pool: Mapping[str, Any]) -> str:
    reason = str(pool.get("reason") or "")
    return podstate.Problem(reason, "").family()


def _failure_reason(status: Mapping[str, Any]) -> str:
    ready = _condition_of(status, READY_CONDITION)
    return str(ready.get("reason") or FAILED)
