"""A checker of the Kubernetes Pod Security Standards (``baseline`` and ``restricted``), for tests.

No kube-apiserver runs here, so the Pod Security admission controller cannot judge our pods; this
module applies the same rules to a pod, a pod template or a workload (Deployment, Job...) and names
every field that breaks one. The rules and their allowed values are those of
kubernetes.io/docs/concepts/security/pod-security-standards (the ``latest`` version of each check in
k8s.io/pod-security-admission/policy, Kubernetes 1.30 to 1.35). Used on the chart's operator
Deployment (tests/test_chart.py) and on the warm-up and expiry pods the operator creates (tests/test_pod_security.py).

Not covered: Windows pods (``spec.os.name: windows`` relaxes some restricted checks) are judged as
Linux pods, which is stricter, never looser.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

BASELINE = "baseline"
RESTRICTED = "restricted"

# Capabilities baseline lets a container add (Docker's default set).
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
# The "safe" namespaced sysctls (the list as of Kubernetes 1.29).
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
# The only volume sources restricted allows (the core types that cannot reach the node or a host).
RESTRICTED_VOLUMES = frozenset(
    {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
)
SECCOMP_RESTRICTED = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")


def pod_template(obj: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """(metadata, spec) of a pod spec, a Pod, a pod template, or the pod a workload (Deployment, Job...) makes."""
    if "containers" in obj:  # a bare pod spec, as the operator's Job templates hold it
        return {}, obj
    if obj.get("kind") == "CronJob":
        obj = obj["spec"]["jobTemplate"]
    if obj.get("kind") not in (None, "Pod"):
        obj = obj["spec"]["template"]
    return obj.get("metadata") or {}, obj["spec"]


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any], Mapping[str, Any]]]:
    """(path, container, its securityContext) of every container, init and ephemeral one."""
    for field in CONTAINER_LISTS:
        for index, container in enumerate(spec.get(field) or []):
            yield f"spec.{field}[{index}]", container, container.get("securityContext") or {}


def _baseline(meta: Mapping[str, Any], spec: Mapping[str, Any]) -> Iterator[str]:
    pod = spec.get("securityContext") or {}
    if (pod.get("windowsOptions") or {}).get("hostProcess"):
        yield "spec.securityContext.windowsOptions.hostProcess: must be unset or false"
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            yield f"spec.{field}: host namespaces are forbidden"
    for index, volume in enumerate(spec.get("volumes") or []):
        if "hostPath" in volume:
            yield f"spec.volumes[{index}].hostPath: forbidden"
    for key, value in (meta.get("annotations") or {}).items():
        if key.startswith(APPARMOR_ANNOTATION) and value != "runtime/default" and not value.startswith("localhost/"):
            yield f"metadata.annotations[{key}]={value}: AppArmor must be runtime/default or localhost/*"
    yield from _apparmor("spec.securityContext", pod)
    yield from _selinux("spec.securityContext", pod)
    if (pod.get("seccompProfile") or {}).get("type") == "Unconfined":
        yield "spec.securityContext.seccompProfile.type: Unconfined is forbidden"
    for index, sysctl in enumerate(pod.get("sysctls") or []):
        if sysctl.get("name") not in SAFE_SYSCTLS:
            yield f"spec.securityContext.sysctls[{index}].name={sysctl.get('name')}: not a safe sysctl"
    for path, container, context in _containers(spec):
        if (context.get("windowsOptions") or {}).get("hostProcess"):
            yield f"{path}.securityContext.windowsOptions.hostProcess: must be unset or false"
        if context.get("privileged"):
            yield f"{path}.securityContext.privileged: must be unset or false"
        added = set((context.get("capabilities") or {}).get("add") or ()) - BASELINE_CAPABILITIES
        if added:
            yield f"{path}.securityContext.capabilities.add: {sorted(added)} beyond the baseline set"
        for port_index, port in enumerate(container.get("ports") or []):
            if port.get("hostPort"):
                yield f"{path}.ports[{port_index}].hostPort: must be unset or 0"
        yield from _apparmor(f"{path}.securityContext", context)
        yield from _selinux(f"{path}.securityContext", context)
        if context.get("procMount", "Default") != "Default":
            yield f"{path}.securityContext.procMount: must be unset or Default"
        if (context.get("seccompProfile") or {}).get("type") == "Unconfined":
            yield f"{path}.securityContext.seccompProfile.type: Unconfined is forbidden"


def _apparmor(path: str, context: Mapping[str, Any]) -> Iterator[str]:
    kind = (context.get("appArmorProfile") or {}).get("type")
    if kind is not None and kind not in ("RuntimeDefault", "Localhost"):
        yield f"{path}.appArmorProfile.type={kind}: must be RuntimeDefault or Localhost"


def _selinux(path: str, context: Mapping[str, Any]) -> Iterator[str]:
    options = context.get("seLinuxOptions") or {}
    if options.get("type", "") not in SELINUX_TYPES:
        yield f"{path}.seLinuxOptions.type={options['type']}: not a container type"
    for field in ("user", "role"):
        if options.get(field):
            yield f"{path}.seLinuxOptions.{field}: must be unset"


def _restricted(spec: Mapping[str, Any]) -> Iterator[str]:
    pod = spec.get("securityContext") or {}
    for index, volume in enumerate(spec.get("volumes") or []):
        sources = set(volume) - {"name"}
        if not sources <= RESTRICTED_VOLUMES:
            yield f"spec.volumes[{index}]: volume type {sorted(sources - RESTRICTED_VOLUMES)} is not allowed"
    if pod.get("runAsUser") == 0:
        yield "spec.securityContext.runAsUser: must not be 0"
    pod_non_root = pod.get("runAsNonRoot") is True
    if pod.get("runAsNonRoot") is False:
        yield "spec.securityContext.runAsNonRoot: must be true"
    pod_seccomp = (pod.get("seccompProfile") or {}).get("type")
    if pod_seccomp is not None and pod_seccomp not in SECCOMP_RESTRICTED:
        yield f"spec.securityContext.seccompProfile.type={pod_seccomp}: must be RuntimeDefault or Localhost"
    for path, _container, context in _containers(spec):
        if context.get("allowPrivilegeEscalation") is not False:
            yield f"{path}.securityContext.allowPrivilegeEscalation: must be false"
        if context.get("runAsNonRoot") is False or (not pod_non_root and context.get("runAsNonRoot") is not True):
            yield f"{path}.securityContext.runAsNonRoot: must be true (here or in the pod's securityContext)"
        if context.get("runAsUser") == 0:
            yield f"{path}.securityContext.runAsUser: must not be 0"
        seccomp = (context.get("seccompProfile") or {}).get("type")
        if seccomp is None and pod_seccomp is None:
            yield f"{path}.securityContext.seccompProfile: RuntimeDefault or Localhost (here or in the pod's)"
        elif seccomp is not None and seccomp not in SECCOMP_RESTRICTED:
            yield f"{path}.securityContext.seccompProfile.type={seccomp}: must be RuntimeDefault or Localhost"
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or ()):
            yield f"{path}.securityContext.capabilities.drop: must contain ALL"
        added = set(capabilities.get("add") or ()) - RESTRICTED_CAPABILITIES
        if added:
            yield f"{path}.securityContext.capabilities.add: only NET_BIND_SERVICE, not {sorted(added)}"


def violations(obj: Mapping[str, Any], level: str = RESTRICTED) -> list[str]:
    """Every field of the pod (or the pod a workload makes) that breaks the Pod Security level; [] if none."""
    if level not in (BASELINE, RESTRICTED):
        raise ValueError(f"unknown Pod Security level {level!r}")
    meta, spec = pod_template(obj)
    found = list(_baseline(meta, spec))
    if level == RESTRICTED:
        found += _restricted(spec)
    return found
