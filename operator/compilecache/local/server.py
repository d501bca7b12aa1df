"""Serving the local API server (``apiserver.KubeEmulator``) on a port, from any thread.

The emulator runs in a background thread with its own event loop on ``127.0.0.1:<free port>``,
so that synchronous code (the demo, the tests, the Job runner), in-process kopf operators
and subprocesses (``compilecache operator``) all reach it over real HTTP. A kubeconfig file
points at it (no auth: the local API server has none).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kmock

from compilecache.api import bounds
from compilecache.local.apiserver import KubeEmulator

# (resource, ResourceInfo): what the operator, the local cluster and the tests read and write.
RESOURCES: list[tuple[str, kmock.ResourceInfo]] = [
    ("v1/namespaces", kmock.ResourceInfo(kind="Namespace", namespaced=False, subresources={"status"})),
    ("v1/nodes", kmock.ResourceInfo(kind="Node", namespaced=False, subresources={"status"})),
    ("v1/pods", kmock.ResourceInfo(kind="Pod", namespaced=True, subresources={"status"})),
    (
        "v1/persistentvolumeclaims",
        kmock.ResourceInfo(kind="PersistentVolumeClaim", namespaced=True, subresources={"status"}),
    ),
    ("v1/events", kmock.ResourceInfo(kind="Event", namespaced=True)),
    # Multi-host warm-ups pair an Indexed Job with a headless Service (the local cluster's DNS reads it).
    ("v1/services", kmock.ResourceInfo(kind="Service", namespaced=True, subresources={"status"})),
    ("v1/serviceaccounts", kmock.ResourceInfo(kind="ServiceAccount", namespaced=True)),
    # What a spec.warmup.podTemplate.templateRef may name (the operator watches them: controller/indexes.py).
    ("v1/podtemplates", kmock.ResourceInfo(kind="PodTemplate", namespaced=True)),
    ("batch/v1/jobs", kmock.ResourceInfo(kind="Job", namespaced=True, subresources={"status"})),
    (
        "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
        kmock.ResourceInfo(kind="MutatingWebhookConfiguration", namespaced=False),
    ),
    # kopf's peering objects (the chart ships their CRDs): replicas under --peering announce
    # themselves in their status. No status subresource, as in kopf's own CRDs.
    ("kopf.dev/v1/clusterkopfpeerings", kmock.ResourceInfo(kind="ClusterKopfPeering", namespaced=False)),
    ("kopf.dev/v1/kopfpeerings", kmock.ResourceInfo(kind="KopfPeering", namespaced=True)),
    (
        "admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
        kmock.ResourceInfo(kind="ValidatingWebhookConfiguration", namespaced=False),
    ),
    # Cluster Autoscaler's ProvisioningRequest CRD (its types.go: namespaced, status subresource, short
    # names provreq/provreqs); the local autoscaler answers them (local/provisioning.py).
    (
        "autoscaling.x-k8s.io/v1/provisioningrequests",
        kmock.ResourceInfo(
            kind="ProvisioningRequest",
            singular="provisioningrequest",
            namespaced=True,
            shortnames={"provreq", "provreqs"},
            subresources={"status"},
        ),
    ),
    # Kueue's kinds (kubernetes-sigs/kueue v0.19, API v1beta2; its CRDs in config/components/crd): scopes,
    # short names and status subresources as there (a check's controller writes a Workload's and an
    # AdmissionCheck's status); the local cluster's Kueue stand-in (local/kueue.py) answers them.
    # No schema: any body is stored.
    (
        "kueue.x-k8s.io/v1beta2/workloads",
        kmock.ResourceInfo(
            kind="Workload", singular="workload", namespaced=True, shortnames={"wl"}, subresources={"status"}
        ),
    ),
    (
        "kueue.x-k8s.io/v1beta2/localqueues",
        kmock.ResourceInfo(
            kind="LocalQueue",
            singular="localqueue",
            namespaced=True,
            shortnames={"queue", "queues", "lq"},
            subresources={"status"},
        ),
    ),
    (
        "kueue.x-k8s.io/v1beta2/clusterqueues",
        kmock.ResourceInfo(
            kind="ClusterQueue", singular="clusterqueue", namespaced=False, shortnames={"cq"}, subresources={"status"}
        ),
    ),
    (
        "kueue.x-k8s.io/v1beta2/admissionchecks",
        kmock.ResourceInfo(kind="AdmissionCheck", singular="admissioncheck", namespaced=False, subresources={"status"}),
    ),
    (
        "kueue.x-k8s.io/v1beta2/workloadpriorityclasses",
        kmock.ResourceInfo(kind="WorkloadPriorityClass", singular="workloadpriorityclass", namespaced=False),
    ),
    (
        "compilecache.dev/v1alpha1/compilecaches",
        kmock.ResourceInfo(
            kind="CompileCache",
            singular="compilecache",
            namespaced=True,
            shortnames={"cc"},
            subresources={"status"},
        ),
    ),
]
_VERBS = {"create", "delete", "get", "list", "patch", "update", "watch"}


def write_kubeconfig(path: Path, url: str) -> Path:
    """Write a kubeconfig (JSON is valid YAML) for ``url``: no auth, context ``emulator``."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "emulator", "user": {}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "emulator"}}],
        "current-context": "emulator",
    }
    path.write_text(json.dumps(config, indent=2))
    return path


class EmulatorThread:
    """A running :class:`KubeEmulator`: ``.emulator``, ``.url``, ``.kubeconfig``, ``.call(coro_fn)``."""

    def __init__(self, kubeconfig: Path, emulator: kmock.KubernetesEmulator | None = None) -> None:
        bounds.read_json_as_deep_as_the_api_server()  # a real server stores JSON 10000 levels deep
        self.kubeconfig = kubeconfig
        self.emulator = KubeEmulator() if emulator is None else emulator
        for resource, info in RESOURCES:
            info.verbs = set(_VERBS)
            self.emulator.resources[resource] = info
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kube-emulator", daemon=True)
        self._stack = contextlib.AsyncExitStack()

    def call(self, fn: Callable[[], Any], timeout: float = 10.0) -> Any:
        """Run ``await fn()`` in the emulator's loop (e.g. to inspect ``emulator.objects`` safely)."""
        return asyncio.run_coroutine_threadsafe(fn(), self._loop).result(timeout)

    async def _start(self) -> None:
        await self._stack.enter_async_context(self.emulator)  # inside it, errors become API errors
        server = await self._stack.enter_async_context(kmock.Server(self.emulator))
        self.url = f"http://{server.host}:{server.port}"

    async def _stop(self) -> None:
        if isinstance(self.emulator, KubeEmulator):
            await self.emulator.close_watches()  # else the server waits for open watches to end
        await self._stack.aclose()

    def start(self) -> None:
        """Start the loop thread and the server; write the kubeconfig."""
        self._thread.start()
        self.call(self._start)
        write_kubeconfig(self.kubeconfig, self.url)

    def stop(self) -> None:
        """Stop the server, the loop and the thread."""
        try:
            self.call(self._stop)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()


@contextlib.contextmanager
def running_emulator(tmp_dir: Path, emulator: kmock.KubernetesEmulator | None = None) -> Iterator[EmulatorThread]:
    """Run an emulator (a new :class:`KubeEmulator` unless given) for the block.

    Its kubeconfig goes to ``tmp_dir / "kubeconfig"``.
    """
    runner = EmulatorThread(tmp_dir / "kubeconfig", emulator)
    runner.start()
    try:
        yield runner
    finally:
        runner.stop()
