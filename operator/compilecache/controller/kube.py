"""The operator's own Kubernetes API calls, as plain JSON dicts.

kopf watches and patches the CompileCache itself; the handlers read Nodes and Jobs
and write Jobs, claims, Events and the status through this module. It uses the
``kubernetes`` client's configuration, authentication, serialisation and transport
(``ApiClient.param_serialize``/``call_api``), but not its typed models: the operator
builds manifests as dicts (pure functions in ``jobs.py``) and must not lose fields a
model does not know. What this module writes itself is only each kind's URL path
(:class:`Resource`) and the verb. The client's other ways to get there do not serve:
the typed ``CoreV1Api``/``BatchV1Api`` methods decode into models that drop unknown
fields (and one method per kind and verb would replace the seven lines of
:meth:`Resource.path`), ``CustomObjectsApi`` addresses only ``/apis/<group>`` (not
core ``/api/v1``), and ``kubernetes.dynamic`` needs discovery calls before the first
request (more API load and another failure mode at start-up). Every call goes through
:meth:`Client.request`, which counts calls in ``compilecache_api_requests`` (by verb and resource) and
failures in ``compilecache_api_errors``, and retries a failed connection once, never a read.
"""

from __future__ import annotations

import datetime
import json
import logging
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import kubernetes
import urllib3

from compilecache.controller import metrics

logger = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
# Connect and read timeouts of one call, and one more try only for a connection that failed
# (never a read: a POST must not be sent twice, and a hung API must fail the pass, not stall it).
# They bound how long a pass takes to notice an unreachable API, and so the operator's shutdown:
# a stopping operator's client fails every new call at once (Client.close), so a shutdown waits
# for at most the one call in flight. (urllib3's default would retry 3 times: 4 × the timeout.)
REQUEST_TIMEOUT = (3.0, 10.0)
CONNECT_RETRIES = 1
# Connections kept to the API server: one per pass worker, the webhook's and the watchdog's, with room.
# (The client's default, 5 per CPU of the machine, is 10 on a 2-core one: passes would queue for one.)
MAX_CONNECTIONS = 64
REPORTING_COMPONENT = "compilecache-operator"
STOPPING = "OperatorStopping"
UNREACHABLE = "Unreachable"


