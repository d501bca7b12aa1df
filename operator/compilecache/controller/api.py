"""The CompileCache resource as the operator reads it: its spec parsed and validated into typed values.

The resource is defined once, in ``compilecache.api.model`` (pydantic): the CRD's schema and
docs/resource.md are generated from it (``make generate``), and :func:`parse_spec` starts by
validating the spec against it (:func:`check_model`): types, bounds, patterns and enums as the
API server checks them, with the field's JSON path in the error (``spec.warmup.workloads[0].steps``).
The typed dataclasses below (``CacheSpec.warmup.workloads[i].steps``), which the rest of the
controller reads, are built from the validated model's values, so the defaults are the model's. The
checks here are only what the model does not make: its CEL rules, which pydantic does not
evaluate; the schema's rules pydantic does not either (list-map keys unique, map keys, a
``valueFrom``'s one source); the API server's pod validation beyond the CRD's patterns (a label
key's parts, extended resource names); parses (cron, durations, byte sizes); and the checks the CRD
deliberately leaves out (too costly for CEL, e.g. a workload's pools naming declared pools; or
needing several fields, e.g. requests not above limits). The CEL rules stay plain checks here
rather than pydantic validators in the model: each names its own field (``spec.storage``,
``...workloads[0].steps``) with its own message, and runs after the whole schema as the API server
orders them; tests/test_spec_property.py checks the two never disagree.

The CRD's schema rejects most bad input at admission, but the operator validates again: a CRD can
be older than the operator, and a clear condition naming the field beats a crash loop. This parser
never refuses what the CRD admits as valid, and anything it lets through becomes objects the API
server accepts: the name and label rules below are apimachinery's
(``k8s.io/apimachinery/pkg/util/validation/validation.go``), the resource and mount rules those of
``pkg/apis/core/validation/validation.go``.
"""

from __future__ import annotations

import posixpath
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pydantic

from compilecache import frameworks
from compilecache.api import model
from compilecache.cache import linear, units
from compilecache.frameworks.interface import STEPS_AUTO

GROUP = "compilecache.dev"
VERSION = "v1alpha1"
PLURAL = "compilecaches"
KIND = "CompileCache"
API_VERSION = f"{GROUP}/{VERSION}"

DEFAULT_MOUNT_PATH: str = model.Spec.model_fields["mountPath"].default

