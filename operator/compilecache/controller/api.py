"""The CompileCache resource: its names, and its spec parsed and validated into typed values.

The CRD's schema rejects most bad input at admission, but the operator validates
again: a CRD can be older than the operator, and a clear condition naming the
field beats a crash loop. Defaults here equal the CRD's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from compilecache.cache import units

GROUP = "compilecache.dev"
VERSION = "v1alpha1"
PLURAL = "compilecaches"
KIND = "CompileCache"
API_VERSION = f"{GROUP}/{VERSION}"

DEFAULT_MOUNT_PATH = "/var/cache/compilecache"
DEFAULT_GROUP_BY = "nvidia.com/gpu.product"
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_GATE_TIMEOUT = "30m"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_ENTRYPOINT = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_ACCESS_MODES = {"ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"}
_PULL_POLICIES = {"Always", "IfNotPresent", "Never"}
_RESERVED_ENV = {"JAX_COMPILATION_CACHE_DIR", "XLA_FLAGS"}


class SpecError(ValueError):
    """Bad input in a CompileCache spec; ``field`` is the path of the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class PVCCreate:
    size: str
    storage_class_name: str | None
    access_modes: tuple[str, ...]


@dataclass(frozen=True)
class PVCStorage:
    claim_name: str
    create: PVCCreate | None
    delete_with_cache: bool


@dataclass(frozen=True)
class GCSStorage:
    bucket: str
    prefix: str
    service_account_name: str | None
    delete_with_cache: bool

    @property
    def url(self) -> str:
        """The ``gs://bucket/prefix`` that JAX and gcsfs understand."""
        prefix = self.prefix.strip("/")
        return f"gs://{self.bucket}/{prefix}" if prefix else f"gs://{self.bucket}"


@dataclass(frozen=True)
class Workload:
    name: str
    entrypoint: str | None
    script: str | None
    args: tuple[str, ...]
    env: tuple[Mapping[str, Any], ...]
    pools: tuple[str, ...]  # empty: every pool


@dataclass(frozen=True)
class PoolSpec:
    name: str
    node_selector: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...]
    gpus_per_pod: int | None  # None: the pool's allocatable GPUs per node
    gpu_resource: str


@dataclass(frozen=True)
class Discover:
    node_selector: Mapping[str, str]
    group_by: str
    tolerations: tuple[Mapping[str, Any], ...]
    gpu_resource: str


@dataclass(frozen=True)
class JaxOptions:
    min_compile_time_secs: float = 0.0
    min_entry_size_bytes: int = 0
    xla_flags: str | None = None


@dataclass(frozen=True)
class Warmup:
    image: str
    image_pull_policy: str | None
    image_pull_secrets: tuple[str, ...]
    service_account_name: str | None
    workloads: tuple[Workload, ...]
    pools: tuple[PoolSpec, ...]
    discover: Discover | None
    resources: Mapping[str, Any]
    backoff_limit: int
    active_deadline_seconds: int
    ttl_seconds_after_finished: int
    jobs: int
    verify: bool
    jax: JaxOptions


@dataclass(frozen=True)
class Lifecycle:
    max_age_seconds: float | None = None
    max_size_bytes: int | None = None
    keep_versions: int | None = None
    verify: bool = True


@dataclass(frozen=True)
class Consumers:
    pod_selector: Mapping[str, Any] | None = None
    read_only: bool = True
    gate: bool = True
    gate_timeout_seconds: float = 1800.0
    init_containers: bool = False


@dataclass(frozen=True)
class CacheSpec:
    """A validated CompileCache spec, with the CRD's defaults applied."""

    pvc: PVCStorage | None
    gcs: GCSStorage | None
    mount_path: str
    warmup: Warmup
    schedule: str | None = None
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    consumers: Consumers = field(default_factory=Consumers)

    @property
    def cache_dir(self) -> str:
        """Where JAX reads and writes the cache: the mount path, or the GCS URL."""
        return self.gcs.url if self.gcs is not None else self.mount_path


