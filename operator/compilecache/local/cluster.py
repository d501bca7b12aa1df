"""The local cluster: an API server, simulated GPU nodes, the Job runner and admission, in one object.

    with LocalCluster(Path("/tmp/cc")) as cluster:        # KUBECONFIG=cluster.kubeconfig
        with run_operator(cluster) as operator:            # the real `compilecache operator`
            cluster.client.create(...)                     # pods go through the operator's webhook

It exists so that a person without a cluster, and the tests, run the product's real loop:
the real operator, the real ``compilecache warm`` and ``compilecache expire`` commands in
its Jobs, a real training process admitted through the operator's webhook. It is a harness,
not a way to run training: every container runs on this machine's CPU, in this Python
environment or, for the images named in ``images``, in the environment mapped to its image (a
training image's own virtual environment, the runtime image's folder: see ``pods.py`` for what is
and is not emulated). Multi-host Jobs (Indexed Jobs
with a headless Service) run too: one pod per node where anti-affinity asks for it, their host
names rewritten to this machine with a block of ports per Job (``dns.py``). Pools may scale from
zero (``autoscaler.py``), ProvisioningRequests get their answer (``provisioning.py``), a node may be
reclaimed mid-run (:meth:`LocalCluster.reclaim`), and where a ClusterQueue exists a stand-in for Kueue
queues Jobs that name a LocalQueue (``kueue.py``).
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from compilecache.local import admission, certs, provisioning
from compilecache.local.apiserver import KubeEmulator
from compilecache.local.client import KubeClient
from compilecache.local.jobrunner import Controllers
from compilecache.local.nodes import DEFAULT_POOLS, NodePool, nodes
from compilecache.local.pods import Image, Images, claim_dir, log_path
from compilecache.local.server import EmulatorThread

WEBHOOK_PATH = "/mutate-pods"  # the operator's kopf handler id (compilecache.controller.webhook.PATH)
VALIDATE_PATH = "/validate-compilecaches"  # compilecache.controller.webhook.VALIDATE_PATH
# The ClusterKopfPeering the cluster starts with: operators run with peering=True share it (as the chart's replicas).
PEERING = "compilecache-operator"
PEERINGS = "kopf.dev/v1/clusterkopfpeerings"


def chart_webhooks() -> list[dict[str, Any]]:
    """The webhooks of the chart's MutatingWebhookConfiguration (``helm/.../webhook.yaml``), less clientConfig.

    A copy for running without helm; ``tests/test_local_admission.py`` checks it against
    what ``helm template`` renders, so it cannot drift from the chart unnoticed.
    """
    return [_chart_webhook(by_namespace) for by_namespace in (False, True)]


def _chart_webhook(by_namespace: bool) -> dict[str, Any]:
    # pods.compilecache.dev: pods labelled with a cache; selected-pods.compilecache.dev: pods labelled
    # compilecache.dev/inject=true in a namespace labelled compilecache.dev/injection=enabled
    # (consumers.podSelector chooses there). Never the operator's own pods (compilecache.dev/role).
    if by_namespace:
        opt_in = [
            {"key": "compilecache.dev/cache", "operator": "DoesNotExist"},
            {"key": "compilecache.dev/inject", "operator": "In", "values": ["true"]},
        ]
        injection = [{"key": "compilecache.dev/injection", "operator": "In", "values": ["enabled"]}]
    else:
        opt_in = [
            {"key": "compilecache.dev/cache", "operator": "Exists"},
            {"key": "compilecache.dev/inject", "operator": "NotIn", "values": ["false"]},
        ]
        injection = []
    operator_pods = {"key": "compilecache.dev/role", "operator": "DoesNotExist"}
    return {
        "name": "selected-pods.compilecache.dev" if by_namespace else "pods.compilecache.dev",
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Ignore",
        "timeoutSeconds": 5,
        "matchPolicy": "Equivalent",
        "reinvocationPolicy": "Never",
        "rules": [
            {
                "operations": ["CREATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ],
        "objectSelector": {"matchExpressions": [*opt_in, operator_pods]},
        "namespaceSelector": {
            "matchExpressions": [
                *injection,
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]},
            ]
        },
    }


def chart_validating_webhooks() -> list[dict[str, Any]]:
    """The webhooks of the chart's ValidatingWebhookConfiguration (all namespaces), less clientConfig.

    A copy for running without helm, checked against ``helm template`` like :func:`chart_webhooks`.
    """
    return [
        {
            "name": "compilecaches.compilecache.dev",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 5,
            "matchPolicy": "Equivalent",
            "rules": [
                {
                    "operations": ["CREATE", "UPDATE"],
                    "apiGroups": ["compilecache.dev"],
                    "apiVersions": ["*"],
                    "resources": ["compilecaches"],
                    "scope": "Namespaced",
                }
            ],
        }
    ]


def webhook_configuration(
    url: str, ca_pem: bytes, webhooks: Sequence[Mapping[str, Any]] | None = None, name: str = "compilecache-operator"
) -> dict[str, Any]:
    """A MutatingWebhookConfiguration whose webhooks (the chart's by default) call ``url``, trusting ``ca_pem``."""
    client_config = {"url": url, "caBundle": base64.b64encode(ca_pem).decode()}
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {**{k: v for k, v in webhook.items() if k != "clientConfig"}, "clientConfig": client_config}
            for webhook in (chart_webhooks() if webhooks is None else webhooks)
        ],
    }


