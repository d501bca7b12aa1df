"""Manifests the operator creates: warm-up Jobs, their headless Services and cache claims (pure functions, no I/O).

A single-host warm-up (``warmup.topologies[].hosts`` 1, the default) is one pod. A multi-host
one is an Indexed Job of ``hosts`` pods, one JAX process per pod on distinct nodes, plus a
headless Service that gives pod 0 the DNS name every process reaches the coordinator at
(``<job>-0.<service>``, see :func:`coordinator_env`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from compilecache import frameworks
from compilecache.cache import cacheenv
from compilecache.cache.cacheenv import GROUP_CONNECT_TIMEOUT, GROUP_COORDINATOR, GROUP_PORTS, GROUP_PROCESSES
from compilecache.controller import api, queueing
from compilecache.controller import runtime as runtime_
from compilecache.controller.api import SINGLE_HOST, CacheSpec, PodTemplate, SpecError, Topology, Workload
from compilecache.controller.pools import Pool

LABEL_CACHE = "compilecache.dev/cache"  # on Jobs and claims; on pods it is the training opt-in label
LABEL_POOL = "compilecache.dev/pool"
LABEL_WARMUP_OF = "compilecache.dev/warmup-of"  # on warm-up pods instead of LABEL_CACHE
# On every pod the operator creates (warm-up, expiry): such a pod is never a training consumer,
# whatever a podSelector says; the chart's webhooks exclude it (DoesNotExist) so it is never even sent.
LABEL_ROLE = "compilecache.dev/role"
ANNOTATION_SPEC_HASH = "compilecache.dev/spec-hash"
ANNOTATION_REWARM = "compilecache.dev/rewarm"  # any new value re-runs the warm-up of every pool
# On a multi-host warm-up's pods (its Service selects them, its anti-affinity spreads them) and Service.
LABEL_WARMUP_JOB = "compilecache.dev/warmup-job"
LABEL_HOSTS = "compilecache.dev/hosts"  # on multi-host warm-up Jobs and Services only
HOSTNAME_LABEL = "kubernetes.io/hostname"
# Container i of a multi-host pod coordinates on COORDINATOR_PORT + GROUP_PORTS * i: the warmer
# uses port..port+3 for its own process groups, and init containers run one after the other, so a
# later container never meets a port its predecessor's coordinator may still hold (TIME_WAIT).
COORDINATOR_PORT = 8476

RUN_AS_USER = 65532  # the distroless "nonroot" uid: any non-zero uid the image does not need to know
TMP_DIR = "/tmp"
REPORT_PATH = f"{TMP_DIR}/compilecache-report.json"
TERMINATION_LOG = "/dev/termination-log"  # the report's summary: the operator reads it into status.pools[]
HASH_LENGTH = 8
NAME_MAX = 63  # the Job controller copies the Job name into a pod label, which is at most 63 characters
# An Indexed Job's pods get the hostname <job name>-<index>, a DNS label (at most 63): the name of
# a multi-host Job leaves room for the longest index (HOSTS_MAX - 1).
MULTIHOST_NAME_MAX = NAME_MAX - len(f"-{api.HOSTS_MAX - 1}")
_NOT_DNS_LABEL = re.compile(r"[^a-z0-9-]")


def cache_hash(cache: Mapping[str, Any], spec: CacheSpec) -> str:
    """A short hash of everything in the cache's spec that changes what gets compiled.

    Lifecycle, schedule, consumers, Job limits and pool placement are left out: changing
    them starts no warm-up. ``compilecache.dev/rewarm`` is left out too (it is in
    :func:`pool_hash`, like the schedule's slot): a rewarm re-runs the same compilation, so the
    published entries stay right and a Ready cache keeps serving while it refreshes.
    """
    warmup = spec.warmup
    material: dict[str, Any] = {
        "cacheDir": spec.cache_dir,
        "mountPath": spec.mount_path,
        "image": warmup.image,
        "workloads": [_workload_material(workload) for workload in warmup.workloads],
        "jax": [warmup.jax.min_compile_time_secs, warmup.jax.min_entry_size_bytes, warmup.jax.xla_flags],
        # Always null: the key stays so that every hash (and Job name) is what it was when the
        # annotation was part of it; a cache that carried one re-warms once after the upgrade.
        "rewarm": None,
    }
    if warmup.pod_template is not None:  # absent without one: those caches keep their Job names
        # Training's env and the arguments a workload takes from it can enter the key (a flag a
        # script reads); its volumes, mounts and ServiceAccount cannot, so changing them starts
        # no warm-up. (The image is warmup.image.)
        template = warmup.pod_template
        material["template"] = {
            "env": [dict(item) for item in template.env],
            "envFrom": [dict(item) for item in template.env_from],
            "workingDir": template.working_dir,
            "args": {w.name: list(template.script_args(w)) for w in warmup.workloads if w.script and not w.args},
        }
    return digest(material)


def pool_hash(
    cache: Mapping[str, Any],
    spec: CacheSpec,
    pool: Pool,
    slot: str | None = None,
    topology: Topology = SINGLE_HOST,
) -> str:
    """The hash of one pool's warm-up: the cache's hash, the pool's device count and its workloads.

    ``slot``: the latest ``spec.schedule`` time that has come (``units.cron_slot``); a new slot
    gives new Job names, and so a periodic re-warm (and, after it, a new expiry). ``topology``:
    a multi-host one adds its host count (the process count is in the cache key).
    """
    material: dict[str, Any] = {
        "cache": cache_hash(cache, spec),
        "name": cache.get("metadata", {}).get("name"),
        "pool": pool.name,
        "gpus": [pool.gpu_resource, pool.gpus_per_pod],
        "workloads": [workload.name for workload in pool.workloads],
    }
    if slot is not None:  # absent, not null: hashes of unscheduled caches stay what they were
        material["slot"] = slot
    rewarm = (cache.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_REWARM)
    if rewarm is not None:  # a new value gives new Job names: a fresh run of every pool
        material["rewarm"] = rewarm
    if topology.multi_host:  # absent for one host: single-host hashes (and Job names) stay what they were
        material["hosts"] = topology.hosts
    return digest(material)


def job_name(cache_name: str, pool_name: str, spec_hash: str, topology: Topology = SINGLE_HOST) -> str:
    """A deterministic Job name: the same cache, pool, topology and hash always give the same name.

    A multi-host Job's name (``<cache>-<pool>-h<hosts>-<hash>``) is also its Service's name and
    the stem of its pods' hostnames, so it is a DNS-1035 label (a letter first: ``cc-`` is put
    in front of a cache name that starts with a digit; ``.`` becomes ``-``) of at most
    :data:`MULTIHOST_NAME_MAX` characters.
    """
    if not topology.multi_host:
        stem = f"{cache_name}-{pool_name}"[: NAME_MAX - HASH_LENGTH - 1].rstrip("-.")
        return f"{stem}-{spec_hash}"
    suffix = f"-h{topology.hosts}-{spec_hash}"
    stem = _NOT_DNS_LABEL.sub("-", f"{cache_name}-{pool_name}".lower())
    if not stem[:1].isalpha():
        stem = f"cc-{stem}"
    return f"{stem[: MULTIHOST_NAME_MAX - len(suffix)].rstrip('-')}{suffix}"


def service_name(job: str) -> str:
    """The headless Service of a multi-host warm-up Job: named like the Job (a DNS-1035 label already)."""
    return job


def common_labels(cache_name: str, component: str) -> dict[str, str]:
    """The ``app.kubernetes.io`` labels of everything the operator creates for a cache."""
    return {
        "app.kubernetes.io/name": "compilecache",
        "app.kubernetes.io/instance": cache_name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "compilecache-operator",
        "app.kubernetes.io/managed-by": "compilecache-operator",
    }


def owner_reference(cache: Mapping[str, Any]) -> dict[str, Any]:
    """An ownerReference to the cache, so Kubernetes deletes what it owns with it."""
    meta = cache["metadata"]
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def pod_security_context(run_as_user: int | None = RUN_AS_USER) -> dict[str, Any]:
    """The pod securityContext of every pod the operator runs: non-root, RuntimeDefault seccomp.

    ``run_as_user`` (the policy's ``runAsUser``) is also the group and the fsGroup (so the pod can write
    the claim it mounts); ``None`` leaves all three to the platform: OpenShift's restricted SCC assigns
    them from the namespace's ranges, and refuses a pod that pins its own.
    """
    context: dict[str, Any] = {"runAsNonRoot": True}
    if run_as_user is not None:
        context |= {
            "runAsUser": run_as_user,
            "runAsGroup": run_as_user,
            "fsGroup": run_as_user,
            "fsGroupChangePolicy": "OnRootMismatch",
        }
    return context | {"seccompProfile": {"type": "RuntimeDefault"}}


def container_security_context() -> dict[str, Any]:
    """The container securityContext: read-only root filesystem, no privilege escalation, no capabilities."""
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def warmup_job(
    cache: Mapping[str, Any],
    spec: CacheSpec,
    pool: Pool,
    slot: str | None = None,
    topology: Topology = SINGLE_HOST,
    *,
    run_as_user: int | None = RUN_AS_USER,
    runtime: runtime_.Runtime | None = None,
) -> dict[str, Any]:
    """The warm-up Job of one pool and topology: runs ``compilecache warm`` on the pool's nodes with its GPUs.

    With a ``runtime`` (the operator's, :mod:`compilecache.controller.runtime`), the image's own Python
    runs the injected package (``python3 -m compilecache.cli warm``); without, the image's ``compilecache``.

    For ``topology.hosts`` > 1: an Indexed Job of that many pods (``backoffLimit`` 0: a retried
    index cannot rejoin a process group that moved on), one per node (required pod
    anti-affinity), in the subdomain of its headless Service (:func:`warmup_service`), each
    container told the coordinator and the process count (:func:`coordinator_env`).

    Raises :class:`compilecache.controller.api.SpecError` (``metadata.name``) for a cache name
    that is no label value: the Job would carry it as one and the API server refuse the Job; and
    (naming the template) with a ``runtime`` that training's env, volumes or mounts leave no room for.
    """
    meta = cache["metadata"]
    name = api.check_cache_name(meta.get("name"))
    spec_hash = pool_hash(cache, spec, pool, slot, topology)
    job = job_name(name, pool.name, spec_hash, topology)
    warmup = spec.warmup

    cache_mounts = []
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}]
    if spec.pvc is not None:
        volumes.append({"name": "cache", "persistentVolumeClaim": {"claimName": spec.pvc.claim_name}})
        cache_mounts.append({"name": "cache", "mountPath": spec.mount_path})
    mounts = [{"name": "tmp", "mountPath": TMP_DIR}, *cache_mounts]
    template = warmup.pod_template
    if template is not None:
        volumes += template_volumes(template)
        mounts += template_mounts(template)

    resources = container_resources(spec, pool.gpu_resource, pool.gpus_per_pod)

    def container(container_name: str, command: list[str], index: int) -> dict[str, Any]:
        # No longer than the Job may run at all (its activeDeadlineSeconds).
        connect = min(warmup.capacity_timeout_seconds, warmup.active_deadline_seconds)
        extra = coordinator_env(job, topology, index, connect) if topology.multi_host else {}
        spec_: dict[str, Any] = {
            "name": container_name,
            "image": warmup.image,
            "command": command,
            "env": _container_env(spec, pool, extra),
            "volumeMounts": mounts,
            **({"envFrom": [dict(item) for item in template.env_from]} if template and template.env_from else {}),
            **({"workingDir": template.working_dir} if template and template.working_dir else {}),
            "securityContext": container_security_context(),
            # A failed warm-up's last log lines become its termination message: the pool's status says why.
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }
        if warmup.image_pull_policy:
            spec_["imagePullPolicy"] = warmup.image_pull_policy
        if resources:
            spec_["resources"] = resources
        return spec_

    # Scripts each run as their own `compilecache warm --script` invocation, one after
    # the other (init containers run in order); entrypoints share one invocation.
    scripts = [w for w in pool.workloads if w.script is not None]
    entrypoints = [w for w in pool.workloads if w.entrypoint is not None]
    if template is not None:  # a script workload without args runs with training's (PodTemplate.script_args)
        scripts = [dataclasses.replace(w, args=template.script_args(w)) for w in scripts]
    commands = [runtime_.command(runtime, _warm_command(spec, [w], topology.hosts)) for w in scripts]
    if entrypoints:
        commands.append(runtime_.command(runtime, _warm_command(spec, entrypoints)))
    *init_commands, main_command = commands
    init_containers = [container(f"warm-{index}", command, index) for index, command in enumerate(init_commands)]

    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "nodeSelector": dict(pool.node_selector),
        "securityContext": pod_security_context(run_as_user),
        "containers": [container("warm", main_command, len(init_containers))],
        "volumes": volumes,
    }
    if init_containers:
        pod_spec["initContainers"] = init_containers
    if runtime is not None:
        # Training's env, volumes and mounts (the template's) and the workloads' env are in this pod: where
        # they leave the runtime out, python3 -m compilecache.cli would fail to start for no reason a
        # status names, so the spec is refused, naming what is in the way.
        skipped = runtime_.inject(
            pod_spec, [*init_containers, *pod_spec["containers"]], runtime, container_security_context()
        )
        if skipped:
            raise SpecError(
                template.origin if template is not None else "spec.warmup.workloads",
                f"leaves no room for the operator's injected runtime ({'; '.join(dict.fromkeys(skipped))})",
            )
    if pool.tolerations:
        pod_spec["tolerations"] = [dict(toleration) for toleration in pool.tolerations]
    pod_spec |= identity(spec)

    job_labels = {**common_labels(name, "warmup"), LABEL_CACHE: name, LABEL_POOL: pool.name}
    # Warm-up pods must not carry the training opt-in label: the admission webhook would
    # gate them on the very cache they are filling.
    pod_labels = {
        **common_labels(name, "warmup"),
        LABEL_WARMUP_OF: name,
        LABEL_POOL: pool.name,
        LABEL_ROLE: "warmup",
    }
    job_spec: dict[str, Any] = {
        "backoffLimit": warmup.backoff_limit,
        "activeDeadlineSeconds": warmup.active_deadline_seconds,
        "ttlSecondsAfterFinished": warmup.ttl_seconds_after_finished,
        "podFailurePolicy": POD_FAILURE_POLICY,
        "template": {"metadata": {"labels": pod_labels}, "spec": pod_spec},
    }
    if topology.multi_host:
        job_labels[LABEL_HOSTS] = str(topology.hosts)
        pod_labels[LABEL_WARMUP_JOB] = job
        pod_spec["subdomain"] = service_name(job)
        # One process per node: two on one node would share its GPUs, and compile for the wrong topology.
        same_job = {"matchLabels": {LABEL_WARMUP_JOB: job}}
        pod_spec["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": same_job, "topologyKey": HOSTNAME_LABEL}
                ]
            }
        }
        # A lost pod fails the whole warm-up: its process group cannot take a newcomer. The
        # operator's own re-run policy (a new spec hash, compilecache.dev/rewarm) starts a new one.
        job_spec |= {
            "backoffLimit": 0,
            "completionMode": "Indexed",
            "completions": topology.hosts,
            "parallelism": topology.hosts,
        }
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job,
            "namespace": meta.get("namespace"),
            "labels": job_labels,
            "annotations": {ANNOTATION_SPEC_HASH: spec_hash},
            "ownerReferences": [owner_reference(cache)],
        },
        "spec": job_spec,
    }
    return queueing.apply(manifest, spec)


def container_resources(spec: CacheSpec, gpu_resource: str, gpus: int) -> dict[str, dict[str, Any]]:
    """The resources of a warm-up container: ``warmup.resources``, and the pool's ``gpus`` as a limit of
    ``gpu_resource`` (the request defaults to it, as for every extended resource)."""
    resources: dict[str, dict[str, Any]] = {
        kind: dict(spec.warmup.resources.get(kind) or {}) for kind in ("requests", "limits")
    }
    if gpus > 0:
        resources["limits"][gpu_resource] = gpus
    return {kind: values for kind, values in resources.items() if values}


def warmup_service_account(spec: CacheSpec) -> str | None:
    """The ServiceAccount the warm-up and expiry pods run as: ``warmup.serviceAccountName``, which for GCS
    defaults to (and is required with) the cache's writer; else, for a PVC cache, training's.

    A GCS cache never takes training's: the writer's identity is the only guard of the prefix, and
    training pods must never have it (``admission.reader_account``).
    """
    template = spec.warmup.pod_template
    if spec.warmup.service_account_name or spec.gcs is not None:
        return spec.warmup.service_account_name
    return template.service_account_name if template else None


def identity(spec: CacheSpec) -> dict[str, Any]:
    """The pod spec fields that say who a warm-up or expiry pod is and what it may pull: its
    ServiceAccount (:func:`warmup_service_account`) and pull Secrets (``warmup.imagePullSecrets``, then
    a training template's). The expiry Job runs with exactly the warm-up's: it reads and deletes
    what the warm-up wrote, from the same image."""
    fields: dict[str, Any] = {}
    account = warmup_service_account(spec)
    if account:
        fields["serviceAccountName"] = account
    template = spec.warmup.pod_template
    pull_secrets = dict.fromkeys([*spec.warmup.image_pull_secrets, *(template.image_pull_secrets if template else ())])
    if pull_secrets:
        fields["imagePullSecrets"] = [{"name": secret} for secret in pull_secrets]
    return fields


def template_volumes(template: PodTemplate) -> list[dict[str, Any]]:
    """Training's volumes for a warm-up: as they are, each claim read-only (the warm-up must not write data)."""
    volumes = []
    for volume in template.volumes:
        copy = dict(volume)
        if "persistentVolumeClaim" in copy:
            copy["persistentVolumeClaim"] = {**copy["persistentVolumeClaim"], "readOnly": True}
        volumes.append(copy)
    return volumes


def template_mounts(template: PodTemplate) -> list[dict[str, Any]]:
    """Training's mounts for a warm-up: read-only, except an emptyDir's (a scratch volume of the pod's own).

    A script writes what it writes into its scratch workdir (under /tmp) or its emptyDirs; a data
    claim, a csi or an ephemeral volume may be training's shared data, and a write there is a side
    effect training would see. ConfigMaps, Secrets and projected volumes are read-only anyway.
    A mount keeps its name, path and subPath; its propagation is dropped (the warm-up shares
    no mounts with the node).
    """
    scratch = {str(volume["name"]) for volume in template.volumes if api.volume_type(volume) == "emptyDir"}
    mounts = []
    for mount in template.volume_mounts:
        # Only where and what: no mountPropagation (Bidirectional needs a privileged container).
        copy = {key: mount[key] for key in ("name", "mountPath", "subPath", "subPathExpr") if key in mount}
        mounts.append(copy if mount.get("name") in scratch else {**copy, "readOnly": True})
    return mounts


def coordinator_env(job: str, topology: Topology, index: int, connect_seconds: float) -> dict[str, str]:
    """The env that makes container ``index`` (init containers first) of a multi-host pod one process of N.

    Every pod reaches process 0 at ``<job>-0.<service>`` (its hostname in the Service's
    subdomain); Kubernetes injects each pod's own index as ``JOB_COMPLETION_INDEX``. The first
    container waits ``connect_seconds`` (the cache's capacityTimeout) for the others: the Job asks for
    every host at once, and on an autoscaled pool the last node may come that much after the first.
    """
    port = COORDINATOR_PORT + GROUP_PORTS * index
    return {
        GROUP_COORDINATOR: f"{job}-0.{service_name(job)}:{port}",
        GROUP_PROCESSES: str(topology.hosts),
        # jax.distributed takes whole seconds as a C int.
        **({GROUP_CONNECT_TIMEOUT: str(min(max(1, round(connect_seconds)), 2**31 - 1))} if index == 0 else {}),
    }


# A pod failed by a disruption (a spot node reclaimed, a drain, preemption) is retried without counting
# against backoffLimit: the kubelet, the eviction API, the taint manager, PodGC and the scheduler's
# preemption each add the condition DisruptionTarget before the pod ends ("Pod disruption conditions",
# Kubernetes 1.26+; the Job controller's podFailurePolicy documents exactly this rule). A retried warm-up
# starts clean: what the cut pod compiled was never published (the warmer publishes at its end).
POD_FAILURE_POLICY: dict[str, Any] = {
    "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
}


def warmup_service(job: Mapping[str, Any]) -> dict[str, Any]:
    """The headless Service of a multi-host warm-up Job (``warmup_job``): DNS names for its pods.

    ``publishNotReadyAddresses``: the pods have no readiness probe to pass, and process 0 must be
    found while it is starting. No ports: a headless Service only publishes the pods' addresses.
    Owned by the cache (the Job's owner), so it goes with the cache; the operator deletes it as
    soon as its Job has finished or is superseded (``plan.py``).
    """
    meta = job["metadata"]
    name = str(meta["name"])
    labels = dict(meta["labels"]) | {LABEL_WARMUP_JOB: name}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(name),
            "namespace": meta.get("namespace"),
            "labels": labels,
            "ownerReferences": [dict(ref) for ref in meta["ownerReferences"]],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_WARMUP_JOB: name},
        },
    }


