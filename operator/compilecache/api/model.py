"""The CompileCache API as one typed model: the source of truth of the CRD schema and the reference docs.

Every field of ``compilecache.dev/v1alpha1`` ``CompileCache`` is declared once here, with what the
API server checks (type, bounds, pattern, enum, default, list type and map keys, and the CEL rules
in ``x-kubernetes-validations`` on the field or object they guard), the description that
``kubectl explain`` shows, and its row of the reference tables in docs/resource.md (``x-doc``).
``generate.py`` (``make generate``) writes ``crds/compilecache.yaml``, the Helm chart's
byte-identical copy and the tables of docs/resource.md from it; tests/test_generate.py fails when
a committed file differs from what the generator writes, as controller-gen users check. Adding a
field is one edit here plus ``make generate``.

Why pydantic v2: it is the well-kept Python library for typed models (a maintained Rust core, used
by FastAPI and the ``kubernetes`` client's own dependency tree, so no new package in the operator
image), it writes JSON Schema from the model (``model_json_schema``, with field-level descriptions,
bounds, patterns and enums), and the same model validates an object at run time with errors that
carry the field's location. Dataclasses + ``jsonschema`` would need the schema written beside the
classes by hand (the duplication this module removes) or a home-made class-to-schema writer.

What the model does not say, the generator adds: OpenAPI's structural form (no ``$ref``, no
``null``, int-or-string as Kubernetes spells it). The CEL rules are evaluated by the API server
(and by the tests' CEL checker), not by pydantic; ``api.py`` keeps the operator's own reading of a
spec (``parse_spec``: typed dataclasses, cross-field checks CEL leaves out, JSON-path errors).
The model never imports JAX or kopf: it is part of the operator pod's code.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# --- the resource's names and columns (the CRD's parts outside the schema)

GROUP = "compilecache.dev"
VERSION = "v1alpha1"
PLURAL = "compilecaches"
NAMES: dict[str, Any] = {
    "kind": "CompileCache",
    "listKind": "CompileCacheList",
    "plural": "compilecaches",
    "singular": "compilecache",
    "shortNames": ["cc"],
}
CRD_LABELS: dict[str, str] = {
    "app.kubernetes.io/name": "compilecache-operator",
    "app.kubernetes.io/part-of": "compilecache-operator",
}
# `kubectl get compilecaches` columns (priority 1: only with -o wide).
PRINTER_COLUMNS: list[dict[str, Any]] = [
    {
        "name": "Phase",
        "type": "string",
        "description": "Where the cache is in its life cycle.",
        "jsonPath": ".status.phase",
    },
    {
        "name": "Pools",
        "type": "string",
        "description": "READY/TOTAL node pools whose warm-up finished.",
        "jsonPath": ".status.poolsReady",
    },
    {
        "name": "Reason",
        "type": "string",
        "description": "Why the cache is not simply in its phase: what a warm-up or expiry pod is stuck on "
        "(ImagePullBackOff, Unschedulable, ...), else the Ready condition's reason when it is not "
        "the phase.",
        "jsonPath": ".status.reason",
    },
    {
        "name": "Entries",
        "type": "integer",
        "description": "Compiled executables in the cache.",
        "jsonPath": ".status.cache.entries",
    },
    {
        "name": "Size",
        "type": "string",
        "description": "Bytes the cache holds, human readable.",
        "jsonPath": ".status.cache.size",
    },
    {
        "name": "Last Warmed",
        "type": "date",
        "description": "When a warm-up last finished.",
        "jsonPath": ".status.cache.lastWarmed",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {
        "name": "Message",
        "type": "string",
        "priority": 1,
        "description": "One line for humans about the current state.",
        "jsonPath": ".status.message",
    },
]


# Patterns used by several fields: apimachinery's own (validation.IsDNS1123Subdomain,
# IsDNS1123Label, IsValidLabelValue, resource.Quantity), spelled as OpenAPI regexes.
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
QUANTITY = r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]+))?$"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DURATION = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h|d|w))+$"
CONFIG_KEY = r"^[-._a-zA-Z0-9]+$"
NONNEGATIVE_QUANTITY = r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]+))?$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LABEL_KEY = (
    r"^(([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$"
)
EXTENDED_RESOURCE = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)

# Bounds of what the model leaves free-form (the API server bounds a whole object at 1.5 MiB, each
# field only where its schema says so: every string, list and map here has one, which no real value
# reaches, so the work any check does on a field is bounded before it starts).
QUANTITY_MAX = 64  # a resource.Quantity: at most 18 digits, a point, an exponent or suffix
# An image reference as the container runtime parses it (distribution/reference): a name of at most
# 255 characters (NameTotalLengthMax), a tag of at most 128, a digest of at most 7 + 128 (sha512).
IMAGE_MAX = 1024
ARG_MAX = 4096  # one argument of a script
ENV_VALUE_MAX = 32768  # one environment variable's value (a JSON config fits)
XLA_FLAGS_MAX = 8192
LABEL_MAP_MAX = 32  # entries of a nodeSelector
# A map of label keys to label values: a nodeSelector, a Job's labels. (Its keys have no schema in a CRD:
# controller/api.py checks them.)
LabelMap = dict[
    str,
    Annotated[str, Field(description="The label's value (at most 63 characters).", max_length=63, pattern=LABEL_VALUE)],
]
RESOURCE_MAP_MAX = 32  # entries of requests or limits
# The status: what the operator writes, cut to these bounds before it is patched (api/bounds.py fit).
MESSAGE_MAX = 32768  # a message for humans (metav1.Condition's bound)
REASON_MAX = 1024  # a CamelCase reason (metav1.Condition's)
TIME_MAX = 64  # an RFC 3339 time
SHORT_MAX = 64  # a hash, a size, a count for kubectl get
VERSION_MAX = 256  # a library version, a backend, a device kind
MISS_REASON_MAX = 300  # a training pod's first miss (controller/reports.py REASON_CHARS)
LAST_USED_ITEM_MAX = 11 + 2048 * 8  # status.lastUsed: DAY= and the record's keys (cache/lastuse.py MAX_RECORD)

# A quantity written as a string (an int-or-string field's string branch).
QuantityText = Annotated[str, Field(max_length=QUANTITY_MAX, pattern=NONNEGATIVE_QUANTITY)]

# A cron field: *, ?, a number or name, a range, a step, or a list of them; five of them (no @macros).
_CRON_FIELD = r"(\*|\?|[0-9A-Za-z]+(-[0-9A-Za-z]+)?)(/[0-9]+)?(,(\*|\?|[0-9A-Za-z]+(-[0-9A-Za-z]+)?)(/[0-9]+)?)*"
CRON = rf"^ *{_CRON_FIELD}( +{_CRON_FIELD}){{4}} *$"


def doc(type_: str, default: str, meaning: str, *, items: bool = False) -> dict[str, Any]:
    """A spec field's row in docs/resource.md (type, default, meaning; ``items``: labelled ``field[]``)."""
    return {"x-doc": {"type": type_, "default": default, "meaning": meaning, "items": items}}


def status_doc(meaning: str, *, items: bool = False) -> dict[str, Any]:
    """A status field's row in docs/resource.md."""
    return {"x-doc": {"meaning": meaning, "items": items}}


AccessMode = Literal["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"]
INT_OR_STRING: dict[str, Any] = {"x-kubernetes-int-or-string": True}  # an IntOrString field (both branches typed)


class Model(BaseModel):
    """Base of every object of the resource: types as strict as the API server's, unknown fields dropped.

    Unknown fields are dropped (not refused) because the API server prunes them from a structural schema.
    """

    # rust-regex (pydantic's default engine, the Rust regex crate): matching takes time linear in the
    # input ("all searches execute in linear time with respect to the size of the regular expression
    # and search text", the crate's docs), as Go's RE2 in the API server; and `$` is the end of the
    # text, as RE2's, where Python's re also matched before a trailing newline ("abc\n" was a DNS label).
    model_config = ConfigDict(strict=True, extra="ignore", regex_engine="rust-regex", frozen=True)


class ConsumersStatus(Model):
    """Training pods of this cache that exist now (labelled compilecache.dev/cache), as the webhook left
    them: held by the compilecache.dev/warm scheduling gate, or released by the operator.
    """

    gated: int | None = Field(
        default=None,
        description="Pods held by the gate until the cache is Ready or Degraded (or gateTimeout passes).",
        json_schema_extra={"format": "int64"},
    )
    released: int | None = Field(
        default=None,
        description=(
            "Pods whose gate the operator removed, or that Kueue started through the operator's admission "
            "check; the annotation compilecache.dev/released on each tells why (CacheReady, CacheDegraded, "
            "CacheFailed, GateTimeout, GateDisabled, CacheDeleted, CacheLabelRemoved) and when."
        ),
        json_schema_extra={"format": "int64"},
    )
    workloads: int | None = Field(
        default=None,
        description=(
            "Kueue Workloads whose pods use this cache and whose admission check (controllerName "
            "compilecache.dev/warm) waits for it now: they hold quota and no pod yet."
        ),
        json_schema_extra={"format": "int64"},
    )
    hits: int | None = Field(
        default=None,
        description=(
            "Compiles that hit the cache, as finished training pods reported them (each pod's "
            "termination message, schema compilecache.dev/trainer/v1), over the pods that "
            "exist now."
        ),
        json_schema_extra={"format": "int64"},
    )
    requests: int | None = Field(
        default=None,
        description="Compiles those training pods asked the cache for (misses = requests - hits).",
        json_schema_extra={"format": "int64"},
    )
    lastMissReason: str | None = Field(
        default=None,
        description="The first miss of the latest finished training pod that missed, and why.",
        max_length=MISS_REASON_MAX,
    )
    unwarmedImage: int | None = Field(
        default=None,
        description=(
            "Pods whose containers run no image the cache warmed or warms now (status.images): "
            "they start without waiting and compile what they run; each gets a Warning Event "
            "UnwarmedImage."
        ),
        json_schema_extra={"format": "int64"},
    )


class ImageStatus(Model):
    """One image the cache warmed, or warms now: pods on it are served (Ready) or wait for it (Warming)."""

    image: str = Field(description="The image, as the warm-up Jobs ran it.", max_length=IMAGE_MAX)
    state: Literal["Warming", "Ready", "Failed"] = Field(
        description=(
            "Warming: its warm-up runs, and training pods on it wait (scheduling gate); Ready: its "
            "entries are in the cache and pods on it start at once; Failed: its warm-up failed on "
            "every pool."
        ),
    )
    since: str | None = Field(
        default=None,
        description="When it entered this state.",
        max_length=TIME_MAX,
        json_schema_extra={"format": "date-time"},
    )
    warmedAt: str | None = Field(
        default=None,
        description="When its warm-up last finished (Ready).",
        max_length=TIME_MAX,
        json_schema_extra={"format": "date-time"},
    )


class CacheVersion(Model):
    """Entries of one build; entries of different builds never hit each other."""

    jax: str | None = Field(default=None, description="jax version.", max_length=VERSION_MAX)
    jaxlib: str | None = Field(default=None, description="jaxlib version.", max_length=VERSION_MAX)
    torch: str | None = Field(default=None, description="torch version (framework pytorch).", max_length=VERSION_MAX)
    cuda: str | None = Field(
        default=None, description="CUDA version of the torch build (framework pytorch, GPU).", max_length=VERSION_MAX
    )
    backend: str | None = Field(
        default=None, description="XLA backend (gpu, tpu, cpu); for pytorch, cuda or cpu.", max_length=VERSION_MAX
    )
    deviceKind: str | None = Field(
        default=None, description="Device kind, e.g. NVIDIA H100 80GB HBM3.", max_length=VERSION_MAX
    )
    entries: int | None = Field(
        default=None, description="Entries of this build.", json_schema_extra={"format": "int64"}
    )


