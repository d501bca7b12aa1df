"""Training pods: which cache a pod uses, and the pod with that cache added (pure functions, no I/O).

The webhook (``handlers.mutate_pods``) and ``compilecache env NAME`` both build on
this module, so a pod mutated by the webhook and a pod written by hand from the
snippet get the same volume, mount and cache settings as the warm-up Jobs (the framework's
``trainer_env``, :mod:`compilecache.frameworks`): one differing option and every step misses.
A framework whose trainers never write the published cache (PyTorch's) gets it read-only, and
an emptyDir for the local copy it works in.

A mutation only ever adds. What the pod already has under one of our names (a
volume, a mount path, an environment variable) stays as the user wrote it, and
the reason is recorded in the ``compilecache.dev/skipped`` annotation.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonpatch

from compilecache import frameworks
from compilecache.cache import linear, units
from compilecache.cache.cacheenv import TERMINATION_LOG, reporting
from compilecache.controller import images as images_
from compilecache.controller import policy, status
from compilecache.controller import runtime as runtime_
from compilecache.controller.api import DEFAULT_SERVICE_ACCOUNT, CacheSpec, SpecError, check_bounded, parse_cache
from compilecache.controller.jobs import LABEL_CACHE, LABEL_ROLE, container_security_context, warmup_env

GATE = "compilecache.dev/warm"  # the scheduling gate that holds a pod until its cache is Ready
# Why and when a pod's wait ended: written by a gate's release (gates.py), or by Kueue onto the pods of a
# Workload our admission check let through (checks.py: podSetUpdates). A pod created with it is not gated.
ANNOTATION_RELEASED = "compilecache.dev/released"
ANNOTATION_SKIPPED = "compilecache.dev/skipped"  # what the mutation left as the user wrote it, and why
VOLUME = "compilecache"  # the name of the cache volume in a training pod
# A framework's local_copy_dir (PyTorch's): the emptyDir that holds the trainer's writable copy of the cache.
LOCAL_VOLUME = "compilecache-local"
# A pod's own switch (Istio's sidecar.istio.io/inject): "true" opts it in to consumers.podSelector
# (in a namespace labelled compilecache.dev/injection=enabled); "false" opts it out of everything.
LABEL_INJECT = "compilecache.dev/inject"
# k8s.io/apimachinery/pkg/util/validation: qualifiedNameFmt-style label values, 63 characters at most.
_LABEL_VALUE = linear.regex(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")  # in linear time: a pod's labels
_LABEL_VALUE_MAX = 63
MAX_CONTAINERS = 64  # containers and init containers of a pod the webhook mutates (pod_too_large)
POD_MAX_CHARS = 256 * 1024  # JSON of a pod's spec the webhook mutates (kopf diffs it on its loop: ~40 ms)


@dataclass(frozen=True)
class Choice:
    """The cache a pod uses: ``name`` (``None``: none), and a warning for the user if something is off."""

    name: str | None
    by_label: bool = False
    warning: str | None = None


@dataclass(frozen=True)
class Mutation:
    """A mutated copy of a pod, what was left alone (``skipped``) and warnings for the user."""

    pod: dict[str, Any]
    skipped: tuple[str, ...] = ()
    warnings: tuple[str, ...] = field(default=())


def is_operator_pod(labels: Mapping[str, str]) -> bool:
    """Whether a pod is one the operator created (warm-up, expiry): never a consumer, whatever selects it."""
    return LABEL_ROLE in labels


def choose_cache(pod: Mapping[str, Any], caches: Sequence[Mapping[str, Any]]) -> Choice:
    """Pick the cache of a pod among the CompileCaches of its namespace.

    The operator's own pods (:func:`is_operator_pod`) and pods labelled
    ``compilecache.dev/inject: "false"`` use none. The label ``compilecache.dev/cache: NAME``
    decides when present (an unknown name is no cache, with a warning: a typo must not block
    training). Otherwise a pod that opted in with ``compilecache.dev/inject: "true"`` uses the
    one cache whose ``consumers.podSelector`` matches it, so a selector only narrows the pods
    that opted in; several matches are ambiguous (one process has one cache dir), so none is
    used and the user is told how to choose.
    """
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if is_operator_pod(labels) or labels.get(LABEL_INJECT) == "false":
        return Choice(None)
    by_name = {cache["metadata"]["name"]: cache for cache in caches}
    wanted = labels.get(LABEL_CACHE)
    if wanted is not None:
        if wanted in by_name:
            return Choice(wanted, by_label=True)
        return Choice(None, warning=f"CompileCache {wanted!r} does not exist here; the pod runs without a cache")
    if labels.get(LABEL_INJECT) != "true":
        return Choice(None)  # no opt-in: no selector can make it a consumer
    matching = sorted(
        name
        for name, cache in by_name.items()
        if (selector := ((cache.get("spec") or {}).get("consumers") or {}).get("podSelector")) is not None
        and selector_matches(selector, labels)
    )
    if len(matching) > 1:
        return Choice(
            None,
            warning=f"the pod matches the podSelector of several CompileCaches ({', '.join(matching)}); "
            f"label it {LABEL_CACHE}=NAME to choose one; it runs without a cache",
        )
    return Choice(matching[0] if matching else None)


def admit(pod: Mapping[str, Any], caches: Sequence[Mapping[str, Any]], *, rules: policy.Policy) -> Mutation:
    """The webhook's decision for a new pod, given the CompileCaches of its namespace and the policy in force.

    Fails open: a pod that uses no cache, names one that does not exist, or uses one whose
    spec is invalid or refused by ``rules`` comes back unchanged, with a warning where the user
    should know.
    """
    choice = choose_cache(pod, caches)
    if choice.name is None:
        return Mutation(pod=copy.deepcopy(dict(pod)), warnings=(choice.warning,) if choice.warning else ())
    cache = next(cache for cache in caches if cache["metadata"]["name"] == choice.name)
    if too_large := pod_too_large(pod):
        return Mutation(pod=copy.deepcopy(dict(pod)), warnings=(f"CompileCache {choice.name}: {too_large}",))
    if not choice.by_label and not is_label_value(choice.name):
        # The pod would get the label compilecache.dev/cache=NAME (how its gate is found), and the
        # API server refuses the whole pod for a bad label value: fail open instead.
        warning = (
            f"CompileCache {choice.name} matches the pod by podSelector, but its name is not a valid label "
            f"value (at most 63 characters), so the pod cannot be labelled {LABEL_CACHE}; "
            "it runs without a cache"
        )
        return Mutation(pod=copy.deepcopy(dict(pod)), warnings=(warning,))
    try:
        return mutate(pod, cache, by_label=choice.by_label, rules=rules, writers=namespace_writers(caches))
    except SpecError as exc:
        warning = f"CompileCache {choice.name} has an invalid spec ({exc}); the pod runs without a cache"
        return Mutation(pod=copy.deepcopy(dict(pod)), warnings=(warning,))


def pod_too_large(pod: Mapping[str, Any]) -> str | None:
    """Why a pod is past what the webhook mutates, or ``None``: more than :data:`MAX_CONTAINERS` containers,
    or a spec of more than :data:`POD_MAX_CHARS` of JSON.

    kopf turns the mutation into a JSON patch on its event loop (a copy and a diff of the whole pod), and
    the mutation adds the cache's settings to each container: a pod of 20,000 containers held the loop
    (every pass, every other admission) 2-3 s. Kubernetes bounds neither; a real training pod has a few
    containers and a few KiB. Such a pod fails open: it runs without the cache, and is told why.
    """
    spec = pod.get("spec") or {}
    containers = len(spec.get("containers") or ()) + len(spec.get("initContainers") or ())
    if containers > MAX_CONTAINERS:
        return (
            f"the pod has {containers} containers, more than the {MAX_CONTAINERS} the webhook mutates; "
            "it runs without the cache"
        )
    try:
        check_bounded(spec, "spec", max_chars=POD_MAX_CHARS)
    except SpecError as exc:
        return f"{exc}: the webhook mutates no larger pod; it runs without the cache"
    return None


def is_label_value(value: str) -> bool:
    """Whether ``value`` is a valid Kubernetes label value: at most 63 characters, alphanumerics and
    ``-_.`` inside, alphanumeric at both ends, or empty (apimachinery's ``IsValidLabelValue``).
    """
    return len(value) <= _LABEL_VALUE_MAX and _LABEL_VALUE(value)


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a Kubernetes LabelSelector matches ``labels``; an empty selector matches nothing here.

    (Kubernetes reads ``{}`` as "everything"; a consumer selector that mutates every pod of a
    namespace is never what a user meant, so it selects none.)
    """
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not match_labels and not expressions:
        return False
    if any(labels.get(key) != value for key, value in match_labels.items()):
        return False
    for expression in expressions:
        key, operator = expression.get("key"), expression.get("operator")
        values = expression.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False  # the CRD rejects other operators; an unknown one selects nothing
    return True


def is_serving(cache: Mapping[str, Any]) -> bool:
    """Whether training pods may start on the cache now: its recorded phase is Ready or Degraded."""
    return (cache.get("status") or {}).get("phase") in status.SERVING


def read_only(spec: CacheSpec) -> bool:
    """Whether consumers mount the cache read-only: ``consumers.readOnly``, and always where the
    framework's trainers never write it (PyTorch: Inductor works in a local copy, as it has no
    read-only mode, so a writable mount would only let a trainer damage the entries)."""
    return spec.consumers.read_only or not frameworks.get(spec.framework).trainers_write


def cache_volume(spec: CacheSpec) -> dict[str, Any] | None:
    """The pod volume of a PVC cache (``None`` for GCS: JAX reads ``gs://`` itself, torch's hook copies it)."""
    if spec.pvc is None:
        return None
    return {"name": VOLUME, "persistentVolumeClaim": {"claimName": spec.pvc.claim_name, "readOnly": read_only(spec)}}


def cache_mount(spec: CacheSpec) -> dict[str, Any] | None:
    """The container mount of a PVC cache at ``mountPath``, read-only unless ``consumers.readOnly: false`` (JAX)."""
    if spec.pvc is None:
        return None
    return {"name": VOLUME, "mountPath": spec.mount_path, "readOnly": read_only(spec)}


def local_volume(spec: CacheSpec) -> dict[str, Any] | None:
    """The emptyDir of a framework's local copy of the cache (PyTorch's; ``None`` for JAX, which has none).

    An emptyDir because the root filesystem may be read-only. Its ``sizeLimit`` is the most the
    published cache can hold where the spec says (the claim's size, ``lifecycle.maxSize``): the
    copy fits, and the kubelet evicts a pod only past it, so it is the larger of the two.
    """
    if frameworks.get(spec.framework).local_copy_dir is None:
        return None
    bounds = [spec.lifecycle.max_size_bytes] if spec.lifecycle.max_size_bytes is not None else []
    if spec.pvc is not None and spec.pvc.create is not None:
        bounds.append(units.parse_bytes(spec.pvc.create.size))
    return {"name": LOCAL_VOLUME, "emptyDir": {"sizeLimit": str(max(bounds))} if bounds else {}}


def local_mount(spec: CacheSpec) -> dict[str, Any] | None:
    """The container mount of :func:`local_volume` at the framework's ``local_copy_dir`` (``None`` for JAX)."""
    local_dir = frameworks.get(spec.framework).local_copy_dir
    return None if local_dir is None else {"name": LOCAL_VOLUME, "mountPath": local_dir}


def pod_volumes(spec: CacheSpec) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """Each volume a consumer gets, with its container mount: the PVC cache's, a framework's local copy."""
    pairs = [(cache_volume(spec), cache_mount(spec)), (local_volume(spec), local_mount(spec))]
    return [(volume, mount) for volume, mount in pairs if volume is not None]


def trainer_cache_env(spec: CacheSpec) -> dict[str, str]:
    """What a training process reads the cache with (before the report switch): the framework's.

    JAX: the warm-up Jobs' settings (the same key), and on a read-only cache a minimum compile
    time that stops JAX trying writes. PyTorch: the published cache (the read-only mount, or the
    gs:// URL) as the source of a local copy that Inductor works in; no JAX variable at all.
    """
    return frameworks.get(spec.framework).trainer_env(spec)


def env_list(spec: CacheSpec) -> list[dict[str, str]]:
    """A trainer's cache environment as a container's ``env`` list, sorted by name: :func:`trainer_cache_env`
    and the report switch."""
    env = reporting(trainer_cache_env(spec))
    return [{"name": key, "value": value} for key, value in sorted(env.items())]


def termination_env(container: Mapping[str, Any], item: dict[str, str]) -> dict[str, str]:
    """``item``, but the trainer's report path is the container's own ``terminationMessagePath`` if it sets one."""
    path = container.get("terminationMessagePath")
    return {"name": TERMINATION_LOG, "value": str(path)} if item["name"] == TERMINATION_LOG and path else item


def settings_differences(container: Mapping[str, Any], spec: CacheSpec) -> list[str]:
    """The container's own key-relevant settings (the framework's ``key_variables``: JAX's
    ``XLA_FLAGS`` and the like, PyTorch's thread count and any ``TORCHINDUCTOR_*``) that no warm-up ran with.

    A warm-up runs with the cache's settings and its workload's ``env``; a trainer whose
    ``XLA_FLAGS`` (say) differs from every workload's misses every compile. A value from
    ``valueFrom`` is unknown here and not judged.
    """
    ours = warmup_env(spec)
    warm = [{**_values(workload.env), **ours} for workload in spec.warmup.workloads] or [ours]
    items = [item for item in container.get("env") or [] if isinstance(item, Mapping)]
    own = _values(items)
    from_refs = {item.get("name") for item in items if "valueFrom" in item}
    framework = frameworks.get(spec.framework)
    variables, hint = framework.key_variables([own, *warm]), framework.key_hint
    found = []
    trainer = trainer_cache_env(spec)  # PyTorch's TORCHINDUCTOR_CACHE_DIR differs from the warm-up's, by design
    for name in variables:
        if name in ours or name in trainer or name in from_refs:
            continue  # the cache's own settings: a differing one is reported where it is skipped
        warmed = {w.get(name) for w in warm}
        if own.get(name) in warmed:
            continue
        mine = repr(own[name]) if name in own else "unset"
        theirs = " or ".join(sorted("unset" if value is None else repr(value) for value in warmed))
        found.append(
            f"container {container.get('name')}: env {name} is {mine} but the warm-up ran with {theirs}: {hint}"
        )
    return found


def image_wait(
    containers: Sequence[Mapping[str, Any]],
    cache: Mapping[str, Any],
    spec: CacheSpec,
    records: Sequence[Mapping[str, Any]],
) -> tuple[bool, str | None]:
    """Whether a pod with ``containers`` waits for the cache (``images.py``), and a note for the warning.

    On an image the cache warmed (``Ready`` in ``status.images``) it starts at once, whatever the cache
    warms now; on the image it warms it waits. On an image not recorded: when the spec names the image
    it warms (``warmup.image``, or an inline template's), a pod on that image waits (before the pass
    recorded it: the first warm-up, or the spec just moved to it) and a pod on another goes; with a
    templateRef only the pass knows training's image as it is now, so the pod waits for its next pass
    (``gates.py``), which lets it go at once unless the template moved to that image.
    """
    pod = {"spec": {"containers": list(containers)}}
    running = images_.pod_images(pod)
    record = images_.match(running, records)
    if record is not None:
        return record["state"] == images_.WARMING, None
    pending = not is_serving(cache) or bool(records)  # bool(records): the image is newer than the status
    if spec.warmup.image:
        note = image_difference(containers, spec.warmup.image, spec.framework)
        return note is None and pending, note
    note = (
        f"the pod runs {', '.join(running)[:256]}, which the cache has not warmed: it waits for the operator's "
        "next pass, which holds it only while training's template names that image"
        if records and running
        else None
    )
    return pending, note


def image_difference(containers: Sequence[Mapping[str, Any]], warmup_image: str, framework: str = "jax") -> str | None:
    """A warning when no container runs the warm-up's image (``spec.warmup.image``), else None.

    JAX's cache key contains the jax, jaxlib and PJRT plugin versions (Inductor's, a hash of
    torch's own sources and the triton and CUDA versions), and the programs come from the image's
    code: entries warmed by another image likely all miss. One container that runs it is enough
    (the others may be sidecars); a pod without images (a template) is not judged.
    """
    images = [str(c["image"]) for c in containers if c.get("image")]
    if not images or any(images_.same_image(image, warmup_image) for image in images):
        return None
    return (
        f"no container runs the warm-up's image {warmup_image} (the pod runs {', '.join(dict.fromkeys(images))}): "
        f"the cache keys contain {frameworks.get(framework).image_key_parts}, so entries warmed by another image "
        "likely miss"
    )


def _values(env: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    return {str(item["name"]): str(item["value"]) for item in env if "name" in item and "value" in item}


def service_account(spec: CacheSpec) -> str | None:
    """The ServiceAccount a GCS cache's readers run as when the pod names none (Workload Identity)."""
    return spec.gcs.reader_service_account_name if spec.gcs is not None else None


def writer_accounts(spec: CacheSpec) -> frozenset[str]:
    """The ServiceAccounts that write a GCS cache (warm-up and expiry pods): never a trainer's."""
    if spec.gcs is None:
        return frozenset()
    return frozenset(a for a in (spec.gcs.service_account_name, spec.warmup.service_account_name) if a)


def namespace_writers(caches: Sequence[Mapping[str, Any]]) -> frozenset[str]:
    """The writers of every GCS cache of a namespace, read from the objects as they are (no parse: a pod's
    admission must not cost a parse of each cache): a reader that is any of them is no reader."""
    writers: set[str] = set()
    for cache in caches:
        spec = _object(cache.get("spec"))
        gcs, warmup = _object(_object(spec.get("storage")).get("gcs")), _object(spec.get("warmup"))
        if gcs:
            accounts = (gcs.get("serviceAccountName"), warmup.get("serviceAccountName"))
            writers |= {account for account in accounts if isinstance(account, str)}
    return frozenset(writers - {DEFAULT_SERVICE_ACCOUNT})  # a writer of default is refused: that cache gives nothing


def _object(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def reader_account(
    spec: CacheSpec, own: str | None, others: frozenset[str] = frozenset()
) -> tuple[str | None, str | None]:
    """The ServiceAccount a GCS consumer runs as, given the one the pod names (``own``), and a warning.

    ``storage.gcs.readerServiceAccountName`` when the pod names none (or ``default``) or names
    a writer; the pod's own otherwise. No writer is ever handed out, this cache's nor one of
    ``others`` (the namespace's other GCS caches' writers, :func:`namespace_writers`): a pod naming
    one without a usable reader runs as the namespace's ``default``, and a reader that is another
    cache's writer is not handed out. Returns ``(None, ...)`` for "leave the pod's as it is"; PVC
    caches have no identity to set (the volume is mounted read-only).
    """
    if spec.gcs is None:
        return None, None
    writers = writer_accounts(spec) | others
    reader = service_account(spec)
    note = None
    if reader is not None and reader in writers:
        note = f"storage.gcs.readerServiceAccountName {reader} writes another cache here; it is not handed out"
        reader = None
    unset = own in (None, "", DEFAULT_SERVICE_ACCOUNT)
    if own in writers:
        instead = reader or DEFAULT_SERVICE_ACCOUNT
        return instead, (
            f"the pod asks for ServiceAccount {own}, a cache's writer; training pods never write a "
            f"cache, so it runs as {instead}" + ("" if reader else " (set storage.gcs.readerServiceAccountName)")
        )
    if reader is not None:
        return (reader, None) if unset else (None, None)
    if unset:
        return None, note or (
            "storage.gcs.readerServiceAccountName is not set, so the pod runs as the namespace's default "
            "ServiceAccount, which needs read access to the prefix (roles/storage.objectViewer)"
        )
    return None, note


def mutate(
    pod: Mapping[str, Any],
    cache: Mapping[str, Any],
    *,
    by_label: bool = True,
    rules: policy.Policy | None = None,
    writers: frozenset[str] = frozenset(),
) -> Mutation:
    """Return ``pod`` with ``cache`` added: volume, mounts, JAX environment, gate, service account,
    and the operator's injected runtime (``rules.runtime``: :mod:`compilecache.controller.runtime`).

    Idempotent: mutating the result again changes nothing. ``by_label`` False (the pod was
    chosen by ``consumers.podSelector``) also labels the pod with the cache's name, so that
    the operator finds it to release its gate. Raises :class:`compilecache.controller.api.SpecError`
    on a cache whose spec is invalid. ``rules``: the operator's policy in force now (the webhook's);
    a cache it refuses gives the pod nothing, not its reader identity nor a gate that only its Ready
    would lift, even when the cache was admitted before the policy changed or without the
    validating webhook. ``writers``: the namespace's GCS caches' writers (:func:`namespace_writers`), none
    of which a training pod gets.
    """
    spec = parse_cache(cache)
    name = cache["metadata"]["name"]
    refused = policy.violations(spec, rules) if rules is not None else []
    if refused:
        warning = (
            f"CompileCache {name} is refused by the operator's policy ({policy.describe(refused)}); "
            "the pod runs without a cache"
        )
        return Mutation(pod=copy.deepcopy(dict(pod)), warnings=(warning,))
    new = copy.deepcopy(dict(pod))
    meta = new.setdefault("metadata", {})
    pod_spec = new.setdefault("spec", {})
    skipped: list[str] = []

    if not by_label:
        meta.setdefault("labels", {})[LABEL_CACHE] = name

    mounts: list[dict[str, Any]] = []
    for volume, mount in pod_volumes(spec):
        volumes = pod_spec.setdefault("volumes", [])
        existing = next((v for v in volumes if v.get("name") == volume["name"]), None)
        if existing is None:
            volumes.append(volume)
        elif existing != volume:
            skipped.append(f"volume {volume['name']}: the pod has its own volume of that name; not mounted")
            continue  # mounting the user's volume as the cache would be wrong
        if mount is not None:
            mounts.append(mount)

    kinds = ["containers", "initContainers"] if spec.consumers.init_containers else ["containers"]
    for kind in kinds:
        for container in pod_spec.get(kind) or []:
            skipped += _mutate_container(
                container, mounts, [termination_env(container, item) for item in env_list(spec)]
            )
            skipped += settings_differences(container, spec)

    notes: list[str] = []
    containers = [c for kind in kinds for c in pod_spec.get(kind) or []]
    if rules is not None and rules.runtime is not None:
        skipped += runtime_.inject(pod_spec, containers, rules.runtime, container_security_context())
    records = images_.recorded(cache.get("status"))
    waits, image_note = image_wait(pod_spec.get("containers") or [], cache, spec, records)
    if image_note:
        notes.append(image_note)
    released = (meta.get("annotations") or {}).get(ANNOTATION_RELEASED)
    if spec.consumers.gate and waits:
        if released is not None:
            # Its wait is over (Kueue's admission check let its Workload through, checks.py): not held again.
            notes.append(f"the pod is not gated: {ANNOTATION_RELEASED}={str(released)[:128]}")
        else:
            gates = pod_spec.setdefault("schedulingGates", [])
            if not any(gate.get("name") == GATE for gate in gates):
                gates.append({"name": GATE})
            notes.append(
                f"the pod waits (scheduling gate {GATE}) until the cache is Ready, "
                f"at most {spec.consumers.gate_timeout_seconds:g}s"
            )

    # The deprecated alias serviceAccount counts when serviceAccountName is unset (the API server copies it).
    own = pod_spec.get("serviceAccountName") or pod_spec.get("serviceAccount")
    account, account_note = reader_account(spec, own, writers)
    if account is not None:
        pod_spec["serviceAccountName"] = account
        if "serviceAccount" in pod_spec:  # the deprecated alias must agree
            pod_spec["serviceAccount"] = account
    if account_note is not None:
        notes.append(account_note)

    if skipped:
        meta.setdefault("annotations", {})[ANNOTATION_SKIPPED] = "; ".join(skipped)
    warnings = tuple(f"CompileCache {name}: {item}" for item in [*skipped, *notes])
    return Mutation(pod=new, skipped=tuple(skipped), warnings=warnings)


def json_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The RFC 6902 operations that turn ``old`` into ``new`` (as an admission response carries)."""
    ops: list[dict[str, Any]] = jsonpatch.make_patch(dict(old), dict(new)).patch
    return ops


def pod_snippet(cache: Mapping[str, Any]) -> dict[str, Any]:
    """What a hand-written pod needs to use ``cache``, as the webhook would add it.

    Keys: ``env`` (for each container), ``volumeMounts`` and ``volumes`` (PVC caches),
    ``serviceAccountName`` (GCS caches that name one), and the opt-in ``labels``.
    """
    spec = parse_cache(cache)
    snippet: dict[str, Any] = {"labels": {LABEL_CACHE: cache["metadata"]["name"]}}
    pairs = [(volume, mount) for volume, mount in pod_volumes(spec) if mount is not None]
    if pairs:
        snippet["volumes"] = [volume for volume, _ in pairs]
        snippet["volumeMounts"] = [mount for _, mount in pairs]
    snippet["env"] = env_list(spec)
    if account := service_account(spec):
        snippet["serviceAccountName"] = account
    return snippet


def format_snippet(cache: Mapping[str, Any]) -> str:
    """The snippet as commented YAML, in the places of a pod manifest where each part goes."""
    import yaml

    snippet = pod_snippet(cache)
    name = cache["metadata"]["name"]
    container: dict[str, Any] = {"env": snippet["env"]}
    if "volumeMounts" in snippet:
        container["volumeMounts"] = snippet["volumeMounts"]
    pod_spec: dict[str, Any] = {}
    if "serviceAccountName" in snippet:
        pod_spec["serviceAccountName"] = snippet["serviceAccountName"]
    pod_spec["containers"] = [{"name": "CONTAINER", **container}]
    if "volumes" in snippet:
        pod_spec["volumes"] = snippet["volumes"]
    body = {"metadata": {"labels": snippet["labels"]}, "spec": pod_spec}
    header = (
        f"# CompileCache {name}: add these to your pod (template). The label lets the operator's\n"
        "# webhook do it instead; without the webhook, wait until the cache is Ready yourself.\n"
    )
    if "serviceAccountName" not in pod_spec and cache["spec"]["storage"].get("gcs") is not None:
        header += (
            "# No storage.gcs.readerServiceAccountName: run the pod as a ServiceAccount that may only\n"
            "# read the prefix (roles/storage.objectViewer), never as the cache's writer (docs/gcs.md).\n"
        )
    return header + yaml.safe_dump(body, sort_keys=False)


def print_snippet(name: str, namespace: str | None) -> int:
    """``compilecache env NAME -n NS``: print the pod snippet of a CompileCache read from the cluster."""
    import sys

    from compilecache.controller.kube import COMPILECACHES, ApiError, Client

    namespace = namespace or _current_namespace()
    try:
        cache = Client.from_environment().get(COMPILECACHES, name, namespace)
    except ApiError as exc:
        print(f"compilecache env: error: reading CompileCache {namespace}/{name}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # no kubeconfig, no cluster: one line, not a traceback
        print(f"compilecache env: error: cannot reach the cluster: {exc}", file=sys.stderr)
        return 1
    if cache is None:
        print(f"compilecache env: error: CompileCache {namespace}/{name} not found", file=sys.stderr)
        return 1
    try:
        sys.stdout.write(format_snippet(cache))
    except SpecError as exc:
        print(f"compilecache env: error: CompileCache {namespace}/{name} has an invalid spec: {exc}", file=sys.stderr)
        return 1
    return 0


def _mutate_container(
    container: dict[str, Any], mounts_: Sequence[Mapping[str, Any]], env: Sequence[Mapping[str, str]]
) -> list[str]:
    """Add the mounts and the environment to one container; return what was left alone and why."""
    skipped: list[str] = []
    where = f"container {container.get('name')}"
    for mount in mounts_:
        mounts = container.setdefault("volumeMounts", [])
        existing = next((m for m in mounts if m.get("mountPath") == mount["mountPath"]), None)
        if existing is None:
            mounts.append(dict(mount))
        elif existing != mount:
            skipped.append(f"{where}: mount path {mount['mountPath']} is taken by the pod's own mount")
    items = container.setdefault("env", [])
    for item in env:
        existing = next((e for e in items if e.get("name") == item["name"]), None)
        if existing is None:
            items.append(dict(item))
        elif existing != item:
            skipped.append(f"{where}: env {item['name']} is set by the pod (the cache wants {item['value']!r})")
    return skipped


def _current_namespace() -> str:
    """The kubeconfig context's namespace, as kubectl picks it; ``default`` without one."""
    try:
        import kubernetes

        _, context = kubernetes.config.list_kube_config_contexts()
        return str((context or {}).get("context", {}).get("namespace") or "default")
    except Exception:  # no kubeconfig (e.g. in a pod): kubectl's default too
        return "default"
