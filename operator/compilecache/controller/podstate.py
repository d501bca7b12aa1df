"""What a warm-up or expiry pod is stuck on, read from its status (pure functions, no I/O).

A Job with ``active > 0`` says nothing about whether its pod runs: the pod may wait for a
node (``PodScheduled=False``, ``Unschedulable``, with the scheduler's message), for its image
(``ErrImagePull``/``ImagePullBackOff``), for its configuration (``CreateContainerConfigError``),
or its last attempt may have been killed for memory (``OOMKilled``). ``status.py`` puts what
:func:`problem` finds into ``status.pools[]`` (reason and message), and ``plan.py`` into the
``Progressing`` condition, the Events and (``metrics.py``) a gauge, as a Deployment's
``Progressing`` condition says why its rollout does not progress.

A pod no node takes waits for capacity: on an autoscaled pool that pod is what makes the
autoscaler add a node. Its reason is :data:`WAITING_FOR_CAPACITY`, with the scheduler's message
and the autoscaler's last word on the pod (its Events: :func:`autoscaler_word`), or
:data:`NOT_TRIGGER_SCALE_UP` when the autoscaler said it will add none. It fails its pool once it
waited longer than the cache's ``warmup.capacityTimeout``.

A pod that waits on something else that does not heal by itself (:data:`STUCK`) for longer than
:data:`STUCK_DEADLINE_SECONDS` fails its pool with that reason; the Job is left running (a
pushed image or a new node may still let it start, as a Deployment keeps trying after its
``progressDeadlineSeconds``), and gated training pods follow their ``gateTimeout`` as always.

Every reason this module emits is in :data:`REASONS` (``docs/observability.md`` lists them).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The scheduler's reason on PodScheduled=False when no node takes the pod.
UNSCHEDULABLE = "Unschedulable"
# A pool's reasons while its pod waits for a node: a scale-up may come (or nothing said yet), or the
# autoscaler said it adds none (Cluster Autoscaler's own Event reason).
WAITING_FOR_CAPACITY = "WaitingForCapacity"
NOT_TRIGGER_SCALE_UP = "NotTriggerScaleUp"
CAPACITY = (WAITING_FOR_CAPACITY, NOT_TRIGGER_SCALE_UP)
# Reasons, as the kubelet writes them (and so as `kubectl describe pod` shows them).
ERR_IMAGE_PULL = "ErrImagePull"
IMAGE_PULL_BACKOFF = "ImagePullBackOff"
INVALID_IMAGE_NAME = "InvalidImageName"
CREATE_CONTAINER_CONFIG_ERROR = "CreateContainerConfigError"
CREATE_CONTAINER_ERROR = "CreateContainerError"
CRASH_LOOP_BACKOFF = "CrashLoopBackOff"
OOM_KILLED = "OOMKilled"
# Waiting reasons that mean a container cannot start (others, ContainerCreating and PodInitializing, are progress).
WAITING = (
    ERR_IMAGE_PULL,
    IMAGE_PULL_BACKOFF,
    INVALID_IMAGE_NAME,
    CREATE_CONTAINER_CONFIG_ERROR,
    CREATE_CONTAINER_ERROR,
    CRASH_LOOP_BACKOFF,
)
# Reasons that do not heal by themselves: past the deadline the pool fails with the reason.
STUCK = (*CAPACITY, ERR_IMAGE_PULL, IMAGE_PULL_BACKOFF, INVALID_IMAGE_NAME, CREATE_CONTAINER_CONFIG_ERROR)
STUCK_DEADLINE_SECONDS = 600  # 10 min: long enough for a large image (capacity has its own bound, the cache's)
REASONS = (*CAPACITY, *WAITING, OOM_KILLED)

# What autoscalers say on a pod they were asked to place, as Events on it (reason → whether it is a refusal).
# Cluster Autoscaler (its FAQ, "What events are emitted by CA?"; also GKE's node auto-provisioning):
# TriggeredScaleUp, NotTriggerScaleUp. Karpenter (its troubleshooting docs and the Events `kubectl
# describe pod` shows): Nominated ("Pod should schedule on: nodeclaim/..."), and FailedScheduling
# reported by karpenter itself ("Failed to schedule pod, incompatible with nodepool ...").
SCALE_UP_EVENTS = {"TriggeredScaleUp": False, "Nominated": False, NOT_TRIGGER_SCALE_UP: True}
KARPENTER = "karpenter"
EVENTS_READ_MAX = 100  # Events read per waiting pod: an autoscaler's are deduplicated (a count), so a few
MESSAGE_MAX = 1024  # characters of a pool's message taken from a pod (or an Event on it)

# The condition, as a Deployment's: False with the pod's reason while a warm-up or expiry pod is stuck.
PROGRESSING_CONDITION = "Progressing"
NO_STUCK_PODS = "NoStuckPods"  # its reason when True


@dataclass(frozen=True)
class Problem:
    """Why a pod does not progress: the reason, the message (the kubelet's or scheduler's) and since when."""

    reason: str
    message: str
    since: str | None = None  # RFC 3339; None: unknown (then no deadline applies)

    def family(self) -> str:
        """The reason with the kubelet's alternation folded (ErrImagePull ↔ ImagePullBackOff): one Event per change."""
        return IMAGE_PULL_BACKOFF if self.reason == ERR_IMAGE_PULL else self.reason


