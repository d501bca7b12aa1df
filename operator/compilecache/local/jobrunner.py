"""The local cluster's controllers: the Job controller, the scheduler, the kubelet and the volume binder.

One thread plays them all against the local API server, over HTTP, as the real ones do
against kube-apiserver:

* the **volume binder** marks every PersistentVolumeClaim ``Bound`` (one local directory per
  claim, ``<root>/volumes/<namespace>/<claim>``, shared by every pod that mounts it);
* the **Job controller** creates one pod at a time from a Job's template (``generateName``
  ``<job>-``, the ``job-name`` and ``controller-uid`` labels, an ownerReference), through the
  API and so through admission; it counts succeeded and failed pods, retries a failed one
  while ``failed <= backoffLimit`` (at once: the real controller backs off 10 s, 20 s, ...),
  fails the Job at ``activeDeadlineSeconds`` (deleting its running pod; a suspended Job has no
  ``startTime`` and loses its pods, so the deadline counts from its resume), and writes
  ``startTime``, ``completionTime``, ``active``/``succeeded``/``failed`` and the conditions
  (``SuccessCriteriaMet`` + ``Complete``, or ``FailureTarget`` + ``Failed``, as Kubernetes 1.31+).
  A Job's ``podFailurePolicy`` decides what a failed pod means (``failure_rule``: ``Ignore``,
  ``FailJob``, ``FailIndex``, ``Count``), as the real controller's does.
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
* the **autoscaler** (``autoscaler.py``, only where a pool declares ``max`` or ``refuse``) adds a
  node to a pool for the ``Unschedulable`` pods it would take, ``scaleUpSeconds`` later, and tells each
  pod so in an Event (``TriggeredScaleUp``/``NotTriggerScaleUp``), as Cluster Autoscaler does; before
  that, it answers the ProvisioningRequests (``provisioning.py``): their conditions, their nodes;
* **Kueue** (``kueue.py``, only where some ClusterQueue exists) makes a Workload for each Job that names
  a LocalQueue, reserves quota for it, reads its admission checks (and whether each is ``Active``), and
  unsuspends the Job once it is admitted, its template given the checks' ``podSetUpdates``, as Kueue's
  controllers do;
* the **cloud** reclaims a node (``reclaim``, or a pool's ``reclaimAfterSeconds``) as a spot
  termination does: its pods get ``DisruptionTarget`` and end ``Failed``, and the Node goes;
* the **kubelet** runs the pod's init containers in order, then its containers, each as a
  local process (``pods.run_container``), and records ``containerStatuses[].state.terminated``
  and the pod's phase. A pod deleted while running has its processes killed. It simulates an
  image pull failure and the OOM killer (``pods.py``: an image named with ``nonexistent``, ``limits.memory``).
"""

from __future__ import annotations

import collections
import copy
import datetime
import functools
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from compilecache.local import autoscaler, dns, kueue, provisioning
from compilecache.local import pods as podrun
from compilecache.local.apiserver import now_rfc3339
from compilecache.local.client import KubeClient, KubeError
from compilecache.local.nodes import NodePool, is_placed, rejection, unschedulable_message
from compilecache.local.nodes import node as pool_node
from compilecache.local.nodes import nodes as pool_nodes

logger = logging.getLogger(__name__)

PODS, JOBS, NODES, PVCS = "v1/pods", "batch/v1/jobs", "v1/nodes", "v1/persistentvolumeclaims"
SERVICES, EVENTS = "v1/services", "v1/events"
PODTEMPLATES, PROVREQS = "v1/podtemplates", provisioning.RESOURCE
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."  # pkg/kubelet/nodeshutdown
KILLED = 137  # SIGKILL's exit code in a container (128 + 9)
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


def failure_rule(job: Mapping[str, Any], pod: Mapping[str, Any]) -> tuple[str, str | None]:
    """What the Job's ``podFailurePolicy`` does with a failed pod (pure): its action, and for ``FailJob`` the message.

    As the Job controller (``pkg/controller/job/pod_failure_policy.go``, the Job docs' "Pod failure
    policy"): the rules in order, the first that matches applies; ``onExitCodes`` matches a terminated
    container (``containerName``: only that one; containers, then init containers) whose exit code is not
    0 and is ``In``/``NotIn`` ``values``; ``onPodConditions`` matches a pod condition of that ``type``
    with that ``status`` (default ``True``). No policy, or no rule that matches: ``Count``.
    """
    rules = ((job.get("spec") or {}).get("podFailurePolicy") or {}).get("rules") or []
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    where = f"{meta.get('namespace')}/{meta.get('name')}"
    for index, rule in enumerate(rules):
        action, said = str(rule.get("action")), None
        if (codes := rule.get("onExitCodes")) is not None:
            if (container := _exit_code_match(status, codes)) is not None:
                code = container["state"]["terminated"].get("exitCode")
                said = f"Container {container.get('name')} for pod {where} failed with exit code {code}"
        elif (condition := _condition_match(status, rule.get("onPodConditions") or [])) is not None:
            said = f"Pod {where} has condition {condition.get('type')}"
        if said is not None:
            return action, f"{said} matching {action} rule at index {index}" if action == "FailJob" else None
    return "Count", None


