"""What a warm-up or expiry pod is stuck on, read from its status (pure functions, no I/O).

A Job with ``active > 0`` says nothing about whether its pod runs: the pod may wait for a
node (``PodScheduled=False``, ``Unschedulable``, with the scheduler's message), for its image
(``ErrImagePull``/``ImagePullBackOff``), for its configuration (``CreateContainerConfigError``),
or its last attempt may have been killed for memory (``OOMKilled``). ``status.py`` puts what
:func:`problem` finds into ``status.pools[]`` (reason and message), and ``plan.py`` into the
``Progressing`` condition, the Events and (``metrics.py``) a gauge, as a Deployment's
``Progressing`` condition says why its rollout does not progress.

A pod that waits on something that does not heal by itself (:data:`STUCK`) for longer than
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

# Reasons, as the kubelet and the scheduler write them (and so as `kubectl describe pod` shows them).
UNSCHEDULABLE = "Unschedulable"
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
STUCK = (UNSCHEDULABLE, ERR_IMAGE_PULL, IMAGE_PULL_BACKOFF, INVALID_IMAGE_NAME, CREATE_CONTAINER_CONFIG_ERROR)
STUCK_DEADLINE_SECONDS = 600  # 10 min: long enough for a cluster autoscaler to add a node, or a large image
REASONS = (UNSCHEDULABLE, *WAITING, OOM_KILLED)

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


def problem(pods: Sequence[Mapping[str, Any]]) -> Problem | None:
    """What a running Job's live pod is stuck on (the newest first; a multi-host Job has one per process,
    and one stuck process holds them all); else an earlier attempt's OOM kill; else ``None``."""
    newest = sorted(pods, key=_created, reverse=True)
    for pod in newest:  # finished attempts are skipped: only a Pending or Running pod is stuck
        found = _stuck(pod)
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


def past_deadline(found: Problem, now: str) -> bool:
    """Whether ``found`` does not heal by itself and has lasted longer than :data:`STUCK_DEADLINE_SECONDS`."""
    if found.reason not in STUCK or not found.since:
        return False
    try:
        waited = _time(now) - _time(found.since)
    except ValueError:
        return False
    return waited.total_seconds() > STUCK_DEADLINE_SECONDS


def _stuck(pod: Mapping[str, Any]) -> Problem | None:
    pod_status = pod.get("status") or {}
    if pod_status.get("phase") not in (None, "Pending", "Running"):
        return None
    for condition in pod_status.get("conditions") or []:
        scheduled = (condition.get("type"), condition.get("status"), condition.get("reason"))
        if scheduled == ("PodScheduled", "False", UNSCHEDULABLE):
            since = condition.get("lastTransitionTime") or _created(pod) or None
            return Problem(UNSCHEDULABLE, str(condition.get("message") or "no node fits the pod"), since)
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
