"""The CompileCache resource as the operator reads it: its spec parsed and validated into typed values.

The resource is defined once, in ``compilecache.api.model`` (pydantic): the CRD's schema and
docs/resource.md are generated from it (``make generate``), and :func:`parse_spec` starts by
validating the spec against it (:func:`check_model`): types, bounds, patterns and enums as the
API server checks them, with the field's JSON path in the error (``spec.warmup.workloads[0].steps``).
The checks that follow are the model's CEL rules (which pydantic does not evaluate) and the checks
the CRD deliberately leaves out (too costly for CEL, e.g. a workload's pools naming declared pools;
or needing several fields, e.g. requests not above limits); the result is the typed dataclasses
below (``CacheSpec.warmup.workloads[i].steps``) that the rest of the controller reads. Defaults
equal the model's. Some type checks below predate the model and now repeat it (see the report of
issue 24); they never disagree with it, as tests/test_spec_property.py checks.

The CRD's schema rejects most bad input at admission, but the operator validates again: a CRD can
be older than the operator, and a clear condition naming the field beats a crash loop. This parser
never refuses what the CRD admits as valid, and anything it lets through becomes objects the API
server accepts: the name and label rules below are apimachinery's
(``k8s.io/apimachinery/pkg/util/validation/validation.go``), the resource and mount rules those of
``pkg/apis/core/validation/validation.go``.
"""

from __future__ import annotations

import posixpath
import re
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pydantic

from compilecache.api import model
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
_DNS_SUBDOMAIN_SYNTAX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_PYTHON_PATH = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
_ENTRYPOINT = re.compile(rf"^{_PYTHON_PATH}:{_PYTHON_PATH}$")  # the CRD's pattern: module:attr.path
# `steps: auto`: whole epochs within a time budget (`compilecache warm --steps auto`).
STEPS_AUTO = "auto"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_MOUNT_PATH = re.compile(r"^(/([^/:.][^/:]*|\.[^/:.][^/:]*|\.\.[^/:]+))+$")  # the CRD's pattern
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_STANDARD_RESOURCES = {"cpu", "memory", "ephemeral-storage"}  # and hugepages-<size>
_VALUE_SOURCES = {
    "secretKeyRef": "key",
    "configMapKeyRef": "key",
    "fieldRef": "fieldPath",
    "resourceFieldRef": "resource",
}
NAME_MAX = 63  # a cache's name is the value of labels on its Jobs, claims and pods
# Paths the operator mounts in warm-up and expiry containers itself (jobs.TMP_DIR): a cache
# there would be a duplicate mountPath, which the API server refuses.
RESERVED_MOUNT_PATHS = frozenset({"/tmp"})
_ACCESS_MODES = {"ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"}
_PULL_POLICIES = {"Always", "IfNotPresent", "Never"}
_RESERVED_ENV = {"JAX_COMPILATION_CACHE_DIR", "XLA_FLAGS"}
HOSTS_MAX = 256  # the CRD's maximum of warmup.topologies[].hosts (pods of one Indexed warm-up Job)
TOPOLOGIES_MAX = 8  # the CRD's maxItems of warmup.topologies
# Bigger than any volume or bucket will be (10^30 bytes), and small enough to print: the CRD's
# quantity pattern admits '.1E5000', whose digits Python refuses to print (the pass crashed on it).
MAX_SIZE_BYTES = 10**30


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
    service_account_name: str | None  # the writer: warm-up and expiry pods
    delete_with_cache: bool
    reader_service_account_name: str | None = None  # training pods: never the writer

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
    steps: int | str | None = None  # exact mode: stop the script after this many step calls, or "auto"
    step_fn: str | None = None  # the jitted function steps counts (None: the warmer's default)
    budget_seconds: float | None = None  # steps "auto": seconds after the first step (None: the warmer's)
    resume: bool | None = None  # exact mode: also warm a run resumed from its checkpoint (None: on)
    resume_args: tuple[str, ...] = ()  # arguments added to that resumed run only


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
class Topology:
    """A training topology to warm for: ``hosts`` nodes of a pool, one JAX process per node.

    The cache key contains the device and process counts, so a multi-host training job hits
    only entries compiled by as many processes on as many devices (GPUs per host from the pool).
    """

    hosts: int = 1

    @property
    def multi_host(self) -> bool:
        """Whether the warm-up is an Indexed Job of ``hosts`` pods with a headless Service."""
        return self.hosts > 1


SINGLE_HOST = Topology(hosts=1)


@dataclass(frozen=True)
class JaxOptions:
    min_compile_time_secs: float = 0.0
    min_entry_size_bytes: int = 0
    xla_flags: str | None = None


# The volume types a training template may bring into a warm-up (the policy refuses others, e.g.
# hostPath: a node's own files are no training data, and a path on the node is no one's to share).
TEMPLATE_VOLUME_TYPES = frozenset(
    {"persistentVolumeClaim", "configMap", "secret", "emptyDir", "projected", "downwardAPI", "csi", "ephemeral"}
)
TEMPLATE_KINDS = ("PodTemplate", "Job", "JobSet")  # what ``podTemplate.templateRef`` may name
# The warm-up pod's own volumes (jobs.py): a template's volume of the same name is refused, not renamed.
OPERATOR_VOLUMES = frozenset({"tmp", "cache"})


@dataclass(frozen=True)
class TemplateRef:
    """``spec.warmup.podTemplate.templateRef``: training's pod template, read by the pass (``snapshot.py``)."""

    kind: str  # one of TEMPLATE_KINDS
    name: str

    def describe(self) -> str:
        """``Job train``: for messages."""
        return f"{self.kind} {self.name}"


