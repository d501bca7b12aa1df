"""The local cluster's controllers: the Job controller, the scheduler, the kubelet and the volume binder.

One thread plays them all against the local API server, over HTTP, as the real ones do
against kube-apiserver:

* the **volume binder** marks every PersistentVolumeClaim ``Bound`` (one local directory per
  claim, ``<root>/volumes/<namespace>/<claim>``, shared by every pod that mounts it);
* the **Job controller** creates one pod at a time from a Job's template (``generateName``
  ``<job>-``, the ``job-name`` and ``controller-uid`` labels, an ownerReference), through the
  API and so through admission; it counts succeeded and failed pods, retries a failed one
  while ``failed <= backoffLimit`` (at once: the real controller backs off 10 s, 20 s, ...),
  fails the Job at ``activeDeadlineSeconds`` (deleting its running pod), and writes
  ``startTime``, ``completionTime``, ``active``/``succeeded``/``failed`` and the conditions
  (``SuccessCriteriaMet`` + ``Complete``, or ``FailureTarget`` + ``Failed``, as Kubernetes 1.31+).
  An **Indexed Job** (``completionMode: Indexed``) gets up to ``parallelism`` pods at once, one
  per pending index, lowest first, made as the real controller makes them (``pod_for``): name
  ``<job>-<index>-<suffix>``, ``hostname: <job>-<index>``, the ``batch.kubernetes.io/job-completion-index``
  annotation and label, and ``JOB_COMPLETION_INDEX`` from that label in every container. It is
  Complete once every index has a succeeded pod (``status.completedIndexes``, ``succeeded`` =
  the count of them); a Job that fails deletes its other active pods, so no peer waits on a dead one;
* the **scheduler** binds a pod to a simulated node that its tolerations, nodeSelector and
  required pod anti-affinity allow (``nodes.rejection``), only once its ``schedulingGates`` are
  empty (until then: ``PodScheduled=False``, ``SchedulingGated``); a pod that fits no node stays
  Pending with ``PodScheduled=False``, ``Unschedulable`` and the scheduler's message, and is
  tried again on every pass; there is no resource accounting;
* the **cluster DNS** (``dns.py``): every Indexed Job with a pod ``subdomain`` gets a block of
  free local ports while it runs, and its pods' host names are rewritten to this machine;
* the **kubelet** runs the pod's init containers in order, then its containers, each as a
  local process (``pods.run_container``), and records ``containerStatuses[].state.terminated``
  and the pod's phase. A pod deleted while running has its processes killed. It simulates an
  image pull failure and the OOM killer (``pods.py``: an image named with ``nonexistent``, ``limits.memory``).
"""

from __future__ import annotations

import copy
import datetime
import functools
import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from compilecache.local import dns
from compilecache.local import pods as podrun
from compilecache.local.apiserver import now_rfc3339
from compilecache.local.client import KubeClient, KubeError
from compilecache.local.nodes import rejection, unschedulable_message

logger = logging.getLogger(__name__)

PODS, JOBS, NODES, PVCS = "v1/pods", "batch/v1/jobs", "v1/nodes", "v1/persistentvolumeclaims"
SERVICES = "v1/services"
DEFAULT_BACKOFF_LIMIT = 6  # the Job API's default
INDEX_KEY = dns.INDEX_KEY  # batch.kubernetes.io/job-completion-index: annotation and label of an Indexed Job's pod
INDEX_ENV = "JOB_COMPLETION_INDEX"
MAX_GENERATED_NAME = 58  # names.MaxGeneratedNameLength: 63 less the 5-character random suffix


def _conditions(job: Mapping[str, Any]) -> set[str]:
    return {c.get("type") for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}


def is_finished(job: Mapping[str, Any]) -> bool:
    """Whether the Job has its terminal condition."""
    return bool(_conditions(job) & {"Complete", "Failed"})


def completion_index(pod: Mapping[str, Any]) -> int | None:
    """The pod's completion index (its annotation, as the real controller reads it), or ``None``."""
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(INDEX_KEY)
    try:
        index = int(value) if value is not None else -1
    except ValueError:
        return None
    return index if index >= 0 else None


def format_indexes(indexes: Sequence[int]) -> str:
    """``status.completedIndexes``: sorted, runs of 3+ as ``first-last``, a pair as ``a,b`` (as the controller)."""
    runs: list[list[int]] = []
    for index in sorted(set(indexes)):
        if runs and index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return ",".join(str(a) if a == b else f"{a},{b}" if b == a + 1 else f"{a}-{b}" for a, b in runs)


