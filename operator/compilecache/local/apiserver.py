"""The local cluster's API server: stock ``kmock`` plus what a real API server does.

Serves the demo and the tests (``compilecache.local.server`` runs it on a port; the
operator, the Job runner and ``kubectl``-like clients talk to it over real HTTP).

Stock ``kmock.KubernetesEmulator`` (0.8) stores objects as plain JSON and merges patches into them.
The operator (through kopf's client and the ``kubernetes`` client) relies on API-server behaviour
that stock kmock lacks. Each gap filled here has a canary test in ``tests/test_kubeemulator.py``
that fails once upstream kmock fills it, so that this module can shrink:

1. server-managed metadata on create: ``uid``, ``resourceVersion``, ``creationTimestamp``,
   ``generation``, the namespace from the URL, ``apiVersion``/``kind`` of the resource;
2. ``generateName`` → a name with a random 5-character suffix;
3. ``201 Created`` on create (stock answers 200);
4. ``resourceVersion`` bumped on every write (one global counter), ``generation`` bumped when
   anything but ``metadata``/``status`` changes, optimistic concurrency (409 on a stale
   ``resourceVersion``), no-op writes change nothing (no new version, no event);
5. patch content types: JSON merge patch (RFC 7386: ``null`` deletes, lists replace, a dict may
   replace a scalar), JSON patch with ``test`` ops failing as 422 (stock: 500), 415 otherwise;
   strategic merge patch is treated as a merge patch (no list merging by key: a remaining gap);
6. ``PUT`` (replace): stock kmock does not route it at all;
7. status-subresource isolation: the main endpoint ignores ``status``, ``/status`` changes only
   ``status``;
8. owner garbage collection (background policy, done synchronously so tests are deterministic;
   ``propagationPolicy=Orphan`` keeps the dependents and drops their owner reference; an object
   created with owners that are all gone is collected at once, as the real collector does);
9. a ``kind: Status`` success body when a DELETE removes the object at once;
10. ``labelSelector`` and ``fieldSelector`` (``metadata.name``, ``metadata.namespace``; a pod's
    ``spec.nodeName`` and ``status.phase``; an Event's ``involvedObject.*``, ``reason``, ``type``) on list
    and watch; watch turns MODIFIED into ADDED/DELETED when an object starts/stops matching;
11. list responses with ``kind: <Kind>List``, ``apiVersion`` and the current ``resourceVersion``;
12. watch from ``?resourceVersion=N`` replays only newer events (stock replays the whole state),
    ``sendInitialEvents`` with the closing bookmark, ``timeoutSeconds``;
13. ``/api/v1/namespaces[/name]`` paths (stock kmock's path parser crashes or misreads them);
    ``keep_requests=False`` forgets served requests (kmock scans them all on every request);
14. mutating admission of Pod and Job creations, when an ``admission`` function is given (the local
    cluster gives ``compilecache.local.admission``: the MutatingWebhookConfigurations over HTTPS for
    Pods, the Kueue stand-in's suspension of queued Jobs),
    and validating admission of namespaced creations, when a ``validation`` function is given
    (``admission.validate``: the ValidatingWebhookConfigurations);
15. validation and defaulting of the built-in fields the product's manifests could get wrong
    (``compilecache.local.validation``: Service names and cluster IPs, a Pod's hostname and
    subdomain), and of a CompileCache's status against the CRD's status schema: ``422 Invalid``
    with the real server's message; a body that is not JSON (``NaN``, ``Infinity``): ``400``.

Remaining gaps (the operator must not rely on them): no validation or defaulting against a CRD
schema beyond a CompileCache's status, nor of built-in kinds beyond item 15; no admission of other
resources or operations; no controllers here (the local cluster's Job runner plays the Job
controller, the scheduler and the kubelet); no namespace lifecycle (deleting a Namespace leaves
its objects); no server-side apply; no list pagination (``limit`` is ignored, all items come in
one page); no 410 Gone for old resource versions (the whole event history is kept in memory).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime
import json
import logging
import random
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import kmock
from kmock._internal import parsing, rendering

from compilecache.local import validation

Body = dict[str, Any]
PODS = kmock.resource("", "v1", "pods")
JOBS = kmock.resource("batch", "v1", "jobs")  # mutated at creation by the local Kueue stand-in's webhook

# (the emulator, the namespace, the new pod) → the pod as admitted; raises a KubernetesError to refuse.
Admission = Callable[["KubeEmulator", str, Body], Awaitable[Body]]
# Validating admission of a creation: (emulator, namespace, group/version/resource, kind, object); raises to refuse.
Validation = Callable[["KubeEmulator", str, Mapping[str, str], str, Body], Awaitable[None]]

# Names a real API server appends to generateName: consonants and digits, no vowels (no words).
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"

# kmock 0.8 parses /api/v1/namespaces as a namespace prefix; it crashes on the bare list path.
_NAMESPACE_PATH = re.compile(r"/api/v1/namespaces(?:/(?P<name>[^/]+)(?:/(?P<sub>status|finalize))?)?/?")

# Server-managed metadata that clients cannot change through an update.
_MANAGED_META = ("uid", "name", "namespace", "creationTimestamp", "generation", "deletionTimestamp")


def kube_error(status: int, reason: str, message: str, **details: Any) -> kmock.KubernetesError:
    """An API error rendered as a ``kind: Status`` failure, with the reasons a real server uses."""
    return kmock.KubernetesError(status=status, reason=reason, message=message, details=details or {})


def now_rfc3339() -> str:
    """The current UTC time the way the API server writes timestamps (seconds, ``Z``)."""
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply an RFC 7386 JSON merge patch; returns a new value and leaves the inputs untouched."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# --- selectors -------------------------------------------------------------------------------------

_Requirement = Callable[[Mapping[str, str]], bool]
_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_SET_RE = re.compile(rf"\s*({_KEY})\s+(in|notin)\s+\(([^)]*)\)\s*")
_EQ_RE = re.compile(rf"\s*({_KEY})\s*(==|=|!=)\s*([-A-Za-z0-9_.]*)\s*")
_EXISTS_RE = re.compile(rf"\s*(!?)\s*({_KEY})\s*")


def _split_selector(selector: str) -> list[str]:
    # Commas separate requirements, except inside the parentheses of `in (a,b)`.
    return [part for part in re.split(r",(?![^()]*\))", selector) if part.strip()]


def _label_requirement(key: str, op: str, values: frozenset[str]) -> _Requirement:
    def check(labels: Mapping[str, str]) -> bool:
        if op == "exists":
            return key in labels
        if op == "!":
            return key not in labels
        # `!=` and `notin` also match objects without the label, as in the API server.
        return (labels.get(key) in values) == (op in ("=", "==", "in"))

    return check


def parse_label_selector(selector: str) -> list[_Requirement]:
    """Parse a label selector into predicates over a labels dict; a bad selector is a 400."""
    requirements: list[_Requirement] = []
    for part in _split_selector(selector):
        if m := _SET_RE.fullmatch(part):
            values = frozenset(v.strip() for v in m[3].split(",") if v.strip())
            requirements.append(_label_requirement(m[1], m[2], values))
        elif m := _EQ_RE.fullmatch(part):
            requirements.append(_label_requirement(m[1], m[2], frozenset([m[3]])))
        elif m := _EXISTS_RE.fullmatch(part):
            requirements.append(_label_requirement(m[2], "!" if m[1] else "exists", frozenset()))
        else:
            raise kube_error(400, "BadRequest", f"unable to parse requirement: {part!r}")
    return requirements


def _field_requirement(field: str, negate: bool, value: str) -> Callable[[Body], bool]:
    def check(obj: Body) -> bool:
        found: Any = obj
        for part in field.split("."):
            found = found.get(part) if isinstance(found, dict) else None
        return ((found or "") == value) != negate  # an absent field is "" (spec.nodeName= : not scheduled)

    return check


# The field selectors a real server serves beyond metadata.name/namespace (pkg/registry/core/pod: the
# pods' selectable fields include spec.nodeName and status.phase; pkg/registry/core/event: an Event's
# involvedObject.*, reason, type, source and reportingComponent; the field-selectors docs list them).
_FIELDS = {
    "pods": ("spec.nodeName", "status.phase"),
    "events": (
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "reason",
        "type",
        "reportingComponent",
    ),
}


def parse_field_selector(selector: str, plural: str = "") -> list[Callable[[Body], bool]]:
    """Parse a field selector over ``metadata.name``/``metadata.namespace`` (all any resource has), and a
    pod's ``spec.nodeName`` and ``status.phase``."""
    requirements: list[Callable[[Body], bool]] = []
    for part in _split_selector(selector):
        m = re.fullmatch(r"\s*([\w.]+)\s*(==|=|!=)\s*([^,]*?)\s*", part)
        if m is None or m[1] not in ("metadata.name", "metadata.namespace", *_FIELDS.get(plural, ())):
            raise kube_error(400, "BadRequest", f'field label not supported: "{part}"')
        requirements.append(_field_requirement(m[1], m[2] == "!=", m[3]))
    return requirements


