"""The local cluster's "cluster DNS": how a pod of a multi-host Job reaches its peers on one machine.

On a real cluster an Indexed Job's pod ``<job>-<i>`` with ``subdomain: <svc>`` gets the DNS name
``<job>-<i>.<svc>.<namespace>.svc.cluster.local`` once a headless Service ``<svc>`` of its
namespace selects it; each pod has its own IP, so every pod may listen on the same port. Here
every pod is a process of this machine: one address (``127.0.0.1``) and one set of ports. So,
**unlike a real cluster**, the local kubelet rewrites the names instead of resolving them:

* In a container's ``env`` values, ``args`` and ``command``, a host name of such a pod —
  ``<host>.<svc>`` (the pod's own namespace), ``<host>.<svc>.<ns>``, ``<host>.<svc>.<ns>.svc``
  or ``<host>.<svc>.<ns>.svc.cluster.local`` (what a pod's DNS search path makes of them) — is
  replaced by ``127.0.0.1`` (:func:`map_hosts`, pure, like ``pods.map_value`` for paths).
* The ports written after such a name (``host:port``) move into a block of ports allocated to
  that Job alone (:func:`allocate_block`: at least 4 consecutive ports, all free when allocated,
  and none given to another live Job), so that two multi-host Jobs running at once never
  collide. A Job's block spans the lowest port its template names for its own hosts to the
  highest plus 3 (the warmer uses ``port..port+3``); :func:`port_map` keeps the offsets.
* The rewrite happens once, when the container starts: the Service must exist by then (a
  real pod would retry its lookups until it does; create the Service before the Job). A name
  resolves only if the Service is headless and its selector selects that pod's labels, as
  the endpoints behind a real record require (``publishNotReadyAddresses`` is moot here: a
  local pod is reachable as soon as it runs).
* Only Indexed Jobs' pods are named this way (their hostnames are known before the pods
  exist: ``<job>-<index>``, index < completions); a bare pod's ``hostname`` is not resolved.
  Ports not named in the Job's own template keep their number. Names inside program text are
  rewritten too (a name is a name wherever it is written), other DNS names are left alone.
"""

from __future__ import annotations

import random
import re
import socket
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from compilecache.cache.cacheenv import GROUP_PORTS
from compilecache.local.admission import selector_matches

LOCAL_ADDRESS = "127.0.0.1"
CLUSTER_DOMAIN = "cluster.local"  # the kubelet's default --cluster-domain
BLOCK_MIN = GROUP_PORTS  # a named port is a warmer's coordinator: its groups use the next ports too
INDEX_KEY = "batch.kubernetes.io/job-completion-index"
# Below Linux's default ephemeral range (32768-60999): outgoing connections do not take these.
PORT_RANGE = (20000, 32000)

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
# A dotted DNS name not inside a longer name or a path (but after a URL's //), then an optional :port.
_HOST_PORT = re.compile(rf"(?:(?<=//)|(?<![\w./-]))({_LABEL}(?:\.{_LABEL})+)(?::(\d{{1,5}}))?(?![\w-])")


@dataclass(frozen=True)
class Host:
    """Where a cluster DNS name leads on this machine: an address and the Job's port map."""

    address: str = LOCAL_ADDRESS
    ports: Mapping[int, int] = field(default_factory=dict)  # container port → local port


HostTable = Mapping[str, Host]  # lower-case DNS name → where it leads


def map_hosts(value: str, table: HostTable) -> str:
    """``value`` with every cluster DNS name of ``table`` (and the port after it) rewritten."""
    if not table:
        return value

    def rewrite(match: re.Match[str]) -> str:
        host = table.get(match[1].lower())
        if host is None:
            return match[0]
        if match[2] is None:
            return host.address
        port = int(match[2])
        return f"{host.address}:{host.ports.get(port, port)}"

    return _HOST_PORT.sub(rewrite, value)


def names_of(hostname: str, subdomain: str, namespace: str, from_namespace: str) -> list[str]:
    """The names a pod of ``from_namespace`` may use for ``<hostname>.<subdomain>`` of ``namespace``.

    A pod's resolv.conf searches ``<ns>.svc.cluster.local svc.cluster.local cluster.local``,
    so the short forms work too; ``<hostname>.<subdomain>`` alone only within the namespace.
    """
    base = f"{hostname}.{subdomain}"
    names = [f"{base}.{namespace}", f"{base}.{namespace}.svc", f"{base}.{namespace}.svc.{CLUSTER_DOMAIN}"]
    return [base, *names] if namespace == from_namespace else names


def is_indexed(job: Mapping[str, Any]) -> bool:
    """Whether the Job is an Indexed Job."""
    return (job.get("spec") or {}).get("completionMode") == "Indexed"


def pod_labels(job: Mapping[str, Any], index: int | None) -> dict[str, str]:
    """The labels the Job controller gives a pod of the Job (``index``: its completion index, if Indexed)."""
    template = (job.get("spec") or {}).get("template") or {}
    meta = job["metadata"]
    labels = {
        **((template.get("metadata") or {}).get("labels") or {}),
        "job-name": meta["name"],
        "batch.kubernetes.io/job-name": meta["name"],
        "controller-uid": meta["uid"],
        "batch.kubernetes.io/controller-uid": meta["uid"],
    }
    if index is not None:
        labels[INDEX_KEY] = str(index)
    return labels