def parse_spec(spec: Mapping[str, Any] | None) -> CacheSpec:
    """Validate a CompileCache ``spec`` and apply defaults; raise :class:`SpecError` naming the field."""
    spec = _mapping(spec, "spec", required=True)
    storage = _mapping(spec.get("storage"), "spec.storage", required=True)
    pvc_raw, gcs_raw = storage.get("pvc"), storage.get("gcs")
    if pvc_raw is None and gcs_raw is None:
        raise SpecError("spec.storage", "set exactly one of storage.pvc or storage.gcs (neither is set)")
    if pvc_raw is not None and gcs_raw is not None:
        raise SpecError("spec.storage", "set exactly one of storage.pvc or storage.gcs (both are set)")
    pvc = _pvc(pvc_raw) if pvc_raw is not None else None
    gcs = _gcs(gcs_raw) if gcs_raw is not None else None

    mount_path = spec.get("mountPath", DEFAULT_MOUNT_PATH)
    if not isinstance(mount_path, str) or not mount_path.startswith("/") or mount_path.rstrip("/") == "":
        raise SpecError("spec.mountPath", f"must be an absolute path other than /, got {mount_path!r}")

    warmup = _warmup(_mapping(spec.get("warmup"), "spec.warmup", required=True), gcs)
    schedule = spec.get("schedule")
    if schedule is not None:
        schedule = _convert(units.check_cron, schedule, "spec.schedule")
    return CacheSpec(
        pvc=pvc,
        gcs=gcs,
        mount_path=mount_path.rstrip("/"),
        warmup=warmup,
        schedule=schedule,
        lifecycle=_lifecycle(_mapping(spec.get("lifecycle"), "spec.lifecycle")),
        consumers=_consumers(_mapping(spec.get("consumers"), "spec.consumers")),
    )


def _pvc(raw: Any) -> PVCStorage:
    pvc = _mapping(raw, "spec.storage.pvc", required=True)
    claim = pvc.get("claimName")
    if not isinstance(claim, str) or not _DNS_SUBDOMAIN.match(claim):
        raise SpecError("spec.storage.pvc.claimName", f"must be a valid claim name, got {claim!r}")
    create = None
    create_raw = pvc.get("create")
    if create_raw is not None:
        create_map = _mapping(create_raw, "spec.storage.pvc.create")
        size = create_map.get("size")
        if size is None:
            raise SpecError("spec.storage.pvc.create.size", "is required to create a claim")
        _convert(units.parse_bytes, size, "spec.storage.pvc.create.size")
        modes = tuple(_strings(create_map.get("accessModes", ["ReadWriteMany"]), "spec.storage.pvc.create.accessModes"))
        for index, mode in enumerate(modes):
            if mode not in _ACCESS_MODES:
                raise SpecError(f"spec.storage.pvc.create.accessModes[{index}]", f"unknown access mode {mode!r}")
        create = PVCCreate(
            size=str(size),
            storage_class_name=_optional_str(
                create_map.get("storageClassName"), "spec.storage.pvc.create.storageClassName"
            ),
            access_modes=modes or ("ReadWriteMany",),
        )
    delete = _bool(pvc.get("deleteWithCache", False), "spec.storage.pvc.deleteWithCache")
    if delete and create is None:
        raise SpecError(
            "spec.storage.pvc.deleteWithCache",
            "only a claim the operator creates (create) can be deleted with the cache",
        )
    return PVCStorage(claim_name=claim, create=create, delete_with_cache=delete)


def _gcs(raw: Any) -> GCSStorage:
    gcs = _mapping(raw, "spec.storage.gcs", required=True)
    bucket = gcs.get("bucket")
    if not isinstance(bucket, str) or not _BUCKET.match(bucket):
        raise SpecError("spec.storage.gcs.bucket", f"must be a GCS bucket name, got {bucket!r}")
    prefix = gcs.get("prefix", "")
    if not isinstance(prefix, str):
        raise SpecError("spec.storage.gcs.prefix", f"must be a string, got {prefix!r}")
    return GCSStorage(
        bucket=bucket,
        prefix=prefix.strip("/"),
        service_account_name=_optional_str(gcs.get("serviceAccountName"), "spec.storage.gcs.serviceAccountName"),
        delete_with_cache=_bool(gcs.get("deleteWithCache", False), "spec.storage.gcs.deleteWithCache"),
    )