class ApiError(Exception):
    """A failed API call, with the HTTP status and the server's message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Resource:
    """A resource kind as the API addresses it."""

    api_version: str  # "v1" or "group/version"
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        """The URL path of the collection, of one object, or of its sub-resource."""
        root = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        parts = [root]
        if self.namespaced and namespace is not None:
            parts.append(f"namespaces/{namespace}")
        parts.append(self.plural)
        if name is not None:
            parts.append(name)
            if subresource is not None:
                parts.append(subresource)
        return "/".join(parts)

    def key(self, name: str) -> str:
        """``plural/name``: what names an object among those of every kind (a Job and its Service share a name)."""
        return f"{self.plural}/{name}"


COMPILECACHES = Resource("compilecache.dev/v1alpha1", "compilecaches")
JOBS = Resource("batch/v1", "jobs")
NODES = Resource("v1", "nodes", namespaced=False)
NAMESPACES = Resource("v1", "namespaces", namespaced=False)  # the gate watchdog expands kopf's patterns
PVCS = Resource("v1", "persistentvolumeclaims")
EVENTS = Resource("v1", "events")
PODS = Resource("v1", "pods")
SERVICES = Resource("v1", "services")  # the headless Services of multi-host warm-up Jobs
# Cluster Autoscaler's capacity requests for warm-up Jobs (spec.warmup.provisioningRequest: provisioning.py).
PROVISIONING_REQUESTS = Resource("autoscaling.x-k8s.io/v1", "provisioningrequests")
# Kueue's Workloads (one per queued Job): read for a warm-up Job that waits in a queue (queueing.py).
WORKLOADS = Resource("kueue.x-k8s.io/v1beta2", "workloads")
# Kueue's AdmissionChecks: the operator serves those whose controllerName is its own (checks.py).
ADMISSION_CHECKS = Resource("kueue.x-k8s.io/v1beta2", "admissionchecks", namespaced=False)


class Client:
    """A configured API client; build it once at start-up (the first build is slow)."""

    def __init__(self, api_client: kubernetes.client.ApiClient) -> None:
        self._api = api_client
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called: every call fails at once."""
        return self._closed

    def close(self) -> None:
        """Stop: calls from now on fail at once (so passes in flight end promptly); idle connections close."""
        self._closed = True
        self._api.close()

    @classmethod
    def from_environment(cls) -> Client:
        """In a pod: the service account; elsewhere: ``KUBECONFIG`` or ``~/.kube/config``."""
        configuration = kubernetes.client.Configuration()
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config(client_configuration=configuration)
        configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize or 0, MAX_CONNECTIONS)
        configuration.retries = urllib3.Retry(
            total=CONNECT_RETRIES, connect=CONNECT_RETRIES, read=0, status=0, redirect=0, raise_on_status=False
        )
        return cls(kubernetes.client.ApiClient(configuration))

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        """Make one API call and return the decoded JSON; raise :class:`ApiError` on a non-2xx answer."""
        metrics.METRICS.api_request(*verb_and_resource(method, path))
        try:
            return self._request(method, path, query=query, body=body, content_type=content_type)
        except ApiError as exc:
            metrics.METRICS.api_error(method, exc.status)
            raise

    def _request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        if self._closed:
            raise ApiError(0, STOPPING, "the operator is stopping; the call was not made")
        headers = {"Accept": "application/json", "Content-Type": content_type}
        method_, url, headers_, body_, post = self._api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(query) or None,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self._api.call_api(method_, url, headers_, body_, post, _request_timeout=REQUEST_TIMEOUT)
            response.read()
        except kubernetes.client.ApiException as exc:
            raise _api_error(exc.status or 0, exc.reason or "", exc.body) from None
        except urllib3.exceptions.HTTPError as exc:  # no answer at all: refused, timed out, reset
            raise ApiError(0, UNREACHABLE, f"{type(exc).__name__}: {exc}") from None
        data = response.data or b""
        if not 200 <= response.status < 300:
            raise _api_error(response.status, response.reason or "", data)
        return json.loads(data) if data else None

    def get(self, resource: Resource, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """Read one object; ``None`` when it does not exist."""
        try:
            obj: dict[str, Any] = self.request("GET", resource.path(namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        labels: Mapping[str, str | None] | None = None,
        fields: Mapping[str, str] | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """List objects, optionally only those carrying all of ``labels`` (a value ``None``: any value) and
        whose ``fields`` (a field selector: ``spec.nodeName``, the fields the API serves for the kind) equal these.

        ``limit``: at most this many (the first page: the API server pages a list at ``limit``, and the rest
        is not read; the answer is cut here too, for a server that does not page)."""
        terms = [k if v is None else f"{k}={v}" for k, v in (labels or {}).items()]
        query = [("labelSelector", ",".join(terms))] if terms else []
        if fields:
            query.append(("fieldSelector", ",".join(f"{k}={v}" for k, v in fields.items())))
        if limit is not None:
            query.append(("limit", str(limit)))
        answer = self.request("GET", resource.path(namespace), query=query)
        items: list[dict[str, Any]] = answer.get("items") or []
        return items if limit is None else items[:limit]

    def create(self, resource: Resource, body: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        """Create an object; :class:`ApiError` 409 when it exists already."""
        created: dict[str, Any] = self.request("POST", resource.path(namespace), body=dict(body))
        return created

    def patch(
        self,
        resource: Resource,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """Merge-patch an object or its sub-resource (e.g. ``status``)."""
        path = resource.path(namespace, name, subresource)
        patched: dict[str, Any] = self.request("PATCH", path, body=dict(patch), content_type=MERGE_PATCH)
        return patched

    def json_patch(
        self,
        resource: Resource,
        name: str,
        ops: Sequence[Mapping[str, Any]],
        namespace: str | None = None,
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """Apply RFC 6902 operations to an object or its sub-resource; a failed ``test`` op is :class:`ApiError`
        422 (the object changed)."""
        body = [dict(op) for op in ops]
        patched: dict[str, Any] = self.request(
            "PATCH", resource.path(namespace, name, subresource), body=body, content_type=JSON_PATCH
        )
        return patched

    def delete(self, resource: Resource, name: str, namespace: str | None = None) -> bool:
        """Delete an object and (in the background) what it owns; ``False`` if it was gone already."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        try:
            self.request("DELETE", resource.path(namespace, name), body=body)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def post_event(
        self, obj: Mapping[str, Any], type_: str, reason: str, message: str, *, name: str | None = None
    ) -> bool:
        """Record a core/v1 Event about ``obj``; a failure is logged, not raised: Events are best-effort.

        ``name``: the Event's own name, to post it once: while an Event of that name exists (the API
        server keeps Events for an hour, ``--event-ttl``), posting again is a quiet 409. Returns whether
        an Event was created.
        """
        meta = obj.get("metadata", {})
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": name or f"{meta.get('name')}.{secrets.token_hex(8)}",
                "namespace": meta.get("namespace"),
            },
            "involvedObject": {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": REPORTING_COMPONENT},
            "reportingComponent": REPORTING_COMPONENT,
            "reportingInstance": REPORTING_COMPONENT,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.create(EVENTS, event, namespace=meta.get("namespace"))
        except ApiError as exc:
            if not (name and exc.status == 409):  # posted before: the once-only Event stands
                logger.warning("Could not post the event %s/%s: %s", reason, message, exc)
            return False
        return True


def verb_and_resource(method: str, path: str) -> tuple[str, str]:
    """The API server's names for a call (``list``/``get``, ``pods``, ``compilecaches/status``), for the metrics.

    A GET of a collection is a ``list``, of one object a ``get``, as the API server's own
    ``apiserver_request_total`` counts them; a ``watch`` the client never makes (kopf watches).
    """
    parts = [part for part in path.split("/") if part]
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]  # after /api/v1 or /apis/<group>/<version>
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    resource = "/".join(rest[:1] + rest[2:3])  # plural[/subresource]: never an object's name
    verb = {"post": "create", "put": "update"}.get(method.lower(), method.lower())
    if verb == "get" and len(rest) < 2:
        verb = "list"
    return verb, resource or "unknown"


def _api_error(status: int, reason: str, data: Any) -> ApiError:
    message = ""
    try:
        message = json.loads(data).get("message", "")
    except (TypeError, ValueError, AttributeError):
        message = data.decode(errors="replace")[:500] if isinstance(data, bytes) else str(data or "")[:500]
    return ApiError(status, reason, message)
