"""Shared pytest fixtures.

Kubernetes API emulator (see ``tests/kubeemulator.py``):

* ``RESOURCES`` — the resources every emulator serves (import it to register more in the same way);
* ``running_emulator()`` — a context manager: the emulator in a background thread with its own
  event loop on ``127.0.0.1:<free port>``, plus a kubeconfig file; usable from sync tests,
  in-process kopf operators (``kopf.testing.KopfRunner``) and subprocesses;
* ``kube`` — a fresh emulator per test with a small sync HTTP client (:class:`KubeClient`);
* ``kube_env`` — the same, with ``KUBECONFIG`` pointing at it for the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import kmock
import pytest

from kubeemulator import KubeEmulator

T = TypeVar("T")

# The kubernetes client reads $KUBECONFIG once, when `kubernetes.config` is first imported, so
# setting it per test is too late for kopf's default login (`login_via_client`) and for handlers
# calling `load_kube_config()`. The session therefore points $KUBECONFIG at one fixed path, before
# anything imports `kubernetes` (keep such imports out of this module), and `kube_env` writes the
# current emulator's kubeconfig there. Without `kube_env` that file does not exist, so no test can
# reach a real cluster from ~/.kube/config by accident.
SESSION_KUBECONFIG = Path(tempfile.mkdtemp(prefix="kubeemulator-")) / "kubeconfig"
os.environ["KUBECONFIG"] = str(SESSION_KUBECONFIG)

# (resource, ResourceInfo): what the operator and its tests read and write.
RESOURCES: list[tuple[str, kmock.ResourceInfo]] = [
    ("v1/namespaces", kmock.ResourceInfo(kind="Namespace", namespaced=False, subresources={"status"})),
    ("v1/nodes", kmock.ResourceInfo(kind="Node", namespaced=False, subresources={"status"})),
    ("v1/pods", kmock.ResourceInfo(kind="Pod", namespaced=True, subresources={"status"})),
    (
        "v1/persistentvolumeclaims",
        kmock.ResourceInfo(kind="PersistentVolumeClaim", namespaced=True, subresources={"status"}),
    ),
    ("v1/events", kmock.ResourceInfo(kind="Event", namespaced=True)),
    ("v1/serviceaccounts", kmock.ResourceInfo(kind="ServiceAccount", namespaced=True)),
    ("batch/v1/jobs", kmock.ResourceInfo(kind="Job", namespaced=True, subresources={"status"})),
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


class KubeError(Exception):
    """An API error answer: ``.status`` (HTTP code) and ``.body`` (the ``kind: Status`` dict)."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"HTTP {status}: {body.get('message') if isinstance(body, dict) else body}")
        self.status = status
        self.body = body


class KubeClient:
    """A small sync client over real HTTP (stdlib only), for arranging and asserting in tests."""

    def __init__(self, runner: EmulatorThread) -> None:
        self.runner = runner
        self.emulator = runner.emulator
        self.url = runner.url
        self.kubeconfig = runner.kubeconfig
        # No proxies: a proxy from the environment must never see the test traffic.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def path(
        self,
        resource: str,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
    ) -> str:
        """The URL path for ``"v1/pods"``-style resources (``group/version/plural`` otherwise)."""
        *group_version, plural = resource.split("/")
        parts = ["api" if len(group_version) == 1 else "apis", *group_version]
        if namespace is not None:
            parts += ["namespaces", namespace]
        parts += [plural, *([name] if name else []), *([subresource] if subresource else [])]
        return "/" + "/".join(parts)

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """Send one request; returns the HTTP status and the decoded JSON (or text) answer."""
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": content_type})
        try:
            with self._opener.open(req, timeout=10) as rsp:
                status, raw = rsp.status, rsp.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        try:
            return status, json.loads(raw or b"null")
        except ValueError:
            return status, raw.decode("utf-8", "replace")

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
    ) -> Any:
        """Send one request; returns the decoded JSON answer or raises :class:`KubeError`."""
        status, payload = self.call(method, path, body, content_type, params)
        if status >= 400:
            raise KubeError(status, payload)
        return payload

    def create(self, resource: str, body: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        """POST an object; returns it as stored."""
        result: dict[str, Any] = self.request("POST", self.path(resource, namespace), body)
        return result

    def get(self, resource: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """GET an object; ``None`` when it does not exist."""
        try:
            result: dict[str, Any] = self.request("GET", self.path(resource, namespace, name))
        except KubeError as e:
            if e.status == 404:
                return None
            raise
        return result

    def list(
        self, resource: str, namespace: str | None = None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """List the objects (all namespaces when ``namespace`` is None); returns the items."""
        params = {"labelSelector": label_selector} if label_selector else None
        answer = self.request("GET", self.path(resource, namespace), params=params)
        items: list[dict[str, Any]] = answer["items"]
        return items

    def patch(
        self,
        resource: str,
        name: str,
        patch: dict[str, Any],
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """Merge-patch an object (or its ``status`` subresource); returns the patched object."""
        result: dict[str, Any] = self.request(
            "PATCH", self.path(resource, namespace, name, subresource), patch, "application/merge-patch+json"
        )
        return result

    def delete(self, resource: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        """DELETE an object; returns the object (finalizers pending) or a ``kind: Status``."""
        result: dict[str, Any] = self.request("DELETE", self.path(resource, namespace, name))
        return result

    def wait_for(self, predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.05) -> T:
        """Poll ``predicate()`` until it returns a truthy value, and return that value.

        Raises AssertionError with the last value (or exception) seen when time runs out.
        """
        deadline = time.monotonic() + timeout
        last: Any = None
        while True:
            try:
                last = predicate()
            except Exception as e:  # e.g. a KeyError on a status not written yet: keep polling
                last = e
            else:
                if last:
                    return last
            if time.monotonic() >= deadline:
                raise AssertionError(f"not true within {timeout}s; last seen: {last!r}")
            time.sleep(interval)


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[KubeClient]:
    """A fresh Kubernetes API emulator for this test, with a sync client (see :class:`KubeClient`)."""
    with running_emulator(tmp_path) as runner:
        yield KubeClient(runner)


@pytest.fixture
def kube_env(kube: KubeClient, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeClient]:
    """Like ``kube``, and ``$KUBECONFIG`` (``SESSION_KUBECONFIG``) leads to this emulator.

    Works for kopf's default login, ``kubernetes.config.load_kube_config()`` and subprocesses.
    """
    write_kubeconfig(SESSION_KUBECONFIG, kube.url)
    monkeypatch.setenv("KUBECONFIG", str(SESSION_KUBECONFIG))  # in case a test changed it
    try:
        yield kube
    finally:
        SESSION_KUBECONFIG.unlink(missing_ok=True)  # a dead emulator's address must not linger
