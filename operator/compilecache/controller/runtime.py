"""The injected runtime: what lets a pod's own Python run the product without it being installed.

The model is the OpenTelemetry Operator's Python auto-instrumentation: an init container of the
runtime image (``images/runtime``) copies the package into an ``emptyDir``, and the containers
that use the cache get it mounted read-only and first on ``PYTHONPATH``. The training image's
Python then runs ``python3 -m compilecache.cli warm|expire`` in the operator's warm-up and expiry
Jobs, and loads the trainer's verdict through the copied ``.dist-info``'s entry points (JAX's
``jax_plugins``, torch's ``torch.backends``) in training pods, with no change to the image.

The operator has a runtime when ``COMPILECACHE_RUNTIME_IMAGE`` is set (the chart sets it from
``runtime.image``); without one, pods run the package installed in the image (``compilecache``
on ``PATH``), as before. Pure functions on manifests: :mod:`compilecache.controller.admission`
(training pods) and :mod:`compilecache.controller.jobs`/``expiryjob`` (Jobs) call them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

IMAGE_ENV = "COMPILECACHE_RUNTIME_IMAGE"
PULL_POLICY_ENV = "COMPILECACHE_RUNTIME_IMAGE_PULL_POLICY"
VOLUME = "compilecache-runtime"  # the emptyDir, and the init container's name
MOUNT_PATH = "/compilecache-runtime"  # where the containers find it (the image's ENTRYPOINT copies here)
SOURCE = "/opt/runtime"  # the folder in the runtime image (images/runtime/Dockerfile)
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
# The copy of ~2 MB of Python files: measured well under these on a CPU node (busybox cp). Requests
# equal to limits: the pod's QoS class counts init containers (Kubernetes' ComputePodQOS sums requests
# and limits over both lists), so anything else would turn a Guaranteed training pod Burstable and
# lose it the static CPU and memory managers' exclusive cores; a LimitRange's maxLimitRequestRatio
# holds too.
_SIZE = {"cpu": "100m", "memory": "64Mi"}
RESOURCES = {"requests": _SIZE, "limits": _SIZE}
# The runtime image's user (images/runtime/Dockerfile: ARG UID, USER): named on the init container
# only in a pod that runs as root, which it would inherit and the kubelet then refuse.
UID = 65532
# Images are references of at most 4096 characters with no whitespace (the same bound as spec images).
_IMAGE_MAX = 4096


@dataclass(frozen=True)
class Runtime:
    """The runtime image the operator injects, and its pull policy (``None``: the kubelet's default)."""

    image: str
    pull_policy: str | None = None


def from_env(environ: Mapping[str, str]) -> Runtime | None:
    """The runtime named by ``COMPILECACHE_RUNTIME_IMAGE``, or ``None`` when it is unset or empty.

    Raises ``ValueError`` (the operator stops at start-up) for a value no pod could carry.
    """
    image = (environ.get(IMAGE_ENV) or "").strip()
    if not image:
        return None
    if len(image) > _IMAGE_MAX or any(char.isspace() for char in image):
        raise ValueError(f"{IMAGE_ENV}={image[:80]!r}: not an image reference")
    pull_policy = (environ.get(PULL_POLICY_ENV) or "").strip() or None
    if pull_policy is not None and pull_policy not in PULL_POLICIES:
        raise ValueError(f"{PULL_POLICY_ENV}={pull_policy!r}: one of {', '.join(PULL_POLICIES)}")
    return Runtime(image, pull_policy)


def command(runtime: Runtime | None, argv: Sequence[str]) -> list[str]:
    """A ``compilecache ...`` command as the container runs it: through its own Python with a runtime.

    ``python3``: the name every Python image has on ``PATH`` (the official images', NGC's, Debian's).
    """
    if runtime is None or not argv or argv[0] != "compilecache":
        return list(argv)
    return ["python3", "-m", "compilecache.cli", *argv[1:]]


def init_container(runtime: Runtime, security_context: Mapping[str, Any]) -> dict[str, Any]:
    """The init container that copies the runtime into the ``emptyDir`` (exec form: no shell, no spec value)."""
    container: dict[str, Any] = {
        "name": VOLUME,
        "image": runtime.image,
        "command": ["cp", "-R", f"{SOURCE}/.", f"{MOUNT_PATH}/"],
        "volumeMounts": [{"name": VOLUME, "mountPath": MOUNT_PATH}],
        "securityContext": dict(security_context),
        "resources": {kind: dict(values) for kind, values in RESOURCES.items()},
    }
    if runtime.pull_policy:
        container["imagePullPolicy"] = runtime.pull_policy
    return container


def pythonpath(container: Mapping[str, Any]) -> tuple[dict[str, str] | None, str | None]:
    """The container's ``PYTHONPATH`` with the runtime first, or why it is left alone.

    A value the container's env already sets stays, after ours. A ``PYTHONPATH`` set only by the
    image's ``ENV`` (or by ``envFrom``) is shadowed: a container's ``env`` wins over both, and the
    kubelet cannot read the image's value to keep it (as with the OTel operator). Of a name set twice
    the last entry counts: the kubelet reads ``env`` in order into a map (pkg/kubelet's
    ``makeEnvironmentVariables``), and the API server takes duplicates with a warning only.
    """
    own = next((item for item in reversed(container.get("env") or []) if item.get("name") == "PYTHONPATH"), None)
    if own is None:
        return {"name": "PYTHONPATH", "value": MOUNT_PATH}, None
    if "value" not in own and own.get("valueFrom") is not None:
        where = f"container {container.get('name')}"
        return None, f"{where}: env PYTHONPATH comes from valueFrom; the runtime ({MOUNT_PATH}) is not added to it"
    value = str(own.get("value") or "")
    if value == MOUNT_PATH or value.startswith(MOUNT_PATH + ":"):
        return {"name": "PYTHONPATH", "value": value}, None  # added before: idempotent
    return {"name": "PYTHONPATH", "value": f"{MOUNT_PATH}:{value}" if value else MOUNT_PATH}, None


def inject(
    pod_spec: dict[str, Any],
    containers: Sequence[dict[str, Any]],
    runtime: Runtime,
    security_context: Mapping[str, Any],
) -> list[str]:
    """Add the runtime to ``pod_spec`` for ``containers`` (in place); return what was left alone and why.

    Only adds: a volume or init container of the pod under our name stays as the user wrote it,
    and then nothing else of the runtime is added (a mount of someone else's volume would be wrong).
    """
    if (pod_spec.get("securityContext") or {}).get("runAsUser") == 0:
        # Else inherited: with our runAsNonRoot the kubelet refuses to start the container
        # ("container's runAsUser breaks non-root policy": verifyRunAsNonRoot reads the pod's
        # runAsUser where the container sets none), and the pod never leaves Init. Elsewhere the
        # image's USER or the platform's choice (OpenShift's SCC refuses a pinned one) stands.
        security_context = {**security_context, "runAsUser": UID}
    volumes = pod_spec.setdefault("volumes", [])
    if any(volume.get("name") == VOLUME for volume in volumes if volume != {"name": VOLUME, "emptyDir": {}}):
        return [f"volume {VOLUME}: the pod has its own volume of that name; the runtime is not injected"]
    inits = pod_spec.setdefault("initContainers", [])
    ours = init_container(runtime, security_context)
    existing = next((c for c in inits if c.get("name") == VOLUME), None)
    if existing is not None and existing != ours:
        return [f"init container {VOLUME}: the pod has its own of that name; the runtime is not injected"]
    if not any(volume.get("name") == VOLUME for volume in volumes):
        volumes.append({"name": VOLUME, "emptyDir": {}})
    if existing is None:
        inits.insert(0, ours)  # first: the init containers after it may run the runtime too
    skipped: list[str] = []
    mount = {"name": VOLUME, "mountPath": MOUNT_PATH, "readOnly": True}
    for container in containers:
        if container is ours or container is existing:
            continue
        mounts = container.setdefault("volumeMounts", [])
        # "/compilecache-runtime/" is the same place: the API server compares mount paths as written, so it
        # would take both, and the container would fail to start on two mounts at one path.
        taken = next((m for m in mounts if str(m.get("mountPath") or "").rstrip("/") == MOUNT_PATH), None)
        if taken is None:
            mounts.append(dict(mount))
        elif taken != mount:
            skipped.append(
                f"container {container.get('name')}: mount path {MOUNT_PATH} is taken by the pod's own mount"
            )
            continue
        item, why = pythonpath(container)
        if why is not None:
            skipped.append(why)
            continue
        assert item is not None
        env = container.setdefault("env", [])
        at = next((index for index in reversed(range(len(env))) if env[index].get("name") == "PYTHONPATH"), None)
        if at is None:
            env.append(item)
        else:
            env[at] = item
    return skipped