def claim(cache: Mapping[str, Any], spec: CacheSpec) -> dict[str, Any] | None:
    """The PersistentVolumeClaim to create for the cache, or ``None`` if the user brings their own."""
    if spec.pvc is None or spec.pvc.create is None:
        return None
    name = api.check_cache_name(cache["metadata"].get("name"))  # a label value below
    metadata: dict[str, Any] = {
        "name": spec.pvc.claim_name,
        "namespace": cache["metadata"].get("namespace"),
        "labels": {**common_labels(name, "cache"), LABEL_CACHE: name},
    }
    # Owned (and so deleted with the cache) only when the user asked: compiled code is
    # expensive to rebuild, and a cache may outlive the resource that first filled it.
    if spec.pvc.delete_with_cache:
        metadata["ownerReferences"] = [owner_reference(cache)]
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata,
        "spec": {
            "accessModes": list(spec.pvc.create.access_modes),
            "resources": {"requests": {"storage": spec.pvc.create.size}},
        },
    }
    if spec.pvc.create.storage_class_name:
        body["spec"]["storageClassName"] = spec.pvc.create.storage_class_name
    return body


def _warm_command(spec: CacheSpec, workloads: list[Workload], hosts: int = 1) -> list[str]:
    """The warm-up container's command: the framework's, with this Job's report and summary paths."""
    outputs = ["--report", REPORT_PATH, "--termination-log", TERMINATION_LOG]
    return frameworks.get(spec.framework).warm_command(spec, workloads, hosts, outputs)


