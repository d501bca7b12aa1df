"""The local cluster's kubelet for one pod: its containers as local processes, its status as a kubelet writes it.

**Images are environments on this machine.** There is no image store and no root filesystem:
an "image" is :class:`Image` — a working directory (standing in for the image's ``WORKDIR``),
a base environment (the image's ``ENV``: ``PATH`` first of all, which decides the ``python3``
a container runs) and folders that stand for paths inside the image (``Image.files``).
:class:`Images` maps a container's ``image`` to one, by its name or a prefix of it (what the
kubelet's pull resolves); an image it does not name runs in *this* Python environment (its
``bin`` first on ``PATH``, our ``PYTHONPATH``), as every image did before images were mapped.
So a training image "without the product" is a virtual environment with only jax
(:meth:`Image.of_path`), and the runtime image (``images/runtime``) is ``/opt/runtime`` mapped
to a built tree, with the system's ``cp``. A container needs ``command`` (there is no image entrypoint);
``command`` + ``args`` are executed directly, never through a shell, with the pod's
``env`` (``value``, and ``fieldRef`` to the pod's name, namespace, uid, node, service account, IPs,
and ``metadata.labels['<key>']``/``metadata.annotations['<key>']`` as the downward API reads them).
Host names of other pods (``<job>-<index>.<service>``) are rewritten to this machine, with their
ports moved to a block of the Job's own: see ``dns.py`` (the local cluster's "cluster DNS").

**Volumes** map to local directories: a PersistentVolumeClaim to
``<root>/volumes/<namespace>/<claim>`` (shared by every pod that mounts it), an
``emptyDir`` to a directory of the pod; other volume types fail the pod. The
``terminationMessagePath`` maps to a file of the pod. Container paths under a mount
(or the termination file) that appear in ``command``, ``args``, ``env`` values or
``workingDir`` — a whole value, or the value of ``--flag=PATH`` — are rewritten to the
local directory, and so are paths under the image's own folders (``Image.files``, e.g.
``/app``); other paths are the host's own (honest limit: there is no root filesystem of the
image, paths inside program text are not rewritten, ``readOnlyRootFilesystem`` is not enforced).

**Privileges.** Processes run as the kubelet's user. When that is root (a container, CI),
every process starts through ``setpriv`` with no capabilities at all (bounding, inheritable
and ambient sets cleared, no new privileges), as ``capabilities: {drop: [ALL]}`` does: root
without ``CAP_DAC_OVERRIDE``/``CAP_FOWNER`` is bound by permission bits like any user.
``runAsUser``, resources (but a memory limit: below) and GPUs are not applied: every process runs on
this machine's CPU.

**Read-only mounts** (``readOnly: true`` on the mount or the claim) get a private copy of
the volume made when the container starts, every file mode ``0444`` and directory ``0555``;
as root the copy is owned by ``nobody`` (65534), so the process can neither write nor change
the modes back: a write fails with ``EACCES`` (a real read-only mount gives ``EROFS``), and
nothing reaches the shared volume. As a non-root kubelet the copy is the process's own, and
the process could change its modes back (an owner may); still nothing reaches the shared
volume. Unlike a real mount, the copy does not see later writes by other pods. (A read-only
bind mount needs root with ``CAP_SYS_ADMIN`` or user namespaces, which CI machines often lack.)
A root kubelet without ``setpriv`` (util-linux) fails every container with ``StartError``.

**Failures it simulates** (for the tests and the demo of a stuck warm-up), as the real kubelet
reports them: an image whose name contains ``nonexistent`` (:data:`UNPULLABLE_MARKER`) cannot be
pulled: the pod stays ``Pending``, the container waiting with ``ErrImagePull`` and then
``ImagePullBackOff`` (``Back-off pulling image "..."``), until the pod is deleted (the real kubelet
retries the pull forever; no process starts). A container with ``resources.limits.memory`` whose
processes together hold more resident memory than that is killed (``SIGKILL``, exit code 137,
reason ``OOMKilled``), as the kernel's cgroup OOM killer does (memory is sampled every
:data:`MEMORY_POLL_SECONDS`, so a brief spike between samples is missed). Unschedulable pods are the
scheduler's (``nodes.py``).

The termination message is the file's content (at most 4096 bytes); with
``terminationMessagePolicy: FallbackToLogsOnError`` and an empty file, a failed
container's last 80 log lines (at most 2048 bytes), as the kubelet does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compilecache.cache.units import parse_bytes
from compilecache.local.apiserver import now_rfc3339
from compilecache.local.client import KubeClient, KubeError
from compilecache.local.dns import HostTable, map_hosts

logger = logging.getLogger(__name__)

PODS = "v1/pods"
DEFAULT_TERMINATION_PATH = "/dev/termination-log"
MESSAGE_MAX = 4096  # bytes of a termination message the kubelet keeps
LOG_TAIL_LINES, LOG_TAIL_BYTES = 80, 2048  # FallbackToLogsOnError: whichever is smaller
NOBODY = 65534  # owns read-only copies when the kubelet is root: the process (root, no capabilities) cannot change them
UNPULLABLE_MARKER = "nonexistent"  # an image named with it "cannot be pulled" (see the module docstring)
IMAGE_BACKOFF_SECONDS = 0.5  # ErrImagePull, then ImagePullBackOff this much later (the kubelet: 10 s, doubling)
MEMORY_POLL_SECONDS = 0.25
# The PATH a container gets when its image sets none: the container runtime's default (moby's
# DefaultPathEnvUnix, containerd's defaultUnixEnv), which the official Python and NGC images extend.
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Variables whose value is a list of paths: each is mapped, as the whole value of any other is.
PATH_LISTS = frozenset({"PATH", "PYTHONPATH", "LD_LIBRARY_PATH"})


class PodError(Exception):
    """The pod cannot run here (an unsupported volume, no command): it fails with this message."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Image:
    """What stands in for every container image: a working directory and a base environment."""

    workdir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, Path] = field(default_factory=dict)  # image paths (e.g. /app) → local folders

    @classmethod
    def this_environment(
        cls,
        workdir: Path,
        passthrough: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        files: Mapping[str, Path] | None = None,
    ) -> Image:
        """This Python environment: its ``bin`` first on ``PATH``, ``PYTHONPATH`` and ``passthrough`` kept.

        ``env`` adds variables (what an image or a node would provide, e.g. ``STORAGE_EMULATOR_HOST``);
        ``files`` maps container paths the image would contain (``/app``) to local folders.
        """
        base = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")])}
        base["LANG"] = "C.UTF-8"
        for name in ("PYTHONPATH", *passthrough):
            if name in os.environ:
                base[name] = os.environ[name]
        base.update(env or {})
        return cls(workdir=workdir.resolve(), env=base, files={k: v.resolve() for k, v in (files or {}).items()})

    @classmethod
    def of_path(
        cls,
        workdir: Path,
        bin_dir: Path | None = None,
        env: Mapping[str, str] | None = None,
        files: Mapping[str, Path] | None = None,
    ) -> Image:
        """An image whose programs are ``bin_dir``'s (a virtual environment's: its ``python3``) and the system's.

        Nothing of this environment: ``PATH`` is ``bin_dir`` then :data:`IMAGE_PATH`, and there is no
        ``PYTHONPATH`` unless ``env`` sets one, as in an image whose ``ENV`` does not.
        """
        path = os.pathsep.join([*([str(bin_dir.resolve())] if bin_dir is not None else []), IMAGE_PATH])
        base = {"PATH": path, "LANG": "C.UTF-8", **(env or {})}
        return cls(workdir=workdir.resolve(), env=base, files={k: v.resolve() for k, v in (files or {}).items()})