def job_verdict(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], now: datetime.datetime) -> dict[str, Any]:
    """What the Job controller does next (pure): ``{"status": ..., "create": [index or None], "kill": [pod names]}``.

    ``status`` is the Job's new status (its counts, and conditions once it is finished); ``create``
    lists the pods to create: their completion indexes for an Indexed Job, ``[None]`` for the next
    pod of another Job, ``[]`` for none.
    """
    spec = job.get("spec") or {}
    old = job.get("status") or {}
    indexed = dns.is_indexed(job)
    completions = int(spec.get("completions") or 1)
    phases = [(pod.get("status") or {}).get("phase") for pod in pods]
    succeeded, failed = phases.count("Succeeded"), phases.count("Failed")
    active = [
        pod["metadata"]["name"] for pod, phase in zip(pods, phases, strict=True) if phase not in ("Succeeded", "Failed")
    ]
    done: list[int] = []
    if indexed:  # an index counts once, however many of its pods succeeded
        done = sorted(
            {
                i
                for pod, phase in zip(pods, phases, strict=True)
                if phase == "Succeeded" and (i := completion_index(pod)) is not None and i < completions
            }
        )
        succeeded = len(done)
    start = old.get("startTime") or _format(now)
    status: dict[str, Any] = {"startTime": start, "active": len(active), "succeeded": succeeded, "failed": failed}
    if done:
        status["completedIndexes"] = format_indexes(done)
    stamp = _format(now)
    deadline = spec.get("activeDeadlineSeconds")
    if succeeded >= completions:
        status["completionTime"] = stamp
        status["conditions"] = [_condition("SuccessCriteriaMet", stamp), _condition("Complete", stamp)]
        return {"status": status, "create": [], "kill": active}
    if failed > int(spec.get("backoffLimit", DEFAULT_BACKOFF_LIMIT)):
        message = "Job has reached the specified backoff limit"
        status["conditions"] = _failed(stamp, "BackoffLimitExceeded", message)
        return {"status": status, "create": [], "kill": active}
    if deadline is not None and (now - _parse(start)).total_seconds() >= float(deadline):
        message = "Job was active longer than specified deadline"
        status["conditions"] = _failed(stamp, "DeadlineExceeded", message)
        status["active"] = 0
        return {"status": status, "create": [], "kill": active}
    if spec.get("suspend"):
        return {"status": status, "create": [], "kill": []}
    if not indexed:
        return {"status": status, "create": [] if active else [None], "kill": []}
    busy = set(done) | {
        i
        for pod, phase in zip(pods, phases, strict=True)
        if phase not in ("Succeeded", "Failed") and (i := completion_index(pod)) is not None
    }
    room = max(int(spec.get("parallelism", 1)) - len(active), 0)
    pending = [index for index in range(completions) if index not in busy][:room]  # lowest first, as the controller
    return {"status": status, "create": pending, "kill": []}


def pod_for(job: Mapping[str, Any], index: int | None = None) -> dict[str, Any]:
    """A new pod of the Job, as the Job controller makes it from the template (``index``: of an Indexed Job).

    An indexed pod is named ``<job>-<index>-<suffix>`` (``podGenerateNameWithIndex``), carries
    its index as annotation and label (``batch.kubernetes.io/job-completion-index``), has
    ``hostname: <job>-<index>``, and every container gets ``JOB_COMPLETION_INDEX`` from that
    label unless it sets the variable itself (``addCompletionIndexEnvVariables``).
    """
    meta, template = job["metadata"], (job.get("spec") or {}).get("template") or {}
    name, uid = meta["name"], meta["uid"]
    labels = dns.pod_labels(job, index)
    generate_name = f"{name}-"
    if index is not None:
        suffix = f"-{index}-"
        generate_name = f"{name}{suffix}"
        if len(generate_name) > MAX_GENERATED_NAME:
            generate_name = generate_name[: MAX_GENERATED_NAME - len(suffix)] + suffix
    pod_meta: dict[str, Any] = {
        "generateName": generate_name,
        "labels": labels,
        "ownerReferences": [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": name,
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if annotations := (template.get("metadata") or {}).get("annotations"):
        pod_meta["annotations"] = dict(annotations)
    spec = copy.deepcopy(dict(template.get("spec") or {}))
    if index is not None:
        pod_meta["annotations"] = {**pod_meta.get("annotations", {}), INDEX_KEY: str(index)}
        spec["hostname"] = f"{name}-{index}"
        reference = {"fieldRef": {"fieldPath": f"metadata.labels['{INDEX_KEY}']"}}
        for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            env = container.setdefault("env", [])
            if not any(item.get("name") == INDEX_ENV for item in env):
                env.append({"name": INDEX_ENV, "valueFrom": reference})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": spec}


def choose_node(
    pod: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]], placed: Sequence[Mapping[str, Any]] = ()
) -> str | None:
    """The first node (by name) the pod fits on, given the ``placed`` pods (bound and live), or ``None``."""
    by_name = {node["metadata"]["name"]: node for node in nodes}
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        if rejection(pod, node, placed, by_name) is None:
            return str(node["metadata"]["name"])
    return None