def _warmup(warmup: Mapping[str, Any], gcs: GCSStorage | None) -> Warmup:
    image = warmup.get("image")
    if not isinstance(image, str) or not image.strip():
        raise SpecError("spec.warmup.image", "must name the image of the warm-up Jobs (usually the training image)")
    pull_policy = _optional_str(warmup.get("imagePullPolicy"), "spec.warmup.imagePullPolicy")
    if pull_policy is not None and pull_policy not in _PULL_POLICIES:
        raise SpecError("spec.warmup.imagePullPolicy", f"must be one of {sorted(_PULL_POLICIES)}, got {pull_policy!r}")
    pull_secrets = tuple(
        _name(
            _mapping(item, f"spec.warmup.imagePullSecrets[{index}]").get("name"),
            f"spec.warmup.imagePullSecrets[{index}].name",
        )
        for index, item in enumerate(_list(warmup.get("imagePullSecrets"), "spec.warmup.imagePullSecrets"))
    )

    pools = tuple(
        _pool(item, f"spec.warmup.pools[{index}]")
        for index, item in enumerate(_list(warmup.get("pools"), "spec.warmup.pools"))
    )
    _unique([pool.name for pool in pools], "spec.warmup.pools")
    discover_raw = warmup.get("discover")
    discover = _discover(_mapping(discover_raw, "spec.warmup.discover")) if discover_raw is not None else None
    if not pools and discover is None:
        raise SpecError("spec.warmup", "set warmup.pools, warmup.discover, or both: there is nowhere to warm")

    workloads_raw = _list(warmup.get("workloads"), "spec.warmup.workloads")
    if not workloads_raw:
        raise SpecError("spec.warmup.workloads", "must list at least one workload to compile")
    workloads = tuple(_workload(item, f"spec.warmup.workloads[{index}]") for index, item in enumerate(workloads_raw))
    _unique([workload.name for workload in workloads], "spec.warmup.workloads")
    _check_env_conflicts(workloads)

    jax_raw = _mapping(warmup.get("jax"), "spec.warmup.jax")
    jax = JaxOptions(
        min_compile_time_secs=_number(jax_raw.get("minCompileTimeSecs", 0), "spec.warmup.jax.minCompileTimeSecs"),
        min_entry_size_bytes=_int(jax_raw.get("minEntrySizeBytes", 0), "spec.warmup.jax.minEntrySizeBytes", minimum=0),
        xla_flags=_optional_str(jax_raw.get("xlaFlags"), "spec.warmup.jax.xlaFlags") or None,
    )
    resources = _mapping(warmup.get("resources"), "spec.warmup.resources")
    for kind in ("requests", "limits"):
        for name, value in _mapping(resources.get(kind), f"spec.warmup.resources.{kind}").items():
            _convert(units.parse_quantity, value, f"spec.warmup.resources.{kind}.{name}")

    service_account = _optional_str(warmup.get("serviceAccountName"), "spec.warmup.serviceAccountName")
    if service_account is None and gcs is not None:
        service_account = gcs.service_account_name
    return Warmup(
        image=image.strip(),
        image_pull_policy=pull_policy,
        image_pull_secrets=pull_secrets,
        service_account_name=service_account,
        workloads=workloads,
        pools=pools,
        discover=discover,
        resources=resources,
        backoff_limit=_int(warmup.get("backoffLimit", 2), "spec.warmup.backoffLimit", minimum=0),
        active_deadline_seconds=_int(
            warmup.get("activeDeadlineSeconds", 7200), "spec.warmup.activeDeadlineSeconds", minimum=1
        ),
        ttl_seconds_after_finished=_int(
            warmup.get("ttlSecondsAfterFinished", 86400), "spec.warmup.ttlSecondsAfterFinished", minimum=0
        ),
        jobs=_int(warmup.get("jobs", 1), "spec.warmup.jobs", minimum=1),
        verify=_bool(warmup.get("verify", True), "spec.warmup.verify"),
        jax=jax,
    )