class CacheStatus(Model):
    """What the cache holds after the last warm-up and expiry."""

    entries: int | None = Field(
        default=None, description="Compiled executables in the cache.", json_schema_extra={"format": "int64"}
    )
    bytes: int | None = Field(
        default=None, description="Their total size in bytes.", json_schema_extra={"format": "int64"}
    )
    size: str | None = Field(
        default=None, description="The same size, human readable (e.g. 12.4Gi).", max_length=SHORT_MAX
    )
    versions: list[CacheVersion] | None = Field(
        default=None,
        description="Entries per build (jax and jaxlib, or torch and CUDA; backend, device kind), newest first.",
        max_length=64,
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    lastWarmed: str | None = Field(
        default=None,
        description="When a warm-up last finished.",
        max_length=TIME_MAX,
        json_schema_extra={"format": "date-time"},
    )
    lastExpired: str | None = Field(
        default=None,
        description="When expiry last ran.",
        max_length=TIME_MAX,
        json_schema_extra={"format": "date-time"},
    )
    lastDeleted: (
        dict[
            str,
            Annotated[int, Field(description="Entries deleted by this rule.", json_schema_extra={"format": "int64"})],
        ]
        | None
    ) = Field(
        default=None,
        description="Entries the last expiry deleted, by rule (integrity, keepVersions, maxAge, maxSize).",
        max_length=16,
    )


class PoolStep(Model):
    """One script's run."""

    script: str | None = Field(default=None, description="The workload's script.", max_length=253)
    calls: int | None = Field(
        default=None, description="Calls of its step function.", json_schema_extra={"format": "int64"}
    )
    stoppedBy: str | None = Field(
        default=None,
        description="steps (its count), budget (steps auto ran out of time) or end (it ended by itself).",
        max_length=SHORT_MAX,
    )
    message: str | None = Field(
        default=None, description="What that means for training, on one line.", max_length=REASON_MAX
    )


class PoolTarget(Model):
    """One target's compile."""

    name: str | None = Field(default=None, description="The target (or script compile) name.", max_length=253)
    seconds: float | None = Field(default=None, description="Seconds spent compiling it.")
    entries: int | None = Field(default=None, description="Entries it wrote.", json_schema_extra={"format": "int64"})
    bytes: int | None = Field(
        default=None, description="Bytes of those entries.", json_schema_extra={"format": "int64"}
    )


class GPUSeconds(Model):
    """GPUs × seconds of warm-up pods, split into the runs they made (the parts add up to total)."""

    total: float | None = Field(
        default=None,
        description="Each warm-up pod's requested GPUs times its run time (its containers' start to end), summed.",
        ge=0,
    )
    first: float | None = Field(default=None, description="Of it, the first run of the training script.", ge=0)
    resumed: float | None = Field(
        default=None, description="Of it, the resumed run (what a restarted training compiles).", ge=0
    )
    verify: float | None = Field(default=None, description="Of it, the verify runs in a fresh process.", ge=0)
    other: float | None = Field(
        default=None,
        description="The rest: start-up, publishing, listing, and runs the pod did not time (older images).",
        ge=0,
    )


class CostStatus(Model):
    """What the pools' recorded warm-ups cost in GPU time."""

    gpuSeconds: GPUSeconds | None = Field(
        default=None,
        description=(
            "The pools' gpuSeconds summed, per run. Expiry Jobs request no GPU: nothing of theirs is counted."
        ),
    )
    pools: int | None = Field(
        default=None, description="Pools whose warm-up cost is counted.", json_schema_extra={"format": "int32"}
    )
    pods: int | None = Field(
        default=None,
        description="Warm-up pods counted (a retry after a preemption counts too).",
        json_schema_extra={"format": "int64"},
    )


class PoolStatus(Model):
    """The state of one pool's warm-up for one topology."""

    name: str = Field(description="Name of the pool.", max_length=63)
    hosts: int = Field(
        default=1,
        description=("The topology's hosts (1 for a single-pod warm-up, also for records from before topologies)."),
        json_schema_extra={"format": "int32"},
    )
    nodes: int | None = Field(
        default=None, description="Nodes currently in the pool.", json_schema_extra={"format": "int32"}
    )
    gpusPerNode: int | None = Field(
        default=None, description="Allocatable GPUs per node.", json_schema_extra={"format": "int32"}
    )
    gpusPerPod: int | None = Field(
        default=None,
        description="GPUs the warm-up pod requested (the device count in the cache key).",
        json_schema_extra={"format": "int32"},
    )
    job: str | None = Field(
        default=None,
        description=("Name of the pool's current warm-up Job (for hosts > 1 also the name of its headless Service)."),
        max_length=63,
    )
    state: Literal["Pending", "Running", "Succeeded", "Failed", "NoNodes", "TooFewNodes"] | None = Field(
        default=None,
        description=(
            "Pending, Running, Succeeded, Failed, or NoNodes (no node has the pool's labels and "
            "its gpusPerPod is not declared, so nothing can ask for one). A pool with no node "
            "and declared GPUs is Pending while its warm-up pod waits for a node (reason "
            "WaitingForCapacity or NotTriggerScaleUp). TooFewNodes is no longer set (records of "
            "earlier versions only): a multi-host Job now asks for its missing nodes."
        ),
    )
    disruptions: int | None = Field(
        default=None,
        description=(
            "Warm-up pods of the current Job ended by a disruption (spot reclaim, drain, "
            "preemption: the pod condition DisruptionTarget); each is retried without counting "
            "against backoffLimit."
        ),
        ge=0,
        json_schema_extra={"format": "int64"},
    )
    lastDisruption: str | None = Field(
        default=None,
        description=(
            "When the newest disruption counted in disruptions happened (its DisruptionTarget "
            "condition): a pod disrupted later is counted on top, also once the earlier pods are gone."
        ),
        max_length=TIME_MAX,
        json_schema_extra={"format": "date-time"},
    )
    entries: int | None = Field(
        default=None,
        description="Entries the pool's last warm-up wrote or confirmed.",
        json_schema_extra={"format": "int64"},
    )
    bytes: int | None = Field(
        default=None, description="Bytes of those entries.", json_schema_extra={"format": "int64"}
    )
    compileSeconds: float | None = Field(
        default=None, description="Seconds the pool's last warm-up spent compiling (from its report)."
    )
    verifyHits: int | None = Field(
        default=None,
        description="Compiles that hit the published cache in the warm-up's fresh-process verify.",
        json_schema_extra={"format": "int64"},
    )
    verifyRequests: int | None = Field(
        default=None, description="Compiles the verify asked the cache for.", json_schema_extra={"format": "int64"}
    )
    targets: list[PoolTarget] | None = Field(
        default=None,
        description=(
            "Per compiled target of the last warm-up (at most 32; targetsOmitted counts the "
            "rest, e.g. when the report had to be summarised to fit a termination message)."
        ),
        max_length=32,
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    targetsOmitted: int | None = Field(
        default=None, description="Targets the report or this list left out.", json_schema_extra={"format": "int64"}
    )
    steps: list[PoolStep] | None = Field(
        default=None,
        description=(
            "How far each script's last warm-up ran: its step calls, what stopped it (steps, "
            "budget or end) and what that leaves out of the cache."
        ),
        max_length=32,
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    gpuSeconds: GPUSeconds | None = Field(
        default=None,
        description=(
            "GPU time of the current Job's finished pods (retries included): each pod's GPUs times its "
            "containers' run time, split into the runs its warm-up timed (first, resumed, verify) and other."
        ),
    )
    gpuPods: int | None = Field(
        default=None, description="The pods gpuSeconds counts.", ge=0, json_schema_extra={"format": "int64"}
    )
    reason: str | None = Field(default=None, description="A CamelCase reason for the state.", max_length=REASON_MAX)
    message: str | None = Field(
        default=None, description="Details for humans, e.g. the Job's failure.", max_length=MESSAGE_MAX
    )
    startedAt: str | None = Field(
        default=None,
        description="When the warm-up Job started.",
        max_length=TIME_MAX,
        json_schema_extra={"format": "date-time"},
    )
    finishedAt: str | None = Field(
        default=None,
        description="When the warm-up Job finished.",
        max_length=TIME_MAX,
        json_schema_extra={"format": "date-time"},
    )


class LeftOutPool(Model):
    """A discovered pool not warmed because training's pod template rules it out."""

    name: str = Field(description="Name of the discovered pool.", max_length=63)
    reason: Literal["TrainingSelectsOtherNodes", "TrainingTaintNotTolerated"] = Field(
        description=(
            "TrainingSelectsOtherNodes (training's nodeSelector or required node affinity selects none "
            "of its nodes) or TrainingTaintNotTolerated (its nodes carry a NoSchedule or NoExecute "
            "taint training does not tolerate)."
        )
    )
    message: str | None = Field(
        default=None, description="Which node and which requirement or taint, on one line.", max_length=1024
    )


class Condition(Model):
    """One aspect of the cache's state (the metav1.Condition shape)."""

    type: str = Field(description="The condition's type, e.g. Ready.", max_length=316)
    status: Literal["True", "False", "Unknown"] = Field(description="Whether the condition holds.")
    reason: str | None = Field(default=None, description="A CamelCase reason for the last transition.", max_length=1024)
    message: str | None = Field(default=None, description="Details for humans.", max_length=MESSAGE_MAX)
    lastTransitionTime: str | None = Field(
        default=None,
        description="When status last changed.",
        max_length=TIME_MAX,
        json_schema_extra={"format": "date-time"},
    )
    observedGeneration: int | None = Field(
        default=None,
        description="The metadata.generation the condition was set for.",
        json_schema_extra={"format": "int64"},
    )


class Status(Model):
    """What the operator observed; written only by the operator (status subresource)."""

    phase: Literal["Pending", "Warming", "Expiring", "Ready", "Degraded", "Failed"] | None = Field(
        default=None,
        description=(
            "Pending (waiting for storage or nodes), Warming (warm-up Jobs running), Expiring "
            "(applying lifecycle), Ready (training pods are released), Degraded (warmed and "
            "expired on some pools, failed on others; training pods are released), Failed (no "
            "usable cache; see conditions)."
        ),
        json_schema_extra={
            **status_doc("`Pending`, `Warming`, `Expiring`, `Ready`, `Degraded`, `Failed`"),
        },
    )
    observedGeneration: int | None = Field(
        default=None,
        description="The metadata.generation this status describes; older means a change is not yet acted on.",
        json_schema_extra={
            "format": "int64",
            **status_doc("the `metadata.generation` this status describes"),
        },
    )
    message: str | None = Field(
        default=None,
        description="One line for humans about the current state.",
        max_length=MESSAGE_MAX,
        json_schema_extra={**status_doc("one line for humans")},
    )
    specHash: str | None = Field(
        default=None,
        description="Short hash of the spec parts that affect compilation; part of warm-up Job names.",
        max_length=SHORT_MAX,
        json_schema_extra={
            **status_doc("short hash of the spec parts that affect compilation (in Job names)"),
        },
    )
    poolsReady: str | None = Field(
        default=None,
        description="READY/TOTAL pools with nodes whose warm-up succeeded, for kubectl get.",
        max_length=SHORT_MAX,
        json_schema_extra={**status_doc("`READY/TOTAL` pools with nodes, for `kubectl get`")},
    )
    reason: str | None = Field(
        default=None,
        description=(
            "For kubectl get: what a warm-up or expiry pod is stuck on (the Progressing "
            "condition's reason), else what a failed pool's pod died of (OOMKilled), else the "
            "Ready condition's reason when it says more than the phase; absent otherwise."
        ),
        max_length=REASON_MAX,
        json_schema_extra={
            **status_doc(
                "for `kubectl get`: what a warm-up or expiry pod is stuck on (`Progressing` "
                "condition's reason: `Unschedulable`, `ImagePullBackOff`, ...; see "
                "[observability](observability.md#stuck-pods)), else what a failed pool's pod "
                "died of (`OOMKilled`), else the `Ready` condition's reason where it is not the "
                "phase (`InvalidSpec`, ...); absent otherwise"
            ),
        },
    )
    lastScheduleTime: str | None = Field(
        default=None,
        description=("The spec.schedule slot whose warm-up the pools follow (as a CronJob's status.lastScheduleTime)."),
        max_length=TIME_MAX,
        json_schema_extra={
            "format": "date-time",
            **status_doc("the `spec.schedule` slot whose warm-up the pools follow (as a CronJob's)"),
        },
    )
    lastSkippedScheduleTime: str | None = Field(
        default=None,
        description=(
            "The last spec.schedule slot skipped because the previous slot's warm-up or expiry "
            "was still running (concurrency Forbid, as a CronJob's): a running Job is never "
            "replaced by a slot."
        ),
        max_length=TIME_MAX,
        json_schema_extra={
            "format": "date-time",
            **status_doc(
                "the last slot skipped because the previous slot's warm-up or expiry still ran: "
                "with `concurrencyPolicy: Forbid` (the default) a slot never replaces a running "
                "Job (Event `ScheduleSkipped`); the skipped slot is not run late"
            ),
        },
    )
    conditions: list[Condition] | None = Field(
        default=None,
        description=(
            "Ready, StorageReady, PoolsWarmed, Expired and Progressing (False, with the "
            "reason, while a warm-up or expiry pod is stuck), with the reason of the latest "
            "transition, and Reconciled (False, with the error) while the operator's last pass "
            "failed and is being retried. Bad input shows here as a condition, never as a "
            "crash."
        ),
        max_length=16,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
            **status_doc(
                (
                    "`Ready`, `StorageReady`, `PoolsWarmed`, `Expired` (the lifecycle expiry Job "
                    "after the warm-up; reason `Expired` or `ExpiryFailed`, or what its pod is stuck "
                    "on), `Progressing` (`False` with the reason while a warm-up or expiry pod is "
                    "stuck; `True`, `NoStuckPods`, otherwise), and `Reconciled` (`False`, reason "
                    "`ReconcileError`, while the operator's last pass failed; it retries with "
                    "backoff from 1 s to 5 min): `type`, `status`, `reason`, `message`, "
                    "`lastTransitionTime`, `observedGeneration`"
                ),
                items=True,
            ),
        },
    )
    pools: list[PoolStatus] | None = Field(
        default=None,
        description=(
            "One entry per node pool (explicit or discovered) and topology (warmup.topologies), and its warm-up Job."
        ),
        max_length=512,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name", "hosts"],
            **status_doc(
                (
                    "one entry per pool × topology: `name`, `hosts` (the topology; 1 for a "
                    "single-pod warm-up), `nodes`, `gpusPerNode`, `gpusPerPod`, `job`, `state` "
                    "(`Pending`, `Running`, `Succeeded`, `Failed`, `NoNodes`, `TooFewNodes`), "
                    "`reason`, `message`, `startedAt`, `finishedAt`, `disruptions` and "
                    "`lastDisruption` (warm-up pods a disruption ended, each retried), `gpuSeconds` (`total`, "
                    "`first`, `resumed`, `verify`, `other`: GPUs × seconds of the Job's finished pods, see "
                    "[cost](cost.md)) and `gpuPods`; from the warm-up pods' own "
                    "report (their termination message, written by `compilecache warm "
                    "--termination-log`): `entries`, `bytes`, `compileSeconds`, `verifyHits`, "
                    "`verifyRequests`, `targets[]` (`name`, `seconds`, `entries`, `bytes`; at most "
                    "32, `targetsOmitted` counts the rest); `steps[]` per script (`script`, `calls` "
                    "of its step function, `stoppedBy`: `steps`, `budget` or `end`, and a `message` "
                    "saying what that leaves out of the cache); a multi-host warm-up adds up its "
                    "processes' reports (`entries`, `bytes`, `verifyHits`, `verifyRequests`; "
                    "`compileSeconds` is the slowest process's, `targets` the lowest process's) and "
                    "a failure names the process (`process 1 of 2: ...`)"
                ),
                items=True,
            ),
        },
    )
    images: list[ImageStatus] | None = Field(
        default=None,
        description=(
            "The images the cache warmed or warms now, the current one first: training pods on a "
            "Ready one start at once (its entries stay while lifecycle keeps them), on a Warming one "
            "they wait for it; pods on any other image are counted in consumers.unwarmedImage."
        ),
        max_length=16,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["image"],
            **status_doc(
                (
                    "the images warmed or warming, the current one first (at most 16): `image`, `state` "
                    "(`Warming`: its pods wait; `Ready`: its pods start at once; `Failed`), `since`, "
                    "`warmedAt`; see [images](images.md)"
                ),
                items=True,
            ),
        },
    )
    leftOutPools: list[LeftOutPool] | None = Field(
        default=None,
        description=(
            "Discovered pools not warmed because training's pod template (warmup.podTemplate) rules "
            "them out, and why; absent when none is."
        ),
        max_length=64,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            **status_doc(
                (
                    "discovered pools not warmed because training's pod template rules them out: "
                    "`name`, `reason` (`TrainingSelectsOtherNodes`: its nodeSelector or required node "
                    "affinity selects none of the pool's nodes; `TrainingTaintNotTolerated`: they carry "
                    "a `NoSchedule` or `NoExecute` taint it does not tolerate) and `message` (which node, "
                    "which requirement or taint); at most 64, absent when none is (see "
                    "[how it works](how-it-works.md#pools-training-cannot-use))"
                ),
                items=True,
            ),
        },
    )
    cache: CacheStatus | None = Field(
        default=None,
        description="What the cache holds after the last warm-up and expiry.",
        json_schema_extra={
            **status_doc(
                "`entries`, `bytes`, `size` (the sum of the pools' reports as soon as the first "
                "warm-up finished; the expiry's count from then on), `versions[]` (`jax`, "
                "`jaxlib`, `backend`, `deviceKind`, `entries`), `lastWarmed`, `lastExpired`, "
                "`lastDeleted` (entries the last expiry deleted, by rule)"
            ),
        },
    )
    cost: CostStatus | None = Field(
        default=None,
        description=(
            "GPU time of the pools' recorded warm-ups, summed: gpuSeconds (total, first, resumed, verify, "
            "other), pools, pods. Expiry Jobs request no GPU and are not counted."
        ),
        json_schema_extra={
            **status_doc(
                "GPU time of the pools' recorded warm-ups (their current Jobs), summed: `gpuSeconds` "
                "(`total`, and per run: `first`, `resumed`, `verify`, `other`), `pools` and `pods` counted; "
                "expiry Jobs request no GPU and are not counted (see [cost](cost.md))"
            ),
        },
    )
    consumers: ConsumersStatus | None = Field(
        default=None,
        description=(
            "Training pods of this cache that exist now (labelled compilecache.dev/cache), as "
            "the webhook left them: held by the compilecache.dev/warm scheduling gate, or "
            "released by the operator."
        ),
        json_schema_extra={
            **status_doc(
                "training pods of the cache that exist now: `gated` (held by the "
                "`compilecache.dev/warm` scheduling gate) and `released` (gate removed by the "
                "operator; the pod's `compilecache.dev/released` annotation says why: "
                "`CacheReady`, `CacheDegraded`, `CacheFailed`, `GateTimeout`, `GateDisabled`, `CacheDeleted`, "
                "`CacheLabelRemoved`, and when; or Kueue started it through the operator's admission check); "
                "`workloads` (Kueue Workloads whose admission check waits for the cache: see [kueue](kueue.md)); "
                "`hits`, `requests` and `lastMissReason` from the finished training "
                "pods' own reports (see [observability](observability.md)); `unwarmedImage` (pods on "
                "an image the cache never warmed: see [images](images.md))"
            ),
        },
    )
    lastUsed: (
        list[
            Annotated[
                str,
                Field(
                    description="DAY=KEYS: a day (YYYY-MM-DD, UTC) and the 8-hex-digit keys last used that day.",
                    max_length=LAST_USED_ITEM_MAX,
                    pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}=([0-9a-f]{8})*$",
                ),
            ]
        ]
        | None
    ) = Field(
        default=None,
        description=(
            "Entries training read from the cache and hit, by the day (UTC) a pod that used them last "
            "finished: DAY=KEYS, each key the first 8 hex digits of the sha256 of an entry's name. "
            "The expiry counts lifecycle.maxAge from an entry's last use by training or warm-up."
        ),
        max_length=64,
        json_schema_extra={
            "x-kubernetes-list-type": "atomic",
            **status_doc(
                "`DAY=KEYS` items: the entries finished training pods reported they read and hit, by the "
                "day of their last use; the expiry counts `lifecycle.maxAge` from it (see "
                "[warmer](warmer.md#expiry-and-integrity))"
            ),
        },
    )
    kopf: dict[str, Any] | None = Field(
        default=None,
        description=(
            "Internal bookkeeping of the kopf framework the operator is built on (handler "
            "progress). Not part of the API; do not rely on it."
        ),
        json_schema_extra={
            "x-kubernetes-preserve-unknown-fields": True,
            **status_doc("the kopf framework's own bookkeeping (unknown fields preserved); not part of the API"),
        },
    )