def warmup_env(spec: CacheSpec) -> dict[str, str]:
    """The cache environment of a warm-up container: the framework's (JAX's key settings, PyTorch's switches)."""
    return frameworks.get(spec.framework).warmup_env(spec)


def _container_env(spec: CacheSpec, pool: Pool, extra: Mapping[str, str]) -> list[dict[str, Any]]:
    # The read-only root filesystem leaves /tmp as the only writable place besides the cache.
    # ``extra`` (a multi-host container's coordinator) wins over a workload's env like the cache settings.
    base = {**warmup_env(spec), "TMPDIR": TMP_DIR, "HOME": TMP_DIR, cacheenv.IMAGE: spec.warmup.image, **extra}
    # Then the workloads' env, then training's (the template's): a workload's env is the warm-up's own
    # setting of what training sets, so it wins over the template's.
    env: list[dict[str, Any]] = [{"name": key, "value": value} for key, value in sorted(base.items())]
    seen = set(base)
    template_env = spec.warmup.pod_template.env if spec.warmup.pod_template is not None else ()
    for item in [*(item for workload in pool.workloads for item in workload.env), *template_env]:
        if item["name"] not in seen:  # the cache settings win: they must equal the trainers'
            seen.add(item["name"])
            env.append(dict(item))
    return env


def _workload_material(workload: Workload) -> dict[str, Any]:
    return {
        "name": workload.name,
        "entrypoint": workload.entrypoint,
        "script": workload.script,
        "args": list(workload.args),
        "env": [dict(item) for item in workload.env],
        # Only when set: a cache without them keeps its Job names across this upgrade.
        **({"steps": workload.steps} if workload.steps is not None else {}),
        **({"stepFn": workload.step_fn} if workload.step_fn is not None else {}),
        **({"budget": workload.budget_seconds} if workload.budget_seconds is not None else {}),
        **({"resume": workload.resume} if workload.resume is not None else {}),
        **({"resumeArgs": list(workload.resume_args)} if workload.resume_args else {}),
        **({"resumeWhen": workload.resume_when} if workload.resume_when is not None else {}),
    }


def digest(material: Mapping[str, Any]) -> str:
    """A short, stable hash of JSON-able material: for names that change exactly when it does."""
    canonical = json.dumps(material, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:HASH_LENGTH]
