"""A small synchronous client of the local API server over real HTTP (stdlib only).

The demo, the Job runner and the tests arrange and read objects with it; the operator
uses its own clients (kopf's and ``kubernetes``). No proxies: a proxy from the
environment must never see the local cluster's traffic.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

from compilecache.local.server import EmulatorThread

T = TypeVar("T")


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