class LabelSelectorRequirement(Model):
    """One label requirement."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": (
                        "self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) "
                        "> 0) : (!has(self.values) || size(self.values) == 0)"
                    ),
                    "message": "operators In and NotIn need values; Exists and DoesNotExist take none",
                },
            ],
        }
    )

    key: str = Field(description="The label key.", min_length=1, max_length=316, pattern=LABEL_KEY)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(description="How the label relates to values.")
    values: (
        list[
            Annotated[
                str, Field(description="A label value (at most 63 characters).", max_length=63, pattern=LABEL_VALUE)
            ]
        ]
        | None
    ) = Field(
        default=None,
        description="Label values for In and NotIn; empty for Exists and DoesNotExist.",
        max_length=64,
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )


class PodSelector(Model):
    """Pods in this namespace that get the cache besides those labelled compilecache.dev/cache=<name> (the
    Kubernetes LabelSelector shape). It only narrows: a pod must also carry
    compilecache.dev/inject=true, in a namespace labelled compilecache.dev/injection=enabled, and
    the operator's own pods never match.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": (
                        "(has(self.matchLabels) && size(self.matchLabels) > 0) || "
                        "(has(self.matchExpressions) && self.matchExpressions.exists(e, e.operator "
                        "== 'In' || e.operator == 'Exists'))"
                    ),
                    "message": (
                        "podSelector must require a label the pods have (a matchLabels entry, or a "
                        "matchExpressions item with operator In or Exists); NotIn and DoesNotExist "
                        "alone, or an empty selector, match every unrelated pod"
                    ),
                },
            ],
            "x-kubernetes-map-type": "atomic",
        }
    )

    matchLabels: LabelMap | None = Field(
        default=None, description="Labels a pod must have, all of them.", max_length=32
    )
    matchExpressions: list[LabelSelectorRequirement] | None = Field(
        default=None,
        description="Label requirements a pod must meet, all of them.",
        max_length=32,
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )


