"""What kube-apiserver validates and defaults for built-in kinds, where the local cluster relies on it (pure).

The local API server (``apiserver.KubeEmulator``) calls :func:`validate` on every create and
update and :func:`defaults` on every create. It covers what the product's manifests could get
wrong and a real API server would refuse with ``422 Invalid``: a Service's name and cluster IP
(multi-host warm-ups use a headless Service), a Pod's ``hostname`` and ``subdomain`` (an
Indexed Job's pods are named ``<job>-<index>`` by the Job controller, so a long Job name gives
an invalid pod). Everything else is stored as sent (see ``apiserver`` for the remaining gaps).

How we know the real server does the same (kubernetes ``pkg/apis/core/validation/validation.go``):

* ``ValidateServiceName = apimachineryvalidation.NameIsDNS1035Label``: a Service name is a
  DNS-1035 label (the Service docs: "The name of a Service object must be a valid RFC 1035
  label name"), because it becomes a DNS label of ``<svc>.<ns>.svc.cluster.local``.
* ``ValidateService``: ``spec.clusterIP`` is ``None`` (headless, "Headless Services" in the
  Service docs), empty (allocated) or an IP; ``None`` only for ``type: ClusterIP``; ``ports``
  are required unless the Service is headless; each port is 1..65535, named when there are
  several, names unique; ``ValidateServiceUpdate``: ``clusterIP`` may not change once set.
* ``ValidatePodSpec``: ``hostname`` and ``subdomain``, when set, are DNS-1123 labels.

A CompileCache's ``status`` is checked against the CRD's status schema (``api.bounds``: the
types, formats and bounds the model declares), as apiextensions-apiserver validates a custom object
on every write, so that a status the real server refuses with 422 is refused here too (an integer
past int64, a count of the wrong type); its CEL rules and its spec are not checked here. A request
body that is not JSON, as Python's ``json`` writes ``NaN`` and ``Infinity``, or nests deeper than
10000 levels, is refused with 400 by :func:`undecodable`, as the real server's decoder refuses it
("error decoding patch", "exceeded max depth").

Messages follow the real ones (``field.ErrorList`` rendered as ``<Kind> "<name>" is invalid: ...``)
so that a test or a person reading a local failure sees what a cluster would say.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from compilecache.api import bounds

DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
LABEL_MAX = 63
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")

_DNS1035_MESSAGE = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
    "character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for "
    "validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)
_DNS1123_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start "
    "and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)

# A field error: (field path, what is wrong), as kube-apiserver's field.Error renders it.
FieldError = tuple[str, str]


def dns1035_label(value: str) -> list[str]:
    """Why ``value`` is not a DNS-1035 label (``IsDNS1035Label``); empty when it is one."""
    errors = [] if len(value) <= LABEL_MAX else [f"must be no more than {LABEL_MAX} characters"]
    return errors if DNS1035.fullmatch(value) else [*errors, _DNS1035_MESSAGE]


def dns1123_label(value: str) -> list[str]:
    """Why ``value`` is not a DNS-1123 label (``IsDNS1123Label``); empty when it is one."""
    errors = [] if len(value) <= LABEL_MAX else [f"must be no more than {LABEL_MAX} characters"]
    return errors if DNS1123_LABEL.fullmatch(value) else [*errors, _DNS1123_MESSAGE]


def _invalid(path: str, value: Any, reasons: list[str]) -> list[FieldError]:
    shown = f'"{value}"' if isinstance(value, str) else str(value)
    return [(path, f"Invalid value: {shown}: {reason}") for reason in reasons]


def validate_service(service: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> list[FieldError]:
    """The field errors of a Service (``old``: the stored one, on an update)."""
    errors: list[FieldError] = []
    name = (service.get("metadata") or {}).get("name") or ""
    if old is None:  # the name cannot change on an update, and was checked at create
        errors += _invalid("metadata.name", name, dns1035_label(name))
    spec = service.get("spec") or {}
    kind = spec.get("type") or "ClusterIP"
    if kind not in SERVICE_TYPES:
        errors.append(("spec.type", f'Unsupported value: "{kind}": supported values: {", ".join(SERVICE_TYPES)}'))
    cluster_ip = spec.get("clusterIP") or ""
    headless = cluster_ip == "None"
    if headless and kind != "ClusterIP":
        errors.append(("spec.clusterIP", f"Invalid value: \"None\": may not be set to 'None' for {kind} services"))
    elif cluster_ip and not headless:
        try:
            ipaddress.ip_address(cluster_ip)
        except ValueError:
            errors += _invalid(
                "spec.clusterIP", cluster_ip, ["must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"]
            )
    if old is not None:
        before = (old.get("spec") or {}).get("clusterIP") or ""
        if before and cluster_ip != before:
            errors.append(("spec.clusterIPs[0]", f'Invalid value: "{cluster_ip}": may not change once set'))
    ports = spec.get("ports") or []
    if not ports and not headless and kind != "ExternalName":
        errors.append(("spec.ports", "Required value"))
    names: set[str] = set()
    for index, port in enumerate(ports):
        path = f"spec.ports[{index}]"
        port_name = port.get("name") or ""
        if len(ports) > 1 and not port_name:
            errors.append((f"{path}.name", "Required value"))
        elif port_name in names:
            errors.append((f"{path}.name", f'Duplicate value: "{port_name}"'))
        names.add(port_name)
        number = port.get("port")
        if not isinstance(number, int) or not 1 <= number <= 65535:
            errors += _invalid(f"{path}.port", number, ["must be between 1 and 65535, inclusive"])
    return errors


def validate_pod(pod: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> list[FieldError]:
    """The field errors of a Pod that the local cluster checks: ``spec.hostname`` and ``spec.subdomain``."""
    spec = pod.get("spec") or {}
    errors: list[FieldError] = []
    for field in ("hostname", "subdomain"):
        if value := spec.get(field):
            errors += _invalid(f"spec.{field}", value, dns1123_label(str(value)))
    return errors


def validate_compilecache(cache: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> list[FieldError]:
    """The field errors of a CompileCache's ``status`` against the CRD's status schema."""
    found = bounds.violations(cache.get("status"), bounds.status_schema(), "status")
    return [(path, f"Invalid value: {why}") for path, _, why in (problem.partition(": ") for problem in found)]


_VALIDATORS = {"services": validate_service, "pods": validate_pod, "compilecaches": validate_compilecache}
KINDS = {"services": "Service", "pods": "Pod", "compilecaches": "CompileCache.compilecache.dev"}
_GROUPS = {"services": "", "pods": "", "compilecaches": "compilecache.dev"}


def validate(
    plural: str, body: Mapping[str, Any], old: Mapping[str, Any] | None = None, group: str = ""
) -> list[FieldError]:
    """The field errors of an object (none for resources not checked here)."""
    validator = _VALIDATORS.get(plural)
    return [] if validator is None or _GROUPS.get(plural) != group else validator(body, old)


def undecodable(body: bytes) -> str | None:
    """Why a request body is not JSON the API server decodes (``NaN``, ``Infinity``, a number past float64,
    objects nested past ``bounds.JSON_DEPTH``), or ``None``; a body that is not JSON at all is left to the
    routing (kmock answers it)."""

    def constant(name: str) -> Any:
        raise _NotJson(f"invalid character {name[0]!r} looking for beginning of value")

    def number(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise _NotJson(f"number {text[:40]} is out of range")
        return value

    try:
        value = json.loads(body, parse_constant=constant, parse_float=number)
    except _NotJson as exc:
        return f"error decoding the request body: {exc}"
    except (ValueError, RecursionError):
        return None
    if _depth(value) > bounds.JSON_DEPTH:
        return f"error decoding the request body: exceeded max depth of {bounds.JSON_DEPTH}"
    return None


def _depth(value: Any) -> int:
    """How deep objects and arrays nest in a decoded JSON value (no recursion: it may be deep)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in children)
    return deepest