def unschedulable(
    pod: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]], placed: Sequence[Mapping[str, Any]]
) -> str:
    """Why no node takes the pod, as the scheduler's message says it."""
    by_name = {node["metadata"]["name"]: node for node in nodes}
    return unschedulable_message([rejection(pod, node, placed, by_name) for node in nodes])


def is_placed(pod: Mapping[str, Any]) -> bool:
    """Whether the pod occupies its node for the scheduler: bound and not finished."""
    phase = (pod.get("status") or {}).get("phase")
    return bool((pod.get("spec") or {}).get("nodeName")) and phase not in ("Succeeded", "Failed")


class Controllers:
    """The controllers of the local cluster, in one thread (``start``/``stop``)."""

    def __init__(self, client: KubeClient, root: Path, image: podrun.Image, interval: float = 0.1) -> None:
        self.client = client
        self.root = root
        self.image = image
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="local-controllers", daemon=True)
        self._running: dict[tuple[str, str], podrun.PodRun] = {}
        self._lock = threading.Lock()
        # The cluster DNS's port blocks: Job uid → (first port, size), while the Job runs.
        self._blocks: dict[str, tuple[int, int]] = {}

    def start(self) -> None:
        """Start the controller thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and kill every process still running."""
        self._stop.set()
        self._thread.join(30)
        with self._lock:
            runs = list(self._running.values())
        for run in runs:
            run.kill()
        for run in runs:
            run.join(30)

    def _loop(self) -> None:
        # Polling, not watching: a handful of objects, and every pass is idempotent.
        while not self._stop.wait(self.interval):
            try:
                self.step()
            except Exception:  # a controller survives one bad pass, as the real ones do
                logger.exception("local cluster: a controller pass failed")

    def step(self) -> None:
        """One pass of every controller."""
        self._bind_claims()
        self._sync_jobs()
        self._sync_pods()

    # --- the volume binder ------------------------------------------------------------------------

    def _bind_claims(self) -> None:
        for claim in self.client.list(PVCS):
            if (claim.get("status") or {}).get("phase") == "Bound":
                continue
            meta = claim["metadata"]
            podrun.claim_dir(self.root, meta["namespace"], meta["name"]).mkdir(parents=True, exist_ok=True)
            spec = claim.get("spec") or {}
            size = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
            status = {"phase": "Bound", "accessModes": spec.get("accessModes") or [], "capacity": {"storage": size}}
            self.client.patch(PVCS, meta["name"], {"status": status}, meta["namespace"], subresource="status")

    # --- the Job controller -----------------------------------------------------------------------

    def _sync_jobs(self) -> None:
        all_pods = self.client.list(PODS)
        jobs = self.client.list(JOBS)
        self._sync_blocks([job for job in jobs if not is_finished(job)])
        for job in jobs:
            if is_finished(job):
                continue
            meta = job["metadata"]
            owned = [
                pod
                for pod in all_pods
                if pod["metadata"].get("namespace") == meta["namespace"]
                and any(ref.get("uid") == meta["uid"] for ref in pod["metadata"].get("ownerReferences") or [])
            ]
            verdict = job_verdict(job, owned, datetime.datetime.now(tz=datetime.UTC))
            for name in verdict["kill"]:
                self._delete_pod(meta["namespace"], name)
            refused = False
            for index in verdict["create"]:
                try:
                    self.client.create(PODS, pod_for(job, index), meta["namespace"])
                except KubeError as exc:  # e.g. refused by a webhook: the real controller retries too
                    logger.warning("local cluster: creating a pod of Job %s failed: %s", meta["name"], exc)
                    refused = True
                    break
                verdict["status"]["active"] += 1
            if refused and not verdict["status"]["active"]:
                continue
            if _changed(job.get("status") or {}, verdict["status"]):
                self.client.patch(JOBS, meta["name"], {"status": verdict["status"]}, meta["namespace"], "status")

    # --- the cluster DNS's port blocks ------------------------------------------------------------

    def _sync_blocks(self, running: Sequence[Mapping[str, Any]]) -> None:
        """Give every running Indexed Job with a pod subdomain its own free ports; free those of finished Jobs."""
        wanted = {job["metadata"]["uid"]: job for job in running if dns.indexed_hosts(job)}
        with self._lock:
            for uid in set(self._blocks) - set(wanted):
                del self._blocks[uid]
            reserved = {port for base, size in self._blocks.values() for port in range(base, base + size)}
            for uid, job in wanted.items():
                if uid in self._blocks:
                    continue
                size = dns.job_block_size(job)
                base = dns.allocate_block(size, reserved)
                self._blocks[uid] = (base, size)
                reserved.update(range(base, base + size))

    def host_table(self, namespace: str) -> dns.HostTable:
        """The cluster DNS names a pod of ``namespace`` resolves now (read when each of its containers starts)."""
        with self._lock:
            blocks = {uid: base for uid, (base, _) in self._blocks.items()}
        if not blocks:
            return {}
        jobs, services = self.client.list(JOBS), self.client.list(SERVICES)
        for job in jobs:
            if job["metadata"]["uid"] in blocks and not dns.job_hosts(job, services):
                # What a real pod would see as NXDOMAIN (until the Service appears; here for good).
                logger.warning(
                    "local cluster: Job %s/%s has no headless Service %r selecting its pods: its names do not resolve",
                    job["metadata"].get("namespace"),
                    job["metadata"]["name"],
                    dns.indexed_hosts(job)[0][1],
                )
        return dns.host_table(namespace, jobs, services, blocks)

    def _delete_pod(self, namespace: str, name: str) -> None:
        try:
            self.client.delete(PODS, name, namespace)
        except KubeError as exc:
            if exc.status != 404:
                raise

    # --- the scheduler and the kubelet ------------------------------------------------------------

    def _sync_pods(self) -> None:
        pods = self.client.list(PODS)
        live = {(pod["metadata"]["namespace"], pod["metadata"]["name"]): pod for pod in pods}
        with self._lock:
            for key, run in list(self._running.items()):
                if key not in live or live[key]["metadata"].get("uid") != run.uid:
                    run.kill()  # deleted while running (its Job's deadline, or its owner went)
                if not run.is_alive():
                    del self._running[key]
        nodes: list[dict[str, Any]] = []
        nodes_read = False
        placed = [pod for pod in pods if is_placed(pod)]  # grows as this pass binds pods
        for key, pod in live.items():
            phase = (pod.get("status") or {}).get("phase")
            if phase not in (None, "Pending") or key in self._running:
                continue
            spec = pod.get("spec") or {}
            if spec.get("schedulingGates"):
                self._set_scheduled(
                    pod, "False", "SchedulingGated", "Scheduling is blocked due to non-empty scheduling gates"
                )
                continue
            if not spec.get("nodeName"):
                if not nodes_read:
                    nodes, nodes_read = self.client.list(NODES), True
                node = choose_node(pod, nodes, placed)
                if node is None:
                    self._set_scheduled(pod, "False", "Unschedulable", unschedulable(pod, nodes, placed))
                    continue
                pod = self.client.patch(PODS, key[1], {"spec": {"nodeName": node}}, key[0])
                placed.append(pod)
            run = podrun.PodRun(self.client, self.root, self.image, pod, functools.partial(self.host_table, key[0]))
            with self._lock:
                self._running[key] = run
            run.start()

    def _set_scheduled(self, pod: Mapping[str, Any], status: str, reason: str, message: str) -> None:
        conditions = (pod.get("status") or {}).get("conditions") or []
        wanted = {"type": "PodScheduled", "status": status, "reason": reason, "message": message}
        if any({k: c.get(k) for k in wanted} == wanted for c in conditions):
            return
        wanted["lastTransitionTime"] = now_rfc3339()
        meta = pod["metadata"]
        self.client.patch(
            PODS, meta["name"], {"status": {"phase": "Pending", "conditions": [wanted]}}, meta["namespace"], "status"
        )


def _changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    keys = ("active", "succeeded", "failed", "conditions", "completionTime", "startTime")
    return any((old.get(k) or None) != (new.get(k) or None) for k in keys)


def _condition(type_: str, stamp: str, reason: str | None = None, message: str | None = None) -> dict[str, Any]:
    condition = {"type": type_, "status": "True", "lastProbeTime": stamp, "lastTransitionTime": stamp}
    if reason:
        condition |= {"reason": reason, "message": message or ""}
    return condition


def _failed(stamp: str, reason: str, message: str) -> list[dict[str, Any]]:
    return [_condition("FailureTarget", stamp, reason, message), _condition("Failed", stamp, reason, message)]


def _format(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(stamp: str) -> datetime.datetime:
    return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