class Consumers(Model):
    """Training pods that use the cache. Pods labelled compilecache.dev/cache=<name>, and pods labelled
    compilecache.dev/inject=true that podSelector matches, get the volume, the same JAX cache
    environment and (optionally) a scheduling gate until the cache is Ready. The operator's own
    warm-up and expiry pods never do.
    """

    podSelector: PodSelector | None = Field(
        default=None,
        description=(
            "Pods in this namespace that get the cache besides those labelled "
            "compilecache.dev/cache=<name> (the Kubernetes LabelSelector shape). It only "
            "narrows: a pod must also carry compilecache.dev/inject=true, in a namespace "
            "labelled compilecache.dev/injection=enabled, and the operator's own pods never "
            "match."
        ),
        json_schema_extra={
            **doc(
                "LabelSelector",
                "",
                (
                    'pods labelled `compilecache.dev/inject: "true"` that get the cache besides '
                    "those labelled `compilecache.dev/cache: NAME`; must require a label (a "
                    "`matchLabels` entry or an `In`/`Exists` expression)"
                ),
            ),
        },
    )
    readOnly: bool = Field(
        default=True,
        description=(
            "Mount the cache read-only in training pods, so only warm-up Jobs write it and "
            "expiry sees every entry that exists. Set false to let training add entries for "
            "programs the warm-up missed."
        ),
        json_schema_extra={
            **doc("bool", "`true`", "mount the cache read-only in training pods"),
        },
    )
    gate: bool = Field(
        default=True,
        description=(
            "Hold training pods with a scheduling gate while the cache is not Ready, so they "
            "do not start cold and spend GPU time compiling."
        ),
        json_schema_extra={
            **doc("bool", "`true`", "hold training pods with a scheduling gate until the cache is Ready"),
        },
    )
    gateTimeout: str = Field(
        default="30m",
        description=(
            "Release the gate anyway after this long (a duration such as 30m), so a failed "
            "warm-up delays training but never blocks it."
        ),
        max_length=64,
        pattern=DURATION,
        json_schema_extra={
            **doc("duration", "`30m`", "release the gate anyway after this"),
        },
    )
    initContainers: bool = Field(
        default=False,
        description="Also give init containers the cache volume and environment.",
        json_schema_extra={
            **doc("bool", "`false`", "also mutate init containers"),
        },
    )


class Lifecycle(Model):
    """Expiry applied after each warm-up, before the cache turns Ready. JAX never evicts entries by itself
    (nor does GCS), and a truncated entry is never repaired, so without expiry a cache only grows
    and keeps broken files.
    """

    maxAge: str | None = Field(
        default=None,
        description=(
            "Drop entries neither re-produced by a warm-up nor used by training (status.lastUsed, to the day) "
            "within this age, a duration such as 7d, 12h or 1h30m (units ms, s, m, h, d, w)."
        ),
        max_length=64,
        pattern=DURATION,
        json_schema_extra={
            **doc(
                "duration (`7d`, `12h`, `1h30m`)",
                "",
                "drop entries neither re-produced by a warm-up nor used by training within this age",
            ),
        },
    )
    maxSize: str | None = Field(
        default=None,
        description=(
            "Delete least-recently-used entries until the cache fits this size, a Kubernetes quantity such as 100Gi."
        ),
        max_length=QUANTITY_MAX,
        pattern=QUANTITY,
        json_schema_extra={
            **doc("quantity ≥ 0", "", "LRU down to this size"),
        },
    )
    keepVersions: int | None = Field(
        default=None,
        description=(
            "Keep entries of the N newest builds (jax, jaxlib, backend, device kind) and drop "
            "older ones: after an upgrade old entries can never hit again."
        ),
        ge=1,
        json_schema_extra={
            "format": "int32",
            **doc("int ≥ 1", "", "keep entries of the N newest jax/jaxlib/backend/device builds"),
        },
    )
    verify: bool = Field(
        default=True,
        description=(
            "Drop truncated, corrupt and unlisted entries. JAX writes entries without an "
            "atomic rename, so an interrupted write leaves a file that every process warns "
            "about and recompiles."
        ),
        json_schema_extra={
            **doc("bool", "`true`", "drop truncated/corrupt entries"),
        },
    )


class Jax(Model):
    """JAX cache options, set identically (as environment variables) in warmers and training pods: any
    difference changes the cache key and every step misses.
    """

    minCompileTimeSecs: float = Field(
        default=0,
        description=(
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS: only programs that took at least this "
            "long to compile are written. 0 caches everything."
        ),
        ge=0,
        json_schema_extra={
            **doc("number ≥ 0", "`0`", "`JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`"),
        },
    )
    minEntrySizeBytes: int = Field(
        default=0,
        description=(
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES: only entries at least this large are "
            "written. 0 caches everything."
        ),
        ge=0,
        json_schema_extra={
            "format": "int64",
            **doc("int ≥ 0", "`0`", "`JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES`"),
        },
    )
    xlaFlags: str | None = Field(
        default=None,
        description=(
            "XLA_FLAGS for warmers and trainers. XLA flags are part of the cache key, so set "
            "them here (not in a workload's env or by hand in a training pod)."
        ),
        max_length=XLA_FLAGS_MAX,
        json_schema_extra={
            **doc("string", "", "`XLA_FLAGS`, identical in warmers and trainers"),
        },
    )


class Topology(Model):
    """One topology, e.g. {hosts: 8} for 8 nodes of 8 GPUs each."""

    hosts: int = Field(
        description="Nodes (and JAX processes, one per node) the training job runs on.",
        ge=1,
        le=256,
        json_schema_extra={
            "format": "int32",
            **doc(
                "int 1–256, required",
                "",
                ("nodes (one JAX process each) a training job runs on; GPUs per host come from the pool"),
            ),
        },
    )


class Resources(Model):
    """CPU and memory of the warm-up container (the Kubernetes ResourceRequirements shape). GPU limits are
    set from the pool; compiling a large model can take tens of GiB of host memory.
    """

    requests: (
        dict[
            str,
            Annotated[
                Annotated[int, Field(ge=0)] | QuantityText,
                Field(description="A quantity, e.g. 8, 500m, 64Gi (not negative).", json_schema_extra=INT_OR_STRING),
            ],
        ]
        | None
    ) = Field(default=None, description='Minimum resources, e.g. cpu "8", memory 64Gi.', max_length=RESOURCE_MAP_MAX)
    limits: (
        dict[
            str,
            Annotated[
                Annotated[int, Field(ge=0)] | QuantityText,
                Field(description="A quantity, e.g. 8, 500m, 64Gi (not negative).", json_schema_extra=INT_OR_STRING),
            ],
        ]
        | None
    ) = Field(default=None, description="Maximum resources, e.g. memory 96Gi.", max_length=RESOURCE_MAP_MAX)


class GpuType(Model):
    """A GPU type to warm before any node of it exists: a value of discover.groupBy and its GPUs per pod."""

    value: str = Field(
        description=(
            "The groupBy label's value that nodes of this type will carry, e.g. nvidia-h100-80gb for "
            "cloud.google.com/gke-accelerator."
        ),
        min_length=1,
        max_length=63,
        pattern=LABEL_VALUE,
        json_schema_extra={**doc("label value, required", "", "the type's value of `groupBy`")},
    )
    gpusPerPod: int = Field(
        description=(
            "GPUs requested by the type's warm-up pod, as pools[].gpusPerPod: with no node to read "
            "them from, the pod's request is what an autoscaler sizes a new node by, and the cache "
            "key contains the device count."
        ),
        ge=0,
        json_schema_extra={
            "format": "int32",
            **doc("int ≥ 0, required", "", "GPUs of the type's warm-up pod (0: no GPU request)"),
        },
    )


class Discover(Model):
    """Discover pools from Nodes instead of (or besides) listing them: nodes matching nodeSelector are
    grouped by GPU type, one pool per type. New GPU types are then warmed without editing the resource.
    With warmup.podTemplate, a discovered pool training cannot run on (its nodeSelector, required node
    affinity or tolerations rule out every node of it) is not warmed: status.leftOutPools says why.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                # size() too: an empty list would otherwise count as "set".
                {
                    "rule": "!has(self.gpuTypes) || size(self.gpuTypes) == 0 || has(self.groupBy)",
                    "message": (
                        "gpuTypes needs groupBy: the label a node that does not exist yet will carry cannot be guessed"
                    ),
                },
            ],
        }
    )

    nodeSelector: LabelMap | None = Field(
        default=None,
        description=(
            "Node labels that candidate nodes must have. Unset, every node is a candidate; with "
            "groupBy unset too, that finds the GPU nodes of any cloud (those that carry an "
            "accelerator label, see groupBy)."
        ),
        max_length=LABEL_MAP_MAX,
        json_schema_extra={
            **doc("map: label key → label value", "", "nodes to discover pools from"),
        },
    )
    # No default in the CRD: unset means "whichever known label a node carries". A cache stored
    # before this field lost its default has groupBy nvidia.com/gpu.product persisted (the API server
    # writes a schema default into the object it stores), so it keeps its pools and Job names.
    groupBy: str | None = Field(
        default=None,
        description=(
            "Node label whose value defines a pool. Nodes with different values compile different "
            "entries, so each value gets its own warm-up. Unset, each node is grouped by the first "
            "of the accelerator labels it carries, clouds' first: cloud.google.com/gke-accelerator "
            "(GKE), k8s.amazonaws.com/accelerator (EKS node groups), "
            "eks.amazonaws.com/instance-gpu-name (EKS Auto Mode), "
            "karpenter.k8s.aws/instance-gpu-name (Karpenter on AWS), "
            "karpenter.azure.com/sku-gpu-name (Karpenter on Azure), kubernetes.azure.com/accelerator "
            "(AKS; its value is the vendor, so those nodes are grouped by "
            "node.kubernetes.io/instance-type), amd.com/gpu.product-name (AMD GPU operator), "
            "nvidia.com/gpu.product (NVIDIA GPU feature discovery); a node with none of them is "
            "no GPU node."
        ),
        max_length=316,
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
        json_schema_extra={
            **doc(
                "label key",
                "the first known accelerator label a node carries",
                "one pool per value of this node label ([GPU labels](how-it-works.md#gpu-labels))",
            ),
        },
    )
    gpuTypes: list[GpuType] | None = Field(
        default=None,
        description=(
            "GPU types to warm whether or not a node of them exists now (a pool that scales from "
            "zero): each is a pool selecting nodeSelector and groupBy=value, with the GPUs per pod "
            "it declares. Needs groupBy. Once nodes of the type exist, it is their discovered pool."
        ),
        max_length=16,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["value"],
            **doc("list, ≤16, unique `value`", "", "GPU types warmed before any node of them exists", items=True),
        },
    )
    tolerations: list[Toleration] | None = Field(
        default=None,
        description=(
            "Tolerations of the warm-up pods on discovered pools. GPU nodes are usually "
            "tainted (e.g. nvidia.com/gpu:NoSchedule); give the warmer the same tolerations as "
            "training."
        ),
        max_length=32,
        json_schema_extra={
            "x-kubernetes-list-type": "atomic",
            **doc("[Toleration]", "", "tolerations of discovered pools"),
        },
    )
    gpuResource: str = Field(
        default="nvidia.com/gpu",
        description=(
            "The extended resource that counts GPUs; a discovered pool's warm-up pod requests "
            "all allocatable GPUs of a node (domain/name)."
        ),
        max_length=316,
        pattern=EXTENDED_RESOURCE,
        json_schema_extra={
            **doc("`domain/name`", "`nvidia.com/gpu`", ""),
        },
    )


class Toleration(Model):
    """A toleration (the Kubernetes Toleration shape)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": (
                        "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''"
                    ),
                    "message": "a toleration with operator Exists must not set value",
                },
                {
                    "rule": ("(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')"),
                    "message": "a toleration without key must use operator Exists (it then tolerates every taint)",
                },
                {
                    "rule": "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
                    "message": "tolerationSeconds is only allowed with effect NoExecute",
                },
            ],
        }
    )

    key: str | None = Field(
        default=None,
        description="Taint key to tolerate (a label key); empty with operator Exists tolerates every taint.",
        max_length=316,
        pattern=LABEL_KEY,
    )
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="Equal (the default) matches key and value; Exists matches any value of key."
    )
    value: str | None = Field(
        default=None,
        description="Taint value to match with operator Equal (a label value).",
        max_length=63,
        pattern=LABEL_VALUE,
    )
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to tolerate (NoSchedule, PreferNoSchedule, NoExecute); empty means all."
    )
    tolerationSeconds: int | None = Field(
        default=None,
        description="With effect NoExecute, how long the pod stays after the taint appears.",
        json_schema_extra={"format": "int64"},
    )