@dataclass(frozen=True)
class PodTemplate:
    """What a warm-up takes from training's pod template (``spec.warmup.podTemplate``; docs/resource.md).

    Taken: the chosen container's image, env, envFrom, volumeMounts and workingDir, the arguments
    after a workload's script in its command + args (:meth:`script_args`), and the pod's volumes,
    serviceAccountName and imagePullSecrets. Everything else (the command itself, resources,
    securityContext, placement, ...) is the operator's: see ``jobs.warmup_job``. ``origin`` is the
    field path that messages name: the inline spec's, or the reference's.
    """

    origin: str
    container: str
    container_path: str  # the chosen container's field path: ``<origin>.containers[<index>]``
    image: str | None
    env: tuple[Mapping[str, Any], ...] = ()
    env_from: tuple[Mapping[str, Any], ...] = ()
    volume_mounts: tuple[Mapping[str, Any], ...] = ()
    working_dir: str | None = None
    volumes: tuple[Mapping[str, Any], ...] = ()
    service_account_name: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()  # the container's command + args: a script workload's default args

    def script_args(self, workload: Workload) -> tuple[str, ...]:
        """A script workload's arguments: its own ``args``, else those after its script in training's argv.

        Training's container runs e.g. ``python train.py --config /etc/train/c.yaml``: a workload
        ``script: train.py`` without ``args`` then runs with ``--config /etc/train/c.yaml``, as training does.
        """
        if workload.args or workload.script is None:
            return workload.args
        target = posixpath.normpath(workload.script)
        for index, part in enumerate(self.argv):
            if posixpath.normpath(part) == target:
                return self.argv[index + 1 :]
        return ()


@dataclass(frozen=True)
class TemplateSource:
    """``spec.warmup.podTemplate``: an inline pod spec (parsed here) or a reference the pass resolves."""

    container: str | None  # the training container's name; None: the first container
    inline: PodTemplate | None = None
    ref: TemplateRef | None = None


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
    topologies: tuple[Topology, ...] = (SINGLE_HOST,)
    template: TemplateSource | None = None  # training's pod template (spec.warmup.podTemplate)
    # The template the warm-up Jobs use: the inline one, or the reference's once the pass read it.
    pod_template: PodTemplate | None = None


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


# spec.concurrencyPolicy, as a CronJob's (no Allow: two warm-ups of one cache would race on its entries).
CONCURRENCY_POLICIES = ("Forbid", "Replace")
# spec.framework: whose compile cache the resource warms (fixed at creation by the CRD's CEL rule).
FRAMEWORKS = ("jax", "pytorch")


@dataclass(frozen=True)
class CacheSpec:
    """A validated CompileCache spec, with the CRD's defaults applied."""

    pvc: PVCStorage | None
    gcs: GCSStorage | None
    mount_path: str
    warmup: Warmup
    schedule: str | None = None
    concurrency_policy: str = "Forbid"  # a slot while a refresh runs: skip it (Forbid) or replace the run (Replace)
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    consumers: Consumers = field(default_factory=Consumers)
    framework: str = "jax"

    @property
    def cache_dir(self) -> str:
        """Where JAX reads and writes the cache: the mount path, or the GCS URL."""
        return self.gcs.url if self.gcs is not None else self.mount_path


def parse_cache(cache: Mapping[str, Any]) -> CacheSpec:
    """Validate a whole CompileCache: its name (used as a label value) and its spec."""
    check_cache_name((cache.get("metadata") or {}).get("name"))
    return parse_spec(cache.get("spec"))


def check_cache_name(name: Any) -> str:
    """A cache's name must be a label value: at most 63 characters (the CRD's root rule says so too)."""
    if not isinstance(name, str) or not is_label_value(name) or not name:
        raise SpecError("metadata.name", f"must be a label value (at most {NAME_MAX} characters), got {name!r}")
    return name


def is_dns_subdomain(value: str) -> bool:
    """A DNS-1123 subdomain: lower-case labels joined by dots, at most 253 characters."""
    return len(value) <= 253 and bool(_DNS_SUBDOMAIN_SYNTAX.match(value))


def is_dns_label(value: str) -> bool:
    """A DNS-1123 label: at most 63 lower-case letters, digits and '-'."""
    return bool(_DNS_LABEL.match(value))


def is_label_value(value: str) -> bool:
    """A label value: empty, or at most 63 alphanumerics with '-', '_', '.' inside."""
    return len(value) <= 63 and bool(_LABEL_VALUE.match(value))


def is_qualified_name(value: str) -> bool:
    """A label key (a qualified name): ``[prefix/]name``, prefix a DNS subdomain, name at most 63."""
    prefix, slash, name = value.rpartition("/")
    if slash and not (prefix and is_dns_subdomain(prefix)):
        return False
    return len(name) <= 63 and bool(_QUALIFIED_NAME_PART.match(name))


def is_extended_resource_name(value: str) -> bool:
    """An extended resource (e.g. nvidia.com/gpu): ``domain/name``, not in kubernetes.io, not ``requests.``."""
    return (
        "/" in value
        and "kubernetes.io/" not in value
        and not value.startswith("requests.")
        and is_qualified_name(f"requests.{value}")
    )