def _workload(raw: Any, path: str) -> Workload:
    workload = _mapping(raw, path, required=True)
    name = _name(workload.get("name"), f"{path}.name")
    entrypoint = _optional_str(workload.get("entrypoint"), f"{path}.entrypoint")
    script = _optional_str(workload.get("script"), f"{path}.script")
    if (entrypoint is None) == (script is None):
        raise SpecError(path, "set exactly one of entrypoint (module:function) or script (a path)")
    if entrypoint is not None and not _ENTRYPOINT.match(entrypoint):
        raise SpecError(f"{path}.entrypoint", f"must look like module.path:function, got {entrypoint!r}")
    if script is not None and not script.strip():
        raise SpecError(f"{path}.script", "must be a path to a script")
    args = tuple(_strings(workload.get("args", []), f"{path}.args"))
    if args and script is None:
        raise SpecError(f"{path}.args", "args are passed to a script; an entrypoint takes none")
    env = tuple(
        _mapping(item, f"{path}.env[{index}]", required=True)
        for index, item in enumerate(_list(workload.get("env"), f"{path}.env"))
    )
    for index, item in enumerate(env):
        if not isinstance(item.get("name"), str) or not item["name"]:
            raise SpecError(f"{path}.env[{index}].name", "is required")
        if item["name"] in _RESERVED_ENV or item["name"].startswith("JAX_PERSISTENT_CACHE_"):
            raise SpecError(
                f"{path}.env[{index}].name",
                f"{item['name']} comes from spec.mountPath, spec.storage and spec.warmup.jax, so that "
                "warmers and trainers match; do not set it in a workload's env",
            )
    pools = tuple(_strings(workload.get("pools", []), f"{path}.pools"))
    return Workload(name=name, entrypoint=entrypoint, script=script, args=args, env=env, pools=pools)


def _pool(raw: Any, path: str) -> PoolSpec:
    pool = _mapping(raw, path, required=True)
    gpus = pool.get("gpusPerPod")
    return PoolSpec(
        name=_name(pool.get("name"), f"{path}.name"),
        node_selector=_labels(pool.get("nodeSelector"), f"{path}.nodeSelector"),
        tolerations=_tolerations(pool.get("tolerations"), f"{path}.tolerations"),
        gpus_per_pod=None if gpus is None else _int(gpus, f"{path}.gpusPerPod", minimum=0),
        gpu_resource=_optional_str(pool.get("gpuResource"), f"{path}.gpuResource") or DEFAULT_GPU_RESOURCE,
    )


def _discover(discover: Mapping[str, Any]) -> Discover:
    group_by = _optional_str(discover.get("groupBy"), "spec.warmup.discover.groupBy") or DEFAULT_GROUP_BY
    return Discover(
        node_selector=_labels(discover.get("nodeSelector"), "spec.warmup.discover.nodeSelector"),
        group_by=group_by,
        tolerations=_tolerations(discover.get("tolerations"), "spec.warmup.discover.tolerations"),
        gpu_resource=_optional_str(discover.get("gpuResource"), "spec.warmup.discover.gpuResource")
        or DEFAULT_GPU_RESOURCE,
    )


def _lifecycle(lifecycle: Mapping[str, Any]) -> Lifecycle:
    max_age = lifecycle.get("maxAge")
    max_size = lifecycle.get("maxSize")
    keep = lifecycle.get("keepVersions")
    return Lifecycle(
        max_age_seconds=None if max_age is None else _convert(units.parse_duration, max_age, "spec.lifecycle.maxAge"),
        max_size_bytes=None if max_size is None else _convert(units.parse_bytes, max_size, "spec.lifecycle.maxSize"),
        keep_versions=None if keep is None else _int(keep, "spec.lifecycle.keepVersions", minimum=1),
        verify=_bool(lifecycle.get("verify", True), "spec.lifecycle.verify"),
    )