class Pool(Model):
    """A set of identical GPU nodes."""

    name: str = Field(
        description="Name of the pool (a DNS label); it appears in Job names and status.",
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL,
        json_schema_extra={**doc("DNS label, required", "", "")},
    )
    nodeSelector: LabelMap | None = Field(
        default=None,
        description=(
            "Node labels that select the pool's nodes, e.g. cloud.google.com/gke-accelerator: nvidia-h100-80gb."
        ),
        max_length=LABEL_MAP_MAX,
        json_schema_extra={
            **doc("map: label key → label value (≤ 63 characters)", "", "nodes of the pool"),
        },
    )
    tolerations: list[Toleration] | None = Field(
        default=None,
        description=(
            "Tolerations of the warm-up pods. GPU nodes are usually tainted (e.g. "
            "nvidia.com/gpu:NoSchedule) so only GPU work lands there; give the warmer the same "
            "tolerations as training."
        ),
        max_length=32,
        json_schema_extra={
            "x-kubernetes-list-type": "atomic",
            **doc("[Toleration]", "", ""),
        },
    )
    gpusPerPod: int | None = Field(
        default=None,
        description=(
            "GPUs requested by a warm-up pod; by default all allocatable GPUs of a node. It "
            "must equal the GPUs of one training process: the cache key contains the device "
            "count (and topology), so entries compiled on 4 GPUs never hit on 8. 0 compiles "
            "without requesting GPUs (only useful for tests)."
        ),
        ge=0,
        json_schema_extra={
            "format": "int32",
            **doc(
                "int ≥ 0",
                "allocatable GPUs per node",
                (
                    "GPUs of a warm-up pod: the cache key contains the device count, so it must "
                    "equal a training process's (0: no GPU request)"
                ),
            ),
        },
    )
    gpuResource: str = Field(
        default="nvidia.com/gpu",
        description="The extended resource that counts GPUs on these nodes (domain/name).",
        max_length=316,
        pattern=EXTENDED_RESOURCE,
        json_schema_extra={
            **doc("`domain/name`", "`nvidia.com/gpu`", "the extended resource that counts GPUs"),
        },
    )


class ResourceFieldRef(Model):
    """A resource limit or request of the container, e.g. limits.memory."""

    containerName: str | None = Field(
        default=None, description="Container name; the warm-up container when unset.", max_length=63
    )
    resource: str = Field(description="The resource to select.", min_length=1, max_length=316)
    divisor: (
        Annotated[
            Annotated[int, Field(ge=0)] | QuantityText,
            Field(description="Output format of the exposed resources, e.g. 1Mi.", json_schema_extra=INT_OR_STRING),
        ]
        | None
    ) = Field(default=None)


class FieldRef(Model):
    """A field of the pod, e.g. metadata.name or status.podIP."""

    apiVersion: str | None = Field(
        default=None, description="Version of the schema fieldPath is written in (v1).", max_length=64
    )
    fieldPath: str = Field(description="Path of the field to select.", min_length=1, max_length=1024)


class ConfigMapKeyRef(Model):
    """A key of a ConfigMap in this namespace."""

    name: str | None = Field(default=None, description="Name of the ConfigMap.", max_length=253, pattern=DNS_SUBDOMAIN)
    key: str = Field(description="The key to select.", min_length=1, max_length=253, pattern=CONFIG_KEY)
    optional: bool | None = Field(default=None, description="Whether the ConfigMap or its key may be missing.")


class SecretKeyRef(Model):
    """A key of a Secret in this namespace."""

    name: str | None = Field(default=None, description="Name of the Secret.", max_length=253, pattern=DNS_SUBDOMAIN)
    key: str = Field(description="The key to select.", min_length=1, max_length=253, pattern=CONFIG_KEY)
    optional: bool | None = Field(default=None, description="Whether the Secret or its key may be missing.")


# Exactly one source (minProperties = maxProperties = 1): unknown fields are dropped, so counting
# properties needs no CEL rule (and costs nothing).
class ValueFrom(Model):
    """Source of the value: exactly one of secretKeyRef, configMapKeyRef, fieldRef or resourceFieldRef, as
    in a pod's EnvVar.
    """

    model_config = ConfigDict(json_schema_extra={"minProperties": 1, "maxProperties": 1})

    secretKeyRef: SecretKeyRef | None = Field(default=None, description="A key of a Secret in this namespace.")
    configMapKeyRef: ConfigMapKeyRef | None = Field(default=None, description="A key of a ConfigMap in this namespace.")
    fieldRef: FieldRef | None = Field(
        default=None, description="A field of the pod, e.g. metadata.name or status.podIP."
    )
    resourceFieldRef: ResourceFieldRef | None = Field(
        default=None, description="A resource limit or request of the container, e.g. limits.memory."
    )


class EnvVar(Model):
    """An environment variable (the Kubernetes EnvVar shape)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!(has(self.value) && has(self.valueFrom))",
                    "message": "an env var sets value or valueFrom, not both",
                },
                {
                    "rule": (
                        "!(self.name in ['JAX_COMPILATION_CACHE_DIR', 'XLA_FLAGS'] || "
                        "self.name.startsWith('JAX_PERSISTENT_CACHE_'))"
                    ),
                    "message": (
                        "JAX cache settings and XLA_FLAGS come from spec.mountPath, spec.storage "
                        "and spec.warmup.jax so that warmers and trainers match; do not set them "
                        "in a workload's env"
                    ),
                },
            ],
        }
    )

    name: str = Field(
        description="Name of the variable.", min_length=1, max_length=256, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
    )
    value: str | None = Field(
        default=None,
        description="Value of the variable; $(VAR) references are expanded as in a pod.",
        max_length=ENV_VALUE_MAX,
    )
    valueFrom: ValueFrom | None = Field(
        default=None,
        description=(
            "Source of the value: exactly one of secretKeyRef, configMapKeyRef, fieldRef or "
            "resourceFieldRef, as in a pod's EnvVar."
        ),
    )


class Workload(Model):
    """One program to compile into the cache."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.entrypoint) != has(self.script)",
                    "message": "a workload must set exactly one of entrypoint or script",
                },
                {
                    "rule": "!has(self.args) || has(self.script)",
                    "message": "a workload's args are only allowed with script (they are the script's arguments)",
                },
                {
                    "rule": "!has(self.steps) || has(self.script)",
                    "message": (
                        "steps (the exact mode) runs a script; an entrypoint's targets are compiled ahead of time"
                    ),
                },
                {
                    "rule": "!has(self.stepFn) || has(self.script)",
                    "message": "stepFn names the function that steps counts, in a script",
                },
                {
                    "rule": (
                        # steps is int-or-string (dyn in CEL): compared as a string, as int == string is a CEL type
                        # error, not false (string(2) is "2").
                        "!has(self.budget) || (has(self.script) && (!has(self.steps) || string(self.steps) == 'auto'))"
                    ),
                    "message": "budget bounds steps auto (the default for a script), not a step count",
                },
                {
                    "rule": "!has(self.resume) || has(self.script)",
                    "message": "resume is a setting of the exact mode; set script too",
                },
                {
                    "rule": "!has(self.resumeArgs) || (has(self.script) && !(has(self.resume) && !self.resume))",
                    "message": "resumeArgs are added to the resumed run; set script, and not resume false",
                },
                {
                    "rule": "!has(self.resumeWhen) || (has(self.script) && !(has(self.resume) && !self.resume))",
                    "message": "resumeWhen says when the resumed run happens; set script, and not resume false",
                },
            ],
        }
    )

    name: str = Field(
        description="Name of the workload (a DNS label); it appears in manifests, status and metrics.",
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL,
        json_schema_extra={**doc("DNS label, required", "", "")},
    )
    entrypoint: str | None = Field(
        default=None,
        description=(
            "A Python function as module:function (e.g. mypkg.train:warm) that returns "
            "compilecache.Target objects; the warmer imports it and compiles each target. "
            "Exactly one of entrypoint or script."
        ),
        max_length=1024,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$",
        json_schema_extra={
            **doc(
                "`module:function` (or `module:Class.attr`)",
                "",
                ("a function returning `compilecache.Target`s; exactly one of `entrypoint`, `script`"),
            ),
        },
    )
    script: str | None = Field(
        default=None,
        description=(
            "Path of a Python script in the image that runs (part of) training under the cache "
            "settings (compilecache warm --script); whatever it compiles is cached. Use it "
            "when targets cannot easily be built as a function. Also module:function, called "
            "as the training main. Exactly one of entrypoint or script."
        ),
        min_length=1,
        max_length=4096,
        json_schema_extra={
            **doc("path", "", "a script run under the cache settings (`compilecache warm --script`)"),
        },
    )
    args: list[Annotated[str, Field(description="One argument.", max_length=ARG_MAX)]] | None = Field(
        default=None,
        description="Arguments passed to script (only with script), e.g. the training config.",
        max_length=256,
        json_schema_extra={
            "x-kubernetes-list-type": "atomic",
            **doc("[string]", "", "arguments of `script`"),
        },
    )
    steps: (
        Annotated[
            Annotated[int, Field(ge=1, le=100000)] | Annotated[str, Field(max_length=4, pattern=r"^auto$")],
            Field(
                description=(
                    "Exact mode (only with script): run the unchanged training script and stop it once "
                    "its step function has run this many times (compilecache warm --steps), or auto, "
                    "the default for a script on one host: whole epochs, the script running on after "
                    "its first step until it ends or budget has passed, then stopping at a step "
                    "boundary, so that epoch-end evaluations are cached too. Verify runs the script "
                    "again in a fresh process and must hit all."
                ),
                json_schema_extra=INT_OR_STRING,
            ),
        ]
        | None
    ) = Field(
        default=None,
        json_schema_extra={
            **doc(
                "int 1–100000 or `auto`",
                "",
                (
                    "exact mode (only with `script`; `auto` when unset, on one host): stop the "
                    "unchanged script once its step function ran this many times (`compilecache warm "
                    "--steps`); `auto`: whole epochs — after its first step the script runs on until "
                    "it ends or `budget` has passed, then stops at a step boundary, so an epoch-end "
                    "evaluation is cached without counting calls. Verify runs it again in a fresh "
                    "process and must hit every compile (under `auto` it stops once it asked for as "
                    "many as the warm-up made). A multi-host topology stops at a count only: there "
                    "`auto` is refused and a script without `steps` runs to its end"
                ),
            ),
        },
    )
    stepFn: str | None = Field(
        default=None,
        description=(
            "Name of the jitted step function that steps counts (default train_step; "
            "compilecache warm --step-fn). Only with script."
        ),
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        json_schema_extra={
            **doc(
                "identifier",
                "",
                (
                    "the name of the jitted step function `steps` counts (through "
                    "`functools.partial`; `train_step` when unset); only with `script`"
                ),
            ),
        },
    )
    budget: str | None = Field(
        default=None,
        description=(
            "With steps auto (the default for a script): how long the script runs on after its "
            "first step has returned, a duration such as 2m or 90s (at least 1s; default 2m; "
            "compilecache warm --budget). Long enough to reach the first evaluation."
        ),
        max_length=64,
        pattern=DURATION,
        json_schema_extra={
            **doc(
                "duration ≥ 1s",
                "",
                (
                    "with `steps: auto`: how long the script runs on after its first step returned "
                    "(`compilecache warm --budget`; 2 minutes when unset); long enough to reach the "
                    "first evaluation; twice it must fit `warmup.activeDeadlineSeconds` (the warm "
                    "run and, at worst, verify's)"
                ),
            ),
        },
    )
    resume: bool | None = Field(
        default=None,
        description=(
            "Exact mode (only with script): after its first run, run the script again in the "
            "same scratch working directory, where it finds and restores the checkpoint its "
            "first run wrote, for steps more step calls (one under auto); verify repeats the runs "
            "made. A restored state is typed differently from a fresh one, so this is what a "
            "restarted training compiles. Unset: only when the first run wrote a file in its "
            "working directory or left resumeWhen; true: always (compilecache warm --resume); "
            "false: never (--no-resume)."
        ),
        json_schema_extra={
            **doc(
                "bool",
                "unset",
                (
                    "exact mode (only with `script`): after the first run, run the script again in "
                    "the same scratch working directory, where it restores the checkpoint its first "
                    "run wrote — for `steps` more step calls, or under `auto` for one (what a "
                    "restart compiles differently is its first step on the restored state); verify "
                    "repeats the runs made. A restored state is typed differently from a fresh one: "
                    "this is what a restarted training compiles. Unset: only when the first run "
                    "wrote a file in its working directory or left `resumeWhen` (else skipped, with "
                    "one line saying why); `true`: always (`compilecache warm --resume`); `false`: "
                    "never (`--no-resume`)"
                ),
            ),
        },
    )
    resumeArgs: list[Annotated[str, Field(description="One argument.", max_length=1024)]] | None = Field(
        default=None,
        description=(
            "Arguments added to the resumed run only (after args), for a script that restores "
            "when asked, e.g. [--restore] (compilecache warm --resume-arg)."
        ),
        max_length=32,
        json_schema_extra={
            "x-kubernetes-list-type": "atomic",
            **doc(
                "[string], ≤32",
                "",
                (
                    "arguments added to the resumed run only, after `args` (`compilecache warm "
                    "--resume-arg`), for a script that restores when asked; only with `script` and "
                    "not with `resume: false`"
                ),
            ),
        },
    )
    resumeWhen: str | None = Field(
        default=None,
        description=(
            "Exact mode (only with script): the checkpoint a restart reads, relative to the "
            "script's working directory or absolute; the resumed run happens when the first run "
            "left it, also where the script writes outside its working directory "
            "(compilecache warm --resume-when)."
        ),
        min_length=1,
        max_length=4096,
        json_schema_extra={
            **doc(
                "path",
                "",
                (
                    "exact mode (only with `script`, not with `resume: false`): the checkpoint a "
                    "restart reads, relative to the script's working directory or absolute; the "
                    "resumed run happens when the first run left it (`compilecache warm "
                    "--resume-when`), e.g. a checkpoint written outside the working directory"
                ),
            ),
        },
    )
    env: list[EnvVar] | None = Field(
        default=None,
        description=(
            "Environment of the warm-up container for this workload, e.g. model size settings. "
            "Names must not conflict across workloads. The JAX cache settings and XLA_FLAGS "
            "are set by the operator (from mountPath/storage and warmup.jax), identically in "
            "warmers and trainers, and cannot be set here."
        ),
        max_length=256,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            **doc(
                "[EnvVar], unique `name`",
                "",
                (
                    "environment of the warm-up container (names must not conflict across "
                    "workloads); `JAX_COMPILATION_CACHE_DIR`, `JAX_PERSISTENT_CACHE_*` and "
                    "`XLA_FLAGS` are rejected: they come from `mountPath`/`storage`/`warmup.jax` so "
                    "warmers and trainers match; `valueFrom` is exactly one of "
                    "`secretKeyRef`/`configMapKeyRef` (`key` required), `fieldRef` (`fieldPath`), "
                    "`resourceFieldRef` (`resource`)"
                ),
            ),
        },
    )
    pools: list[Annotated[str, Field(description="A pool name.", max_length=63)]] | None = Field(
        default=None,
        description=(
            "Compile this workload only on these pools (names from warmup.pools or discovered "
            "pools); all pools when unset. Use it for programs that only ever train on some "
            "GPU types."
        ),
        max_length=64,
        json_schema_extra={
            "x-kubernetes-list-type": "set",
            **doc(
                "[string]",
                "all pools",
                ("compile this workload only on these pools (checked by the operator, not the API server: see below)"),
            ),
        },
    )