@dataclass(frozen=True)
class Images:
    """The images the kubelet can "pull": a container's ``image`` → the :class:`Image` it runs in.

    A key is an image reference, or a prefix of references when it ends with ``*``
    (``registry.example.com/ml/*``); the exact name wins, then the longest prefix; any other image
    is ``default``. Names are compared as written: the kubelet's normalisation (``docker.io/library/``,
    a missing ``:latest``) is not applied, so name the image as the manifests write it.
    """

    default: Image
    named: Mapping[str, Image] = field(default_factory=dict)

    def of(self, reference: str) -> Image:
        """The image a container naming ``reference`` runs in."""
        if reference in self.named:
            return self.named[reference]
        prefixes = [key for key in self.named if key.endswith("*") and reference.startswith(key[:-1])]
        return self.named[max(prefixes, key=len)] if prefixes else self.default


def claim_dir(root: Path, namespace: str, claim: str) -> Path:
    """The local directory of a PersistentVolumeClaim."""
    return root / "volumes" / namespace / claim


def pod_dir(root: Path, namespace: str, name: str) -> Path:
    """The local directory of a pod: its emptyDirs, read-only copies, logs and termination files."""
    return root / "pods" / namespace / name


def log_path(root: Path, namespace: str, pod: str, container: str) -> Path:
    """Where a container's output (stdout and stderr) goes; ``kubectl logs`` reads the same."""
    return pod_dir(root, namespace, pod) / f"{container}.log"