@dataclasses.dataclass(frozen=True)
class _Event:
    """One write, as kept for watch replays; ``old`` lets a selector watch see (un)matching."""

    resource: kmock.resource
    rv: int
    type: str
    obj: Body
    old: Body | None = None


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesEmulator):
    """``kmock.KubernetesEmulator`` with the API-server behaviour listed in this module's docstring.

    Objects stay in kmock's ``objects`` store (one history per object) and events go through
    kmock's per-resource buses, so kmock's assertions (``emulator.objects[...]``) and its DSL
    reactions (``emulator['patch', 'v1/pods'] << 500`` to inject failures) keep working.
    Resources must be registered in ``emulator.resources`` to be served.
    """

    _counter: int = attrs.field(default=0, init=False)
    _history: list[_Event] = attrs.field(factory=list, init=False)
    _outcomes: dict[int, rendering.Payload] = attrs.field(factory=dict, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    _admitted: dict[int, Body] = attrs.field(factory=dict, init=False)
    _cluster_ips: int = attrs.field(default=0, init=False)  # ClusterIPs handed out (10.96.0.10 + n)
    admission: Admission | None = None
    validation: Validation | None = None
    # kmock keeps every request for assertions (``list(emulator)``) and scans them all on each
    # new request (its reactions' filters): the cost per request grows with the run, ~0.2 s
    # per request after 2000. Long runs (the local cluster) forget served requests; the
    # pending ones (open watches included) stay.
    keep_requests: bool = True

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # aiohttp logs every request at INFO ("aiohttp.access"): with an operator's logging set up in
        # the same process, each watch and patch became a line of noise in tests and the demo.
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
        # kmock guesses no action for PUT, so it would fall through to "endpoint not found".
        self.fallback[kmock.method.PUT] << self._serve_replace

    @property
    def resource_version(self) -> int:
        """The current value of the global resourceVersion counter."""
        return self._counter

    def live(self, resource: str) -> list[Body]:
        """Copies of the stored objects of ``resource`` (``"v1/pods"`` style), for in-process readers."""
        wanted = kmock.resource(resource)
        return [copy.deepcopy(o.raw) for (r, _, _), o in self._objects.items() if r == wanted and not o.deleted]

    async def close_watches(self) -> None:
        """End all open watch streams; call before stopping the server, which would wait for them."""
        self._closed = True
        for bus in list(self._buses.values()):
            await bus.put(None)

    # --- request routing ----------------------------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """Serve a request (``_serve``), then forget it unless ``keep_requests``."""
        try:
            return await self._serve(raw_request)
        finally:
            if not self.keep_requests:
                self._requests[:] = [r for r in self._requests if r._raw_request is not raw_request]

    async def _serve(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """Namespace paths get a correct parse, everything else goes to kmock."""
        m = _NAMESPACE_PATH.fullmatch(raw_request.path)
        if m is None:
            return await super().__call__(raw_request)
        # Only the parse differs from kmock's entry point; the rest of it is repeated here.
        body = await raw_request.read()
        try:
            data = json.loads(body) if body else None
        except ValueError:
            data = None
        path = parsing.ParsedPath("", "v1", "namespaces", None, m["name"], m["sub"])
        request = rendering.Request(
            id=len(self._requests),
            raw_request=raw_request,
            url=raw_request.url,
            method=raw_request.method,
            params=dict(raw_request.query),
            headers=dict(raw_request.headers),
            cookies=dict(raw_request.cookies),
            body=body,
            text=body.decode("utf-8", "replace"),
            data=data,
            action=parsing.guess_k8s(path, kmock.method(raw_request.method), dict(raw_request.query)),
            resource=kmock.resource("", "v1", "namespaces"),
            name=m["name"],
            subresource=m["sub"],
        )
        self._requests.append(request)
        try:
            return await self._handle(request)
        except Exception as e:
            if not self._errors:  # outside `async with`, kmock lets the server see the error
                raise
            self._errors[-1].append(e)
            return await self._render_error(e)

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        resource = request.resource
        # Discovery (no plural) and non-Kubernetes paths: kmock serves them as they are.
        if resource is None or resource.plural is None:
            return await super()._handle(request)
        if resource not in self._resources:
            raise kmock.KubernetesResourceNotFoundError()
        info = self._resources[resource]
        if request.subresource not in (None, *info.subresources):
            raise kube_error(404, "NotFound", "the server could not find the requested resource")

        if request.method in ("POST", "PUT", "PATCH") and request.body:
            problem = validation.undecodable(request.body)
            if problem is not None:  # NaN, Infinity: the real server's decoder refuses the body
                raise kube_error(400, "BadRequest", problem)

        # Admission comes before the write and outside the lock: a webhook reads the API itself.
        # (kube-apiserver also runs mutating admission before it stores the object.)
        admitting = request.action == kmock.action.CREATE and resource in (PODS, JOBS) and self.admission is not None
        if admitting and isinstance(request.data, dict) and request.namespace is not None:
            assert self.admission is not None
            body = copy.deepcopy(request.data)
            body.setdefault("metadata", {})["namespace"] = request.namespace
            # Admission sees the decoded object, whose kind is the resource's (as in kube-apiserver).
            body["apiVersion"], body["kind"] = self._api_version(resource), info.kind
            self._admitted[id(request)] = await self.admission(self, request.namespace, body)
        # Validating admission after mutating, as kube-apiserver runs them (creations only; see admission.py).
        validating = request.action == kmock.action.CREATE and self.validation is not None
        if validating and isinstance(request.data, dict) and request.namespace is not None:
            assert self.validation is not None
            body = copy.deepcopy(self._admitted.get(id(request), request.data))
            body.setdefault("metadata", {})["namespace"] = request.namespace
            gvr = {"group": resource.group or "", "version": resource.version or "", "resource": resource.plural}
            try:
                await self.validation(self, request.namespace, gvr, info.kind or "", body)
            except Exception:
                self._admitted.pop(id(request), None)  # refused: nothing is written
                raise

        # Writes happen here, under the lock, before any reaction renders the response: so
        # a reaction can still replace the response, and the store is already consistent.
        writer = (
            self._create
            if request.action == kmock.action.CREATE
            else self._patch
            if request.action == kmock.action.UPDATE
            else self._delete
            if request.action == kmock.action.DELETE
            else self._replace
            if request.method == kmock.method.PUT and request.name is not None
            else None
        )
        if writer is not None:
            async with self._lock:
                self._outcomes[id(request)] = await writer(request, info)
        try:
            # Skip kmock.KubernetesEmulator._handle: its own writes would repeat ours.
            return await super(kmock.KubernetesEmulator, self)._handle(request)
        finally:
            self._outcomes.pop(id(request), None)

    # --- helpers --------------------------------------------------------------------------------

    @staticmethod
    def _api_version(resource: kmock.resource) -> str:
        return f"{resource.group}/{resource.version}" if resource.group else str(resource.version)

    def _live(self, key: tuple[kmock.resource, str | None, str]) -> Body | None:
        if key not in self._objects or self._objects[key].deleted:
            return None
        return copy.deepcopy(self._objects[key].raw)

    def _key(self, request: rendering.Request, info: kmock.ResourceInfo) -> tuple[Any, str | None, str]:
        assert request.resource is not None and request.name is not None  # routed only so
        return (request.resource, request.namespace if info.namespaced else None, request.name)

    @staticmethod
    def _validate(resource: kmock.resource, body: Body, old: Body | None) -> None:
        """Refuse an invalid object with the real server's 422 (``validation``)."""
        plural = str(resource.plural)
        errors = validation.validate(plural, body, old, str(resource.group or ""))
        if errors:
            name = (body.get("metadata") or {}).get("name") or ""
            causes = [{"reason": "FieldValueInvalid", "message": what, "field": path} for path, what in errors]
            kind = validation.KINDS.get(plural, plural)
            raise kube_error(
                422, "Invalid", validation.invalid_message(plural, name, errors), name=name, kind=kind, causes=causes
            )

    def _not_found(self, request: rendering.Request) -> kmock.KubernetesError:
        assert request.resource is not None
        plural = request.resource.plural
        return kube_error(404, "NotFound", f'{plural} "{request.name}" not found', name=request.name, kind=plural)

    async def _write(self, resource: kmock.resource, type_: str, obj: Body, old: Body | None) -> Body:
        """Record a new version (or a deletion) with a fresh resourceVersion, and announce it."""
        self._counter += 1
        obj["metadata"]["resourceVersion"] = str(self._counter)
        meta = obj["metadata"]
        key = (resource, meta.get("namespace"), meta["name"])
        if type_ == "DELETED":
            self._objects[key].delete()
        elif key in self._objects:
            self._objects[key].history.append(copy.deepcopy(obj))
        else:
            self._objects[key] = copy.deepcopy(obj)
        event = _Event(resource, self._counter, type_, copy.deepcopy(obj), old)
        self._history.append(event)
        await self._buses[resource].put(event)
        return obj

    async def _remove(self, resource: kmock.resource, obj: Body, orphan: bool = False) -> None:
        """Really delete an object, then its dependents (owner GC), depth first."""
        await self._write(resource, "DELETED", copy.deepcopy(obj), obj)
        uid = obj["metadata"]["uid"]
        live_uids = {o.raw["metadata"].get("uid") for o in self._objects.values() if not o.deleted}
        for (dep_resource, _, _), stored in list(self._objects.items()):
            if stored.deleted:
                continue
            dep = copy.deepcopy(stored.raw)
            refs = dep["metadata"].get("ownerReferences") or []
            if not any(ref.get("uid") == uid for ref in refs):
                continue
            if orphan:
                dep["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != uid] or None
                dep["metadata"] = {k: v for k, v in dep["metadata"].items() if v is not None}
                await self._write(dep_resource, "MODIFIED", dep, copy.deepcopy(stored.raw))
            elif not any(ref.get("uid") in live_uids for ref in refs):  # kept while any owner lives
                await self._delete_obj(dep_resource, dep)

    async def _delete_obj(self, resource: kmock.resource, obj: Body, orphan: bool = False) -> Body | None:
        """Delete as the API server does: finalizers postpone it; returns the object if it remains."""
        meta = obj["metadata"]
        if meta.get("deletionTimestamp"):
            return obj
        if meta.get("finalizers"):
            old = copy.deepcopy(obj)
            meta["deletionTimestamp"] = now_rfc3339()
            meta["generation"] = meta.get("generation", 0) + 1
            return await self._write(resource, "MODIFIED", obj, old)
        await self._remove(resource, obj, orphan=orphan)
        return None

    async def _update(
        self, request: rendering.Request, info: kmock.ResourceInfo, old: Body, new: Any
    ) -> rendering.Payload:
        """Store an updated body: keep server-managed fields, isolate status, bump versions."""
        assert request.resource is not None
        if not isinstance(new, dict) or not isinstance(new.get("metadata", {}), dict):
            raise kube_error(422, "Invalid", "the object must be a JSON object with metadata")
        new_rv = (new.get("metadata") or {}).get("resourceVersion")
        if new_rv not in (None, "", old["metadata"]["resourceVersion"]):
            raise kube_error(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {request.resource.plural} "{request.name}": '
                "the object has been modified; please apply your changes to the latest version",
            )
        new.setdefault("metadata", {})
        if "status" in info.subresources:
            main = copy.deepcopy(old) if request.subresource == "status" else new
            status_from = new if request.subresource == "status" else old
            if "status" in status_from:
                main["status"] = copy.deepcopy(status_from["status"])
            else:
                main.pop("status", None)
            new = main
        meta = new["metadata"]
        for field in _MANAGED_META:
            if field in old["metadata"]:
                meta[field] = old["metadata"][field]
            else:
                meta.pop(field, None)
        meta["resourceVersion"] = old["metadata"]["resourceVersion"]
        new["apiVersion"], new["kind"] = old["apiVersion"], old["kind"]
        if meta.get("deletionTimestamp") and set(meta.get("finalizers") or ()) - set(
            old["metadata"].get("finalizers") or ()
        ):
            raise kube_error(422, "Invalid", "Forbidden: no new finalizers can be added if the object is being deleted")
        if new == old:  # a no-op write changes nothing and notifies nobody, as in the API server
            return old
        if request.resource.plural == "services":
            new = validation.keep_allocated(new, old)
        self._validate(request.resource, new, old)
        ignored = ("metadata", "status") if "status" in info.subresources else ("metadata",)
        if {k: v for k, v in new.items() if k not in ignored} != {k: v for k, v in old.items() if k not in ignored}:
            meta["generation"] = meta.get("generation", 0) + 1
        await self._write(request.resource, "MODIFIED", new, old)
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            await self._remove(request.resource, new)  # the last finalizer is gone
        return new

    # --- writers (called under the lock; return the response payload) ----------------------------

    async def _create(self, request: rendering.Request, info: kmock.ResourceInfo) -> rendering.Payload:
        assert request.resource is not None
        body = self._admitted.pop(id(request), request.data)
        if not isinstance(body, dict) or not isinstance(body.get("metadata", {}), dict):
            raise kube_error(400, "BadRequest", "the body must be a JSON object")
        body = copy.deepcopy(body)
        meta = body.setdefault("metadata", {})
        if info.namespaced:
            if request.namespace is None:
                raise kube_error(404, "NotFound", "namespaced resources are created in a namespace URL")
            if meta.get("namespace") not in (None, request.namespace):
                raise kube_error(400, "BadRequest", "the namespace of the object does not match the URL")
            meta["namespace"] = request.namespace
        elif request.namespace is not None:
            raise kube_error(404, "NotFound", f"{request.resource.plural} are not namespaced")
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise kube_error(422, "Invalid", "metadata.name: Required value: name or generateName is required")
            while True:  # a real server retries a taken random name too
                meta["name"] = meta["generateName"] + "".join(random.choices(_NAME_ALPHABET, k=5))
                if self._live((request.resource, meta.get("namespace"), meta["name"])) is None:
                    break
        if self._live((request.resource, meta.get("namespace"), meta["name"])) is not None:
            raise kube_error(
                409,
                "AlreadyExists",
                f'{request.resource.plural} "{meta["name"]}" already exists',
                name=meta["name"],
                kind=request.resource.plural,
            )
        for field in ("deletionTimestamp", "resourceVersion"):
            meta.pop(field, None)
        self._validate(request.resource, body, None)
        ip = ""
        if request.resource.plural == "services" and not (body.get("spec") or {}).get("clusterIP"):
            self._cluster_ips += 1
            ip = f"10.96.{(10 + self._cluster_ips) // 256}.{(10 + self._cluster_ips) % 256}"
        body = validation.defaults(str(request.resource.plural), body, ip)
        meta = body["metadata"]
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
        body["apiVersion"] = self._api_version(request.resource)
        body["kind"] = info.kind or request.resource.plural
        if "status" in info.subresources and request.resource.plural != "nodes":  # kubelets create with status
            body.pop("status", None)
        obj = await self._write(request.resource, "ADDED", body, None)
        refs = meta.get("ownerReferences") or []
        live_uids = {o.raw["metadata"].get("uid") for o in self._objects.values() if not o.deleted}
        if refs and not any(ref.get("uid") in live_uids for ref in refs):
            # The garbage collector deletes a dependent whose owners are all gone, e.g. one
            # created by a controller that had read its owner just before the owner's deletion.
            await self._delete_obj(request.resource, copy.deepcopy(obj))
        return rendering.Response(status=201, payload=obj)

    async def _patch(self, request: rendering.Request, info: kmock.ResourceInfo) -> rendering.Payload:
        old = self._live(self._key(request, info))
        if old is None:
            raise self._not_found(request)
        content_type = next((v for k, v in request.headers.items() if k.lower() == "content-type"), "")
        content_type = content_type.split(";")[0].strip()
        if content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            if not isinstance(request.data, dict):
                raise kube_error(400, "BadRequest", "a merge patch must be a JSON object")
            new = merge_patch(old, request.data)
        elif content_type == "application/json-patch+json":
            try:
                new = jsonpatch.apply_patch(old, request.data, in_place=False)
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException, TypeError) as e:
                # A failed `test` op is how kopf's optimistic concurrency notices newer changes.
                raise kube_error(422, "Invalid", f"the JSON patch cannot be applied: {e}") from e
        else:
            raise kube_error(415, "UnsupportedMediaType", f"the patch content type {content_type!r} is unsupported")
        return await self._update(request, info, old, new)

    async def _replace(self, request: rendering.Request, info: kmock.ResourceInfo) -> rendering.Payload:
        old = self._live(self._key(request, info))
        if old is None:
            raise self._not_found(request)
        new = copy.deepcopy(request.data)
        if not isinstance(new, dict):
            raise kube_error(400, "BadRequest", "the body must be a JSON object")
        meta = new.get("metadata") or {}
        if meta.get("name") not in (None, request.name):
            raise kube_error(400, "BadRequest", "the name of the object does not match the URL")
        if not meta.get("resourceVersion"):
            raise kube_error(422, "Invalid", "metadata.resourceVersion: must be specified for an update")
        return await self._update(request, info, old, new)

    async def _delete(self, request: rendering.Request, info: kmock.ResourceInfo) -> rendering.Payload:
        assert request.resource is not None
        obj = self._live(self._key(request, info))
        if obj is None:
            raise self._not_found(request)
        options = request.data if isinstance(request.data, dict) else {}
        policy = request.params.get("propagationPolicy") or options.get("propagationPolicy")
        remaining = await self._delete_obj(request.resource, obj, orphan=policy == "Orphan")
        if remaining is not None:
            return remaining
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {
                "name": request.name,
                "group": request.resource.group,
                "kind": request.resource.plural,
                "uid": obj["metadata"]["uid"],
            },
        }

    # --- kmock's fallback reactions (responses) ----------------------------------------------------

    async def _serve_create(self, request: rendering.Request) -> rendering.Payload:
        return self._outcomes.pop(id(request))

    async def _serve_update(self, request: rendering.Request) -> rendering.Payload:
        return self._outcomes.pop(id(request))

    async def _serve_delete(self, request: rendering.Request) -> rendering.Payload:
        return self._outcomes.pop(id(request))

    async def _serve_replace(self, request: rendering.Request) -> rendering.Payload:
        if id(request) not in self._outcomes:  # a PUT to a non-object path
            raise kmock.KubernetesEndpointNotFoundError()
        return self._outcomes.pop(id(request))

    async def _serve_fetch(self, request: rendering.Request) -> rendering.Payload:
        assert request.resource is not None
        async with self._lock:
            obj = self._live(self._key(request, self._resources[request.resource]))
        if obj is None:
            raise self._not_found(request)
        return obj

    def _matcher(self, request: rendering.Request) -> Callable[[Body], bool]:
        """A predicate for the objects a list/watch request selects (URL, name, selectors)."""
        labels = parse_label_selector(request.params.get("labelSelector", ""))
        plural = str(request.resource.plural or "") if request.resource is not None else ""
        fields = parse_field_selector(request.params.get("fieldSelector", ""), plural)

        def matches(obj: Body) -> bool:
            meta = obj.get("metadata", {})
            return (
                (request.namespace is None or meta.get("namespace") == request.namespace)
                and (request.name is None or meta.get("name") == request.name)
                and all(req(meta.get("labels") or {}) for req in labels)
                and all(req(obj) for req in fields)
            )

        return matches

    def _selected(self, request: rendering.Request, matches: Callable[[Body], bool]) -> list[Body]:
        objs = [
            copy.deepcopy(stored.raw)
            for (resource, _, _), stored in self._objects.items()
            if resource == request.resource and not stored.deleted
        ]
        # etcd returns lists ordered by key: namespace, then name.
        objs.sort(key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"]["name"]))
        return [obj for obj in objs if matches(obj)]

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        assert request.resource is not None
        info = self._resources[request.resource]
        matches = self._matcher(request)
        async with self._lock:
            items = self._selected(request, matches)
            rv = self._counter
        return {
            "kind": f"{info.kind or request.resource.plural}List",
            "apiVersion": self._api_version(request.resource),
            "metadata": {"resourceVersion": str(rv)},
            "items": items,
        }

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        assert request.resource is not None
        info = self._resources[request.resource]
        matches = self._matcher(request)  # before the first chunk: a bad selector is a plain 400
        since = request.params.get("resourceVersion", "")
        timeout = float(request.params.get("timeoutSeconds", 0)) or None
        yield b""  # send the headers now: a client waits for them before it sees any event

        bus = self._buses[request.resource]
        async with self._lock:  # mark the bus and snapshot atomically: no event lost or repeated
            marker = await bus.mark()
            if since in ("", "0"):  # "any version": synthetic ADDED events for the current state
                backlog = [_Event(request.resource, 0, "ADDED", o) for o in self._selected(request, matches)]
            else:
                backlog = [e for e in self._history if e.resource == request.resource and e.rv > int(since)]
            rv = self._counter
        try:
            for event in backlog:
                if (shown := self._show(event, matches)) is not None:
                    yield shown
            if request.params.get("sendInitialEvents") == "true":
                yield {
                    "type": "BOOKMARK",
                    "object": {
                        "kind": info.kind,
                        "apiVersion": self._api_version(request.resource),
                        "metadata": {
                            "resourceVersion": str(rv),
                            "annotations": {"k8s.io/initial-events-end": "true"},
                        },
                    },
                }
            deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
            stream = aiter(bus.stream(since=marker))
            while not self._closed:
                remaining = None if deadline is None else deadline - asyncio.get_running_loop().time()
                if remaining is not None and remaining <= 0:
                    return
                try:
                    event = await asyncio.wait_for(anext(stream), remaining)
                except TimeoutError:
                    return  # timeoutSeconds: the server ends the stream; clients re-watch
                if event is None:  # close_watches()
                    return
                if (shown := self._show(event, matches)) is not None:
                    yield shown
        finally:
            await bus.unmark(marker)

    @staticmethod
    def _show(event: _Event, matches: Callable[[Body], bool]) -> Body | None:
        """The event as this watcher sees it: selectors turn MODIFIED into ADDED/DELETED."""
        now = matches(event.obj)
        before = event.old is not None and matches(event.old)
        if event.type == "MODIFIED":
            type_ = "MODIFIED" if now and before else "ADDED" if now else "DELETED" if before else None
        else:
            type_ = event.type if (now or before) else None
        return None if type_ is None else {"type": type_, "object": event.obj}


__all__ = [
    "Admission",
    "KubeEmulator",
    "kube_error",
    "merge_patch",
    "now_rfc3339",
    "parse_field_selector",
    "parse_label_selector",
]