def parse_spec(spec: Mapping[str, Any] | None) -> CacheSpec:
    """Validate a CompileCache ``spec`` and apply defaults; raise :class:`SpecError` naming the field."""
    spec = _mapping(spec, "spec", required=True)
    check_model(_forgiven(spec))
    storage = _mapping(spec.get("storage"), "spec.storage", required=True)
    pvc_raw, gcs_raw = storage.get("pvc"), storage.get("gcs")
    if pvc_raw is None and gcs_raw is None:
        raise SpecError("spec.storage", "set exactly one of storage.pvc or storage.gcs (neither is set)")
    if pvc_raw is not None and gcs_raw is not None:
        raise SpecError("spec.storage", "set exactly one of storage.pvc or storage.gcs (both are set)")
    pvc = _pvc(pvc_raw) if pvc_raw is not None else None
    gcs = _gcs(gcs_raw) if gcs_raw is not None else None

    mount_path = spec.get("mountPath", DEFAULT_MOUNT_PATH)
    if isinstance(mount_path, str) and len(mount_path) > 1:
        mount_path = mount_path.rstrip("/")  # lenient where it is harmless: the CRD refuses a trailing /
    if not isinstance(mount_path, str) or len(mount_path) > 1024 or not _MOUNT_PATH.match(mount_path):
        raise SpecError(
            "spec.mountPath", f"must be an absolute path without '.', '..' or empty segments, got {mount_path!r}"
        )
    if mount_path in RESERVED_MOUNT_PATHS:
        raise SpecError("spec.mountPath", f"{mount_path} is where the operator mounts its own scratch volume")

    warmup = _warmup(_mapping(spec.get("warmup"), "spec.warmup", required=True), gcs, mount_path)
    if gcs is not None and gcs.reader_service_account_name is not None:
        # Training pods run as the reader: the same account as a writer would let them write the cache.
        # (The CRD's CEL rules refuse both cases too.)
        writers = {gcs.service_account_name, warmup.service_account_name}
        if gcs.reader_service_account_name in writers:
            raise SpecError(
                "spec.storage.gcs.readerServiceAccountName",
                f"{gcs.reader_service_account_name!r} is the cache's writer (storage.gcs.serviceAccountName or "
                "warmup.serviceAccountName); training pods need a ServiceAccount that may only read the prefix",
            )
    schedule = spec.get("schedule")
    if schedule is not None:
        schedule = _convert(units.check_cron, schedule, "spec.schedule")
    concurrency = spec.get("concurrencyPolicy", "Forbid")
    if concurrency not in CONCURRENCY_POLICIES:
        raise SpecError("spec.concurrencyPolicy", f"must be one of {list(CONCURRENCY_POLICIES)}, got {concurrency!r}")
    framework = spec.get("framework", "jax")
    if framework not in FRAMEWORKS:
        raise SpecError("spec.framework", f"must be one of {list(FRAMEWORKS)}, got {framework!r}")
    if framework == "pytorch":
        _refuse_jax_only(spec["warmup"])
    return CacheSpec(
        framework=framework,
        pvc=pvc,
        gcs=gcs,
        mount_path=mount_path,
        warmup=warmup,
        schedule=schedule,
        concurrency_policy=concurrency,
        lifecycle=_lifecycle(_mapping(spec.get("lifecycle"), "spec.lifecycle")),
        consumers=_consumers(_mapping(spec.get("consumers"), "spec.consumers")),
    )