# Matched in linear time (cache/linear.py), each against the whole value: these read a cache author's strings.
_DNS_LABEL = linear.regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN_SYNTAX = linear.regex(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME_PART = linear.regex(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE = linear.regex(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_ENV_NAME = linear.regex(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_CONFIG_KEY = linear.regex(r"[-._a-zA-Z0-9]+")
_MOUNT_PATH = linear.regex(r"(/([^/:.][^/:]*|\.[^/:.][^/:]*|\.\.[^/:]+))+")  # the CRD's pattern
_STANDARD_RESOURCES = {"cpu", "memory", "ephemeral-storage"}  # and hugepages-<size>
_VALUE_SOURCES = {
    "secretKeyRef": "key",
    "configMapKeyRef": "key",
    "fieldRef": "fieldPath",
    "resourceFieldRef": "resource",
}
NAME_MAX = 63  # a cache's name is the value of labels on its Jobs, claims and pods
DEFAULT_SERVICE_ACCOUNT = "default"  # what a pod without serviceAccountName runs as
# A training pod template (inline, or the object templateRef names) is free-form (the CRD preserves
# its unknown fields): bounded here, before anything reads it. A real pod spec is a few KiB and
# nests about 10 levels (affinity terms, projected sources); the API server bounds a whole object
# at 1.5 MiB and its JSON nesting only at 10,000 levels, deeper than Python's parsers go.
TEMPLATE_MAX_CHARS = 256 * 1024
TEMPLATE_MAX_DEPTH = 32
# Paths the operator mounts in warm-up and expiry containers itself (jobs.TMP_DIR): a cache
# there would be a duplicate mountPath, which the API server refuses.
RESERVED_MOUNT_PATHS = frozenset({"/tmp"})
_RESERVED_ENV = {"JAX_COMPILATION_CACHE_DIR", "XLA_FLAGS"}
HOSTS_MAX = 256  # the CRD's maximum of warmup.topologies[].hosts (pods of one Indexed warm-up Job)
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
    resume_when: str | None = None  # the checkpoint a restart reads: the resumed run happens when it is left


@dataclass(frozen=True)
class PoolSpec:
    name: str
    node_selector: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...]
    gpus_per_pod: int | None  # None: the pool's allocatable GPUs per node
    gpu_resource: str


@dataclass(frozen=True)
class GpuType:
    """A GPU type declared for discovery: a value of ``groupBy`` and its warm-up pod's GPUs."""

    value: str
    gpus_per_pod: int


@dataclass(frozen=True)
class Discover:
    node_selector: Mapping[str, str]
    group_by: str | None  # None: each node's first accelerator label (controller/accelerators.py)
    tolerations: tuple[Mapping[str, Any], ...]
    gpu_resource: str
    gpu_types: tuple[GpuType, ...] = ()


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
# What ``podTemplate.templateRef`` may name: the model's enum (one definition; template.py says where each keeps it).
TEMPLATE_KINDS: tuple[str, ...] = typing.get_args(model.TemplateRef.model_fields["kind"].annotation)
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


# What a template's placement may hold (nodeSelector entries, affinity requirements, tolerations):
# pools.py checks every node of every discovered pool against all of it, so the work of a pass is
# nodes × this. A real training pod has a handful; the API server sets no bound of its own.
PLACEMENT_REQUIREMENTS_MAX = 128
PLACEMENT_TOLERATIONS_MAX = 64
# The operators of a NodeSelectorRequirement (core/v1 NodeSelectorOperator) and those a matchFields
# item may use (nodeaffinity.go: nodeSelectorRequirementsAsFieldSelector supports In and NotIn only).
NODE_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
FIELD_OPERATORS = ("In", "NotIn")
NODE_NAME_FIELD = "metadata.name"  # the one node field a matchFields item may name (the API's validation)
_INT64 = linear.regex(r"[+-]?[0-9]{1,19}")  # what Go's strconv.ParseInt(value, 10, 64) reads (range checked apart)


def parse_int64(value: str) -> int | None:
    """``value`` as Go's ``strconv.ParseInt(value, 10, 64)`` reads it (an optional sign, ASCII digits, in
    int64's range), or ``None`` where that fails: how a ``Gt``/``Lt`` requirement reads its value and a label."""
    if not _INT64(value):
        return None
    number = int(value)
    return number if -(2**63) <= number < 2**63 else None


@dataclass(frozen=True)
class NodeRequirement:
    """One ``matchExpressions`` item of a required node affinity term (or, ``node_name``, a ``matchFields``
    one). ``bound`` is ``Gt``'s and ``Lt``'s one value, as the integer it must be."""

    key: str
    operator: str  # one of NODE_OPERATORS
    values: frozenset[str] = frozenset()
    bound: int | None = None
    node_name: bool = False  # a matchFields item: its key is metadata.name, matched against the node's name

    def describe(self) -> str:
        """``nvidia.com/gpu.product In [A100, H100]``: for messages (at most 5 values named)."""
        if self.operator in ("Exists", "DoesNotExist"):
            return f"{self.key} {self.operator}"
        if self.bound is not None:
            return f"{self.key} {self.operator} {self.bound}"
        shown = sorted(self.values)
        more = f", and {len(shown) - 5} more" if len(shown) > 5 else ""
        return f"{self.key} {self.operator} [{', '.join(shown[:5])}{more}]"


@dataclass(frozen=True)
class Placement:
    """Where training's pods may run, as its pod template says: read to leave out the discovered pools
    training cannot land on (``pools.py``), never copied to a warm-up pod (the pool places it).

    ``node_terms`` is the required node affinity's ``nodeSelectorTerms`` (``None``: no required
    affinity); ``extended_resources`` are the extended resources its containers request, whose
    NoSchedule taints Kubernetes' ExtendedResourceToleration admission lets such pods tolerate.
    """

    node_selector: Mapping[str, str] = field(default_factory=dict)
    node_terms: tuple[tuple[NodeRequirement, ...], ...] | None = None
    tolerations: tuple[Mapping[str, Any], ...] = ()
    extended_resources: frozenset[str] = frozenset()


@dataclass(frozen=True)
class PodTemplate:
    """What a warm-up takes from training's pod template (``spec.warmup.podTemplate``; docs/resource.md).

    Taken: the chosen container's image, env, envFrom, volumeMounts and workingDir, the arguments
    after a workload's script in its command + args (:meth:`script_args`), and the pod's volumes,
    serviceAccountName and imagePullSecrets. Everything else (the command itself, resources,
    securityContext, placement, ...) is the operator's: see ``jobs.warmup_job``; the placement is read
    (``placement``) only to leave out the discovered pools training cannot run on. ``origin`` is the
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
    placement: Placement = field(default_factory=Placement)  # where training runs (which pools to warm)

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
    # The warm-up's image: ``warmup.image``, else training's (the template's container), which a
    # templateRef gives only once the pass has read it (``template.resolve``): "" until then.
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
    capacity_timeout_seconds: float
    jobs: int
    verify: bool
    jax: JaxOptions
    topologies: tuple[Topology, ...] = (SINGLE_HOST,)
    template: TemplateSource | None = None  # training's pod template (spec.warmup.podTemplate)
    # The template the warm-up Jobs use: the inline one, or the reference's once the pass read it.
    pod_template: PodTemplate | None = None
    provisioning: Provisioning | None = None
    queue: Queue | None = None
    priority_class_name: str | None = None
    job_labels: Mapping[str, str] = field(default_factory=dict)
    job_annotations: Mapping[str, str] = field(default_factory=dict)
    # True when warmup.image is unset: the cache follows training's image (``images.py``), warming
    # each new one while it serves the entries of those it warmed before.
    image_from_template: bool = False
    image_path: str = "spec.warmup.image"  # the field that names the image, for messages and the policy


@dataclass(frozen=True)
class Queue:
    """``warmup.queue``: the Kueue LocalQueues the warm-up and expiry Jobs join, and their priority class."""

    name: str
    expiry_name: str
    priority_class: str | None = None


# Label and annotation domains a cache author may not put on the operator's Jobs (warmup.jobMetadata):
# the operator's own, Kueue's (warmup.queue sets those), and Kubernetes' reserved ones.
RESERVED_METADATA = ("compilecache.dev", "kueue.x-k8s.io", "kubernetes.io", "k8s.io")
# The Job controller's own unprefixed pod labels (the API server fills them in from the Job's selector).
JOB_CONTROLLER_LABELS = ("job-name", "controller-uid")


@dataclass(frozen=True)
class Provisioning:
    """``warmup.provisioningRequest``: a ProvisioningRequest of this class asks for each warm-up's capacity."""

    class_name: str
    parameters: Mapping[str, str] = field(default_factory=dict)


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
    return len(value) <= 253 and _DNS_SUBDOMAIN_SYNTAX(value)


def is_dns_label(value: str) -> bool:
    """A DNS-1123 label: at most 63 lower-case letters, digits and '-'."""
    return _DNS_LABEL(value)


def is_label_value(value: str) -> bool:
    """A label value: empty, or at most 63 alphanumerics with '-', '_', '.' inside."""
    return len(value) <= 63 and _LABEL_VALUE(value)


def is_qualified_name(value: str) -> bool:
    """A label key (a qualified name): ``[prefix/]name``, prefix a DNS subdomain, name at most 63."""
    prefix, slash, name = value.rpartition("/")
    if slash and not (prefix and is_dns_subdomain(prefix)):
        return False
    return len(name) <= 63 and _QUALIFIED_NAME_PART(name)


def is_extended_resource_name(value: str) -> bool:
    """An extended resource (e.g. nvidia.com/gpu): ``domain/name``, not in kubernetes.io, not ``requests.``."""
    return (
        "/" in value
        and "kubernetes.io/" not in value
        and not value.startswith("requests.")
        and is_qualified_name(f"requests.{value}")
    )


def parse_spec(spec: Mapping[str, Any] | None) -> CacheSpec:
    """Validate a CompileCache ``spec`` and apply defaults; raise :class:`SpecError` naming the field.

    The model (:func:`check_model`) checks types, bounds, patterns and enums and gives the defaults;
    what follows reads its validated values and checks only what it does not (see the module's doc).
    Fields the operator passes on as they are (env, tolerations, resources, podSelector, a template's
    pod spec) are read from ``spec`` itself, so no pydantic default or dropped field reaches a manifest.
    """
    spec = _mapping(spec, "spec", required=True)
    typed = check_model(_forgiven(spec))
    storage = typed.storage
    # A CEL rule (the API server evaluates CEL, pydantic does not), as are the other checks marked so below.
    if storage.pvc is None and storage.gcs is None:
        raise SpecError("spec.storage", "set exactly one of storage.pvc or storage.gcs (neither is set)")
    if storage.pvc is not None and storage.gcs is not None:
        raise SpecError("spec.storage", "set exactly one of storage.pvc or storage.gcs (both are set)")
    pvc = _pvc(storage.pvc) if storage.pvc is not None else None
    gcs = _gcs(storage.gcs) if storage.gcs is not None else None

    mount_path = typed.mountPath  # a trailing / already stripped (_forgiven)
    if mount_path in RESERVED_MOUNT_PATHS:  # CEL rule
        raise SpecError("spec.mountPath", f"{mount_path} is where the operator mounts its own scratch volume")

    warmup = _warmup(typed.warmup, spec["warmup"], gcs, mount_path)
    if gcs is not None:
        _check_writer(gcs, typed.warmup.serviceAccountName)
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
    # The model checks the cron's shape; croniter's ranges and steps only a parse can.
    schedule = None if typed.schedule is None else _convert(units.check_cron, typed.schedule, "spec.schedule")
    # Options the framework's warmer would ignore are refused, each named, not dropped without a word.
    problems = frameworks.get(typed.framework).spec_problems(spec["warmup"])
    if problems:
        raise SpecError(*problems[0])
    return CacheSpec(
        framework=typed.framework,
        pvc=pvc,
        gcs=gcs,
        mount_path=mount_path,
        warmup=warmup,
        schedule=schedule,
        concurrency_policy=typed.concurrencyPolicy,
        lifecycle=_lifecycle(typed.lifecycle),
        consumers=_consumers(typed.consumers, _mapping(spec.get("consumers"), "spec.consumers")),
    )


def _check_writer(gcs: GCSStorage, warmup_account: str | None) -> None:
    """A GCS cache's writer (CEL rules): named, and not ``default``. Its warm-up and expiry pods write the
    prefix as it, and it is what keeps training off the prefix: were it ``default`` (or unnamed, so
    ``default``), every training pod that names no ServiceAccount would run as the writer."""
    if gcs.service_account_name is None and warmup_account is None:
        raise SpecError(
            "spec.storage.gcs",
            "names no writer: set serviceAccountName to a ServiceAccount that may write the prefix (Workload "
            "Identity); the warm-up and expiry pods write as it, and training pods never run as it",
        )
    for path, account in (
        ("spec.storage.gcs.serviceAccountName", gcs.service_account_name),
        ("spec.warmup.serviceAccountName", warmup_account),
    ):
        if account == DEFAULT_SERVICE_ACCOUNT:
            raise SpecError(
                path,
                "the cache's writer must not be default: every pod that names no ServiceAccount runs as default, "
                "training's too; name a ServiceAccount of its own",
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


def check_model(spec: Mapping[str, Any]) -> model.Spec:
    """The spec against the model the CRD is generated from (``compilecache.api.model``), validated.

    What the API server's schema checks (not the CEL rules, which :func:`parse_spec` checks after it).
    Raises :class:`SpecError` naming the first offending field by its JSON path.
    """
    try:
        return model.Spec.model_validate(spec)
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
            # The hints, not model_fields' annotation: a field typed with a class defined further down
            # the module keeps its forward reference there (Discover.tolerations).
            kind = typing.get_type_hints(kind, include_extras=True)[part]
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


def _pvc(pvc: model.Pvc) -> PVCStorage:
    create = None
    if pvc.create is not None:
        # The pattern admits quantities no byte count has (1m, 0.5): only a parse refuses them.
        _convert(units.parse_bytes, pvc.create.size, "spec.storage.pvc.create.size")
        create = PVCCreate(
            size=pvc.create.size,
            storage_class_name=pvc.create.storageClassName,
            access_modes=tuple(pvc.create.accessModes),
        )
    if pvc.deleteWithCache and create is None:  # CEL rule
        raise SpecError(
            "spec.storage.pvc.deleteWithCache",
            "only a claim the operator creates (create) can be deleted with the cache",
        )
    return PVCStorage(claim_name=pvc.claimName, create=create, delete_with_cache=pvc.deleteWithCache)


def _gcs(gcs: model.Gcs) -> GCSStorage:
    return GCSStorage(
        bucket=gcs.bucket,
        prefix=gcs.prefix,  # without a leading or trailing / (_forgiven)
        service_account_name=gcs.serviceAccountName,
        delete_with_cache=gcs.deleteWithCache,
        reader_service_account_name=gcs.readerServiceAccountName,
    )


def _warmup(warmup: model.Warmup, raw: Mapping[str, Any], gcs: GCSStorage | None, mount_path: str) -> Warmup:
    """``spec.warmup``: ``warmup`` validated by the model, ``raw`` as written (for what is passed on as is)."""
    image = (warmup.image or "").strip()
    if warmup.image is not None and not image:  # the model wants one character; blanks name no image either
        raise SpecError("spec.warmup.image", "must name the image of the warm-up Jobs (usually the training image)")
    if warmup.image is None and warmup.podTemplate is None:  # CEL rule
        raise SpecError(
            "spec.warmup",
            "must name the image of the warm-up Jobs, or set podTemplate to take training's image from it",
        )

    raw_pools = raw.get("pools") or []
    pools = tuple(
        _pool(pool, raw_pools[index], f"spec.warmup.pools[{index}]") for index, pool in enumerate(warmup.pools or ())
    )
    # List-map keys (unique names, unique hosts) are the API server's; pydantic does not check them.
    _unique([pool.name for pool in pools], "spec.warmup.pools")
    discover = _discover(warmup.discover, raw["discover"]) if warmup.discover is not None else None
    if not pools and discover is None:  # CEL rule
        raise SpecError("spec.warmup", "set warmup.pools, warmup.discover, or both: there is nowhere to warm")

    workloads = tuple(
        _workload(workload, raw["workloads"][index], f"spec.warmup.workloads[{index}]")
        for index, workload in enumerate(warmup.workloads)
    )
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

    jax = JaxOptions(
        min_compile_time_secs=float(warmup.jax.minCompileTimeSecs),
        min_entry_size_bytes=warmup.jax.minEntrySizeBytes,
        xla_flags=warmup.jax.xlaFlags or None,
    )
    resources = _mapping(raw.get("resources"), "spec.warmup.resources")
    gpu_resources = {pool.gpu_resource for pool in pools} | ({discover.gpu_resource} if discover else set())
    _check_resources(resources, gpu_resources)

    service_account = warmup.serviceAccountName
    if service_account is None and gcs is not None:
        service_account = gcs.service_account_name
    topologies = _topologies(warmup.topologies)
    deadline = warmup.activeDeadlineSeconds
    _check_budgets(workloads, topologies, deadline)
    template = (
        _template_source(warmup.podTemplate, raw["podTemplate"], mount_path) if warmup.podTemplate is not None else None
    )
    image_path = "spec.warmup.image"
    if not image and template is not None and template.inline is not None:
        image, image_path = template_image(template.inline), f"{template.inline.container_path}.image"
    return Warmup(
        image=image,
        image_from_template=warmup.image is None,
        image_path=image_path,
        image_pull_policy=warmup.imagePullPolicy,
        image_pull_secrets=tuple(secret.name for secret in warmup.imagePullSecrets or ()),
        service_account_name=service_account,
        workloads=workloads,
        pools=pools,
        discover=discover,
        resources=resources,
        backoff_limit=warmup.backoffLimit,
        active_deadline_seconds=deadline,
        ttl_seconds_after_finished=warmup.ttlSecondsAfterFinished,
        capacity_timeout_seconds=_convert(units.parse_duration, warmup.capacityTimeout, "spec.warmup.capacityTimeout"),
        jobs=warmup.jobs,
        verify=warmup.verify,
        jax=jax,
        topologies=topologies,
        template=template,
        pod_template=template.inline if template is not None else None,
        provisioning=(
            Provisioning(warmup.provisioningRequest.className, dict(warmup.provisioningRequest.parameters or {}))
            if warmup.provisioningRequest is not None
            else None
        ),
        queue=_queue(warmup),
        priority_class_name=warmup.priorityClassName,
        job_labels=_job_metadata(warmup, "labels"),
        job_annotations=_job_metadata(warmup, "annotations"),
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


def _template_source(source: model.PodTemplate, raw: Mapping[str, Any], mount_path: str) -> TemplateSource:
    """``spec.warmup.podTemplate``: exactly one of ``spec`` (inline) or ``templateRef``, and ``container``."""
    path = "spec.warmup.podTemplate"
    if ("spec" in raw) == ("templateRef" in raw):  # CEL rule
        raise SpecError(path, "set exactly one of spec (the pod spec inline) or templateRef")
    if "spec" in raw:
        # A preserved-unknown-fields object: the model leaves the pod spec to parse_pod_template.
        inline = parse_pod_template(
            _mapping(raw["spec"], f"{path}.spec", required=True), f"{path}.spec", source.container
        )
        check_template(inline, mount_path)
        return TemplateSource(container=source.container, inline=inline)
    if source.templateRef is None:
        raise SpecError(f"{path}.templateRef", "is required")
    ref = TemplateRef(kind=source.templateRef.kind, name=source.templateRef.name)
    return TemplateSource(container=source.container, ref=ref)


def check_template(template: PodTemplate, mount_path: str) -> None:
    """What a template must agree on with the cache: nothing of it is mounted where the cache is.

    Its image may differ from a ``warmup.image`` that is set (the author pinned the warm-up's image):
    training's pods on the template's image are then on an image the cache never warmed, and the
    status, a metric and an Event on each such pod say so (``images.py``).
    """
    for index, mount in enumerate(template.volume_mounts):
        if str(mount.get("mountPath", "")).rstrip("/") == mount_path:
            raise SpecError(
                f"{template.container_path}.volumeMounts[{index}].mountPath",
                f"{mount_path} is spec.mountPath, where the warm-up mounts the cache",
            )


def template_image(template: PodTemplate) -> str:
    """Training's image, which the warm-up takes when ``warmup.image`` is unset; refused when there is none."""
    if not template.image:
        raise SpecError(
            f"{template.container_path}.image",
            "names no image: set it, or spec.warmup.image to the image the warm-up runs",
        )
    return template.image


def parse_pod_template(pod_spec: Mapping[str, Any], origin: str, container: str | None) -> PodTemplate:
    """The part of a pod spec a warm-up takes (:class:`PodTemplate`), checked; errors name ``origin``'s fields.

    Used for the inline ``podTemplate.spec`` and, by the pass, for the pod spec of the object
    ``templateRef`` names (``origin`` then says which). Fields not taken are not read at all.
    """
    check_bounded(pod_spec, origin)
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
        if not isinstance(item.get("name"), str) or not _ENV_NAME(item["name"]):
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
        if not isinstance(target, str) or not _MOUNT_PATH(target.rstrip("/") or "/"):
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
        placement=_placement(pod_spec, containers, origin),
    )


def check_bounded(value: Any, path: str, *, max_chars: int = TEMPLATE_MAX_CHARS) -> None:
    """Refuse a free-form object (a pod template) longer than ``max_chars`` as JSON text, or nested deeper than
    :data:`TEMPLATE_MAX_DEPTH`, naming where it went past the bound.

    Each value is charged about its JSON size (a key or string its length plus quotes, an object or list its
    brackets, a number or a literal a few characters), so that ``{}`` and ``[]`` cost what they weigh too;
    an object's or a list's members are charged their smallest size (a comma and one character) before
    they are walked, so a list of a million is refused at once. One walk without recursion, whose paths
    are spelled only for the message: its work is bounded by the bound, not by the value.
    """
    budget = max_chars
    # (value, its parent's entry, its key or index, depth): a path is spelled from this chain only to be shown.
    stack: list[tuple[Any, Any, Any, int]] = [(value, None, None, 0)]
    while stack:
        entry = stack.pop()
        item, depth = entry[0], entry[3]
        if depth > TEMPLATE_MAX_DEPTH:
            raise SpecError(
                _spelled(path, entry), f"nests deeper than {TEMPLATE_MAX_DEPTH} levels; a pod spec needs about 10"
            )
        if isinstance(item, Mapping):
            budget -= 2 + sum(len(str(key)) + 5 for key in item)  # {}, and "key": with a comma and a value
        elif isinstance(item, list):
            budget -= 2 + 2 * len(item)  # [], and a comma and a value each
        else:
            budget -= len(item) + 1 if isinstance(item, str) else 7  # beyond the one character charged already
        if budget < 0:
            raise SpecError(_spelled(path, entry), f"the pod spec holds more than {max_chars // 1024} KiB of JSON")
        if isinstance(item, Mapping):
            stack += [(child, entry, key, depth + 1) for key, child in item.items()]
        elif isinstance(item, list):
            stack += [(child, entry, index, depth + 1) for index, child in enumerate(item)]


def _spelled(path: str, entry: tuple[Any, Any, Any, int]) -> str:
    """The JSON path of a walked value: ``spec.containers[0].env``."""
    parts: list[str] = []
    while entry[1] is not None:
        key = entry[2]
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
        entry = entry[1]
    return path + "".join(reversed(parts))


def _env_from(raw: Any, path: str) -> Mapping[str, Any]:
    """An EnvFromSource: exactly one of configMapRef or secretRef naming its object; an optional prefix."""
    source = _mapping(raw, path, required=True)
    refs = [key for key in ("configMapRef", "secretRef") if key in source]
    if len(refs) != 1:
        raise SpecError(path, "must set exactly one of configMapRef or secretRef")
    _subdomain(_mapping(source[refs[0]], f"{path}.{refs[0]}", required=True).get("name"), f"{path}.{refs[0]}.name")
    prefix = _optional_str(source.get("prefix"), f"{path}.prefix")
    if prefix and not _ENV_NAME(prefix):
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


def _placement(pod_spec: Mapping[str, Any], containers: Sequence[Any], origin: str) -> Placement:
    """Training's placement (:class:`Placement`): its nodeSelector, required node affinity, tolerations and
    the extended resources its containers request, checked as the API server and the scheduler read them.

    A pod's nodeSelector and required node affinity both must hold; the affinity's terms are ORed and a
    term's requirements ANDed; a term without requirements matches no node; a ``Gt``/``Lt`` value is a
    base-10 int64 (component-helpers scheduling/corev1/nodeaffinity/nodeaffinity.go, apimachinery
    labels.NewRequirement). Bounded (:data:`PLACEMENT_REQUIREMENTS_MAX`): pools.py checks every node
    against all of it.
    """
    where = f"{origin}.nodeSelector"
    selector = _labels(pod_spec.get("nodeSelector"), where)
    for key, value in selector.items():
        if not isinstance(value, str) or not is_label_value(value):
            raise SpecError(f"{where}.{key}", f"must be a label value, got {value!r}")
    count = len(selector)
    affinity = _mapping(pod_spec.get("affinity"), f"{origin}.affinity")
    node_affinity = _mapping(affinity.get("nodeAffinity"), f"{origin}.affinity.nodeAffinity")
    where = f"{origin}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    terms: tuple[tuple[NodeRequirement, ...], ...] | None = None
    if node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") is not None:
        required = _mapping(node_affinity["requiredDuringSchedulingIgnoredDuringExecution"], where)
        raw_terms = _list(required.get("nodeSelectorTerms"), f"{where}.nodeSelectorTerms")
        if not raw_terms:  # the API server's validation: a required node selector lists at least one term
            raise SpecError(f"{where}.nodeSelectorTerms", "must list at least one term")
        parsed: list[tuple[NodeRequirement, ...]] = []
        for tindex, raw_term in enumerate(raw_terms):
            tpath = f"{where}.nodeSelectorTerms[{tindex}]"
            term = _mapping(raw_term, tpath, required=True)
            items: list[NodeRequirement] = []
            for kind, is_field in (("matchExpressions", False), ("matchFields", True)):
                for index, item in enumerate(_list(term.get(kind), f"{tpath}.{kind}")):
                    count += 1
                    if count > PLACEMENT_REQUIREMENTS_MAX:
                        raise SpecError(
                            f"{tpath}.{kind}[{index}]",
                            f"the placement holds more than {PLACEMENT_REQUIREMENTS_MAX} node requirements "
                            "(nodeSelector entries and affinity expressions)",
                        )
                    items.append(_node_requirement(item, f"{tpath}.{kind}[{index}]", field=is_field))
            parsed.append(tuple(items))
        terms = tuple(parsed)
    raw_tolerations = _list(pod_spec.get("tolerations"), f"{origin}.tolerations")
    if len(raw_tolerations) > PLACEMENT_TOLERATIONS_MAX:
        raise SpecError(f"{origin}.tolerations", f"lists more than {PLACEMENT_TOLERATIONS_MAX} tolerations")
    for index, item in enumerate(raw_tolerations):
        toleration = _mapping(item, f"{origin}.tolerations[{index}]", required=True)
        for key in ("key", "operator", "value", "effect"):
            _optional_str(toleration.get(key), f"{origin}.tolerations[{index}].{key}")
    tolerations = _tolerations(raw_tolerations, f"{origin}.tolerations")
    extended: set[str] = set()
    for kind in ("containers", "initContainers"):
        listed = containers if kind == "containers" else _list(pod_spec.get(kind), f"{origin}.{kind}")
        for index, item in enumerate(listed):
            resources = _mapping(
                _mapping(item, f"{origin}.{kind}[{index}]").get("resources"),
                f"{origin}.{kind}[{index}].resources",
            )
            for amounts in ("requests", "limits"):  # limits alone default the requests (the API's defaulting)
                names = _mapping(resources.get(amounts), f"{origin}.{kind}[{index}].resources.{amounts}")
                extended.update(name for name in names if is_extended_resource_name(str(name)))
    return Placement(
        node_selector=selector,
        node_terms=terms,
        tolerations=tolerations,
        extended_resources=frozenset(extended),
    )


def _node_requirement(raw: Any, path: str, *, field: bool) -> NodeRequirement:
    """A NodeSelectorRequirement as the API server validates it: a label key (``metadata.name`` for a
    field), a known operator, and the values it takes (``In``/``NotIn`` some label values, one for a
    field; ``Exists``/``DoesNotExist`` none; ``Gt``/``Lt`` one integer)."""
    item = _mapping(raw, path, required=True)
    key, operator = item.get("key"), item.get("operator")
    if field and key != NODE_NAME_FIELD:
        raise SpecError(f"{path}.key", f"must be {NODE_NAME_FIELD} (the one node field a term may match), got {key!r}")
    if not field and (not isinstance(key, str) or not is_qualified_name(key)):
        raise SpecError(f"{path}.key", f"must be a label key (a qualified name), got {key!r}")
    allowed = FIELD_OPERATORS if field else NODE_OPERATORS
    if operator not in allowed:
        raise SpecError(f"{path}.operator", f"must be one of {', '.join(allowed)}, got {operator!r}")
    values = _strings(item.get("values"), f"{path}.values")
    if operator in ("Exists", "DoesNotExist"):
        if values:
            raise SpecError(f"{path}.values", f"must be empty with operator {operator}")
        return NodeRequirement(str(key), str(operator), node_name=field)
    if operator in ("Gt", "Lt"):
        number = parse_int64(values[0]) if len(values) == 1 else None
        if number is None:
            raise SpecError(f"{path}.values", f"must be one integer (a base-10 int64) with operator {operator}")
        return NodeRequirement(str(key), str(operator), frozenset(values), bound=number)
    if not values or (field and len(values) != 1):
        raise SpecError(f"{path}.values", f"must list {'one value' if field else 'values'} with operator {operator}")
    for index, value in enumerate(values):
        if not field and not is_label_value(value):  # labels.NewRequirement refuses the term otherwise
            raise SpecError(f"{path}.values[{index}]", f"must be a label value, got {value!r}")
    return NodeRequirement(str(key), str(operator), frozenset(values), node_name=field)


def volume_type(volume: Mapping[str, Any]) -> str:
    """The source of a volume (``persistentVolumeClaim``, ``hostPath``, ...): its one key besides ``name``."""
    return next((key for key in volume if key != "name"), "")


def _topologies(topologies: Sequence[model.Topology]) -> tuple[Topology, ...]:
    """``warmup.topologies``: ``hosts`` unique (the CRD's list-map key, which pydantic does not check)."""
    seen: list[Topology] = []
    for index, topology in enumerate(topologies):
        if any(other.hosts == topology.hosts for other in seen):
            raise SpecError(f"spec.warmup.topologies[{index}].hosts", f"duplicate topology hosts={topology.hosts}")
        seen.append(Topology(hosts=topology.hosts))
    return tuple(seen)


def _workload(workload: model.Workload, raw: Mapping[str, Any], path: str) -> Workload:
    """One workload: the model's values, its CEL rules, and its env as written (``raw``)."""
    script = workload.script
    if (workload.entrypoint is None) == (script is None):  # CEL rule, as are the other "with script" ones
        raise SpecError(path, "set exactly one of entrypoint (module:function) or script (a path)")
    if script is not None and not script.strip():  # the model wants one character; blanks are no path
        raise SpecError(f"{path}.script", "must be a path to a script")
    if workload.args and script is None:
        raise SpecError(f"{path}.args", "args are passed to a script; an entrypoint takes none")
    env = tuple(raw.get("env") or ())
    for index, item in enumerate(env):
        if "valueFrom" in item:
            if "value" in item:
                raise SpecError(f"{path}.env[{index}]", "sets value or valueFrom, not both")
            # Exactly one source and no unknown field: JSON-schema rules pydantic does not evaluate.
            _check_value_from(item["valueFrom"], f"{path}.env[{index}].valueFrom")
        if item["name"] in _RESERVED_ENV or item["name"].startswith("JAX_PERSISTENT_CACHE_"):
            raise SpecError(
                f"{path}.env[{index}].name",
                f"{item['name']} comes from spec.mountPath, spec.storage and spec.warmup.jax, so that "
                "warmers and trainers match; do not set it in a workload's env",
            )
    steps = workload.steps
    if steps is not None and script is None:
        raise SpecError(f"{path}.steps", "the exact mode runs a script; an entrypoint's targets are compiled ahead")
    step_fn = workload.stepFn
    if step_fn is not None and script is None:
        raise SpecError(f"{path}.stepFn", f"names a Python function (with script), got {step_fn!r}")
    budget = workload.budget
    if budget is not None and (script is None or steps not in (None, STEPS_AUTO)):
        raise SpecError(f"{path}.budget", f"bounds steps: {STEPS_AUTO} (the default for a script), not a step count")
    budget_seconds = None if budget is None else _convert(units.parse_duration, budget, f"{path}.budget")
    if budget_seconds is not None and not budget_seconds >= 1:
        raise SpecError(f"{path}.budget", f"must be at least 1s, got {budget!r}")
    resume = workload.resume
    if resume is not None and script is None:
        raise SpecError(f"{path}.resume", f"is true or false, with a script (the exact mode), got {resume!r}")
    resume_args = tuple(workload.resumeArgs or ())
    if resume_args and (script is None or resume is False):
        raise SpecError(f"{path}.resumeArgs", "are added to the resumed run: they need a script, and resume not false")
    resume_when = workload.resumeWhen
    if resume_when is not None and (script is None or resume is False or not resume_when.strip()):
        raise SpecError(f"{path}.resumeWhen", "names the checkpoint a restart reads: with a script, not resume false")
    return Workload(
        name=workload.name,
        entrypoint=workload.entrypoint,
        script=script,
        args=tuple(workload.args or ()),
        env=env,
        pools=tuple(workload.pools or ()),
        steps=steps,
        step_fn=step_fn,
        budget_seconds=budget_seconds,
        resume=resume,
        resume_args=resume_args,
        resume_when=resume_when,
    )


def _pool(pool: model.Pool, raw: Mapping[str, Any], path: str) -> PoolSpec:
    return PoolSpec(
        name=pool.name,
        node_selector=_labels(raw.get("nodeSelector"), f"{path}.nodeSelector"),
        tolerations=_tolerations(raw.get("tolerations"), f"{path}.tolerations"),
        gpus_per_pod=pool.gpusPerPod,
        gpu_resource=_gpu_resource(pool.gpuResource, f"{path}.gpuResource"),
    )


def _discover(discover: model.Discover, raw: Mapping[str, Any]) -> Discover:
    # The model's pattern bounds the whole key (316), not its prefix (253) and name (63) apart.
    if discover.groupBy is not None and not is_qualified_name(discover.groupBy):
        raise SpecError("spec.warmup.discover.groupBy", f"must be a node label key, got {discover.groupBy!r}")
    gpu_types = tuple(GpuType(value=t.value, gpus_per_pod=t.gpusPerPod) for t in discover.gpuTypes or ())
    if gpu_types and discover.groupBy is None:  # CEL rule
        raise SpecError(
            "spec.warmup.discover.gpuTypes",
            "gpuTypes needs groupBy: the label a node that does not exist yet will carry cannot be guessed",
        )
    _unique([t.value for t in gpu_types], "spec.warmup.discover.gpuTypes", "value")  # the list-map key
    return Discover(
        node_selector=_labels(raw.get("nodeSelector"), "spec.warmup.discover.nodeSelector"),
        group_by=discover.groupBy,
        tolerations=_tolerations(raw.get("tolerations"), "spec.warmup.discover.tolerations"),
        gpu_resource=_gpu_resource(discover.gpuResource, "spec.warmup.discover.gpuResource"),
        gpu_types=gpu_types,
    )


def _lifecycle(lifecycle: model.Lifecycle) -> Lifecycle:
    max_age, max_size = lifecycle.maxAge, lifecycle.maxSize
    return Lifecycle(
        max_age_seconds=None if max_age is None else _convert(units.parse_duration, max_age, "spec.lifecycle.maxAge"),
        max_size_bytes=None if max_size is None else _max_size(max_size),
        keep_versions=lifecycle.keepVersions,
        verify=lifecycle.verify,
    )


def _max_size(value: str) -> int:
    size: int = _convert(units.parse_bytes, value, "spec.lifecycle.maxSize")
    if size > MAX_SIZE_BYTES:
        raise SpecError("spec.lifecycle.maxSize", f"must be at most 1E30 bytes, got {value!r}")
    return size


def _consumers(consumers: model.Consumers, raw: Mapping[str, Any]) -> Consumers:
    """``spec.consumers``: the podSelector as written (``raw``), checked where the model does not."""
    selector = raw.get("podSelector") if consumers.podSelector is not None else None
    if selector is not None:
        # Map keys and the parts of a label key: what the model's patterns cannot bound.
        _labels(selector.get("matchLabels"), "spec.consumers.podSelector.matchLabels")
        for index, requirement in enumerate(selector.get("matchExpressions") or ()):
            if not is_qualified_name(requirement["key"]):
                where = f"spec.consumers.podSelector.matchExpressions[{index}]"
                raise SpecError(f"{where}.key", f"must be a label key, got {requirement['key']!r}")
        problem = selector_problem(selector)  # CEL rule
        if problem is not None:
            raise SpecError("spec.consumers.podSelector", problem)
    return Consumers(
        pod_selector=selector,
        read_only=consumers.readOnly,
        gate=consumers.gate,
        gate_timeout_seconds=_convert(units.parse_duration, consumers.gateTimeout, "spec.consumers.gateTimeout"),
        init_containers=consumers.initContainers,
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
    """A label map as written; its keys checked (values are the model's: map keys have no schema)."""
    labels = _mapping(value, path)
    for key in labels:
        if not is_qualified_name(key):
            raise SpecError(f"{path}.{key}", f"must be a label key (a qualified name), got {key!r}")
    return dict(labels)


def _tolerations(value: Any, path: str) -> tuple[Mapping[str, Any], ...]:
    """Tolerations as written: the key's parts bounded (the model's pattern bounds only the whole), CEL rules."""
    tolerations = tuple(_list(value, path))
    for index, toleration in enumerate(tolerations):
        key, operator = toleration.get("key", ""), toleration.get("operator", "Equal")
        if key and not is_qualified_name(key):
            raise SpecError(f"{path}[{index}].key", f"must be a taint key (a qualified name), got {key!r}")
        if not key and operator != "Exists":
            raise SpecError(f"{path}[{index}].operator", "a toleration without key must use operator Exists")
        if operator == "Exists" and toleration.get("value", ""):
            raise SpecError(f"{path}[{index}].value", "a toleration with operator Exists must not set value")
    return tolerations


def _gpu_resource(resource: str, path: str) -> str:
    # The model's pattern admits kubernetes.io/ names, requests.* and over-long parts; a pod's validation does not.
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
            # The model refuses floats and signs; the comparisons below need the parsed amount.
            parsed[kind][name] = _convert(units.parse_quantity, value, where)
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
    if required == "key" and (len(text) > 253 or not _CONFIG_KEY(text)):
        raise SpecError(f"{path}.{kind}.key", f"must be a valid key, got {text!r}")
    if "name" in ref:
        _subdomain(ref["name"], f"{path}.{kind}.name")
    if "optional" in ref:
        _bool(ref["optional"], f"{path}.{kind}.optional")
    if "divisor" in ref:
        _convert(units.parse_quantity, ref["divisor"], f"{path}.{kind}.divisor")


def _name(value: Any, path: str) -> str:
    if not isinstance(value, str) or not _DNS_LABEL(value):
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


def _unique(names: Sequence[str], path: str, key: str = "name") -> None:
    seen: set[str] = set()
    for index, name in enumerate(names):
        if name in seen:
            raise SpecError(f"{path}[{index}].{key}", f"duplicate {key} {name!r}")
        seen.add(name)


def _queue(warmup: Any) -> Queue | None:
    """``warmup.queue``, checked against ``provisioningRequest`` (one way to ask for capacity)."""
    if warmup.queue is None:
        return None
    if warmup.provisioningRequest is not None:
        raise SpecError(
            "spec.warmup.queue",
            "queue and provisioningRequest exclude each other: with Kueue, ask for capacity through "
            "its ProvisioningRequest admission check on the queue's ClusterQueue",
        )
    queue = warmup.queue
    return Queue(queue.name, queue.expiryName or queue.name, queue.priorityClass)


def _job_metadata(warmup: Any, kind: str) -> dict[str, str]:
    """``warmup.jobMetadata.labels``/``annotations``; a key of a reserved domain is bad input, naming it."""
    path = f"spec.warmup.jobMetadata.{kind}"
    found = _labels(getattr(warmup.jobMetadata, kind), path) if warmup.jobMetadata is not None else {}
    for key in found:
        domain = key.rpartition("/")[0]
        if key in JOB_CONTROLLER_LABELS:
            raise SpecError(f"{path}.{key}", "the Job controller's own label")
        if any(domain == reserved or domain.endswith(f".{reserved}") for reserved in RESERVED_METADATA):
            raise SpecError(
                f"{path}.{key}", f"keys of {', '.join(RESERVED_METADATA)} are the operator's, Kueue's or Kubernetes'"
            )
    return found


def _convert(parse: Any, value: Any, path: str) -> Any:
    try:
        return parse(value)
    except (ValueError, TypeError) as exc:
        raise SpecError(path, str(exc)) from None