class LocalCluster:
    """The local cluster, started by ``with`` (or ``start``/``stop``); state under ``root``."""

    def __init__(
        self,
        root: Path,
        *,
        pools: Sequence[NodePool] = DEFAULT_POOLS,
        workdir: Path | None = None,
        passthrough_env: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        image_files: Mapping[str, Path] | None = None,
        images: Mapping[str, Image] | None = None,
        namespaces: Mapping[str, Mapping[str, str]] | None = None,
        request_expiry: datetime.timedelta = provisioning.EXPIRE_AFTER,
    ) -> None:
        """``pools``: the simulated nodes (``nodes.py``; a multi-host warm-up of N hosts needs a pool of at
        least N nodes: the default ``h100`` pool has 2); ``workdir``: every container's working directory
        (the image's WORKDIR; default the current one); ``env``/``passthrough_env``: added to every
        container's environment; ``image_files``: container paths the image would hold
        (``{"/app": Path("my-app")}``); these four make the image every container runs in unless ``images``
        names its image: image name (or prefix ending with ``*``) → :class:`~compilecache.local.pods.Image`
        (``Image.of_path(workdir, venv / "bin")``: a training image's own Python; ``pods.py``), taken as
        given; ``namespaces``: name → labels; ``request_expiry``: how long a
        ProvisioningRequest may stay unprovisioned before the autoscaler fails it (``provisioning.py``)."""
        self.root = root.resolve()
        self.pools = tuple(pools)
        self.images = Images(
            Image.this_environment(workdir or Path.cwd(), passthrough_env, env, image_files), dict(images or {})
        )
        self.namespaces = dict(namespaces) if namespaces is not None else {"default": {}}
        self.request_expiry = request_expiry
        self._api = EmulatorThread(
            self.root / "kubeconfig",
            KubeEmulator(admission=admission.admit, validation=admission.validate, keep_requests=False),
        )
        self.client: KubeClient
        self._controllers: Controllers | None = None

    @property
    def kubeconfig(self) -> Path:
        """A kubeconfig for the local API server (no credentials)."""
        return self._api.kubeconfig

    def start(self) -> LocalCluster:
        """Start the API server, create the namespaces and nodes, start the controllers."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._api.start()
        self.client = KubeClient(self._api)
        for name, labels in self.namespaces.items():
            # The API server labels every namespace with its name (NamespaceDefaultLabelName, 1.21+).
            meta = {"name": name, "labels": {**labels, admission.NAMESPACE_NAME_LABEL: name}}
            self.client.create("v1/namespaces", {"metadata": meta})
        for node in nodes(self.pools):
            self.client.create("v1/nodes", node)
        self.client.create(PEERINGS, {"metadata": {"name": PEERING}})
        self._controllers = Controllers(
            self.client, self.root, self.images, pools=self.pools, expire_after=self.request_expiry
        )
        self._controllers.start()
        return self

    def stop(self) -> None:
        """Stop the controllers (killing running pods) and the API server."""
        if self._controllers is not None:
            self._controllers.stop()
        self._api.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()

    def reclaim(self, node: str) -> list[str]:
        """Take ``node`` away as a spot reclaim does: its live pods get ``DisruptionTarget``, are killed and
        end ``Failed``, then the Node is deleted; returns their names (``Controllers.reclaim``)."""
        if self._controllers is None:
            raise RuntimeError("the cluster is not started")
        return self._controllers.reclaim(node)

    def step(self) -> None:
        """One pass of every controller, now, after the pass in flight: a test that must see that the
        controllers left something as it was waits for this instead of sleeping."""
        if self._controllers is None:
            raise RuntimeError("the cluster is not started")
        self._controllers.step()

    def logs(self, namespace: str, pod: str, container: str) -> str:
        """A container's output so far (``kubectl logs``)."""
        path = log_path(self.root, namespace, pod, container)
        return path.read_text(errors="replace") if path.exists() else ""

    def claim_dir(self, namespace: str, claim: str) -> Path:
        """The local directory behind a PersistentVolumeClaim."""
        return claim_dir(self.root, namespace, claim)