class TemplateRef(Model):
    """An object of a training workload kind in the cache's namespace whose pod template the warm-up takes,
    read at every pass. Until it exists the cache is Pending (reason TemplateNotFound).
    """

    kind: Literal["PodTemplate", "Job", "JobSet", "LeaderWorkerSet", "TrainJob", "PyTorchJob", "RayJob"] = Field(
        description=(
            "PodTemplate, Job, JobSet (jobset.x-k8s.io), LeaderWorkerSet (leaderworkerset.x-k8s.io), "
            "TrainJob (trainer.kubeflow.org, with its training runtime), PyTorchJob (kubeflow.org) or "
            "RayJob (ray.io)."
        ),
        json_schema_extra={
            **doc(
                "`PodTemplate`, `Job`, `JobSet`, `LeaderWorkerSet`, `TrainJob`, `PyTorchJob`, `RayJob`, required",
                "",
                (
                    "the kind of the object in the cache's namespace that holds training's pod template "
                    "(where each kind keeps it: see below)"
                ),
            ),
        },
    )
    name: str = Field(
        description="Name of the object.",
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        json_schema_extra={
            **doc(
                "DNS subdomain, required",
                "",
                ("its name; until it exists the cache is `Pending` (reason `TemplateNotFound`)"),
            ),
        },
    )


class PodTemplate(Model):
    """Training's pod template, so that the warm-up sees what training sees at startup: inline (spec) or by
    reference (templateRef). Taken from it: the container's image (unless warmup.image is set), env,
    envFrom, volumeMounts (read-only, except emptyDirs), workingDir and the arguments after a script
    workload's script in its command (when the workload has no args), and the pod's volumes,
    serviceAccountName (when warmup.serviceAccountName is unset) and imagePullSecrets. The operator
    sets the command, the cache volume, the GPUs, the security context and the placement. See
    docs/resource.md.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.spec) != has(self.templateRef)",
                    "message": "podTemplate must set exactly one of spec or templateRef",
                },
            ],
        }
    )

    spec: dict[str, Any] | None = Field(
        default=None,
        description=(
            "A pod spec (the Kubernetes PodSpec shape), inline. Fields the warm-up does not "
            "take are ignored, so a training Job's pod spec can be pasted as it is."
        ),
        json_schema_extra={
            "x-kubernetes-preserve-unknown-fields": True,
            **doc("PodSpec", "", ("training's pod spec inline; the fields the warm-up does not take are ignored")),
        },
    )
    templateRef: TemplateRef | None = Field(
        default=None,
        description=(
            "A PodTemplate, Job, JobSet, LeaderWorkerSet, TrainJob, PyTorchJob or RayJob in the "
            "cache's namespace whose pod template the warm-up takes, read at every pass. Until it "
            "exists the cache is Pending (reason TemplateNotFound)."
        ),
    )
    container: str | None = Field(
        default=None,
        description="Name of training's container in the template; the first one when unset.",
        max_length=63,
        pattern=DNS_LABEL,
        json_schema_extra={
            **doc("DNS label", "the first container", "training's container in the template"),
        },
    )


class LocalObjectReference(Model):
    """A reference to a docker-registry Secret."""

    name: str = Field(
        description="Name of the Secret (a DNS subdomain, e.g. gcr.io-pull).", max_length=253, pattern=DNS_SUBDOMAIN
    )


class Queue(Model):
    """Kueue: the LocalQueue the warm-up (and expiry) Jobs join, and their workload priority class."""

    name: str = Field(
        description=(
            "The LocalQueue of the cache's namespace that warm-up Jobs join (the kueue.x-k8s.io/queue-name "
            "label); they are created suspended, and Kueue starts them when it admits them."
        ),
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL,
        json_schema_extra={**doc("LocalQueue name, required", "", "the warm-up Jobs' LocalQueue")},
    )
    expiryName: str | None = Field(
        default=None,
        description=(
            "The LocalQueue of the expiry Job, which needs no GPU (e.g. a CPU queue); by default the warm-ups' queue."
        ),
        max_length=63,
        pattern=DNS_LABEL,
        json_schema_extra={**doc("LocalQueue name", "", "the expiry Job's LocalQueue (default: `name`'s)")},
    )
    priorityClass: str | None = Field(
        default=None,
        description="A Kueue WorkloadPriorityClass for the Jobs' Workloads (the kueue.x-k8s.io/priority-class label).",
        max_length=63,
        pattern=DNS_LABEL,
        json_schema_extra={**doc("WorkloadPriorityClass name", "", "the Workloads' priority in the queue")},
    )


class JobMetadata(Model):
    """Labels and annotations the platform's tooling expects on every Job (cost attribution, policy engines)."""

    labels: LabelMap | None = Field(
        default=None,
        description=(
            "Labels of the warm-up and expiry Jobs and their pods. Keys of compilecache.dev, "
            "kueue.x-k8s.io, kubernetes.io and k8s.io are the operator's and Kubernetes': refused."
        ),
        max_length=LABEL_MAP_MAX,
        json_schema_extra={**doc("map: label key → label value", "", "labels of the Jobs and their pods")},
    )
    annotations: dict[str, Annotated[str, Field(description="The annotation's value.", max_length=4096)]] | None = (
        Field(
            default=None,
            description="Annotations of the warm-up and expiry Jobs and their pods (the same keys refused).",
            max_length=LABEL_MAP_MAX,
            json_schema_extra={
                **doc("map: key → value (≤ 4096 characters)", "", "annotations of the Jobs and their pods")
            },
        )
    )


class ProvisioningRequestSpec(Model):
    """Ask Cluster Autoscaler for each warm-up's capacity with a ProvisioningRequest (autoscaling.x-k8s.io/v1)
    before its Job runs: the Job is created suspended and starts once the request is Provisioned."""

    className: str = Field(
        description=(
            "The provisioning class, e.g. queued-provisioning.gke.io (GKE's queued provisioning), "
            "best-effort-atomic-scale-up.autoscaling.x-k8s.io (all nodes or none) or "
            "check-capacity.autoscaling.x-k8s.io."
        ),
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        json_schema_extra={**doc("DNS subdomain, required", "", "the ProvisioningRequest's provisioningClassName")},
    )
    parameters: (
        # No bound on the keys: a CRD schema has no propertyNames (the object's size bounds them).
        dict[str, Annotated[str, Field(description="A parameter's value (at most 255 characters).", max_length=255)]]
        | None
    ) = Field(
        default=None,
        description="The request's parameters, as the class reads them (e.g. ValidUntilSeconds).",
        max_length=32,
        json_schema_extra={**doc("map: name → value (≤ 255 characters)", "", "the class's parameters")},
    )