def map_value(value: str, table: Sequence[tuple[str, str]]) -> str:
    """``value`` with a leading container path (whole, or after ``--flag=``) replaced by its local path."""
    prefix = ""
    if value.startswith("-") and "=" in value:
        prefix, value = value.split("=", 1)
        prefix += "="
    for container_path, local in table:  # longest first
        if value == container_path or value.startswith(container_path.rstrip("/") + "/"):
            return prefix + local + value[len(container_path) :]
    return prefix + value


DOWNWARD_FIELDS = (
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "metadata.labels['<key>']",
    "metadata.annotations['<key>']",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.podIP",
)
_KEYED_FIELD = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]")


def downward_field(pod: Mapping[str, Any], path: str) -> str | None:
    """The value of an env ``fieldRef`` (the downward API), ``None`` for a path the local cluster does not serve.

    Every pod's IP is this machine's (``127.0.0.1``); a missing label or annotation is ``""``, as in the kubelet.
    """
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if keyed := _KEYED_FIELD.fullmatch(path):
        return str((meta.get(keyed[1]) or {}).get(keyed[2], ""))
    plain = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.hostIP": "127.0.0.1",
        "status.podIP": "127.0.0.1",
    }
    return str(plain[path] or "") if path in plain else None


def read_only_copy(source: Path, target: Path) -> None:
    """A private copy of ``source`` whose files are 0444 and directories 0555 (owned by nobody when root)."""
    shutil.copytree(source, target, symlinks=True)
    owner = NOBODY if os.geteuid() == 0 else None
    for folder, dirs, files in os.walk(target, topdown=False):
        for name in [*files, *dirs]:
            path = Path(folder, name)
            if path.is_symlink():
                continue
            path.chmod(0o555 if path.is_dir() else stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
            if owner is not None:
                os.chown(path, owner, owner)
    target.chmod(0o555)
    if owner is not None:
        os.chown(target, owner, owner)


def _make_writable(path: Path) -> None:
    for folder, dirs, _ in os.walk(path):
        Path(folder).chmod(0o755)
        for name in dirs:
            with contextlib.suppress(OSError):
                Path(folder, name).chmod(0o755)


def termination_message(container: Mapping[str, Any], file: Path, log: Path, exit_code: int) -> str:
    """The container's termination message, as the kubelet reads it."""
    try:
        message = file.read_bytes()[:MESSAGE_MAX].decode("utf-8", "replace")
    except OSError:
        message = ""
    if not message and exit_code != 0 and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
        try:
            lines = log.read_bytes().splitlines(keepends=True)[-LOG_TAIL_LINES:]
        except OSError:
            lines = []
        message = b"".join(lines)[-LOG_TAIL_BYTES:].decode("utf-8", "replace")
    return message


def unprivileged(argv: list[str]) -> list[str]:
    """``argv`` started with no capabilities when this process is root; as it is otherwise."""
    if os.geteuid() != 0:
        return argv
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise PodError("StartError", "the local cluster runs as root and needs setpriv (util-linux) to drop privileges")
    return [setpriv, "--bounding-set=-all", "--inh-caps=-all", "--ambient-caps=-all", "--no-new-privs", "--", *argv]


class PodRun(threading.Thread):
    """One pod on the local kubelet, from start to its final status."""

    def __init__(
        self,
        client: KubeClient,
        root: Path,
        images: Images,
        pod: Mapping[str, Any],
        hosts: Callable[[], HostTable] | None = None,
    ) -> None:
        """``images``: what each container's ``image`` runs in; ``hosts``: the cluster DNS names this pod
        resolves, read when each container starts (``dns.py``)."""
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['name']}", daemon=True)
        self.client, self.root, self.images, self.pod = client, root, images, pod
        self.hosts = hosts
        self.namespace, self.pod_name, self.uid = meta["namespace"], meta["name"], meta.get("uid")
        self.dir = pod_dir(root, self.namespace, self.pod_name)
        self._processes: list[subprocess.Popen[bytes]] = []
        self._killed = threading.Event()
        self._lock = threading.Lock()

    def kill(self) -> None:
        """Kill the pod's processes (process groups: a child's children too)."""
        self._killed.set()
        with self._lock:
            for process in self._processes:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)

    def run(self) -> None:
        """Run the pod and record its status; a pod deleted meanwhile is left alone."""
        try:
            self._run()
        except KubeError as exc:
            if exc.status != 404:  # the pod went away: nothing to record
                logger.exception("local cluster: pod %s/%s", self.namespace, self.pod_name)
        except Exception:
            logger.exception("local cluster: pod %s/%s", self.namespace, self.pod_name)
        finally:
            ro = self.dir / "ro"
            if ro.exists():
                _make_writable(ro)
                shutil.rmtree(ro, ignore_errors=True)

    def _run(self) -> None:
        spec = self.pod.get("spec") or {}
        started = now_rfc3339()
        self.dir.mkdir(parents=True, exist_ok=True)
        containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
        unpullable = next((c for c in containers if UNPULLABLE_MARKER in str(c.get("image") or "")), None)
        if unpullable is not None:
            self._pull_fails(spec, unpullable, started)
            return
        try:
            volumes = self._volumes(spec)
        except PodError as exc:
            self._patch({"phase": "Failed", "reason": exc.reason, "message": str(exc), "startTime": started})
            return
        running: dict[str, Any] = {
            "phase": "Running",
            "startTime": started,
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
        }
        running["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": started}]
        self._patch(running)
        init_statuses: list[dict[str, Any]] = []
        for container in spec.get("initContainers") or []:
            init_statuses.append(self._container(container, volumes))
            if init_statuses[-1]["state"]["terminated"]["exitCode"] != 0:
                waiting = [_waiting(c, "PodInitializing") for c in spec.get("containers") or []]
                self._finish("Failed", init_statuses, waiting)
                return
            self._patch({"initContainerStatuses": init_statuses})
        results: list[dict[str, Any]] = [{} for _ in spec.get("containers") or []]
        threads = [
            threading.Thread(target=lambda i=i, c=c: results.__setitem__(i, self._container(c, volumes)))
            for i, c in enumerate(spec.get("containers") or [])
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        ok = all(result["state"]["terminated"]["exitCode"] == 0 for result in results)
        self._finish("Succeeded" if ok else "Failed", init_statuses, results)

    def _pull_fails(self, spec: Mapping[str, Any], unpullable: Mapping[str, Any], started: str) -> None:
        """Stay Pending with the image's container waiting on the pull (as the kubelet), until deleted."""
        image = str(unpullable.get("image"))
        said = {
            "ErrImagePull": f'failed to pull and unpack image "{image}": not found (the local cluster pulls no image '
            f'named with "{UNPULLABLE_MARKER}")',
            "ImagePullBackOff": f'Back-off pulling image "{image}"',
        }
        for reason, message in said.items():
            if self._killed.is_set():
                return

            def state(container: Mapping[str, Any], init: bool, reason: str = reason, message: str = message) -> Any:
                if container is unpullable:
                    waiting = {"reason": reason, "message": message}
                else:
                    waiting = {"reason": "PodInitializing" if not init else "ContainerCreating"}
                return {"name": container["name"], "ready": False, "restartCount": 0, "state": {"waiting": waiting}}

            body: dict[str, Any] = {
                "phase": "Pending",
                "startTime": started,
                "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": started}],
                "containerStatuses": [state(c, False) for c in spec.get("containers") or []],
            }
            if spec.get("initContainers"):
                body["initContainerStatuses"] = [state(c, True) for c in spec["initContainers"]]
            self._patch(body)
            self._killed.wait(IMAGE_BACKOFF_SECONDS)
        self._killed.wait()  # the real kubelet retries forever; the pod's deletion ends it

    def _finish(self, phase: str, init: list[dict[str, Any]], main: list[dict[str, Any]]) -> None:
        if self._killed.is_set():
            return  # deleted: a kubelet writes no status for a pod that is gone
        body: dict[str, Any] = {"phase": phase, "containerStatuses": main}
        if init:
            body["initContainerStatuses"] = init
        self._patch(body)

    def _patch(self, status: dict[str, Any]) -> None:
        self.client.patch(PODS, self.pod_name, {"status": status}, self.namespace, subresource="status")

    def _volumes(self, spec: Mapping[str, Any]) -> dict[str, tuple[Path, bool]]:
        """Volume name → (local directory, read-only at the volume)."""
        result: dict[str, tuple[Path, bool]] = {}
        for volume in spec.get("volumes") or []:
            name = volume["name"]
            if "persistentVolumeClaim" in volume:
                source = volume["persistentVolumeClaim"]
                if self.client.get("v1/persistentvolumeclaims", source["claimName"], self.namespace) is None:
                    raise PodError("FailedMount", f'persistentvolumeclaim "{source["claimName"]}" not found')
                local = claim_dir(self.root, self.namespace, source["claimName"])
                local.mkdir(parents=True, exist_ok=True)
                result[name] = (local, bool(source.get("readOnly")))
            elif "emptyDir" in volume:
                local = self.dir / "volumes" / name
                local.mkdir(parents=True, exist_ok=True)
                result[name] = (local, False)
            else:
                kind = next((key for key in volume if key != "name"), "unknown")
                raise PodError("FailedMount", f"the local cluster does not support {kind} volumes ({name})")
        return result

    def _container(self, container: Mapping[str, Any], volumes: Mapping[str, tuple[Path, bool]]) -> dict[str, Any]:
        name = container["name"]
        started = now_rfc3339()
        log = log_path(self.root, self.namespace, self.pod_name, name)
        termination = self.dir / f"{name}.termination-log"
        termination.unlink(missing_ok=True)
        # The kubelet creates the (empty) file at terminationMessagePath before the container starts.
        termination.touch()
        try:
            argv, env, cwd = self._command(container, volumes, termination)
            argv = unprivileged(argv)
        except PodError as exc:
            return terminated(name, 128, exc.reason, str(exc), started)
        with log.open("ab") as out:
            try:
                process = subprocess.Popen(
                    argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )  # fmt: skip
            except OSError as exc:
                return terminated(name, 128, "StartError", f"failed to start {argv[0]!r}: {exc}", started)
            with self._lock:
                self._processes.append(process)
            if self._killed.is_set():
                self.kill()
            ended, oom = threading.Event(), threading.Event()
            limit = memory_limit(container)
            if limit is not None:
                threading.Thread(target=_watch_memory, args=(process.pid, limit, ended, oom), daemon=True).start()
            code = process.wait()
            ended.set()
        code = 128 - code if code < 0 else code  # a signal N is exit code 128+N in a container
        message = termination_message(container, termination, log, code)
        reason = "OOMKilled" if oom.is_set() else "Completed" if code == 0 else "Error"
        return terminated(name, code, reason, message, started)

    def _command(
        self,
        container: Mapping[str, Any],
        volumes: Mapping[str, tuple[Path, bool]],
        termination: Path,
    ) -> tuple[list[str], dict[str, str], str]:
        """The process to start: argv, environment and working directory, with container paths mapped."""
        image = self.images.of(str(container.get("image") or ""))
        table = [(container.get("terminationMessagePath") or DEFAULT_TERMINATION_PATH, str(termination))]
        table += [(path, str(local)) for path, local in image.files.items()]
        for mount in container.get("volumeMounts") or []:
            if mount["name"] not in volumes:
                raise PodError("CreateContainerConfigError", f"volume {mount['name']!r} is not in the pod")
            local, read_only = volumes[mount["name"]]
            if mount.get("subPath"):
                local = local / mount["subPath"]
                local.mkdir(parents=True, exist_ok=True)
            if read_only or mount.get("readOnly"):
                copy = self.dir / "ro" / f"{container['name']}-{len(table)}"
                copy.parent.mkdir(parents=True, exist_ok=True)
                read_only_copy(local, copy)
                local = copy
            table.append((mount["mountPath"], str(local)))
        table.sort(key=lambda item: len(item[0]), reverse=True)

        hosts = self.hosts() if self.hosts is not None else {}

        def mapped(value: Any) -> str:
            return map_hosts(map_value(str(value), table), hosts)

        env = dict(image.env)
        for item in container.get("env") or []:
            if "value" in item or "valueFrom" not in item:
                given = str(item.get("value", ""))
                parts = given.split(":") if item["name"] in PATH_LISTS else [given]
                env[item["name"]] = ":".join(mapped(part) for part in parts)
                continue
            field_ref = (item["valueFrom"] or {}).get("fieldRef") or {}
            value = downward_field(self.pod, str(field_ref.get("fieldPath")))
            if value is None:
                raise PodError(
                    "CreateContainerConfigError",
                    f"env {item['name']}: the local cluster supports fieldRef only to {', '.join(DOWNWARD_FIELDS)}",
                )
            env[item["name"]] = value
        if container.get("envFrom"):
            raise PodError("CreateContainerConfigError", "envFrom is not supported by the local cluster")

        command = [mapped(part) for part in container.get("command") or []]
        args = [mapped(part) for part in container.get("args") or []]
        if not command:
            raise PodError(
                "CreateContainerConfigError", "the local cluster runs no images: give the container a command"
            )
        if "/" not in command[0]:
            found = shutil.which(command[0], path=env.get("PATH"))
            if found is None:
                raise PodError("StartError", f'exec: "{command[0]}": executable file not found in $PATH')
            command[0] = found
        cwd = map_value(container["workingDir"], table) if container.get("workingDir") else str(image.workdir)
        return [*command, *args], env, cwd