def indexed_hosts(job: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(hostname, subdomain)`` of every pod an Indexed Job with a pod ``subdomain`` will have."""
    spec = job.get("spec") or {}
    subdomain = ((spec.get("template") or {}).get("spec") or {}).get("subdomain")
    if not is_indexed(job) or not subdomain:
        return []
    name = job["metadata"]["name"]
    return [(f"{name}-{index}", str(subdomain)) for index in range(int(spec.get("completions") or 1))]


def job_hosts(job: Mapping[str, Any], services: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """``(hostname, subdomain)`` of the Job's pods that a headless Service of its namespace selects."""
    hosts = indexed_hosts(job)
    if not hosts:
        return []
    subdomain = hosts[0][1]
    namespace = job["metadata"].get("namespace")
    service = next(
        (
            s
            for s in services
            if s["metadata"]["name"] == subdomain
            and s["metadata"].get("namespace") == namespace
            and (s.get("spec") or {}).get("clusterIP") == "None"
        ),
        None,
    )
    if service is None:
        return []
    selector = (service.get("spec") or {}).get("selector")
    if not selector:  # a Service without a selector has no endpoints the DNS would serve
        return []
    return [
        (hostname, subdomain)
        for index, (hostname, subdomain) in enumerate(hosts)
        if selector_matches({"matchLabels": selector}, pod_labels(job, index))
    ]


def _template_values(job: Mapping[str, Any]) -> Iterable[str]:
    pod_spec = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    for container in [*(pod_spec.get("initContainers") or []), *(pod_spec.get("containers") or [])]:
        yield from (str(part) for part in container.get("command") or [])
        yield from (str(part) for part in container.get("args") or [])
        yield from (str(item["value"]) for item in container.get("env") or [] if "value" in item)


def named_ports(job: Mapping[str, Any], names: Collection[str]) -> set[int]:
    """The ports the Job's template writes after one of ``names`` (``host:port``)."""
    wanted = {name.lower() for name in names}
    return {
        int(match[2])
        for value in _template_values(job)
        for match in _HOST_PORT.finditer(value)
        if match[2] is not None and match[1].lower() in wanted
    }


def block_size(ports: Collection[int]) -> int:
    """How many consecutive ports a Job naming ``ports`` needs (at least :data:`BLOCK_MIN`)."""
    return max(ports) + BLOCK_MIN - min(ports) if ports else BLOCK_MIN


def port_map(ports: Collection[int], base: int) -> dict[int, int]:
    """Container port → local port: the span ``min(ports)..max(ports)+3`` moved to start at ``base``."""
    if not ports:
        return {}
    low = min(ports)
    return {low + offset: base + offset for offset in range(block_size(ports))}


def job_names(job: Mapping[str, Any]) -> list[str]:
    """Every name (each form) of the Job's pods, Service or not: what sizes its port block (:func:`named_ports`)."""
    namespace = job["metadata"].get("namespace") or ""
    return [
        name
        for hostname, subdomain in indexed_hosts(job)
        for name in names_of(hostname, subdomain, namespace, namespace)
    ]


def job_block_size(job: Mapping[str, Any]) -> int:
    """How many ports the Job's block needs (from its template alone: known before its Service exists)."""
    return block_size(named_ports(job, job_names(job)))


def host_table(
    namespace: str,
    jobs: Sequence[Mapping[str, Any]],
    services: Sequence[Mapping[str, Any]],
    blocks: Mapping[str, int],
) -> dict[str, Host]:
    """The names a pod of ``namespace`` resolves, from the Indexed Jobs that have a port block.

    ``blocks``: Job uid → the first port of its block (:func:`allocate_block`).
    """
    table: dict[str, Host] = {}
    for job in jobs:
        base = blocks.get(job["metadata"]["uid"])
        if base is None:
            continue
        ports = port_map(named_ports(job, job_names(job)), base)
        job_namespace = job["metadata"].get("namespace") or ""
        for hostname, subdomain in job_hosts(job, services):
            for name in names_of(hostname, subdomain, job_namespace, namespace):
                table[name.lower()] = Host(LOCAL_ADDRESS, ports)
    return table


def port_is_free(port: int) -> bool:
    """Whether nothing listens on ``port`` (IPv4 and, where there is one, IPv6: JAX binds ``[::]``)."""
    families = [(socket.AF_INET, "0.0.0.0")]  # a probe bind on every address, closed at once
    if socket.has_ipv6:
        families.append((socket.AF_INET6, "::"))
    for family, address in families:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind((address, port))
        except OSError as error:
            if family == socket.AF_INET6 and error.errno in (97, 99):  # no IPv6 on this machine
                continue
            return False
    return True


def allocate_block(
    size: int,
    reserved: Collection[int],
    *,
    rng: random.Random | None = None,
    is_free: Any = port_is_free,
    port_range: tuple[int, int] = PORT_RANGE,
) -> int:
    """The first port of ``size`` consecutive ports, none ``reserved`` and all free now.

    Starts at a random port of ``port_range`` (two local clusters on one machine, e.g. tests
    run side by side, rarely pick the same block), then scans upwards and wraps around.
    """
    low, high = port_range
    span = high - low - size
    if span <= 0:
        raise ValueError(f"no block of {size} ports fits in {low}..{high}")
    start = (rng or random.Random()).randrange(span)
    for step in range(span):
        base = low + (start + step) % span
        ports = range(base, base + size)
        if not any(port in reserved for port in ports) and all(is_free(port) for port in ports):
            return base
    raise RuntimeError(f"no {size} consecutive free ports in {low}..{high}")