class Warmup(Model):
    """How to fill the cache: which image and programs to compile, on which GPU node pools, with which Job
    settings and JAX cache options. One warm-up Job runs per pool and topology.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                # size() too: an empty pools list would otherwise count as "set".
                {
                    "rule": "(has(self.pools) && size(self.pools) > 0) || has(self.discover)",
                    "message": "warmup must set pools, discover, or both",
                },
                {
                    "rule": "has(self.image) || has(self.podTemplate)",
                    "message": "warmup must set image, or podTemplate to take training's image from it",
                },
            ],
        }
    )

    image: str | None = Field(
        default=None,
        description=(
            "Image of the warm-up Jobs. Unset, it is training's image, taken from podTemplate "
            "(inline or templateRef), and the cache follows it: a new image is warmed while the "
            "entries of those warmed before keep serving the pods still on them (status.images). "
            "Set, it pins the warm-up's image. The cache key contains the jax/jaxlib versions and "
            "the compiled program, so the warmer must run the same code and libraries as training. "
            "It needs the compilecache package unless the operator injects its runtime "
            "(the chart's runtime.image)."
        ),
        min_length=1,
        max_length=IMAGE_MAX,
        json_schema_extra={
            **doc(
                "string",
                "training's image (podTemplate)",
                "image of the warm-up Jobs; unset, training's image from `podTemplate`, which the cache follows "
                "(see [images](images.md)); required without `podTemplate`",
            ),
        },
    )
    imagePullPolicy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None,
        description="Pull policy of the warm-up container; the Kubernetes default when unset.",
        json_schema_extra={
            **doc("enum", "", "`Always`, `IfNotPresent`, `Never`"),
        },
    )
    imagePullSecrets: list[LocalObjectReference] | None = Field(
        default=None,
        description="Secrets in this namespace used to pull the image of the warm-up pods.",
        max_length=16,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            **doc("[{name}]", "", ("pull secrets of the warm-up pods; names are DNS subdomains (`gcr.io-pull`)")),
        },
    )
    serviceAccountName: str | None = Field(
        default=None,
        description=(
            "ServiceAccount of the warm-up pods. With GCS storage it defaults to "
            "storage.gcs.serviceAccountName, the one that may write the prefix."
        ),
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        json_schema_extra={
            **doc("string", "", ("ServiceAccount of warm-up pods (GCS: defaults to `storage.gcs.serviceAccountName`)")),
        },
    )
    podTemplate: PodTemplate | None = Field(
        default=None,
        description=(
            "Training's pod template, so that the warm-up sees what training sees at startup: "
            "inline (spec) or by reference (templateRef). Taken from it: the container's image "
            "(unless warmup.image is set), env, envFrom, volumeMounts (read-only, except "
            "emptyDirs), workingDir and the arguments after a script workload's script in its "
            "command (when the workload has no args), and the pod's volumes, "
            "serviceAccountName (when warmup.serviceAccountName is unset) and "
            "imagePullSecrets. The operator sets the command, the cache volume, the GPUs, the "
            "security context and the placement. See docs/resource.md."
        ),
        json_schema_extra={
            **doc(
                "object",
                "",
                (
                    "training's pod template, so that the warm-up sees what training sees at "
                    "startup: exactly one of `spec` and `templateRef` (see [training's pod "
                    "template](#trainings-pod-template))"
                ),
            ),
        },
    )
    workloads: list[Workload] = Field(
        description=(
            "The programs to compile. Each names a Python function or a script that builds the "
            "same jitted steps, shapes, shardings and flags that training runs; an "
            "ahead-of-time compile that differs in any of them produces an entry training "
            "never hits."
        ),
        min_length=1,
        max_length=128,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            **doc("list, required, 1–128, unique `name`", "", "what to compile", items=True),
        },
    )
    pools: list[Pool] | None = Field(
        default=None,
        description=(
            "Explicit GPU node pools; one warm-up Job runs on each. The cache key contains the "
            "device kind and count, so every kind of node a training job can land on needs its "
            "own warm-up."
        ),
        max_length=64,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            **doc("list, ≤64, unique `name`", "", "explicit node pools", items=True),
        },
    )
    discover: Discover | None = Field(
        default=None,
        description=(
            "Discover pools from Nodes instead of (or besides) listing them: nodes matching "
            "nodeSelector are grouped by GPU type (the groupBy label, or the accelerator labels "
            "clouds and GPU operators set), one pool per type. New GPU types are then warmed "
            "without editing the resource."
        ),
    )
    resources: Resources | None = Field(
        default=None,
        description=(
            "CPU and memory of the warm-up container (the Kubernetes ResourceRequirements "
            "shape). GPU limits are set from the pool; compiling a large model can take tens "
            "of GiB of host memory."
        ),
        json_schema_extra={
            **doc(
                "{requests, limits}",
                "",
                (
                    "cpu/memory of warm-up pods: quantities ≥ 0, requests ≤ limits; the GPU resource "
                    "of a pool is not allowed here (the operator sets it from the pool)"
                ),
            ),
        },
    )
    backoffLimit: int = Field(
        default=2,
        description="Retries of a failed warm-up Job before its pool is marked Failed.",
        ge=0,
        json_schema_extra={
            "format": "int32",
            **doc("int ≥ 0", "`2`", "Job retries"),
        },
    )
    activeDeadlineSeconds: int = Field(
        default=7200,
        description=(
            "Deadline of a warm-up Job in seconds; a Job still compiling after it fails (e.g. "
            "a hung compile or a pod stuck waiting for GPUs)."
        ),
        ge=1,
        json_schema_extra={
            "format": "int64",
            **doc("int ≥ 1", "`7200`", "Job deadline"),
        },
    )
    capacityTimeout: str = Field(
        default="15m",
        description=(
            "How long a warm-up pod may wait for a node (a duration such as 15m): on an autoscaled "
            "pool, the time the autoscaler has to add one. Past it the pool fails with the "
            "scheduler's or the autoscaler's reason, and training is no longer held for it. The "
            "default is Cluster Autoscaler's own bound on a node's provisioning (15m)."
        ),
        max_length=64,
        pattern=DURATION,
        json_schema_extra={
            **doc("duration", "`15m`", "how long a warm-up pod may wait for a node (autoscaler)"),
        },
    )
    ttlSecondsAfterFinished: int = Field(
        default=86400,
        description="Finished warm-up Jobs (and their pods and logs) are removed this many seconds later.",
        ge=0,
        json_schema_extra={
            "format": "int32",
            **doc("int ≥ 0", "`86400`", "finished Jobs are removed after this"),
        },
    )
    jobs: int = Field(
        default=1,
        description=(
            "Targets compiled concurrently in one warm-up pod (compilecache warm --jobs). More "
            "is faster but needs more host memory."
        ),
        ge=1,
        json_schema_extra={
            "format": "int32",
            **doc("int ≥ 1", "`1`", "targets compiled concurrently (`compilecache warm --jobs`)"),
        },
    )
    verify: bool = Field(
        default=True,
        description=(
            "After compiling, check in a fresh process that every target hits the cache "
            "(compilecache warm --verify). This catches settings that differ between compile "
            "and load before training pays for them."
        ),
        json_schema_extra={
            **doc("bool", "`true`", "check in a fresh process that every target hits (`--verify`)"),
        },
    )
    # The list-map key (hosts) makes hosts unique without a CEL rule (no cost).
    queue: Queue | None = Field(
        default=None,
        description=(
            "Kueue: the warm-up and expiry Jobs join this LocalQueue, created suspended; the pool is "
            "Queued with Kueue's message until Kueue admits the Job, and the time bounds count from "
            "admission. Exclusive with provisioningRequest (Kueue has its own ProvisioningRequest check)."
        ),
        json_schema_extra={**doc("object", "", "the Kueue LocalQueue of the warm-up Jobs (docs/kueue.md)")},
    )
    priorityClassName: str | None = Field(
        default=None,
        description="The PriorityClass of the warm-up and expiry pods (the policy's priorityClasses bound it).",
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        json_schema_extra={**doc("PriorityClass name", "", "the warm-up and expiry pods' priority")},
    )
    jobMetadata: JobMetadata | None = Field(
        default=None,
        description="Labels and annotations of the warm-up and expiry Jobs and their pods.",
        json_schema_extra={**doc("object", "", "extra labels and annotations of the Jobs and their pods")},
    )
    provisioningRequest: ProvisioningRequestSpec | None = Field(
        default=None,
        description=(
            "Opt-in: ask Cluster Autoscaler for each warm-up Job's capacity through a "
            "ProvisioningRequest of this class; the Job is created suspended and starts once the "
            "request is Provisioned (a request still waiting after capacityTimeout fails the pool)."
        ),
        json_schema_extra={
            **doc("object", "", "ask for each warm-up's capacity with a ProvisioningRequest (docs/autoscaling.md)")
        },
    )
    topologies: list[Topology] = Field(
        default_factory=lambda: [Topology(hosts=1)],
        description=(
            "The training topologies to warm for, on every pool: the cache key contains the "
            "number of processes and devices, so a job training on 8 nodes hits only entries "
            "compiled by 8 processes on 8 nodes. hosts 1 is one warm-up pod on one node; hosts "
            "N > 1 is an Indexed Job of N pods on N distinct nodes of the pool (one JAX "
            "process each, GPUs per host from the pool) with a headless Service for the "
            "coordinator. A pool with fewer nodes than hosts asks for the missing ones (its pods "
            "wait for capacity, up to capacityTimeout)."
        ),
        min_length=1,
        max_length=8,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["hosts"],
            "default": [{"hosts": 1}],
            **doc(
                "list, 1–8, unique `hosts`",
                "`[{hosts: 1}]`",
                ("the training topologies to warm for, on every pool (see [multi-host warm-up](#multi-host-warm-up))"),
            ),
        },
    )
    jax: Jax = Field(
        default_factory=Jax,
        description=(
            "JAX cache options, set identically (as environment variables) in warmers and "
            "training pods: any difference changes the cache key and every step misses."
        ),
        json_schema_extra={
            "default": {},
            **doc("object", "`{}`", "defaulted so that its fields' defaults show in the stored object"),
        },
    )


class Gcs(Model):
    """Keep the cache under a Google Cloud Storage prefix. JAX reads and writes it directly
    (gs://bucket/prefix), so nothing is mounted.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": (
                        "!has(self.readerServiceAccountName) || !has(self.serviceAccountName) || "
                        "self.readerServiceAccountName != self.serviceAccountName"
                    ),
                    "message": (
                        "storage.gcs.readerServiceAccountName must differ from "
                        "storage.gcs.serviceAccountName: training pods must not run as the cache's "
                        "writer"
                    ),
                },
                {
                    "rule": "!has(self.serviceAccountName) || self.serviceAccountName != 'default'",
                    "message": (
                        "storage.gcs.serviceAccountName (the writer) must not be default: every pod "
                        "that names no ServiceAccount runs as default"
                    ),
                },
            ],
        }
    )

    bucket: str = Field(
        description="Bucket name only, without gs:// or a path (e.g. my-jax-caches).",
        min_length=3,
        max_length=222,
        pattern=r"^[a-z0-9][-a-z0-9_.]*[a-z0-9]$",
        json_schema_extra={
            **doc("string, required", "", "GCS bucket name only (no `gs://`, no path)"),
        },
    )
    prefix: str = Field(
        default="",
        description=(
            "Object prefix inside the bucket (e.g. caches/llama), without a leading slash. "
            "Give each model or team its own prefix so that expiry of one cache never deletes "
            "another's entries."
        ),
        max_length=1024,
        pattern=r"^([^/].*)?$",
        json_schema_extra={
            **doc("string", '`""`', "object prefix inside the bucket, without a leading `/`"),
        },
    )
    serviceAccountName: str | None = Field(
        default=None,
        description=(
            "Kubernetes ServiceAccount bound (Workload Identity) to a Google service account "
            "that may write the prefix: the cache's writer, required (here or as "
            "warmup.serviceAccountName) and never default. Warm-up and expiry pods run as it "
            "unless warmup.serviceAccountName is set; training pods never get it (see "
            "readerServiceAccountName)."
        ),
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        json_schema_extra={
            **doc("string", "", ("Kubernetes ServiceAccount (Workload Identity) that may write the prefix")),
        },
    )
    readerServiceAccountName: str | None = Field(
        default=None,
        description=(
            "Kubernetes ServiceAccount bound (Workload Identity) to a Google service account "
            "that may only read the prefix (roles/storage.objectViewer). The webhook gives it "
            "to training pods that name no ServiceAccount, or that name the writer; without it "
            "they keep their own (never the writer). It must differ from serviceAccountName "
            "and warmup.serviceAccountName."
        ),
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        json_schema_extra={
            **doc(
                "string",
                "",
                (
                    "ServiceAccount that may only read the prefix: what training pods run as (never "
                    "the writer; see [gcs.md](gcs.md))"
                ),
            ),
        },
    )
    deleteWithCache: bool = Field(
        default=False,
        description="Delete the prefix's objects when this CompileCache is deleted. Off by default.",
        json_schema_extra={
            **doc("bool", "`false`", "delete the prefix's objects with the cache"),
        },
    )