def _forgiven(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The spec with what the parser forgives spelled as the CRD wants it: a trailing / of ``mountPath``
    and a leading or trailing / of a GCS prefix are harmless, and the parser strips them."""
    forgiven = {**spec}
    mount_path = spec.get("mountPath")
    if isinstance(mount_path, str) and len(mount_path) > 1:
        forgiven["mountPath"] = mount_path.rstrip("/")
    storage = spec.get("storage")
    gcs = storage.get("gcs") if isinstance(storage, Mapping) else None
    if isinstance(storage, Mapping) and isinstance(gcs, Mapping) and isinstance(gcs.get("prefix"), str):
        forgiven["storage"] = {**storage, "gcs": {**gcs, "prefix": gcs["prefix"].strip("/")}}
    return forgiven


def check_model(spec: Mapping[str, Any]) -> None:
    """The spec against the model the CRD is generated from (``compilecache.api.model``).

    What the API server's schema checks (not the CEL rules, which the checks after it cover).
    Raises :class:`SpecError` naming the first offending field by its JSON path.
    """
    try:
        model.Spec.model_validate(spec)
    except pydantic.ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        raise SpecError(model_path("spec", model.Spec, error["loc"]), error["msg"]) from None


def model_path(prefix: str, root: type[pydantic.BaseModel], loc: Sequence[int | str]) -> str:
    """The JSON path (``spec.warmup.workloads[0].steps``) of a pydantic error location.

    pydantic adds the branch of a union to the location (``steps.int``); the path stops where the
    location leaves the model's fields, lists and maps.
    """
    path = prefix
    kind: Any = root
    for part in loc:
        kind = _unwrap(kind)
        origin = typing.get_origin(kind)
        if isinstance(part, int) and origin is list:
            path += f"[{part}]"
            kind = typing.get_args(kind)[0]
        elif isinstance(part, str) and origin is dict:
            path += f".{part}"
            kind = typing.get_args(kind)[1]
        elif isinstance(part, str) and isinstance(kind, type) and issubclass(kind, pydantic.BaseModel):
            if part not in kind.model_fields:
                break
            path += f".{part}"
            kind = kind.model_fields[part].annotation
        else:
            break
    return path


def _unwrap(kind: Any) -> Any:
    """``X`` of ``Annotated[X, ...]`` and of ``X | None`` (the field's own type)."""
    while True:
        if typing.get_origin(kind) is typing.Annotated:
            kind = typing.get_args(kind)[0]
            continue
        args = [arg for arg in typing.get_args(kind) if arg is not type(None)]
        if typing.get_origin(kind) in (typing.Union, types.UnionType) and len(args) == 1:
            kind = args[0]
            continue
        return kind


def _pvc(raw: Any) -> PVCStorage:
    pvc = _mapping(raw, "spec.storage.pvc", required=True)
    claim = pvc.get("claimName")
    if not isinstance(claim, str) or not is_dns_subdomain(claim):
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
            storage_class_name=_optional_subdomain(
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
        service_account_name=_optional_subdomain(gcs.get("serviceAccountName"), "spec.storage.gcs.serviceAccountName"),
        delete_with_cache=_bool(gcs.get("deleteWithCache", False), "spec.storage.gcs.deleteWithCache"),
        reader_service_account_name=_optional_subdomain(
            gcs.get("readerServiceAccountName"), "spec.storage.gcs.readerServiceAccountName"
        ),
    )


def _warmup(warmup: Mapping[str, Any], gcs: GCSStorage | None, mount_path: str) -> Warmup:
    image = warmup.get("image")
    if not isinstance(image, str) or not image.strip():
        raise SpecError("spec.warmup.image", "must name the image of the warm-up Jobs (usually the training image)")
    pull_policy = _optional_str(warmup.get("imagePullPolicy"), "spec.warmup.imagePullPolicy")
    if pull_policy is not None and pull_policy not in _PULL_POLICIES:
        raise SpecError("spec.warmup.imagePullPolicy", f"must be one of {sorted(_PULL_POLICIES)}, got {pull_policy!r}")
    # Secret names are DNS subdomains (gcr.io-pull is one), not labels.
    pull_secrets = tuple(
        _subdomain(
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
    if discover is None:
        # Not a CEL rule: 128 workloads x 64 x 64 pools cost 1.7x the API server's budget.
        declared = {pool.name for pool in pools}
        for windex, workload in enumerate(workloads):
            for pindex, pool_name in enumerate(workload.pools):
                if pool_name not in declared:
                    raise SpecError(
                        f"spec.warmup.workloads[{windex}].pools[{pindex}]",
                        f"names no pool in warmup.pools ({sorted(declared)}); without warmup.discover "
                        "there are no other pools",
                    )

    jax_raw = _mapping(warmup.get("jax"), "spec.warmup.jax")
    jax = JaxOptions(
        min_compile_time_secs=_number(jax_raw.get("minCompileTimeSecs", 0), "spec.warmup.jax.minCompileTimeSecs"),
        min_entry_size_bytes=_int(jax_raw.get("minEntrySizeBytes", 0), "spec.warmup.jax.minEntrySizeBytes", minimum=0),
        xla_flags=_optional_str(jax_raw.get("xlaFlags"), "spec.warmup.jax.xlaFlags") or None,
    )
    resources = _mapping(warmup.get("resources"), "spec.warmup.resources")
    gpu_resources = {pool.gpu_resource for pool in pools} | ({discover.gpu_resource} if discover else set())
    _check_resources(resources, gpu_resources)

    service_account = _optional_subdomain(warmup.get("serviceAccountName"), "spec.warmup.serviceAccountName")
    if service_account is None and gcs is not None:
        service_account = gcs.service_account_name
    topologies = _topologies(warmup.get("topologies"))
    deadline = _int(warmup.get("activeDeadlineSeconds", 7200), "spec.warmup.activeDeadlineSeconds", minimum=1)
    _check_budgets(workloads, topologies, deadline)
    template_raw = warmup.get("podTemplate")
    template = _template_source(template_raw, image.strip(), mount_path) if template_raw is not None else None
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
        active_deadline_seconds=deadline,
        ttl_seconds_after_finished=_int(
            warmup.get("ttlSecondsAfterFinished", 86400), "spec.warmup.ttlSecondsAfterFinished", minimum=0
        ),
        jobs=_int(warmup.get("jobs", 1), "spec.warmup.jobs", minimum=1),
        verify=_bool(warmup.get("verify", True), "spec.warmup.verify"),
        jax=jax,
        topologies=topologies,
        template=template,
        pod_template=template.inline if template is not None else None,
    )


def _check_budgets(workloads: Sequence[Workload], topologies: Sequence[Topology], deadline: int) -> None:
    """``steps: auto`` only where it can work: on one host, within the Job's deadline."""
    for index, workload in enumerate(workloads):
        if workload.steps == STEPS_AUTO and any(topology.hosts > 1 for topology in topologies):
            # Each process would stop on its own clock, at its own step, and the others would wait for it.
            raise SpecError(
                f"spec.warmup.workloads[{index}].steps",
                "auto stops by time, which the processes of a multi-host warm-up cannot agree on: give a count",
            )
        # The warm run's budget plus verify's rerun, at least, must fit the Job's activeDeadlineSeconds.
        if workload.budget_seconds is not None and 2 * workload.budget_seconds >= deadline:
            raise SpecError(
                f"spec.warmup.workloads[{index}].budget",
                f"the warm-up and its verify need twice the budget; warmup.activeDeadlineSeconds is {deadline}",
            )


def _template_source(raw: Any, image: str, mount_path: str) -> TemplateSource:
    """``spec.warmup.podTemplate``: exactly one of ``spec`` (inline) or ``templateRef``, and ``container``."""
    path = "spec.warmup.podTemplate"
    source = _mapping(raw, path, required=True)
    container = source.get("container")
    if container is not None:
        container = _name(container, f"{path}.container")
    if ("spec" in source) == ("templateRef" in source):
        raise SpecError(path, "set exactly one of spec (the pod spec inline) or templateRef")
    if "spec" in source:
        inline = parse_pod_template(_mapping(source["spec"], f"{path}.spec", required=True), f"{path}.spec", container)
        check_template(inline, image, mount_path)
        return TemplateSource(container=container, inline=inline)
    ref = _mapping(source["templateRef"], f"{path}.templateRef", required=True)
    kind = ref.get("kind")
    if kind not in TEMPLATE_KINDS:
        raise SpecError(f"{path}.templateRef.kind", f"must be one of {list(TEMPLATE_KINDS)}, got {kind!r}")
    name = _subdomain(ref.get("name"), f"{path}.templateRef.name")
    return TemplateSource(container=container, ref=TemplateRef(kind=kind, name=name))


def check_template(template: PodTemplate, image: str, mount_path: str) -> None:
    """What a template must agree on with the cache: its image is ``warmup.image`` (one image decides
    jaxlib, so the key, the expiry Job's image and what the policy checked at apply time), and
    nothing of it is mounted where the cache is."""
    for index, mount in enumerate(template.volume_mounts):
        if str(mount.get("mountPath", "")).rstrip("/") == mount_path:
            raise SpecError(
                f"{template.container_path}.volumeMounts[{index}].mountPath",
                f"{mount_path} is spec.mountPath, where the warm-up mounts the cache",
            )
    if template.image is not None and template.image != image:
        raise SpecError(
            f"{template.container_path}.image",
            f"runs {template.image!r} but spec.warmup.image is {image!r}: the image decides the jax and jaxlib "
            "versions in the cache key, so set warmup.image to training's image",
        )


def parse_pod_template(pod_spec: Mapping[str, Any], origin: str, container: str | None) -> PodTemplate:
    """The part of a pod spec a warm-up takes (:class:`PodTemplate`), checked; errors name ``origin``'s fields.

    Used for the inline ``podTemplate.spec`` and, by the pass, for the pod spec of the object
    ``templateRef`` names (``origin`` then says which). Fields not taken are not read at all.
    """
    containers = _list(pod_spec.get("containers"), f"{origin}.containers")
    if not containers:
        raise SpecError(origin, "must list training's container in containers")
    chosen: Mapping[str, Any] | None = None
    where = origin
    for index, item in enumerate(containers):
        entry = _mapping(item, f"{origin}.containers[{index}]", required=True)
        if container is None or entry.get("name") == container:
            chosen, where = entry, f"{origin}.containers[{index}]"
            break
    if chosen is None:
        names = [item.get("name") for item in containers if isinstance(item, Mapping)]
        raise SpecError("spec.warmup.podTemplate.container", f"{origin} has no container {container!r} (has {names})")
    name = chosen.get("name")
    if not isinstance(name, str) or not name:
        raise SpecError(where, "needs a name")
    image = _optional_str(chosen.get("image"), f"{where}.image")
    env = tuple(
        _mapping(item, f"{where}.env[{index}]", required=True)
        for index, item in enumerate(_list(chosen.get("env"), f"{where}.env"))
    )
    for index, item in enumerate(env):
        if not isinstance(item.get("name"), str) or not _ENV_NAME.match(item["name"]):
            raise SpecError(f"{where}.env[{index}].name", f"must be a variable name, got {item.get('name')!r}")
        if "valueFrom" in item:
            _check_value_from(item["valueFrom"], f"{where}.env[{index}].valueFrom")
        elif not isinstance(item.get("value", ""), str):
            raise SpecError(f"{where}.env[{index}].value", f"must be a string, got {item['value']!r}")
    env_from = tuple(
        _env_from(item, f"{where}.envFrom[{index}]")
        for index, item in enumerate(_list(chosen.get("envFrom"), f"{where}.envFrom"))
    )
    volumes = tuple(
        _template_volume(item, f"{origin}.volumes[{index}]")
        for index, item in enumerate(_list(pod_spec.get("volumes"), f"{origin}.volumes"))
    )
    _unique([str(volume["name"]) for volume in volumes], f"{origin}.volumes")
    declared = {str(volume["name"]) for volume in volumes}
    mounts = tuple(
        _mapping(item, f"{where}.volumeMounts[{index}]", required=True)
        for index, item in enumerate(_list(chosen.get("volumeMounts"), f"{where}.volumeMounts"))
    )
    targets: set[str] = set()
    for index, mount in enumerate(mounts):
        mpath = f"{where}.volumeMounts[{index}]"
        if mount.get("name") not in declared:
            raise SpecError(f"{mpath}.name", f"names no volume of the template ({sorted(declared)})")
        target = mount.get("mountPath")
        if not isinstance(target, str) or not _MOUNT_PATH.match(target.rstrip("/") or "/"):
            raise SpecError(f"{mpath}.mountPath", f"must be an absolute path without '..' or ':', got {target!r}")
        if target.rstrip("/") in targets:  # the API server refuses a container with two mounts at one path
            raise SpecError(f"{mpath}.mountPath", f"{target} is mounted twice")
        targets.add(target.rstrip("/"))
        if target.rstrip("/") in RESERVED_MOUNT_PATHS:
            raise SpecError(f"{mpath}.mountPath", f"{target} is where the warm-up mounts its own scratch volume")
        for key in ("subPath", "subPathExpr"):
            sub = mount.get(key)
            if sub is not None and (not isinstance(sub, str) or sub.startswith("/") or ".." in sub.split("/")):
                raise SpecError(f"{mpath}.{key}", f"must be a relative path without '..', got {sub!r}")
    argv = (
        *_strings(chosen.get("command"), f"{where}.command"),
        *_strings(chosen.get("args"), f"{where}.args"),
    )
    working_dir = _optional_str(chosen.get("workingDir"), f"{where}.workingDir")
    if working_dir is not None and not working_dir.startswith("/"):
        raise SpecError(f"{where}.workingDir", f"must be an absolute path, got {working_dir!r}")
    pull_secrets = tuple(
        _subdomain(
            _mapping(item, f"{origin}.imagePullSecrets[{index}]").get("name"),
            f"{origin}.imagePullSecrets[{index}].name",
        )
        for index, item in enumerate(_list(pod_spec.get("imagePullSecrets"), f"{origin}.imagePullSecrets"))
    )
    return PodTemplate(
        origin=origin,
        container=name,
        container_path=where,
        image=image.strip() if image is not None else None,
        env=env,
        env_from=env_from,
        volume_mounts=mounts,
        working_dir=working_dir,
        volumes=volumes,
        service_account_name=_optional_subdomain(pod_spec.get("serviceAccountName"), f"{origin}.serviceAccountName"),
        image_pull_secrets=pull_secrets,
        argv=tuple(argv),
    )


def _env_from(raw: Any, path: str) -> Mapping[str, Any]:
    """An EnvFromSource: exactly one of configMapRef or secretRef naming its object; an optional prefix."""
    source = _mapping(raw, path, required=True)
    refs = [key for key in ("configMapRef", "secretRef") if key in source]
    if len(refs) != 1:
        raise SpecError(path, "must set exactly one of configMapRef or secretRef")
    _subdomain(_mapping(source[refs[0]], f"{path}.{refs[0]}", required=True).get("name"), f"{path}.{refs[0]}.name")
    prefix = _optional_str(source.get("prefix"), f"{path}.prefix")
    if prefix and not _ENV_NAME.match(prefix):
        raise SpecError(f"{path}.prefix", f"must start a variable name, got {prefix!r}")
    return source


def _template_volume(raw: Any, path: str) -> Mapping[str, Any]:
    """A volume of training's template: a DNS-label name not used by the warm-up itself, one source."""
    volume = _mapping(raw, path, required=True)
    name = _name(volume.get("name"), f"{path}.name")
    if name in OPERATOR_VOLUMES:
        raise SpecError(f"{path}.name", f"{name!r} names a volume of the warm-up's own ({sorted(OPERATOR_VOLUMES)})")
    sources = [key for key in volume if key != "name"]
    if len(sources) != 1:
        raise SpecError(path, f"must have exactly one volume source, got {sorted(sources)}")
    return volume


def volume_type(volume: Mapping[str, Any]) -> str:
    """The source of a volume (``persistentVolumeClaim``, ``hostPath``, ...): its one key besides ``name``."""
    return next((key for key in volume if key != "name"), "")


# What only JAX's warmer reads: with spec.framework pytorch it would be ignored without a word.
# (AOT entrypoints, a jitted step function and resumed runs are JAX's exact and AOT modes; the
# PyTorch warmer counts optimizer steps and runs one process, so no multi-host group either.)
_JAX_ONLY_WORKLOAD_KEYS = ("entrypoint", "stepFn", "resume", "resumeArgs")


def _refuse_jax_only(warmup: Mapping[str, Any]) -> None:
    """Refuse, naming the field, a JAX-only option in a ``framework: pytorch`` spec (already parsed once).

    Only values other than the defaults: the API server writes the CRD's defaults into every
    object (``jax: {minCompileTimeSecs: 0, minEntrySizeBytes: 0}``, ``jobs: 1``).
    """
    for key, value in (warmup.get("jax") or {}).items():
        if value:  # 0, "" and null are the defaults
            raise SpecError(f"spec.warmup.jax.{key}", "is a JAX setting; spec.framework is pytorch")
    if warmup.get("jobs", 1) != 1:  # parallel AOT compiles
        raise SpecError("spec.warmup.jobs", "is a JAX setting (parallel AOT compiles); spec.framework is pytorch")
    for index, workload in enumerate(warmup["workloads"]):
        for key in _JAX_ONLY_WORKLOAD_KEYS:
            if key in workload:
                raise SpecError(f"spec.warmup.workloads[{index}].{key}", "is JAX-only; spec.framework is pytorch")
    for index, topology in enumerate(warmup.get("topologies") or []):
        if topology["hosts"] != 1:
            raise SpecError(f"spec.warmup.topologies[{index}].hosts", "must be 1 with spec.framework pytorch")


def _topologies(raw: Any) -> tuple[Topology, ...]:
    """``warmup.topologies``: at least one, ``hosts`` 1..HOSTS_MAX and unique (the CRD's list-map key)."""
    if raw is None:
        return (SINGLE_HOST,)
    items = _list(raw, "spec.warmup.topologies")
    if not items:
        raise SpecError("spec.warmup.topologies", "must list at least one topology (the default is [{hosts: 1}])")
    if len(items) > TOPOLOGIES_MAX:
        raise SpecError("spec.warmup.topologies", f"at most {TOPOLOGIES_MAX} topologies, got {len(items)}")
    topologies: list[Topology] = []
    for index, item in enumerate(items):
        path = f"spec.warmup.topologies[{index}].hosts"
        hosts = _mapping(item, f"spec.warmup.topologies[{index}]", required=True).get("hosts")
        if hosts is None:
            raise SpecError(path, "is required")
        hosts = _int(hosts, path, minimum=1)
        if hosts > HOSTS_MAX:
            raise SpecError(path, f"must be at most {HOSTS_MAX}, got {hosts}")
        if any(topology.hosts == hosts for topology in topologies):
            raise SpecError(path, f"duplicate topology hosts={hosts}")
        topologies.append(Topology(hosts=hosts))
    return tuple(topologies)


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
        if not _ENV_NAME.match(item["name"]):
            raise SpecError(f"{path}.env[{index}].name", f"must be a variable name, got {item['name']!r}")
        if "valueFrom" in item:
            if "value" in item:
                raise SpecError(f"{path}.env[{index}]", "sets value or valueFrom, not both")
            _check_value_from(item["valueFrom"], f"{path}.env[{index}].valueFrom")
        elif "value" in item and not isinstance(item["value"], str):
            raise SpecError(f"{path}.env[{index}].value", f"must be a string, got {item['value']!r}")
        if item["name"] in _RESERVED_ENV or item["name"].startswith("JAX_PERSISTENT_CACHE_"):
            raise SpecError(
                f"{path}.env[{index}].name",
                f"{item['name']} comes from spec.mountPath, spec.storage and spec.warmup.jax, so that "
                "warmers and trainers match; do not set it in a workload's env",
            )
    pools = tuple(_strings(workload.get("pools", []), f"{path}.pools"))
    steps = workload.get("steps")
    if steps is not None and steps != STEPS_AUTO and not _whole(steps, 1, 100_000):
        raise SpecError(f"{path}.steps", f"must be a whole number from 1 to 100000 or {STEPS_AUTO}, got {steps!r}")
    if steps is not None and script is None:
        raise SpecError(f"{path}.steps", "the exact mode runs a script; an entrypoint's targets are compiled ahead")
    step_fn = _optional_str(workload.get("stepFn"), f"{path}.stepFn")
    if step_fn is not None and (script is None or not _IDENTIFIER.match(step_fn)):
        raise SpecError(f"{path}.stepFn", f"names a Python function (with script), got {step_fn!r}")
    budget = workload.get("budget")
    if budget is not None and (script is None or steps not in (None, STEPS_AUTO)):
        raise SpecError(f"{path}.budget", f"bounds steps: {STEPS_AUTO} (the default for a script), not a step count")
    budget_seconds = None if budget is None else _convert(units.parse_duration, budget, f"{path}.budget")
    if budget_seconds is not None and not budget_seconds >= 1:
        raise SpecError(f"{path}.budget", f"must be at least 1s, got {budget!r}")
    resume, resume_args = _resume_fields(workload, path, script)
    return Workload(
        name=name,
        entrypoint=entrypoint,
        script=script,
        args=args,
        env=env,
        pools=pools,
        steps=steps,
        step_fn=step_fn,
        budget_seconds=budget_seconds,
        resume=resume,
        resume_args=resume_args,
    )


def _resume_fields(workload: Mapping[str, Any], path: str, script: str | None) -> tuple[bool | None, tuple[str, ...]]:
    """``resume`` and ``resumeArgs``: the exact mode's resumed run (compilecache warm --resume, --resume-arg)."""
    resume = workload.get("resume")
    if resume is not None and (not isinstance(resume, bool) or script is None):
        raise SpecError(f"{path}.resume", f"is true or false, with a script (the exact mode), got {resume!r}")
    resume_args = tuple(_strings(workload.get("resumeArgs", []), f"{path}.resumeArgs"))
    if resume_args and (script is None or resume is False):
        raise SpecError(f"{path}.resumeArgs", "are added to the resumed run: they need a script, and resume not false")
    return resume, resume_args


def _whole(value: Any, low: int, high: int) -> bool:
    """An int (not a bool) from ``low`` to ``high``."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _pool(raw: Any, path: str) -> PoolSpec:
    pool = _mapping(raw, path, required=True)
    gpus = pool.get("gpusPerPod")
    return PoolSpec(
        name=_name(pool.get("name"), f"{path}.name"),
        node_selector=_labels(pool.get("nodeSelector"), f"{path}.nodeSelector"),
        tolerations=_tolerations(pool.get("tolerations"), f"{path}.tolerations"),
        gpus_per_pod=None if gpus is None else _int(gpus, f"{path}.gpusPerPod", minimum=0),
        gpu_resource=_gpu_resource(pool.get("gpuResource"), f"{path}.gpuResource"),
    )


def _discover(discover: Mapping[str, Any]) -> Discover:
    group_by = _optional_str(discover.get("groupBy", DEFAULT_GROUP_BY), "spec.warmup.discover.groupBy")
    if group_by is None or not is_qualified_name(group_by):
        raise SpecError("spec.warmup.discover.groupBy", f"must be a node label key, got {group_by!r}")
    return Discover(
        node_selector=_labels(discover.get("nodeSelector"), "spec.warmup.discover.nodeSelector"),
        group_by=group_by,
        tolerations=_tolerations(discover.get("tolerations"), "spec.warmup.discover.tolerations"),
        gpu_resource=_gpu_resource(discover.get("gpuResource"), "spec.warmup.discover.gpuResource"),
    )


def _lifecycle(lifecycle: Mapping[str, Any]) -> Lifecycle:
    max_age = lifecycle.get("maxAge")
    max_size = lifecycle.get("maxSize")
    keep = lifecycle.get("keepVersions")
    return Lifecycle(
        max_age_seconds=None if max_age is None else _convert(units.parse_duration, max_age, "spec.lifecycle.maxAge"),
        max_size_bytes=None if max_size is None else _max_size(max_size),
        keep_versions=None if keep is None else _int(keep, "spec.lifecycle.keepVersions", minimum=1),
        verify=_bool(lifecycle.get("verify", True), "spec.lifecycle.verify"),
    )


def _max_size(value: Any) -> int:
    size: int = _convert(units.parse_bytes, value, "spec.lifecycle.maxSize")
    if size > MAX_SIZE_BYTES:
        raise SpecError("spec.lifecycle.maxSize", f"must be at most 1E30 bytes, got {value!r}")
    return size


def _consumers(consumers: Mapping[str, Any]) -> Consumers:
    selector = consumers.get("podSelector")
    if selector is not None:
        selector = _mapping(selector, "spec.consumers.podSelector")
        _labels(selector.get("matchLabels"), "spec.consumers.podSelector.matchLabels")
        for index, item in enumerate(
            _list(selector.get("matchExpressions"), "spec.consumers.podSelector.matchExpressions")
        ):
            where = f"spec.consumers.podSelector.matchExpressions[{index}]"
            requirement = _mapping(item, where, required=True)
            if not isinstance(requirement.get("key"), str) or not is_qualified_name(requirement["key"]):
                raise SpecError(f"{where}.key", f"must be a label key, got {requirement.get('key')!r}")
            for vindex, value in enumerate(_strings(requirement.get("values"), f"{where}.values")):
                if not is_label_value(value):
                    raise SpecError(f"{where}.values[{vindex}]", f"must be a label value, got {value!r}")
        problem = selector_problem(selector)
        if problem is not None:
            raise SpecError("spec.consumers.podSelector", problem)
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


def selector_problem(selector: Mapping[str, Any]) -> str | None:
    """Why a ``consumers.podSelector`` cannot narrow the opted-in pods, or ``None`` when it can.

    A selector must require a label a pod has: a ``matchLabels`` entry, or an ``In`` or ``Exists``
    expression. ``NotIn`` and ``DoesNotExist`` alone match every pod that lacks a label, i.e. every
    unrelated pod, and ``{}`` means "everything" to Kubernetes. (Pods must also opt in with
    ``compilecache.dev/inject: "true"``; this keeps a selector from meaning "all of those".) The
    CRD has the same rule in CEL; the admission check of the operator's policy calls this too.
    """
    if selector.get("matchLabels"):
        return None
    expressions = selector.get("matchExpressions") or []
    if any(isinstance(item, Mapping) and item.get("operator") in ("In", "Exists") for item in expressions):
        return None
    return (
        "must require a label the pods have (a matchLabels entry, or a matchExpressions item with "
        "operator In or Exists); NotIn and DoesNotExist alone, or an empty selector, match every unrelated pod"
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
        if not isinstance(key, str) or not is_qualified_name(key):
            raise SpecError(f"{path}.{key}", f"must be a label key (a qualified name), got {key!r}")
        if not isinstance(item, str) or not is_label_value(item):
            raise SpecError(f"{path}.{key}", f"must be a label value (at most 63 characters), got {item!r}")
    return dict(labels)


def _tolerations(value: Any, path: str) -> tuple[Mapping[str, Any], ...]:
    tolerations = tuple(
        _mapping(item, f"{path}[{index}]", required=True) for index, item in enumerate(_list(value, path))
    )
    for index, toleration in enumerate(tolerations):
        key, operator = toleration.get("key", ""), toleration.get("operator", "Equal")
        if not isinstance(key, str) or (key and not is_qualified_name(key)):
            raise SpecError(f"{path}[{index}].key", f"must be a taint key (a qualified name), got {key!r}")
        if not key and operator != "Exists":
            raise SpecError(f"{path}[{index}].operator", "a toleration without key must use operator Exists")
        value_ = toleration.get("value", "")
        if not isinstance(value_, str) or not is_label_value(value_):
            raise SpecError(f"{path}[{index}].value", f"must be a label value, got {value_!r}")
        if operator == "Exists" and value_:
            raise SpecError(f"{path}[{index}].value", "a toleration with operator Exists must not set value")
    return tolerations


def _gpu_resource(value: Any, path: str) -> str:
    resource = _optional_str(value, path)
    if resource is None:
        return DEFAULT_GPU_RESOURCE
    if not is_extended_resource_name(resource):
        raise SpecError(path, f"must be an extended resource name such as nvidia.com/gpu, got {resource!r}")
    return resource


def _check_resources(resources: Mapping[str, Any], gpu_resources: set[str]) -> None:
    """Requests and limits the API server accepts in a container, and no GPU count of their own."""
    parsed: dict[str, dict[str, Any]] = {}
    for kind in ("requests", "limits"):
        parsed[kind] = {}
        for name, value in _mapping(resources.get(kind), f"spec.warmup.resources.{kind}").items():
            where = f"spec.warmup.resources.{kind}.{name}"
            if name in gpu_resources:
                raise SpecError(where, "GPUs come from the pool (gpusPerPod, or all of a node's); do not set them here")
            standard = name in _STANDARD_RESOURCES or name.startswith("hugepages-")
            if not (standard if "/" not in name else is_extended_resource_name(name)):
                raise SpecError(
                    where, f"must be cpu, memory, ephemeral-storage, hugepages-* or domain/name, got {name!r}"
                )
            if isinstance(value, float):
                raise SpecError(where, f"must be an integer or a quantity string, got {value!r}")
            quantity = _convert(units.parse_quantity, value, where)
            if quantity < 0:
                raise SpecError(where, f"must not be negative, got {value!r}")
            parsed[kind][name] = quantity
    for name, request in parsed["requests"].items():
        limit = parsed["limits"].get(name)
        if limit is not None and request > limit:
            raise SpecError(f"spec.warmup.resources.requests.{name}", f"must not exceed limits.{name}")
        if "/" in name and limit is None:  # extended resources cannot be overcommitted
            raise SpecError(f"spec.warmup.resources.requests.{name}", f"needs limits.{name} set to the same amount")
        if "/" in name and limit != request:
            raise SpecError(f"spec.warmup.resources.limits.{name}", f"must equal requests.{name}")


def _check_value_from(value: Any, path: str) -> None:
    """An EnvVarSource: exactly one known source, with the field that source requires."""
    source = _mapping(value, path, required=True)
    if len(source) != 1 or next(iter(source)) not in _VALUE_SOURCES:
        raise SpecError(path, f"must set exactly one of {sorted(_VALUE_SOURCES)}, got {sorted(source)}")
    kind, ref_raw = next(iter(source.items()))
    ref = _mapping(ref_raw, f"{path}.{kind}", required=True)
    required = _VALUE_SOURCES[kind]
    allowed = {
        "secretKeyRef": {"name", "key", "optional"},
        "configMapKeyRef": {"name", "key", "optional"},
        "fieldRef": {"apiVersion", "fieldPath"},
        "resourceFieldRef": {"containerName", "resource", "divisor"},
    }[kind]
    unknown = sorted(set(ref) - allowed)
    if unknown:
        raise SpecError(f"{path}.{kind}.{unknown[0]}", f"is not a field of {kind}")
    text = ref.get(required)
    if not isinstance(text, str) or not text:
        raise SpecError(f"{path}.{kind}.{required}", "is required")
    if required == "key" and (len(text) > 253 or not _CONFIG_KEY.match(text)):
        raise SpecError(f"{path}.{kind}.key", f"must be a valid key, got {text!r}")
    if "name" in ref:
        _subdomain(ref["name"], f"{path}.{kind}.name")
    if "optional" in ref:
        _bool(ref["optional"], f"{path}.{kind}.optional")
    if "divisor" in ref:
        _convert(units.parse_quantity, ref["divisor"], f"{path}.{kind}.divisor")


def _name(value: Any, path: str) -> str:
    if not isinstance(value, str) or not _DNS_LABEL.match(value):
        raise SpecError(path, f"must be a DNS label (lower-case letters, digits, '-'), got {value!r}")
    return value


def _subdomain(value: Any, path: str) -> str:
    if not isinstance(value, str) or not is_dns_subdomain(value):
        raise SpecError(path, f"must be a DNS subdomain (lower-case letters, digits, '-', '.'), got {value!r}")
    return value


def _optional_subdomain(value: Any, path: str) -> str | None:
    return None if value is None else _subdomain(value, path)


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