def _exit_code_match(status: Mapping[str, Any], requirement: Mapping[str, Any]) -> Mapping[str, Any] | None:
    values = requirement.get("values") or []
    wanted = requirement.get("operator") == "In"
    for container in [*(status.get("containerStatuses") or []), *(status.get("initContainerStatuses") or [])]:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated is None or requirement.get("containerName") not in (None, container.get("name")):
            continue
        code = terminated.get("exitCode")
        if code != 0 and (code in values) == wanted:
            return container
    return None


def _condition_match(status: Mapping[str, Any], patterns: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    for condition in status.get("conditions") or []:
        for pattern in patterns:
            wanted = (pattern.get("type"), pattern.get("status", "True"))  # status defaults to True (API defaulting)
            if (condition.get("type"), condition.get("status")) == wanted:
                return condition
    return None


def job_verdict(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], now: datetime.datetime) -> dict[str, Any]:
    """What the Job controller does next (pure): ``{"status": ..., "create": [index or None], "kill": [pod names]}``.

    ``status`` is the Job's new status (its counts, and conditions once it is finished); ``create``
    lists the pods to create: their completion indexes for an Indexed Job, ``[None]`` for the next
    pod of another Job, ``[]`` for none. A failed pod goes through ``podFailurePolicy``
    (:func:`failure_rule`): ``Ignore`` drops it (not in ``failed``, not against ``backoffLimit``: a new
    pod replaces it), ``FailJob`` fails the Job (reason ``PodFailurePolicy``), ``FailIndex`` ends an
    Indexed Job's index (it is counted and not retried; the Job fails with ``FailedIndexes`` once no index
    is left to run), ``Count`` counts it. The API requires ``restartPolicy: Never`` and, for ``FailIndex``,
    ``backoffLimitPerIndex``; the emulator checks neither (``FailIndex`` on a Job that is not Indexed counts).
    """
    spec = job.get("spec") or {}
    old = job.get("status") or {}
    indexed = dns.is_indexed(job)
    completions = int(spec.get("completions") or 1)
    verdicts = [
        failure_rule(job, pod) if (pod.get("status") or {}).get("phase") == "Failed" else ("", None) for pod in pods
    ]
    kept = [(pod, verdict) for pod, verdict in zip(pods, verdicts, strict=True) if verdict[0] != "Ignore"]
    pods = [pod for pod, _ in kept]
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
    ended = sorted(
        {
            i
            for pod, (action, _) in kept
            if indexed and action == "FailIndex" and (i := completion_index(pod)) is not None and i < completions
        }
        - set(done)
    )
    suspended = bool(spec.get("suspend"))
    # A suspended Job has no startTime (cleared when it is suspended, set again when it resumes), so
    # activeDeadlineSeconds counts from the resume (the Job API reference: status.startTime, spec.suspend).
    start = None if suspended else old.get("startTime") or _format(now)
    status: dict[str, Any] = {"startTime": start, "active": len(active), "succeeded": succeeded, "failed": failed}
    if done:
        status["completedIndexes"] = format_indexes(done)
    if ended:
        status["failedIndexes"] = format_indexes(ended)
    stamp = _format(now)
    deadline = spec.get("activeDeadlineSeconds")
    # The controller checks a FailJob rule before success and the backoff limit (syncJob).
    fail_job = next((message for action, message in verdicts if action == "FailJob"), None)
    if fail_job is not None:
        status["conditions"] = _failed(stamp, "PodFailurePolicy", fail_job or "")
        return {"status": status, "create": [], "kill": active}
    if succeeded >= completions:
        status["completionTime"] = stamp
        status["conditions"] = [_condition("SuccessCriteriaMet", stamp), _condition("Complete", stamp)]
        return {"status": status, "create": [], "kill": active}
    if failed > int(spec.get("backoffLimit", DEFAULT_BACKOFF_LIMIT)):
        message = "Job has reached the specified backoff limit"
        status["conditions"] = _failed(stamp, "BackoffLimitExceeded", message)
        return {"status": status, "create": [], "kill": active}
    if deadline is not None and start is not None and (now - _parse(start)).total_seconds() >= float(deadline):
        message = "Job was active longer than specified deadline"
        status["conditions"] = _failed(stamp, "DeadlineExceeded", message)
        status["active"] = 0
        return {"status": status, "create": [], "kill": active}
    if suspended:  # the controller deletes a suspended Job's active pods (the Job docs' "Suspending a Job")
        return {"status": status, "create": [], "kill": active}
    if not indexed:
        return {"status": status, "create": [] if active else [None], "kill": []}
    busy = (
        set(done)
        | set(ended)
        | {
            i
            for pod, phase in zip(pods, phases, strict=True)
            if phase not in ("Succeeded", "Failed") and (i := completion_index(pod)) is not None
        }
    )
    if ended and not active and len(busy) >= completions:
        status["conditions"] = _failed(stamp, "FailedIndexes", "Job has failed indexes")
        return {"status": status, "create": [], "kill": []}
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