class PvcCreate(Model):
    """Create the claim with these settings when it does not exist. Without it the operator waits
    (condition StorageReady=False) for you to create it.
    """

    size: str = Field(
        description=(
            "Requested capacity, a Kubernetes quantity such as 200Gi (binary suffixes Ki, Mi, "
            'Gi, Ti; not "GB"). Compiled executables of a large model take a few GiB per jax '
            "version and device kind."
        ),
        max_length=QUANTITY_MAX,
        pattern=QUANTITY,
        json_schema_extra={
            **doc("quantity, required in `create`", "", "create the claim with this size when it does not exist"),
        },
    )
    storageClassName: str | None = Field(
        default=None,
        description="StorageClass of the created claim; the cluster default when unset.",
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        json_schema_extra={
            **doc("DNS subdomain", "cluster default", "storage class of a created claim"),
        },
    )
    accessModes: list[Annotated[AccessMode, Field(description="One PersistentVolumeClaim access mode.")]] = Field(
        default_factory=lambda: list[AccessMode](["ReadWriteMany"]),
        description=(
            "Access modes of the created claim. ReadWriteMany lets warm-up pods on several "
            "nodes write and all training pods read at the same time."
        ),
        min_length=1,
        max_length=4,
        json_schema_extra={
            "x-kubernetes-list-type": "set",
            "default": ["ReadWriteMany"],
            **doc("[enum]", "`[ReadWriteMany]`", "access modes of a created claim"),
        },
    )


class Pvc(Model):
    """Keep the cache on a PersistentVolumeClaim. Use a ReadWriteMany volume (e.g. NFS/Filestore) when
    pools on several nodes warm or train at once.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.deleteWithCache) || !self.deleteWithCache || has(self.create)",
                    "message": (
                        "storage.pvc.deleteWithCache requires storage.pvc.create: the operator "
                        "only deletes a claim it created"
                    ),
                },
            ],
        }
    )

    claimName: str = Field(
        description=(
            "Name of the PersistentVolumeClaim in this namespace that holds the cache. It must "
            "exist unless create is set."
        ),
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        json_schema_extra={
            **doc("string, required", "", "the PersistentVolumeClaim that holds the cache"),
        },
    )
    create: PvcCreate | None = Field(
        default=None,
        description=(
            "Create the claim with these settings when it does not exist. Without it the "
            "operator waits (condition StorageReady=False) for you to create it."
        ),
    )
    deleteWithCache: bool = Field(
        default=False,
        description=(
            "Make a claim the operator created owned by this CompileCache, so that it (and the "
            "compiled entries) is deleted with it. Only allowed with create; by default data "
            "outlives the resource."
        ),
        json_schema_extra={
            **doc(
                "bool", "`false`", ("a created claim is owned by the cache and deleted with it (only with `create`)")
            ),
        },
    )


class Storage(Model):
    """Where the cache lives: exactly one of pvc (a volume mounted into warmers and trainers) or gcs (a
    bucket prefix that JAX reads and writes directly).
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.pvc) != has(self.gcs)",
                    "message": "storage must set exactly one of pvc or gcs",
                },
            ],
        }
    )

    pvc: Pvc | None = Field(
        default=None,
        description=(
            "Keep the cache on a PersistentVolumeClaim. Use a ReadWriteMany volume (e.g. "
            "NFS/Filestore) when pools on several nodes warm or train at once."
        ),
    )
    gcs: Gcs | None = Field(
        default=None,
        description=(
            "Keep the cache under a Google Cloud Storage prefix. JAX reads and writes it "
            "directly (gs://bucket/prefix), so nothing is mounted."
        ),
    )


class Spec(Model):
    """What to compile, where to keep the result, on which GPU pools, and how long entries live. Changing
    anything that affects compilation starts a new warm-up.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": (
                        "!has(self.storage.gcs) || !has(self.storage.gcs.readerServiceAccountName) "
                        "|| !has(self.warmup.serviceAccountName) || "
                        "self.storage.gcs.readerServiceAccountName != "
                        "self.warmup.serviceAccountName"
                    ),
                    "message": (
                        "storage.gcs.readerServiceAccountName must not be "
                        "warmup.serviceAccountName: training pods must not run as the cache's "
                        "writer"
                    ),
                },
                {
                    "rule": (
                        "!has(self.storage.gcs) || has(self.storage.gcs.serviceAccountName) || "
                        "has(self.warmup.serviceAccountName)"
                    ),
                    "message": (
                        "a GCS cache names its writer, storage.gcs.serviceAccountName: the warm-up and "
                        "expiry pods write the prefix as it, and training pods never run as it"
                    ),
                },
                {
                    "rule": (
                        "!has(self.storage.gcs) || !has(self.warmup.serviceAccountName) || "
                        "self.warmup.serviceAccountName != 'default'"
                    ),
                    "message": (
                        "warmup.serviceAccountName of a GCS cache (its writer) must not be default: "
                        "every pod that names no ServiceAccount runs as default"
                    ),
                },
            ],
        }
    )

    storage: Storage = Field(
        description=(
            "Where the cache lives: exactly one of pvc (a volume mounted into warmers and "
            "trainers) or gcs (a bucket prefix that JAX reads and writes directly)."
        ),
        json_schema_extra={
            **doc("object, required", "", "where the cache lives: exactly one of `pvc`, `gcs`"),
        },
    )
    mountPath: str = Field(
        default="/var/cache/compilecache",
        description=(
            "Absolute path where warm-up and training containers mount the cache (PVC), or the "
            "local staging path (GCS). It is identical in both on purpose: unless XLA's own "
            "caches are off, JAX hashes paths into the cache key, and a cache mounted "
            "elsewhere misses."
        ),
        max_length=1024,
        # Segments other than "." and "..", so that the path the container sees is the path written here
        # (RE2 has no lookahead, hence the three alternatives).
        pattern=r"^(/([^/:.][^/:]*|\.[^/:.][^/:]*|\.\.[^/:]+))+$",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self != '/tmp'",
                    "message": (
                        "mountPath must not be /tmp: warm-up and expiry containers mount their own scratch volume there"
                    ),
                },
            ],
            **doc(
                "absolute path",
                "`/var/cache/compilecache`",
                (
                    "where warmers and trainers mount the cache: identical in both (not `/`, not "
                    "`/tmp` where the operator mounts its own scratch volume, no trailing `/`, no "
                    "empty, `.` or `..` segments, no `:`)"
                ),
            ),
        },
    )
    warmup: Warmup = Field(
        description=(
            "How to fill the cache: which image and programs to compile, on which GPU node "
            "pools, with which Job settings and JAX cache options. One warm-up Job runs per "
            "pool and topology."
        )
    )
    schedule: str | None = Field(
        default=None,
        description=(
            "Optional periodic re-warm, a 5-field cron expression (minute hour day-of-month "
            'month day-of-week, e.g. "0 3 * * 0" for 03:00 on Sundays). Each re-warm is followed '
            "by the lifecycle expiry; entries training uses are kept by that use (status.lastUsed), "
            "not by re-warming."
        ),
        max_length=256,
        pattern=CRON,
        json_schema_extra={
            **doc(
                "cron (5 fields)",
                "",
                (
                    "periodic re-warm; the schema checks the 5-field shape (`*`, numbers, names, "
                    "ranges, steps, lists) and no `@daily` macros; the operator (croniter) checks "
                    "value ranges, steps ≥ 1 and ranges that do not run backwards"
                ),
            ),
        },
    )
    framework: Literal["jax", "pytorch"] = Field(
        default="jax",
        description=(
            "Which compiler's cache this resource keeps warm: jax (the JAX persistent "
            "compilation cache) or pytorch (torch.compile's Inductor, AOTAutograd and kernel "
            "caches). Fixed at creation: the two caches' entries never share a folder."
        ),
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self == oldSelf",
                    "message": "framework cannot be changed; create another CompileCache",
                },
            ],
            **doc(
                "enum `jax`, `pytorch`",
                "`jax`",
                (
                    "which compiler's cache is warmed: JAX's persistent compilation cache, or "
                    "`torch.compile`'s (Inductor, AOTAutograd, kernels); fixed at creation"
                ),
            ),
        },
    )
    concurrencyPolicy: Literal["Forbid", "Replace"] = Field(
        default="Forbid",
        description=(
            "What a spec.schedule slot does while the last slot's warm-up or expiry still "
            "runs, as a CronJob's: Forbid skips the slot (recorded in "
            "status.lastSkippedScheduleTime and as a ScheduleSkipped Event); Replace deletes "
            "the running Jobs and starts the new slot's."
        ),
        json_schema_extra={
            **doc(
                "enum",
                "`Forbid`",
                (
                    "what a `schedule` slot does while the last slot's warm-up or expiry still runs, "
                    "as a CronJob's: `Forbid` skips it (`status.lastSkippedScheduleTime`, Event "
                    "`ScheduleSkipped`), `Replace` deletes the running Jobs and starts the new slot's"
                ),
            ),
        },
    )
    lifecycle: Lifecycle = Field(
        default_factory=Lifecycle,
        description=(
            "Expiry applied after each warm-up, before the cache turns Ready. JAX never evicts "
            "entries by itself (nor does GCS), and a truncated entry is never repaired, so "
            "without expiry a cache only grows and keeps broken files."
        ),
        json_schema_extra={
            "default": {},
            **doc("object", "`{}`", "defaulted so that `verify: true` shows"),
        },
    )
    consumers: Consumers = Field(
        default_factory=Consumers,
        description=(
            "Training pods that use the cache. Pods labelled compilecache.dev/cache=<name>, "
            "and pods labelled compilecache.dev/inject=true that podSelector matches, get the "
            "volume, the same JAX cache environment and (optionally) a scheduling gate until "
            "the cache is Ready. The operator's own warm-up and expiry pods never do."
        ),
        json_schema_extra={
            "default": {},
            **doc("object", "`{}`", "defaulted so that `readOnly`, `gate`, `gateTimeout` show"),
        },
    )


# The root rule may read metadata.name: the API server adds ObjectMeta to the root's CEL type
# (k8s.io/apiserver/pkg/cel/common/schemas.go WithTypeAndObjectMeta; documented in "Validation rules"
# of the CustomResourceDefinition page). The name becomes the value of labels on every Job, claim and
# pod of the cache, and label values are at most 63 characters.
class CompileCache(Model):
    """A CompileCache keeps a JAX persistent compilation cache warm for training jobs. The operator runs
    warm-up Jobs on each GPU node pool that compile the training programs into shared storage (a PVC
    or a GCS prefix), expires stale or corrupt entries, and holds training pods that use the cache
    until it is Ready, so a training step that took minutes to compile loads in seconds.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "size(self.metadata.name) <= 63",
                    "message": (
                        "the name of a CompileCache is at most 63 characters: it is the value of "
                        "the compilecache.dev/cache label on the cache's Jobs, claims and training "
                        "pods"
                    ),
                },
            ],
        }
    )

    apiVersion: str | None = Field(
        default=None,
        description=(
            "APIVersion defines the versioned schema of this representation of an object (here "
            "compilecache.dev/v1alpha1)."
        ),
    )
    kind: str | None = Field(
        default=None, description="Kind is the REST resource this object represents (here CompileCache)."
    )
    # No description: the API server publishes ObjectMeta's own schema here, and structural rules
    # allow nothing but restrictions on name/generateName.
    metadata: dict[str, Any] | None = Field(default=None)
    spec: Spec = Field(
        description=(
            "What to compile, where to keep the result, on which GPU pools, and how long "
            "entries live. Changing anything that affects compilation starts a new warm-up."
        )
    )
    status: Status | None = Field(
        default=None, description="What the operator observed; written only by the operator (status subresource)."
    )