def pod_uid(pod: Mapping[str, Any]) -> str:
    """The pod's uid (namespace/name when it has none yet): what a counter remembers a pod by."""
    meta = pod.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")


@dataclass(frozen=True)
class Word:
    """An autoscaler's last Event on a pod: its reason, message, and whether it refuses to add a node."""

    reason: str
    message: str
    refused: bool


Events = Mapping[str, Sequence[Mapping[str, Any]]]  # a pod's uid → the Events about it (as read)


def waits_for_node(pod: Mapping[str, Any]) -> bool:
    """Whether the scheduler found no node for this live pod (``PodScheduled=False``, ``Unschedulable``)."""
    pod_status = pod.get("status") or {}
    if pod_status.get("phase") not in (None, "Pending"):
        return False
    return any(
        (c.get("type"), c.get("status"), c.get("reason")) == ("PodScheduled", "False", UNSCHEDULABLE)
        for c in pod_status.get("conditions") or []
    )


def waiting_pod(pods: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The newest pod that waits for a node: the one whose autoscaler Events a pass reads (one per Job)."""
    return next((pod for pod in sorted(pods, key=_created, reverse=True) if waits_for_node(pod)), None)


def autoscaler_word(events: Sequence[Mapping[str, Any]]) -> Word | None:
    """The newest Event an autoscaler posted (:data:`SCALE_UP_EVENTS`, or Karpenter's FailedScheduling), or ``None``."""
    said: list[tuple[str, Word]] = []
    for event in events:
        reason = str(event.get("reason") or "")
        source = str((event.get("source") or {}).get("component") or event.get("reportingComponent") or "")
        if reason in SCALE_UP_EVENTS:
            refused = SCALE_UP_EVENTS[reason]
        elif reason == "FailedScheduling" and source == KARPENTER:
            refused = True
        else:
            continue
        when = str(event.get("lastTimestamp") or event.get("eventTime") or _created(event))
        message = " ".join(str(event.get("message") or "").split())[:MESSAGE_MAX]
        said.append((when, Word(reason, message, refused)))
    return max(said, key=lambda item: item[0])[1] if said else None


def problem(pods: Sequence[Mapping[str, Any]], events: Events | None = None) -> Problem | None:
    """What a running Job's live pod is stuck on (the newest first; a multi-host Job has one per process,
    and one stuck process holds them all); else an earlier attempt's OOM kill; else ``None``.

    ``events``: the autoscaler's Events on a pod that waits for a node (by the pod's uid), read by the pass.
    """
    newest = sorted(pods, key=_created, reverse=True)
    for pod in newest:  # finished attempts are skipped: only a Pending or Running pod is stuck
        found = _stuck(pod, (events or {}).get(pod_uid(pod), ()))
        if found is not None:
            return found
    for pod in newest:
        for name, terminated in _terminated(pod):
            if terminated.get("reason") == OOM_KILLED:
                return Problem(OOM_KILLED, _oom_message(name, terminated), terminated.get("finishedAt"))
    return None


def oom_killed(pods: Sequence[Mapping[str, Any]]) -> Problem | None:
    """The newest container of these pods killed for memory, if any (a failed Job's cause)."""
    found = [
        (str(terminated.get("finishedAt") or ""), name, terminated)
        for pod in pods
        for name, terminated in _terminated(pod)
        if terminated.get("reason") == OOM_KILLED
    ]
    if not found:
        return None
    when, name, terminated = max(found, key=lambda item: item[0])
    return Problem(OOM_KILLED, _oom_message(name, terminated), when or None)


def disruptions(pods: Sequence[Mapping[str, Any]]) -> list[Problem]:
    """The pods ended by a disruption, oldest first: the condition ``DisruptionTarget=True`` that the kubelet
    (node shutdown, a spot reclaim), the eviction API (a drain), the taint manager, PodGC and the scheduler's
    preemption add before a pod ends ("Pod disruption conditions", Kubernetes 1.26+). Their reason is the
    condition's (``TerminationByKubelet``, ``EvictionByEvictionAPI``, ``PreemptionByScheduler``, ...)."""
    found = []
    for pod in pods:
        if (pod.get("status") or {}).get("phase") != "Failed":
            continue
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if (condition.get("type"), condition.get("status")) == ("DisruptionTarget", "True"):
                since = str(condition.get("lastTransitionTime") or _created(pod))
                said = " ".join(str(condition.get("message") or "").split())[:MESSAGE_MAX]
                name = (pod.get("metadata") or {}).get("name")
                found.append(Problem(str(condition.get("reason") or "DisruptionTarget"), f"pod {name}: {said}", since))
                break
    return sorted(found, key=lambda problem: problem.since or "")


def deadline_seconds(found: Problem, capacity_seconds: float) -> float:
    """How long ``found`` may last before its pool fails: the cache's capacity bound for a pod that waits
    for a node, :data:`STUCK_DEADLINE_SECONDS` for the rest."""
    return capacity_seconds if found.reason in CAPACITY else STUCK_DEADLINE_SECONDS


def past_deadline(found: Problem, now: str, capacity_seconds: float = STUCK_DEADLINE_SECONDS) -> bool:
    """Whether ``found`` does not heal by itself and has lasted longer than its :func:`deadline_seconds`."""
    if found.reason not in STUCK or not found.since:
        return False
    try:
        waited = _time(now) - _time(found.since)
    except ValueError:
        return False
    return waited.total_seconds() > deadline_seconds(found, capacity_seconds)


def _stuck(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> Problem | None:
    pod_status = pod.get("status") or {}
    if pod_status.get("phase") not in (None, "Pending", "Running"):
        return None
    for condition in pod_status.get("conditions") or []:
        scheduled = (condition.get("type"), condition.get("status"), condition.get("reason"))
        if scheduled == ("PodScheduled", "False", UNSCHEDULABLE):
            # Since the pod first waited: the scheduler moves lastTransitionTime only when the status changes.
            since = condition.get("lastTransitionTime") or _created(pod) or None
            said = " ".join(str(condition.get("message") or "no node fits the pod").split())
            word = autoscaler_word(events)
            if word is not None and word.refused:
                message = f"the autoscaler adds no node ({word.reason}: {word.message}); the scheduler: {said}"
                return Problem(NOT_TRIGGER_SCALE_UP, message[:MESSAGE_MAX], since)
            message = f"waiting for a node: {said}"
            if word is not None:
                message += f"; the autoscaler: {word.reason}: {word.message}"
            return Problem(WAITING_FOR_CAPACITY, message[:MESSAGE_MAX], since)
    statuses = [*(pod_status.get("initContainerStatuses") or []), *(pod_status.get("containerStatuses") or [])]
    for state in statuses:
        waiting = (state.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in WAITING:
            message = str(waiting.get("message") or waiting["reason"])
            since = pod_status.get("startTime") or _created(pod) or None
            return Problem(str(waiting["reason"]), f"container {state.get('name')}: {message}"[:1024], since)
    return None


def _terminated(pod: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    pod_status = pod.get("status") or {}
    found = []
    for state in [*(pod_status.get("initContainerStatuses") or []), *(pod_status.get("containerStatuses") or [])]:
        for where in ("state", "lastState"):
            terminated = (state.get(where) or {}).get("terminated")
            if terminated:
                found.append((str(state.get("name")), terminated))
    return found


def _oom_message(name: str, terminated: Mapping[str, Any]) -> str:
    code = terminated.get("exitCode", 137)
    return f"container {name} was killed for exceeding its memory limit (OOMKilled, exit code {code}): raise resources"


def _created(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("creationTimestamp") or "")


def _time(value: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