def memory_limit(container: Mapping[str, Any]) -> int | None:
    """The container's ``resources.limits.memory`` in bytes, or ``None`` (no limit, or one that does not parse)."""
    limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
    try:
        return parse_bytes(limit) if limit is not None else None
    except (ValueError, TypeError):
        return None


def group_rss(pgid: int) -> int:
    """Resident bytes of the processes in process group ``pgid`` (a container's: it starts a new session)."""
    total = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", encoding="ascii", errors="replace") as file:
                fields = file.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
            if int(fields[2]) == pgid:
                total += int(fields[21]) * page  # rss, in pages (proc(5): field 24)
        except (OSError, ValueError, IndexError):
            continue  # a process that ended meanwhile
    return total


def _watch_memory(pgid: int, limit: int, ended: threading.Event, oom: threading.Event) -> None:
    # The cgroup OOM killer's stand-in: sampled, so a spike between samples is missed (module docstring).
    while not ended.wait(MEMORY_POLL_SECONDS):
        if group_rss(pgid) > limit:
            oom.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            return


def terminated(name: str, code: int, reason: str, message: str, started: str) -> dict[str, Any]:
    """A container's status as the kubelet writes it once the container ended."""
    state = {"exitCode": code, "reason": reason, "startedAt": started, "finishedAt": now_rfc3339()}
    if message:
        state["message"] = message
    return {"name": name, "ready": False, "restartCount": 0, "state": {"terminated": state}}


def _waiting(container: Mapping[str, Any], reason: str) -> dict[str, Any]:
    return {"name": container["name"], "ready": False, "restartCount": 0, "state": {"waiting": {"reason": reason}}}