class Controllers:
    """The controllers of the local cluster, in one thread (``start``/``stop``)."""

    def __init__(
        self,
        client: KubeClient,
        root: Path,
        images: podrun.Images,
        interval: float = 0.1,
        pools: Sequence[NodePool] = (),
        expire_after: datetime.timedelta = provisioning.EXPIRE_AFTER,
    ) -> None:
        """``pools``: the node pools the cluster started with (their nodes already created), for the
        autoscaler and reclaims; ``expire_after``: how long a ProvisioningRequest may stay unprovisioned
        before it fails (``Expired``; Cluster Autoscaler's 7 days)."""
        self.client = client
        self.root = root
        self.images = images
        self.interval = interval
        self.pools = tuple(pools)
        # The cloud's side: node → pool of the nodes that exist, the nodes coming, the next index per pool.
        self._members = {n["metadata"]["name"]: pool.name for pool in self.pools for n in pool_nodes([pool])}
        self._upcoming: list[autoscaler.Upcoming] = []
        self._next_index = {pool.name: pool.count for pool in self.pools}
        self._serving: dict[str, str] = {}  # pod uid → the upcoming node it waits for
        self._said: dict[str, tuple[str, str]] = {}  # pod uid → the autoscaler's last (reason, message) to it
        self._reclaimed: set[str] = set()  # pools whose reclaimAfterSeconds was spent
        self.expire_after = expire_after
        self._awaiting: dict[str, tuple[str, ...]] = {}  # ProvisioningRequest uid → the coming nodes it waits for
        self._step_lock = threading.Lock()  # a reclaim and a pass never interleave
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
        with self._step_lock:
            self._bind_claims()
            self._sync_kueue()
            self._sync_jobs()
            self._sync_pods()
            if any(pool.autoscaled or pool.reclaim_after_seconds is not None for pool in self.pools):
                self._autoscale()

    # --- the autoscaler and the cloud -------------------------------------------------------------

    def _autoscale(self) -> None:
        now = time.monotonic()
        for upcoming in [u for u in self._upcoming if u.due <= now]:
            pool = next(p for p in self.pools if p.name == upcoming.pool)
            self.client.create(NODES, pool_node(pool, upcoming.index))
            self._members[upcoming.name] = pool.name
            self._upcoming.remove(upcoming)
        pods = self.client.list(PODS)
        wall = datetime.datetime.now(tz=datetime.UTC)
        for name in autoscaler.due_reclaims(self.pools, self._members, pods, wall, self._reclaimed):
            self._reclaimed.add(self._members[name])
            self._reclaim(name)
            pods = self.client.list(PODS)
        if not any(pool.autoscaled for pool in self.pools):
            return
        nodes = self.client.list(NODES)
        self._provision(nodes, pods, now)
        plan = autoscaler.plan(
            self.pools, self._sizes(), self._next_index, nodes, self._upcoming, pods, self._serving, now
        )
        self._add(plan.grow)
        self._serving = plan.serving
        uids = {pod["metadata"].get("uid") for pod in pods}
        self._said = {uid: said for uid, said in self._said.items() if uid in uids}
        for pod, reason, message in plan.said:
            uid = pod["metadata"]["uid"]
            if self._said.get(uid) != (reason, message):  # one Event per change of what it says
                self._said[uid] = (reason, message)
                self._post(pod, reason, message)

    def _sizes(self) -> collections.Counter[str]:
        """Each pool's nodes, present and coming."""
        return collections.Counter([*self._members.values(), *(u.pool for u in self._upcoming)])

    def _add(self, grow: Sequence[autoscaler.Upcoming]) -> None:
        self._upcoming += grow
        for upcoming in grow:
            self._next_index[upcoming.pool] = upcoming.index + 1

    def _provision(self, nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]], now: float) -> None:
        """Answer the ProvisioningRequests (``provisioning.decide``), one after the other: each sees the
        nodes the ones before it added."""
        requests = self.client.list(PROVREQS)
        templates: dict[str, dict[str, Mapping[str, Any]]] = {}
        if requests:
            for template in self.client.list(PODTEMPLATES):
                meta = template["metadata"]
                templates.setdefault(meta["namespace"], {})[meta["name"]] = template
        wall = datetime.datetime.now(tz=datetime.UTC)
        awaiting: dict[str, tuple[str, ...]] = {}
        for request in requests:
            meta = request["metadata"]
            decision = provisioning.decide(
                request,
                templates.get(meta["namespace"], {}),
                self.pools,
                self._sizes(),
                self._next_index,
                nodes,
                pods,
                self._awaiting.get(meta["uid"], ()),
                [u.name for u in self._upcoming],
                now,
                wall,
                self.expire_after,
            )
            self._add(decision.grow)
            if decision.awaiting:
                awaiting[meta["uid"]] = decision.awaiting
            conditions = decision.conditions
            if conditions is not None and conditions != (request.get("status") or {}).get("conditions"):
                try:
                    status = {"conditions": conditions}
                    self.client.patch(PROVREQS, meta["name"], {"status": status}, meta["namespace"], "status")
                except KubeError as exc:
                    if exc.status != 404:  # deleted meanwhile: nothing to answer
                        raise
        self._awaiting = awaiting

    def _post(self, pod: Mapping[str, Any], reason: str, message: str) -> None:
        name = f"{pod['metadata']['name']}.{time.time_ns():x}"  # as client-go's recorder names Events
        body = autoscaler.event(pod, reason, message, name, now_rfc3339())
        self.client.create(EVENTS, body, pod["metadata"]["namespace"])

    def reclaim(self, node_name: str) -> list[str]:
        """Reclaim a node as a spot termination does (``LocalCluster.reclaim``); the names of the pods it failed."""
        with self._step_lock:
            return self._reclaim(node_name)

    def _reclaim(self, node_name: str) -> list[str]:
        # As the kubelet's graceful node shutdown (the "Pod disruption conditions" and "Node shutdowns"
        # docs; pkg/kubelet/nodeshutdown): each live pod gets DisruptionTarget=True, reason
        # TerminationByKubelet, its containers are killed, and it ends Failed with reason Terminated;
        # then the node goes (the cloud deletes the instance; Karpenter deletes a reclaimed spot node).
        victims = [
            pod
            for pod in self.client.list(PODS)
            if (pod.get("spec") or {}).get("nodeName") == node_name and is_placed(pod)
        ]
        stamp = now_rfc3339()
        target = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "TerminationByKubelet",
            "message": SHUTDOWN_MESSAGE,
            "lastTransitionTime": stamp,
        }
        for pod in victims:
            kept = [c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") != target["type"]]
            pod["status"] = {**(pod.get("status") or {}), "conditions": [*kept, target]}
            self._patch_status(pod, {"conditions": pod["status"]["conditions"]})
        for pod in victims:
            key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
            with self._lock:
                run = self._running.pop(key, None)
            if run is not None:
                run.kill()
                run.join(30)
        for pod in victims:
            started = (pod.get("status") or {}).get("startTime") or stamp
            killed = [
                podrun.terminated(c["name"], KILLED, "Error", "", started)
                for c in (pod.get("spec") or {}).get("containers") or []
            ]
            final = {"phase": "Failed", "reason": "Terminated", "message": SHUTDOWN_MESSAGE}
            self._patch_status(pod, final | {"containerStatuses": killed})
        self._members.pop(node_name, None)
        try:
            self.client.delete(NODES, node_name)
        except KubeError as exc:
            if exc.status != 404:
                raise
        logger.info("local cluster: reclaimed node %s (%d pods failed)", node_name, len(victims))
        return [pod["metadata"]["name"] for pod in victims]

    def _patch_status(self, pod: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        meta = pod["metadata"]
        try:
            self.client.patch(PODS, meta["name"], {"status": dict(status)}, meta["namespace"], "status")
        except KubeError as exc:
            if exc.status != 404:  # deleted meanwhile: nothing to record
                raise

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

    # --- the Kueue stand-in (kueue.py) -------------------------------------------------------------

    def _sync_kueue(self) -> None:
        """Kueue's Job integration, workload controller and scheduler, where some ClusterQueue exists."""
        cluster_queues = self.client.list(kueue.CLUSTER_QUEUES)
        if not cluster_queues:
            return  # no Kueue here: queued Jobs stay suspended, as without Kueue's controllers
        stamp = now_rfc3339()
        jobs = [job for job in self.client.list(JOBS) if kueue.queue_name(job)]
        workloads: dict[tuple[str, str], Mapping[str, Any]] = {_key(w): w for w in self.client.list(kueue.WORKLOADS)}
        owned = kueue.by_uid(workloads.values())
        priorities: dict[str, int] | None = None
        workload: Mapping[str, Any] | None
        for job in jobs:
            meta = job["metadata"]
            workload = owned.get(meta["uid"])
            if workload is None and not is_finished(job):
                if priorities is None:
                    priorities = kueue.priority_values(self.client.list(kueue.PRIORITY_CLASSES))
                try:
                    workload = self.client.create(
                        kueue.WORKLOADS, kueue.workload_for(job, priorities), meta["namespace"]
                    )
                except KubeError as exc:
                    if exc.status != 409:
                        raise
                    continue  # made by an earlier pass whose list this one did not see: the next pass reads it
            elif workload is not None and (status := kueue.finished_status(workload, job, stamp)) is not None:
                workload = self._set_workload_status(workload, status)
            if workload is not None:
                workloads[_key(workload)] = owned[meta["uid"]] = workload
        local = {_key(queue): queue for queue in self.client.list(kueue.LOCAL_QUEUES)}
        checks = self._sync_cluster_queues(cluster_queues, stamp)
        cluster = {cq["metadata"]["name"]: cq for cq in cluster_queues}
        queues = kueue.Queues(local=local, cluster=cluster, checks=checks)
        for key, status in kueue.schedule(list(workloads.values()), queues, stamp).items():
            workload = self._set_workload_status(workloads[key], status)
            if kueue.is_rejected(workload):  # Kueue deactivates a Workload a check rejected
                workload = self._patch_workload(workload, {"spec": {"active": False}})
            workloads[key] = workload
        owned = kueue.by_uid(workloads.values())
        for job in jobs:
            workload = owned.get(job["metadata"]["uid"])
            if is_finished(job) or workload is None or (action := kueue.job_action(job, workload)) is None:
                continue
            meta = job["metadata"]
            try:
                body = kueue.start_patch(job, workload) if action == "unsuspend" else kueue.stop_patch(job, workload)
            except kueue.CannotStart as exc:  # Kueue gives up on the Job: its Workload finishes, the Job stays
                self._set_workload_status(workload, kueue.failed_to_start_status(workload, str(exc), stamp))
                continue
            self.client.patch(JOBS, meta["name"], body, meta["namespace"])

    def _sync_cluster_queues(
        self, cluster_queues: Sequence[Mapping[str, Any]], stamp: str
    ) -> dict[str, Mapping[str, Any]]:
        """Each ClusterQueue's ``Active`` condition, from its AdmissionChecks; answers the checks by name."""
        named = any(kueue.check_names(cq) for cq in cluster_queues)
        listed = self.client.list(kueue.ADMISSION_CHECKS) if named else []
        checks: dict[str, Mapping[str, Any]] = {check["metadata"]["name"]: check for check in listed}
        for cq in cluster_queues:
            if (status := kueue.cluster_queue_status(cq, checks, stamp)) is not None:
                name = cq["metadata"]["name"]
                try:
                    self.client.patch(kueue.CLUSTER_QUEUES, name, {"status": status}, subresource="status")
                except KubeError as exc:
                    if exc.status != 404:  # deleted meanwhile: nothing to write
                        raise
        return checks

    def _set_workload_status(self, workload: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, Any]:
        old = workload.get("status") or {}
        patch = {**{k: None for k in old if k not in status}, **status}  # a merge patch drops a key with null
        return self._patch_workload(workload, {"status": patch}, "status")

    def _patch_workload(
        self, workload: Mapping[str, Any], body: Mapping[str, Any], sub: str | None = None
    ) -> dict[str, Any]:
        meta = workload["metadata"]
        try:
            return self.client.patch(kueue.WORKLOADS, meta["name"], dict(body), meta["namespace"], sub)
        except KubeError as exc:
            if exc.status != 404:  # deleted meanwhile (its Job went): nothing to write
                raise
            return dict(workload)

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
            run = podrun.PodRun(self.client, self.root, self.images, pod, functools.partial(self.host_table, key[0]))
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


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    return (str(obj["metadata"].get("namespace")), str(obj["metadata"]["name"]))


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