@dataclass
class Operator:
    """The running ``compilecache operator``: its process, its webhook's URL, its log file, its peering identity."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path
    name: str = "operator"
    killed: bool = False

    def output(self) -> str:
        """What the operator printed so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL it, as a node failure or the OOM killer would: no cleanup, no goodbye to its peers."""
        self.killed = True
        self.process.kill()
        self.process.wait()


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def run_operator(
    cluster: LocalCluster,
    *,
    resync_seconds: float = 1.0,
    webhooks: Sequence[Mapping[str, Any]] | None = None,
    extra_args: Sequence[str] = (),
    timeout: float = 60.0,
    policy: Mapping[str, Any] | None = None,
    name: str = "operator",
    peering: bool = False,
    register_webhook: bool = True,
    env: Mapping[str, str] | None = None,
) -> Iterator[Operator]:
    """Run the real ``compilecache operator`` on the cluster, serving its webhook over TLS on 127.0.0.1.

    Registers a MutatingWebhookConfiguration with ``webhooks`` (the chart's by default) that calls it,
    and the chart's ValidatingWebhookConfiguration of CompileCaches, unless ``register_webhook`` is
    false (a second replica: one configuration each, as the chart has).
    ``policy``: the operator's policy (the chart's ``policy:`` values; default: the operator's default).
    ``peering``: run with ``--peering`` in the cluster's ClusterKopfPeering (``PEERING``) instead of
    ``--standalone``, with ``name`` as the peering identity (the chart gives the pod name). ``env``: more of
    the operator's environment, as the chart's Deployment sets it (``COMPILECACHE_KUEUE``). Stops it
    with SIGTERM at the end of the block, and raises if it did not exit cleanly (unless it was killed).
    """
    folder = cluster.root / name
    pem = certs.make(folder / "certs")
    port = free_port()
    environ = {
        **os.environ,
        **(env or {}),
        "KUBECONFIG": str(cluster.kubeconfig),
        "COMPILECACHE_RESYNC_SECONDS": str(resync_seconds),
        "COMPILECACHE_WEBHOOK": "tls",
        "COMPILECACHE_WEBHOOK_ADDR": "127.0.0.1",
        "COMPILECACHE_WEBHOOK_PORT": str(port),
        "COMPILECACHE_WEBHOOK_CERT_FILE": str(pem.cert),
        "COMPILECACHE_WEBHOOK_KEY_FILE": str(pem.key),
        "PYTHONFAULTHANDLER": "1",  # SIGABRT dumps every thread's stack: why a stop hung
        "POD_ID": name,  # kopf's peering identity (the chart sets the pod's name)
    }
    if policy is not None:
        environ["COMPILECACHE_POLICY"] = json.dumps(policy)  # as the chart's Deployment sets it
    mode = f"--peering={PEERING}" if peering else "--standalone"
    command = [sys.executable, "-m", "compilecache.cli", "operator", mode, "-A", *extra_args]
    log = folder / "operator.log"
    out: IO[bytes] = log.open("wb")
    process = subprocess.Popen(command, env=environ, stdout=out, stderr=subprocess.STDOUT)
    operator = Operator(process, f"https://127.0.0.1:{port}{WEBHOOK_PATH}", log, name)
    try:
        _wait_tls(port, pem.ca, process, timeout)
        if register_webhook:
            body = webhook_configuration(operator.url, pem.ca.read_bytes(), webhooks)
            cluster.client.create(admission.CONFIGURATIONS, body)
            # The chart's validating webhook of CompileCaches, the same server at its own path.
            validating = webhook_configuration(
                operator.url.replace(WEBHOOK_PATH, VALIDATE_PATH), pem.ca.read_bytes(), chart_validating_webhooks()
            )
            cluster.client.create(
                admission.VALIDATING_CONFIGURATIONS, validating | {"kind": "ValidatingWebhookConfiguration"}
            )
        yield operator
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGABRT)  # the stacks go to the log, then it dies
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        out.close()
    if process.returncode != 0 and not operator.killed:
        raise RuntimeError(f"compilecache operator exited with {process.returncode}:\n{operator.output()[-3000:]}")


def _wait_tls(port: int, ca: Path, process: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait until the webhook completes a TLS handshake with a client that trusts only ``ca``."""
    context = ssl.create_default_context(cafile=str(ca))
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"compilecache operator exited with {process.returncode} before serving its webhook")
        try:
            with (
                socket.create_connection(("127.0.0.1", port), timeout=1) as sock,
                context.wrap_socket(sock, server_hostname="127.0.0.1"),
            ):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the operator's webhook did not listen on port {port} within {timeout:g}s"
                ) from None
            time.sleep(0.1)  # polling a port: there is nothing to wait on
