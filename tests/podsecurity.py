"""The ``restricted`` Pod Security Standard (which includes ``baseline``), checked on a pod spec.

What kube-apiserver's PodSecurity admission enforces at ``pod-security.kubernetes.io/enforce:
restricted`` (policy version latest, Kubernetes 1.30-1.35), written from the standard
(https://kubernetes.io/docs/concepts/security/pod-security-standards/) and its checks in
``k8s.io/pod-security-admission/policy``: one message per failed control, naming the field.
No API server runs here, so the tests hold the operator's pods to it with this function.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# baseline: capabilities a container may add; restricted allows only NET_BIND_SERVICE.
_RESTRICTED_CAPABILITIES = {"NET_BIND_SERVICE"}
_RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
_SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
_SAFE_SYSCTLS = {
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
_SECCOMP_OK = {"RuntimeDefault", "Localhost"}


def violations(pod_spec: Mapping[str, Any]) -> list[str]:
    """Why ``pod_spec`` (a Pod's ``spec``, a Job's ``spec.template.spec``) fails ``restricted``; [] if it passes."""
    found: list[str] = []
    pod_context: Mapping[str, Any] = pod_spec.get("securityContext") or {}
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(flag):
            found.append(f"spec.{flag} must not be true")
    if (pod_context.get("windowsOptions") or {}).get("hostProcess"):
        found.append("spec.securityContext.windowsOptions.hostProcess must not be true")
    found += _selinux(pod_context, "spec.securityContext")
    for sysctl in pod_context.get("sysctls") or []:
        if sysctl.get("name") not in _SAFE_SYSCTLS:
            found.append(f"spec.securityContext.sysctls: {sysctl.get('name')!r} is not a safe sysctl")
    if pod_context.get("runAsUser") == 0:
        found.append("spec.securityContext.runAsUser must not be 0")
    for index, volume in enumerate(pod_spec.get("volumes") or []):
        kinds = set(volume) - {"name"}
        if not kinds <= _RESTRICTED_VOLUMES:
            found.append(f"spec.volumes[{index}] ({volume.get('name')}): {sorted(kinds)} is not an allowed volume type")
    pod_seccomp = (pod_context.get("seccompProfile") or {}).get("type")
    if pod_seccomp is not None and pod_seccomp not in _SECCOMP_OK:
        found.append(f"spec.securityContext.seccompProfile.type must be RuntimeDefault or Localhost, got {pod_seccomp}")
    pod_apparmor = (pod_context.get("appArmorProfile") or {}).get("type")
    if pod_apparmor == "Unconfined":
        found.append("spec.securityContext.appArmorProfile.type must not be Unconfined")
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for index, container in enumerate(pod_spec.get(kind) or []):
            found += _container(container, f"spec.{kind}[{index}]", pod_context)
    return found


def _container(container: Mapping[str, Any], path: str, pod_context: Mapping[str, Any]) -> list[str]:
    found: list[str] = []
    context: Mapping[str, Any] = container.get("securityContext") or {}
    where = f"{path}.securityContext"
    if context.get("privileged"):
        found.append(f"{where}.privileged must not be true")
    if (context.get("windowsOptions") or {}).get("hostProcess"):
        found.append(f"{where}.windowsOptions.hostProcess must not be true")
    if context.get("procMount", "Default") != "Default":
        found.append(f"{where}.procMount must be Default")
    found += _selinux(context, where)
    if (context.get("appArmorProfile") or {}).get("type") == "Unconfined":
        found.append(f"{where}.appArmorProfile.type must not be Unconfined")
    for port_index, port in enumerate(container.get("ports") or []):
        if port.get("hostPort"):
            found.append(f"{path}.ports[{port_index}].hostPort must be 0 or unset")
    if context.get("allowPrivilegeEscalation") is not False:
        found.append(f"{where}.allowPrivilegeEscalation must be false")
    # runAsNonRoot: the container's own setting, else the pod's; it must end up true.
    non_root = context.get("runAsNonRoot", pod_context.get("runAsNonRoot"))
    if non_root is not True:
        found.append(f"{where}.runAsNonRoot must be true (here or in spec.securityContext)")
    if context.get("runAsUser") == 0:
        found.append(f"{where}.runAsUser must not be 0")
    seccomp = (context.get("seccompProfile") or {}).get("type")
    if seccomp is None:
        seccomp = (pod_context.get("seccompProfile") or {}).get("type")
        if seccomp is None:
            found.append(f"{where}.seccompProfile.type must be set (here or in spec.securityContext)")
    elif seccomp not in _SECCOMP_OK:
        found.append(f"{where}.seccompProfile.type must be RuntimeDefault or Localhost, got {seccomp}")
    capabilities: Mapping[str, Any] = context.get("capabilities") or {}
    if "ALL" not in (capabilities.get("drop") or []):
        found.append(f"{where}.capabilities.drop must include ALL")
    added = set(capabilities.get("add") or []) - _RESTRICTED_CAPABILITIES
    if added:
        found.append(f"{where}.capabilities.add may only hold NET_BIND_SERVICE, got {sorted(added)}")
    return found


def _selinux(context: Mapping[str, Any], where: str) -> list[str]:
    options: Mapping[str, Any] = context.get("seLinuxOptions") or {}
    found = []
    if options.get("type", "") not in _SELINUX_TYPES:
        found.append(f"{where}.seLinuxOptions.type {options['type']!r} is not allowed")
    for key in ("user", "role"):
        if options.get(key):
            found.append(f"{where}.seLinuxOptions.{key} must be unset")
    return found