def _consumers(consumers: Mapping[str, Any]) -> Consumers:
    selector = consumers.get("podSelector")
    if selector is not None:
        selector = _mapping(selector, "spec.consumers.podSelector")
    return Consumers(
        pod_selector=selector,
        read_only=_bool(consumers.get("readOnly", True), "spec.consumers.readOnly"),
        gate=_bool(consumers.get("gate", True), "spec.consumers.gate"),
        gate_timeout_seconds=_convert(
            units.parse_duration,
            consumers.get("gateTimeout", DEFAULT_GATE_TIMEOUT),
            "spec.consumers.gateTimeout",
        ),
        init_containers=_bool(consumers.get("initContainers", False), "spec.consumers.initContainers"),
    )


def _check_env_conflicts(workloads: Sequence[Workload]) -> None:
    # All workloads of a pool share one container's environment.
    seen: dict[str, tuple[str, Any]] = {}
    for windex, workload in enumerate(workloads):
        for eindex, item in enumerate(workload.env):
            name = item["name"]
            if name in seen and seen[name][1] != item:
                raise SpecError(
                    f"spec.warmup.workloads[{windex}].env[{eindex}]",
                    f"{name} conflicts with workload {seen[name][0]!r}: the workloads share one container",
                )
            seen[name] = (workload.name, item)


# Small typed readers: each raises SpecError with the path of what it reads.


def _mapping(value: Any, path: str, *, required: bool = False) -> Mapping[str, Any]:
    if value is None:
        if required:
            raise SpecError(path, "is required")
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(path, f"must be an object, got {type(value).__name__}")
    return value


def _list(value: Any, path: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise SpecError(path, f"must be a list, got {type(value).__name__}")
    return value


def _strings(value: Any, path: str) -> list[str]:
    items = _list(value, path)
    for index, item in enumerate(items):
        if not isinstance(item, str):
            raise SpecError(f"{path}[{index}]", f"must be a string, got {item!r}")
    return items


def _labels(value: Any, path: str) -> dict[str, str]:
    labels = _mapping(value, path)
    for key, item in labels.items():
        if not isinstance(item, str):
            raise SpecError(f"{path}.{key}", f"label values are strings, got {item!r}")
    return dict(labels)


def _tolerations(value: Any, path: str) -> tuple[Mapping[str, Any], ...]:
    return tuple(_mapping(item, f"{path}[{index}]", required=True) for index, item in enumerate(_list(value, path)))


def _name(value: Any, path: str) -> str:
    if not isinstance(value, str) or not _DNS_LABEL.match(value):
        raise SpecError(path, f"must be a DNS label (lower-case letters, digits, '-'), got {value!r}")
    return value


def _optional_str(value: Any, path: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise SpecError(path, f"must be a string, got {value!r}")
    return value


def _bool(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise SpecError(path, f"must be true or false, got {value!r}")
    return value


def _int(value: Any, path: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(path, f"must be an integer, got {value!r}")
    if value < minimum:
        raise SpecError(path, f"must be at least {minimum}, got {value}")
    return value


def _number(value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise SpecError(path, f"must be a non-negative number, got {value!r}")
    return float(value)


def _unique(names: Sequence[str], path: str) -> None:
    seen: set[str] = set()
    for index, name in enumerate(names):
        if name in seen:
            raise SpecError(f"{path}[{index}].name", f"duplicate name {name!r}")
        seen.add(name)


def _convert(parse: Any, value: Any, path: str) -> Any:
    try:
        return parse(value)
    except (ValueError, TypeError) as exc:
        raise SpecError(path, str(exc)) from None