class _NotJson(Exception):
    """A body the API server's JSON decoder refuses."""


def invalid_message(plural: str, name: str, errors: list[FieldError]) -> str:
    """The message of a 422 answer, as kube-apiserver writes it."""
    details = ", ".join(f"{path}: {what}" for path, what in errors)
    shown = f"[{details}]" if len(errors) > 1 else details
    return f'{KINDS.get(plural, plural)} "{name}" is invalid: {shown}'


def defaults(plural: str, body: dict[str, Any], next_cluster_ip: str) -> dict[str, Any]:
    """``body`` with the defaults the API server fills in on create (Services only).

    ``next_cluster_ip``: the address to give a ClusterIP Service that asks for none (the real
    allocator picks a free one of the service CIDR; the local one counts up, nothing routes it).
    """
    if plural != "services":
        return body
    spec = body.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    if spec["type"] != "ExternalName":
        if not spec.get("clusterIP"):
            spec["clusterIP"] = next_cluster_ip
        spec["clusterIPs"] = [spec["clusterIP"]]
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
        spec.setdefault("internalTrafficPolicy", "Cluster")
    for port in spec.get("ports") or []:
        port.setdefault("protocol", "TCP")
        port.setdefault("targetPort", port.get("port"))
    return body


def keep_allocated(service: dict[str, Any], old: Mapping[str, Any]) -> dict[str, Any]:
    """An updated Service keeps the cluster IP it was given when the update leaves it out (as the real server)."""
    before = old.get("spec") or {}
    spec = service.get("spec")
    if isinstance(spec, dict) and not spec.get("clusterIP") and before.get("clusterIP"):
        spec["clusterIP"], spec["clusterIPs"] = before["clusterIP"], list(before.get("clusterIPs") or [])
    return service
