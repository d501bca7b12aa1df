"""The operator's policy: what a CompileCache author may make the operator run (pure, no I/O).

Creating a CompileCache makes the operator create Jobs, so without a policy "may create a
CompileCache" would mean "may run any image, as any ServiceAccount, with any claim, on any
node". The policy bounds that: allowed images, ServiceAccounts, node selectors, tolerations
and claims (globs, or regular expressions starting with ``^``; ``allow`` then ``deny``), and
caps on GPUs per pod, hosts per topology, pools, and ``consumers.gateTimeout``.

It is read once at start-up from ``COMPILECACHE_POLICY`` (JSON; the chart renders its
``policy:`` values there); a policy that does not parse stops the operator with a message
naming the key. Unset keys take :data:`DEFAULT`'s values, which are safe but usable: any
pinned image from a named registry, only the namespace's ``default`` ServiceAccount, no
control-plane or node-condition tolerations and no tolerate-everything, no node selected
by hostname or role, no existing claim that has not opted in (``claim_violation``).

:func:`violations` checks a parsed spec (``api.parse_spec``); the validating webhook
(``handlers.validate_cache``) runs it at apply time, and the pass (``plan.py``) again, with
:func:`pool_violations` for what only the Nodes tell (discovered pools, a pool's GPUs).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from compilecache.cache import linear, units
from compilecache.controller import api, jobs
from compilecache.controller import runtime as runtime_
from compilecache.controller.api import DEFAULT_SERVICE_ACCOUNT, CacheSpec, Consumers, SpecError, parse_cache
from compilecache.controller.pools import Pool

POLICY_ENV = "COMPILECACHE_POLICY"
# On a claim: "true" lets every cache of the namespace mount it; the label compilecache.dev/cache
# naming one cache (what the operator puts on the claims it creates) lets that cache.
CLAIM_OPT_IN_LABEL = "compilecache.dev/cache-claim"

NAMED_REGISTRY = r"^([^/]*[.:][^/]*|localhost)/.+"  # an image reference that starts with its registry host
# The extended resources that count as accelerators in maxGpusPerPod, besides each pool's own gpuResource:
# the device plugins' resource names of NVIDIA (GPUs and MIG slices), AMD, Intel, Google TPUs, Habana
# Gaudi and AWS Neuron.
ACCELERATORS = (
    "nvidia.com/*",
    "amd.com/*",
    "gpu.intel.com/*",
    "google.com/tpu",
    "habana.ai/*",
    "aws.amazon.com/neuron*",
)
# The Secrets Store CSI driver mounts secrets of a cloud secret manager: a credential like a Secret volume.
SECRET_CSI_DRIVERS = ("secrets-store.csi.k8s.io",)
# Sources of a projected volume that carry no credential (secrets are checked by name, tokens by the policy).
_PLAIN_PROJECTIONS = frozenset({"configMap", "downwardAPI", "clusterTrustBundle"})
# Projected sources that mint a credential of the pod's identity for whatever runs in it.
_TOKEN_PROJECTIONS = frozenset({"serviceAccountToken", "podCertificate"})

Violation = tuple[str, str]  # (the field's path, why it is refused)


class PolicyError(ValueError):
    """A policy that cannot be used; the message names the key."""


def matches(value: str, pattern: str) -> bool:
    """A pattern starting with ``^`` is a regular expression (the whole value must match), else a glob
    (``fnmatch``'s, case-sensitive; ``*`` also matches ``/``). Both in time linear in the value
    (``cache/linear.py``): the values are a cache author's, the operator's loop must not wait on them."""
    return (linear.regex(pattern) if pattern.startswith("^") else linear.glob(pattern))(value)


@dataclass(frozen=True)
class Rules:
    """Patterns (:func:`matches`): a value is allowed when an ``allow`` pattern matches and no ``deny`` one."""

    allow: tuple[str, ...] = ("*",)
    deny: tuple[str, ...] = ()

    def permits(self, value: str) -> bool:
        """Whether ``value`` matches an ``allow`` pattern and no ``deny`` pattern."""
        return any(matches(value, p) for p in self.allow) and not any(matches(value, p) for p in self.deny)

    def describe(self) -> str:
        """The rules in one phrase, for a refusal's message."""
        text = f"allow {list(self.allow)}"
        return f"{text}, deny {list(self.deny)}" if self.deny else text


@dataclass(frozen=True)
class Policy:
    """The operator's policy; ``None`` for a cap means no cap (0 or null in JSON, ``""`` for the gate timeout)."""

    # A registry host first (a '.' or a ':port' before the first '/', or localhost): no short
    # name that a runtime resolves on Docker Hub or on whatever registry it is set to search.
    images: Rules = Rules(allow=(NAMED_REGISTRY,))
    # A tag other than latest, or a digest: what ran is what was reviewed.
    require_pinned_images: bool = True
    service_accounts: Rules = Rules(allow=(DEFAULT_SERVICE_ACCOUNT,))
    # On "key=value" of every nodeSelector entry (and "key=*" for discover.groupBy).
    node_selectors: Rules = Rules(deny=("kubernetes.io/hostname=*", "node-role.kubernetes.io/*"))
    # On each toleration's key; "" is a toleration without key, which tolerates every taint.
    tolerations: Rules = Rules(deny=("", "node-role.kubernetes.io/*", "node.kubernetes.io/*"))
    # Names of existing claims usable without opting in (none by default).
    claims: Rules = Rules(allow=())
    # Names of the Secrets a warm-up or expiry pod may read (volumes, projected volumes, env and envFrom of
    # a training template or a workload): none by default, since the cache author's code runs there.
    secrets: Rules = Rules(allow=())
    # Drivers of csi volumes a training template may bring (by driver name).
    csi_drivers: Rules = Rules(deny=SECRET_CSI_DRIVERS)
    # Kueue LocalQueues (of the cache's namespace) the warm-up and expiry Jobs may join (warmup.queue).
    queues: Rules = Rules()
    # PriorityClasses of the warm-up and expiry pods and Kueue WorkloadPriorityClasses of their Jobs: not the
    # system ones, which would let a cache author's warm-up preempt the cluster's own pods.
    priority_classes: Rules = Rules(deny=("system-*",))
    # Projected ServiceAccount tokens (and pod certificates) in a training template's volumes.
    service_account_tokens: bool = False
    # Extended resources counted in max_gpus_per_pod (patterns), besides each pool's gpuResource.
    accelerators: tuple[str, ...] = ACCELERATORS
    max_gpus_per_pod: int | None = 8
    max_hosts: int | None = 16
    max_pools: int | None = 16
    max_gate_timeout_seconds: float | None = 2 * 3600.0
    # The uid (and gid, fsGroup) of the pods the operator creates; None leaves them to the platform
    # (OpenShift's restricted SCC assigns one from the namespace's range and refuses a pinned one).
    run_as_user: int | None = jobs.RUN_AS_USER
    # Not of COMPILECACHE_POLICY: the operator's runtime image (COMPILECACHE_RUNTIME_IMAGE, the chart's
    # runtime.image), carried here because it reaches the same places, the webhook and the Job builder.
    runtime: runtime_.Runtime | None = None

    @property
    def max_gate_timeout(self) -> str | None:
        """``max_gate_timeout_seconds`` as a duration, for messages (e.g. ``7200s``)."""
        seconds = self.max_gate_timeout_seconds
        return None if seconds is None else units.format_duration(seconds)


DEFAULT = Policy()
_RULES = {
    "images": "images",
    "serviceAccounts": "service_accounts",
    "nodeSelectors": "node_selectors",
    "tolerations": "tolerations",
    "claims": "claims",
    "secrets": "secrets",
    "csiDrivers": "csi_drivers",
    "queues": "queues",
    "priorityClasses": "priority_classes",
}
_CAPS = {"maxGpusPerPod": "max_gpus_per_pod", "maxHosts": "max_hosts", "maxPools": "max_pools"}


def parse(raw: Mapping[str, Any] | None) -> Policy:
    """A policy from its JSON form (the chart's ``policy:`` values); unset keys keep :data:`DEFAULT`'s."""
    if raw is None:
        return DEFAULT
    if not isinstance(raw, Mapping):
        raise PolicyError(f"the policy must be an object, got {type(raw).__name__}")
    known = {*_RULES, *_CAPS, "maxGateTimeout", "serviceAccountTokens", "accelerators", "runAsUser"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise PolicyError(f"policy.{unknown[0]} is not a policy key (known: {sorted(known)})")
    changes: dict[str, Any] = {}
    for key, attr in _RULES.items():
        if key in raw:
            changes[attr] = _rules(raw[key], getattr(DEFAULT, attr), f"policy.{key}")
            if key == "images" and isinstance(raw[key], Mapping) and "requirePinned" in raw[key]:
                pinned = raw[key]["requirePinned"]
                if not isinstance(pinned, bool):
                    raise PolicyError(f"policy.images.requirePinned must be true or false, got {pinned!r}")
                changes["require_pinned_images"] = pinned
    for key, attr in _CAPS.items():
        if key in raw:
            value = raw[key]
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise PolicyError(f"policy.{key} must be a whole number (0 or null: no cap), got {value!r}")
            # 0 too: Helm drops a key set to null from the values, so the chart cannot say null.
            changes[attr] = value or None
    if "serviceAccountTokens" in raw:
        if not isinstance(raw["serviceAccountTokens"], bool):
            raise PolicyError(f"policy.serviceAccountTokens must be true or false, got {raw['serviceAccountTokens']!r}")
        changes["service_account_tokens"] = raw["serviceAccountTokens"]
    if "accelerators" in raw:
        changes["accelerators"] = _patterns(raw["accelerators"], "policy.accelerators")
    if "runAsUser" in raw:
        value = raw["runAsUser"]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise PolicyError(f"policy.runAsUser must be a uid (0 or null: the platform's), got {value!r}")
        changes["run_as_user"] = value or None  # 0 too: never root (runAsNonRoot), and Helm drops null
    if "maxGateTimeout" in raw:
        value = raw["maxGateTimeout"]
        try:
            changes["max_gate_timeout_seconds"] = None if value in (None, "") else units.parse_duration(value)
        except (ValueError, TypeError) as exc:
            raise PolicyError(f"policy.maxGateTimeout: {exc}") from None
    return replace(DEFAULT, **changes)


def from_env(environ: Mapping[str, str]) -> Policy:
    """The policy in ``COMPILECACHE_POLICY`` (JSON), or :data:`DEFAULT` when it is unset or empty,
    with the runtime of ``COMPILECACHE_RUNTIME_IMAGE`` (:func:`compilecache.controller.runtime.from_env`)."""
    try:
        injected = runtime_.from_env(environ)
    except ValueError as exc:
        raise PolicyError(str(exc)) from None
    text = (environ.get(POLICY_ENV) or "").strip()
    if not text:
        return replace(DEFAULT, runtime=injected)
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise PolicyError(f"{POLICY_ENV} is not JSON: {exc}") from None
    return replace(parse(raw), runtime=injected)


def _rules(raw: Any, default: Rules, path: str) -> Rules:
    if not isinstance(raw, Mapping):
        raise PolicyError(f"{path} must be an object with allow and deny lists, got {type(raw).__name__}")
    allowed = {"allow", "deny", "requirePinned"} if path == "policy.images" else {"allow", "deny"}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise PolicyError(f"{path}.{unknown[0]} is not a key of {path} (known: {sorted(allowed)})")
    lists = {key: _patterns(raw.get(key, getattr(default, key)), f"{path}.{key}") for key in ("allow", "deny")}
    return Rules(allow=lists["allow"], deny=lists["deny"])


def _patterns(value: Any, path: str) -> tuple[str, ...]:
    """A list of patterns (:func:`matches`), each compiled once here so that a bad one stops the operator."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not all(isinstance(item, str) for item in value):
        raise PolicyError(f"{path} must be a list of patterns (strings), got {value!r}")
    for item in value:
        try:
            linear.regex(item) if item.startswith("^") else linear.glob(item)
        except linear.PatternError as exc:
            raise PolicyError(f"{path}: {exc} (RE2 syntax: no backreferences, no look-around)") from None
    return tuple(value)


def image_pinned(image: str) -> bool:
    """Whether ``image`` names one build: a digest, or a tag other than ``latest``."""
    if "@" in image:
        return True
    name = image.rsplit("/", 1)[-1]
    tag = name.partition(":")[2]
    return bool(tag) and tag != "latest"


def _queueing(spec: CacheSpec, policy: Policy) -> list[Violation]:
    """The LocalQueues (``queues``) and priority classes (``priorityClasses``) the Jobs would use."""
    warmup, found = spec.warmup, []
    named: list[tuple[str, str | None, Rules, str]] = [
        ("spec.warmup.priorityClassName", warmup.priority_class_name, policy.priority_classes, "priorityClasses")
    ]
    if warmup.queue is not None:
        named += [
            ("spec.warmup.queue.name", warmup.queue.name, policy.queues, "queues"),
            # Unset, expiryName is name's: then it is refused once, at the field the author wrote.
            (
                "spec.warmup.queue.expiryName",
                warmup.queue.expiry_name if warmup.queue.expiry_name != warmup.queue.name else None,
                policy.queues,
                "queues",
            ),
            (
                "spec.warmup.queue.priorityClass",
                warmup.queue.priority_class,
                policy.priority_classes,
                "priorityClasses",
            ),
        ]
    for path, value, rules, key in named:
        if value is not None and not rules.permits(value):
            found.append((path, f"{value} is not allowed ({key}: {rules.describe()})"))
    return found


def violations(spec: CacheSpec, policy: Policy) -> list[Violation]:
    """What in ``spec`` the policy refuses, as (field path, message); empty when it is all allowed."""
    warmup = spec.warmup
    # "" while a templateRef is unread (the webhook at apply time): the pass checks training's image.
    found = _image(warmup.image, warmup.image_path, policy) if warmup.image else []
    found += _accounts(spec, policy)
    found += _template_volumes(spec, policy)
    found += _secret_env(spec, policy)
    for index, pool in enumerate(warmup.pools):
        path = f"spec.warmup.pools[{index}]"
        found += _placement(pool.node_selector, pool.tolerations, path, policy)
        cap = policy.max_gpus_per_pod
        if cap is not None and pool.gpus_per_pod is not None and pool.gpus_per_pod > cap:
            found.append((f"{path}.gpusPerPod", f"{pool.gpus_per_pod} GPUs per pod is above the policy's {cap}"))
        else:  # the pool's GPUs with what warmup.resources adds (a node's count, when unset, is the pass's)
            found += _resource_accelerators(spec, pool.gpu_resource, pool.gpus_per_pod or 0, pool.name, policy)
    if warmup.discover is not None:
        found += _resource_accelerators(spec, warmup.discover.gpu_resource, 0, "discovered", policy)
    if warmup.discover is not None:
        discover = warmup.discover
        found += _placement(discover.node_selector, discover.tolerations, "spec.warmup.discover", policy)
        # Each discovered pool selects its value of groupBy: a key refused with any value is refused here.
        # Unset, a pool selects the accelerator label its nodes carry: pool_violations checks those.
        if discover.group_by is not None and not policy.node_selectors.permits(f"{discover.group_by}=*"):
            found.append(
                (
                    "spec.warmup.discover.groupBy",
                    f"pools by {discover.group_by} are not allowed (nodeSelectors: {policy.node_selectors.describe()})",
                )
            )
        cap = policy.max_gpus_per_pod
        for index, gpu_type in enumerate(discover.gpu_types):
            path = f"spec.warmup.discover.gpuTypes[{index}]"
            if not policy.node_selectors.permits(f"{discover.group_by}={gpu_type.value}"):
                message = f"{discover.group_by}={gpu_type.value} ({policy.node_selectors.describe()})"
                found.append((f"{path}.value", message))
            if cap is not None and gpu_type.gpus_per_pod > cap:
                message = f"{gpu_type.gpus_per_pod} GPUs per pod is above the policy's {cap}"
                found.append((f"{path}.gpusPerPod", message))
    found += _queueing(spec, policy)
    if policy.max_pools is not None and len(warmup.pools) > policy.max_pools:
        found.append(("spec.warmup.pools", f"{len(warmup.pools)} pools is above the policy's {policy.max_pools}"))
    if policy.max_hosts is not None:
        for index, topology in enumerate(warmup.topologies):
            if topology.hosts > policy.max_hosts:
                path = f"spec.warmup.topologies[{index}].hosts"
                found.append((path, f"{topology.hosts} hosts is above the policy's {policy.max_hosts}"))
    cap_seconds = policy.max_gate_timeout_seconds
    if cap_seconds is not None and spec.consumers.gate_timeout_seconds > cap_seconds:
        timeout = units.format_duration(spec.consumers.gate_timeout_seconds)
        found.append(("spec.consumers.gateTimeout", f"{timeout} is above the policy's {policy.max_gate_timeout}"))
    return found


def pool_violations(spec: CacheSpec, pools: Sequence[Pool], policy: Policy) -> list[Violation]:
    """What the resolved ``pools`` (``pools.resolve_pools``) add: discovered pools and each pool's real GPUs."""
    found: list[Violation] = []
    declared = {pool.name: index for index, pool in enumerate(spec.warmup.pools)}
    resolved = [pool for pool in pools if pool.nodes]  # a pool without nodes runs nothing
    for pool in resolved:
        path = f"spec.warmup.pools[{declared[pool.name]}]" if pool.name in declared else "spec.warmup.discover"
        for key, value in sorted(pool.node_selector.items()):
            if not policy.node_selectors.permits(f"{key}={value}"):
                message = f"pool {pool.name!r} selects {key}={value} ({policy.node_selectors.describe()})"
                found.append((f"{path}.nodeSelector", message))
        cap = policy.max_gpus_per_pod
        if cap is not None and pool.gpus_per_pod > cap:
            # A declared pool without gpusPerPod takes its nodes' GPUs: then the field named is the pool.
            explicit = pool.name in declared and spec.warmup.pools[declared[pool.name]].gpus_per_pod is not None
            where = f"{path}.gpusPerPod" if explicit else path
            message = f"pool {pool.name!r} would use {pool.gpus_per_pod} GPUs per pod, above the policy's {cap}"
            found.append((where, message))
        else:
            found += _resource_accelerators(spec, pool.gpu_resource, pool.gpus_per_pod, pool.name, policy)
    if policy.max_pools is not None and len(resolved) > policy.max_pools:
        message = f"{len(resolved)} pools with nodes is above the policy's {policy.max_pools}"
        found.append(("spec.warmup.discover" if spec.warmup.discover else "spec.warmup.pools", message))
    return _unique(found)


def claim_violation(
    spec: CacheSpec, claim: Mapping[str, Any], cache_name: str, cache_uid: str | None, policy: Policy
) -> Violation | None:
    """Why the existing ``claim`` may not be mounted by this cache, or ``None`` when it may.

    It may when the cache owns it (created with ``deleteWithCache``), when it is labelled with
    this cache's name (``compilecache.dev/cache``, as on every claim the operator creates) or
    ``compilecache.dev/cache-claim: "true"``, or when the policy's ``claims`` allow its name.
    ``create`` does not make a foreign claim this cache's: the operator creates only what is missing.
    """
    meta = claim.get("metadata") or {}
    labels = meta.get("labels") or {}
    owners = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
    if cache_uid is not None and cache_uid in owners:
        return None
    if labels.get(jobs.LABEL_CACHE) == cache_name or labels.get(CLAIM_OPT_IN_LABEL) == "true":
        return None
    assert spec.pvc is not None
    if policy.claims.permits(spec.pvc.claim_name):
        return None
    return (
        "spec.storage.pvc.claimName",
        f"PersistentVolumeClaim {spec.pvc.claim_name} exists and was not made for this cache: label it "
        f'{CLAIM_OPT_IN_LABEL}="true" (any cache of the namespace) or {jobs.LABEL_CACHE}={cache_name} '
        "to let this cache mount it, or allow it in the operator's policy (claims)",
    )


def admission_violations(
    cache: Mapping[str, Any], policy: Policy, read_claim: Callable[[str], Mapping[str, Any] | None] | None = None
) -> list[Violation]:
    """What refuses a CompileCache at apply time: its first spec error (``api.parse_cache``), else the policy's.

    The parser's checks include those the CRD's CEL cannot afford (a workload naming a pool not
    in ``warmup.pools``), which a real API server would otherwise accept. ``read_claim`` reads the
    existing claim ``storage.pvc.claimName`` names, if any; it is called only once the spec is
    valid, so a name of a megabyte never reaches the API.
    """
    try:
        spec = parse_cache(cache)
    except SpecError as exc:
        return [(exc.field, exc.message)]
    found = violations(spec, policy)
    claim = read_claim(spec.pvc.claim_name) if spec.pvc is not None and read_claim is not None else None
    if spec.pvc is not None and claim is not None:
        meta = cache.get("metadata") or {}
        refused = claim_violation(spec, claim, str(meta.get("name")), meta.get("uid"), policy)
        found += [refused] if refused is not None else []
    return found


def bounded(consumers: Consumers, policy: Policy) -> Consumers:
    """``consumers`` with ``gateTimeout`` cut to the policy's cap: a refused cache must not hold pods longer."""
    cap = policy.max_gate_timeout_seconds
    if cap is None or consumers.gate_timeout_seconds <= cap:
        return consumers
    return replace(consumers, gate_timeout_seconds=cap)


def describe(found: Sequence[Violation]) -> str:
    """Violations in one message, each naming its field (a refusal, a condition)."""
    return "; ".join(f"{path}: {message}" for path, message in found)


def _accounts(spec: CacheSpec, policy: Policy) -> list[Violation]:
    found: list[Violation] = []
    gcs_account = spec.gcs.service_account_name if spec.gcs is not None else None
    if gcs_account is not None and not policy.service_accounts.permits(gcs_account):
        found.append(
            (
                "spec.storage.gcs.serviceAccountName",
                f"ServiceAccount {gcs_account!r} is not allowed ({policy.service_accounts.describe()})",
            )
        )
    # The reader is the identity the webhook gives the cache's training pods: the cache author chooses
    # it for other people's pods, so it is held to the same list as the writers.
    reader = spec.gcs.reader_service_account_name if spec.gcs is not None else None
    if reader is not None and not policy.service_accounts.permits(reader):
        found.append(
            (
                "spec.storage.gcs.readerServiceAccountName",
                f"ServiceAccount {reader!r} is not allowed ({policy.service_accounts.describe()})",
            )
        )
    account = jobs.warmup_service_account(spec)
    if account == gcs_account and account is not None:
        return found  # the warm-up runs as the GCS account (checked above)
    path = "spec.warmup.serviceAccountName"
    template = spec.warmup.pod_template
    if spec.warmup.service_account_name is None and template is not None and template.service_account_name:
        path = f"{template.origin}.serviceAccountName"  # training's account, taken by the warm-up
    if not policy.service_accounts.permits(account or DEFAULT_SERVICE_ACCOUNT):
        found.append(
            (
                path,
                f"ServiceAccount {account or DEFAULT_SERVICE_ACCOUNT!r} is not allowed "
                f"({policy.service_accounts.describe()})" + (" (unset runs as default)" if account is None else ""),
            )
        )
    return found


def _template_volumes(spec: CacheSpec, policy: Policy) -> list[Violation]:
    """Training's volumes may come only in the kinds a pod of the namespace shares (api.TEMPLATE_VOLUME_TYPES),
    and without credentials the policy does not allow (:func:`_volume_credentials`).

    Not hostPath (a node's files), nor the in-tree network kinds (nfs, iscsi, ...: a server any
    author could name). Claims need no opt-in (``claim_violation``): that guards the claim the
    warm-up writes; a template's claims are mounted read-only (``jobs.template_volumes``).
    """
    template = spec.warmup.pod_template
    found: list[Violation] = []
    if template is None:
        return found
    for index, volume in enumerate(template.volumes):
        kind = api.volume_type(volume)
        if kind not in api.TEMPLATE_VOLUME_TYPES:
            found.append(
                (
                    f"{template.origin}.volumes[{index}]",
                    f"a {kind} volume is not allowed in a warm-up (allowed: {sorted(api.TEMPLATE_VOLUME_TYPES)})",
                )
            )
    return found + _volume_credentials(template.volumes, f"{template.origin}.volumes", policy)


def _image(image: str, path: str, policy: Policy) -> list[Violation]:
    """The policy's images and pinning, on one image (the spec's, or a container's) at ``path``."""
    if not policy.images.permits(image):
        return [(path, f"image {image!r} is not allowed ({policy.images.describe()})")]
    if policy.require_pinned_images and not image_pinned(image):
        return [(path, f"image {image!r} must have a tag other than latest, or a digest")]
    return []


def _is_accelerator(name: str, policy: Policy) -> bool:
    """Whether an extended resource counts as an accelerator by the policy's ``accelerators`` patterns."""
    return any(matches(name, pattern) for pattern in policy.accelerators)


def accelerators(resources: Mapping[str, Mapping[str, Any]], policy: Policy, gpu_resource: str) -> Decimal:
    """How many accelerators a container's ``resources`` ask for: each extended resource the policy counts
    (``accelerators``) or that is the pool's ``gpu_resource``, by the larger of its request and limit
    (an extended resource's request defaults to its limit, and the two must be equal)."""
    total = Decimal(0)
    names = {name for kind in ("requests", "limits") for name in resources.get(kind) or {}}
    for name in names:
        if name == gpu_resource or _is_accelerator(name, policy):
            amounts = [(resources.get(kind) or {}).get(name) for kind in ("requests", "limits")]
            total += max(_quantity(amount) for amount in amounts if amount is not None)
    return total


def pod_accelerators(pod_spec: Mapping[str, Any], policy: Policy, gpu_resource: str) -> Decimal:
    """A pod's accelerators as the scheduler counts its request: the containers' sum, or the largest init
    container's when that is more (init containers run one at a time, before the containers)."""

    def count(container: Any) -> Decimal:
        resources = container.get("resources") if isinstance(container, Mapping) else None
        return accelerators(resources if isinstance(resources, Mapping) else {}, policy, gpu_resource)

    running = sum((count(c) for c in pod_spec.get("containers") or ()), Decimal(0))
    return max([running, *(count(c) for c in pod_spec.get("initContainers") or ())])


def pod_violations(pod_spec: Mapping[str, Any], policy: Policy, gpu_resource: str, where: str) -> list[Violation]:
    """What the policy refuses in a pod the operator is about to create, whatever field of the spec it came from.

    The spec's checks (:func:`violations`, :func:`pool_violations`) name the cache's fields; this one
    holds the same rules on the pod itself (``where`` names it, e.g. ``Job x``), so that no field
    they miss can reach a pod: the images, the ServiceAccount, the accelerators, the placement, the
    volumes and the Secrets of the environment.
    """
    found: list[Violation] = []
    containers = [
        (f"{where}: {kind}[{index}]", container)
        for kind in ("initContainers", "containers")
        for index, container in enumerate(pod_spec.get(kind) or ())
    ]
    for path, container in containers:
        found += _image(str(container.get("image") or ""), f"{path}.image", policy)
        found += _env_secrets(container.get("env") or (), container.get("envFrom") or (), path, policy)
    account = str(pod_spec.get("serviceAccountName") or DEFAULT_SERVICE_ACCOUNT)
    if not policy.service_accounts.permits(account):
        message = f"ServiceAccount {account!r} is not allowed ({policy.service_accounts.describe()})"
        found.append((f"{where}: serviceAccountName", message))
    if pod_spec.get("automountServiceAccountToken") is not False:
        message = "must be false: no pod of the operator's needs the API"
        found.append((f"{where}: automountServiceAccountToken", message))
    cap = policy.max_gpus_per_pod
    total = pod_accelerators(pod_spec, policy, gpu_resource)
    if cap is not None and total > cap:
        found.append((f"{where}: resources", f"the pod asks for {total} accelerators, above the policy's {cap}"))
    found += _placement(pod_spec.get("nodeSelector") or {}, pod_spec.get("tolerations") or (), where, policy)
    found += _volume_credentials(pod_spec.get("volumes") or (), f"{where}: volumes", policy)
    return found


def _resource_accelerators(spec: CacheSpec, gpu_resource: str, gpus: int, pool: str, policy: Policy) -> list[Violation]:
    """The accelerators ``warmup.resources`` adds to a pool's ``gpus``, against ``maxGpusPerPod``."""
    cap = policy.max_gpus_per_pod
    resources = jobs.container_resources(spec, gpu_resource, gpus)
    total = accelerators(resources, policy, gpu_resource)
    if cap is None or total <= cap:
        return []
    counted = [
        f"{kind}.{name}"
        for kind in ("requests", "limits")
        for name in spec.warmup.resources.get(kind) or {}
        if name != gpu_resource and _is_accelerator(name, policy)
    ]
    where = f"spec.warmup.resources.{counted[0]}" if counted else "spec.warmup.resources"
    message = (
        f"the warm-up pod of pool {pool!r} would ask for {total} accelerators ({gpus} {gpu_resource} from the pool "
        f"and {', '.join(counted)} from warmup.resources), above the policy's {cap}"
    )
    return [(where, message)]


def _quantity(value: Any) -> Decimal:
    try:
        return units.parse_quantity(value)
    except ValueError:
        return Decimal(0)  # not a quantity: the spec's own validation refused it already


def _volume_credentials(volumes: Sequence[Any], path: str, policy: Policy) -> list[Violation]:
    """Volumes that carry a credential: Secrets outside the policy's ``secrets``, projected tokens and pod
    certificates unless ``serviceAccountTokens``, csi drivers outside ``csiDrivers``."""
    found: list[Violation] = []
    for index, volume in enumerate(volumes):
        if not isinstance(volume, Mapping):
            continue
        where = f"{path}[{index}]"
        secret = volume.get("secret")
        if isinstance(secret, Mapping):
            found += _secret(secret.get("secretName"), f"{where}.secret.secretName", policy)
        csi = volume.get("csi")
        if isinstance(csi, Mapping) and not policy.csi_drivers.permits(str(csi.get("driver") or "")):
            message = f"csi driver {csi.get('driver')!r} is not allowed ({policy.csi_drivers.describe()})"
            found.append((f"{where}.csi.driver", message))
        projected = volume.get("projected")
        sources = projected.get("sources") if isinstance(projected, Mapping) else None
        for sindex, source in enumerate(sources if isinstance(sources, list) else ()):
            spath = f"{where}.projected.sources[{sindex}]"
            for kind, value in source.items() if isinstance(source, Mapping) else ():
                if kind == "secret":
                    name = value.get("name") if isinstance(value, Mapping) else None
                    found += _secret(name, f"{spath}.secret.name", policy)
                elif kind in _TOKEN_PROJECTIONS and not policy.service_account_tokens:
                    message = (
                        f"a projected {kind} gives the warm-up's code a credential of its ServiceAccount; "
                        "not allowed (policy serviceAccountTokens)"
                    )
                    found.append((f"{spath}.{kind}", message))
                elif kind not in _PLAIN_PROJECTIONS | _TOKEN_PROJECTIONS | {"secret"}:
                    found.append((f"{spath}.{kind}", f"an unknown projected source {kind!r} is not allowed"))
    return found


def _env_secrets(env: Sequence[Any], env_from: Sequence[Any], path: str, policy: Policy) -> list[Violation]:
    """Secrets an environment reads (``valueFrom.secretKeyRef``, ``envFrom[].secretRef``), against ``secrets``."""
    found: list[Violation] = []
    for index, item in enumerate(env):
        value_from = item.get("valueFrom") if isinstance(item, Mapping) else None
        ref = value_from.get("secretKeyRef") if isinstance(value_from, Mapping) else None
        if isinstance(ref, Mapping):
            found += _secret(ref.get("name"), f"{path}.env[{index}].valueFrom.secretKeyRef.name", policy)
    for index, item in enumerate(env_from):
        ref = item.get("secretRef") if isinstance(item, Mapping) else None
        if isinstance(ref, Mapping):
            found += _secret(ref.get("name"), f"{path}.envFrom[{index}].secretRef.name", policy)
    return found


def _secret(name: Any, path: str, policy: Policy) -> list[Violation]:
    if policy.secrets.permits(str(name or "")):
        return []
    return [
        (
            path,
            f"Secret {name!r} is not allowed ({policy.secrets.describe()}): the warm-up runs the cache author's "
            "code, which could read it; allow it in the operator's policy (secrets)",
        )
    ]


def _secret_env(spec: CacheSpec, policy: Policy) -> list[Violation]:
    """The Secrets the warm-up's environment reads: each workload's env and a training template's env and envFrom."""
    found: list[Violation] = []
    for index, workload in enumerate(spec.warmup.workloads):
        found += _env_secrets(workload.env, (), f"spec.warmup.workloads[{index}]", policy)
    template = spec.warmup.pod_template
    if template is not None:
        found += _env_secrets(template.env, template.env_from, template.container_path, policy)
    return found


def _placement(
    node_selector: Mapping[str, str], tolerations: Sequence[Mapping[str, Any]], path: str, policy: Policy
) -> list[Violation]:
    found: list[Violation] = []
    for key, value in sorted(node_selector.items()):
        if not policy.node_selectors.permits(f"{key}={value}"):
            found.append(
                (f"{path}.nodeSelector.{key}", f"{key}={value} is not allowed ({policy.node_selectors.describe()})")
            )
    for index, toleration in enumerate(tolerations):
        key = str(toleration.get("key") or "")
        if not policy.tolerations.permits(key):
            what = f"key {key!r}" if key else "no key (it tolerates every taint)"
            found.append(
                (
                    f"{path}.tolerations[{index}]",
                    f"a toleration with {what} is not allowed ({policy.tolerations.describe()})",
                )
            )
    return found


def _unique(found: list[Violation]) -> list[Violation]:
    return list(dict.fromkeys(found))
