"""The Pod Security checker (tests/podsecurity.py) itself: a hardened pod passes, each known-bad field fails."""

from __future__ import annotations

import copy
from typing import Any

import pytest

import podsecurity

GOOD: dict[str, Any] = {
    "kind": "Pod",
    "metadata": {"name": "p"},
    "spec": {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": "c",
                "image": "x",
                "ports": [{"containerPort": 8080}],
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }
        ],
        "volumes": [
            {"name": "tmp", "emptyDir": {}},
            {"name": "certs", "secret": {"secretName": "s"}},
            {"name": "cache", "persistentVolumeClaim": {"claimName": "c", "readOnly": True}},
        ],
    },
}


def container(pod: dict[str, Any]) -> dict[str, Any]:
    first: dict[str, Any] = pod["spec"]["containers"][0]
    return first


def set_in(path: str, value: Any):
    """A change to GOOD: ``value`` at a dotted ``path`` (``c`` is the first container, ``pod`` the pod's context)."""

    def change(pod: dict[str, Any]) -> None:
        head, *rest = path.split(".")
        target = {
            "c": container(pod).setdefault("securityContext", {}),
            "pod": pod["spec"]["securityContext"],
            "spec": pod["spec"],
            "meta": pod["metadata"],
        }[head]
        for key in rest[:-1]:
            target = target.setdefault(key, {})
        target[rest[-1]] = value

    return change


def init_container(pod: dict[str, Any]) -> None:
    pod["spec"]["initContainers"] = [{"name": "init", "image": "x"}]  # no securityContext at all


def host_port(pod: dict[str, Any]) -> None:
    container(pod)["ports"][0]["hostPort"] = 80


def volume(source: dict[str, Any]):
    def change(pod: dict[str, Any]) -> None:
        pod["spec"]["volumes"].append({"name": "v", **source})

    return change


def no_non_root(pod: dict[str, Any]) -> None:
    del pod["spec"]["securityContext"]["runAsNonRoot"]


# (a change that breaks a rule, a word of the field the checker must name)
BAD = {
    "privileged": (set_in("c.privileged", True), "privileged"),
    "privilege-escalation": (set_in("c.allowPrivilegeEscalation", True), "allowPrivilegeEscalation"),
    "run-as-root-user": (set_in("pod.runAsUser", 0), "runAsUser"),
    "container-root-user": (set_in("c.runAsUser", 0), "runAsUser"),
    "run-as-root-allowed": (set_in("c.runAsNonRoot", False), "runAsNonRoot"),
    "no-non-root-anywhere": (no_non_root, "runAsNonRoot"),
    "capability-added": (set_in("c.capabilities.add", ["NET_ADMIN"]), "capabilities.add"),
    "baseline-capability-added": (set_in("c.capabilities.add", ["CHOWN"]), "capabilities.add"),
    "capabilities-not-dropped": (set_in("c.capabilities", {"drop": ["NET_RAW"]}), "capabilities.drop"),
    "seccomp-unconfined": (set_in("pod.seccompProfile", {"type": "Unconfined"}), "seccompProfile"),
    "container-seccomp-unconfined": (set_in("c.seccompProfile", {"type": "Unconfined"}), "seccompProfile"),
    "apparmor-unconfined": (set_in("c.appArmorProfile", {"type": "Unconfined"}), "appArmorProfile"),
    "apparmor-annotation": (
        set_in("meta.annotations", {"container.apparmor.security.beta.kubernetes.io/c": "unconfined"}),
        "apparmor",
    ),
    "selinux-type": (set_in("pod.seLinuxOptions", {"type": "spc_t"}), "seLinuxOptions.type"),
    "selinux-user": (set_in("c.seLinuxOptions", {"user": "system_u"}), "seLinuxOptions.user"),
    "proc-mount": (set_in("c.procMount", "Unmasked"), "procMount"),
    "unsafe-sysctl": (set_in("pod.sysctls", [{"name": "kernel.msgmax", "value": "1"}]), "sysctls"),
    "host-network": (set_in("spec.hostNetwork", True), "hostNetwork"),
    "host-pid": (set_in("spec.hostPID", True), "hostPID"),
    "host-ipc": (set_in("spec.hostIPC", True), "hostIPC"),
    "host-port": (host_port, "hostPort"),
    "host-path": (volume({"hostPath": {"path": "/var"}}), "hostPath"),
    "nfs-volume": (volume({"nfs": {"server": "n", "path": "/"}}), "volume type"),
    "host-process": (set_in("pod.windowsOptions", {"hostProcess": True}), "hostProcess"),
    "init-container-unhardened": (init_container, "initContainers[0]"),
}


def test_a_hardened_pod_passes_restricted():
    assert podsecurity.violations(GOOD) == []


def test_a_pod_template_of_a_workload_is_checked():
    deployment = {"kind": "Deployment", "spec": {"template": {"metadata": {}, "spec": GOOD["spec"]}}}
    cronjob = {"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": {"spec": GOOD["spec"]}}}}}
    assert podsecurity.violations(deployment) == podsecurity.violations(cronjob) == []
    bad = copy.deepcopy(deployment)
    bad["spec"]["template"]["spec"]["hostNetwork"] = True
    assert podsecurity.violations(bad) == ["spec.hostNetwork: host namespaces are forbidden"]


@pytest.mark.parametrize("name", list(BAD))
def test_each_known_bad_field_is_named(name: str):
    change, word = BAD[name]
    pod = copy.deepcopy(GOOD)
    change(pod)
    found = podsecurity.violations(pod)
    assert found and all(word in line or "initContainers" in line for line in found), found
    assert any(word in line for line in found), found


def test_baseline_allows_what_only_restricted_forbids():
    pod = copy.deepcopy(GOOD)
    del pod["spec"]["securityContext"]
    del container(pod)["securityContext"]
    pod["spec"]["volumes"].append({"name": "n", "nfs": {"server": "n", "path": "/"}})
    container(pod)["securityContext"] = {"capabilities": {"add": ["CHOWN"]}}
    assert podsecurity.violations(pod, podsecurity.BASELINE) == []
    fields = [line.split(":")[0].rsplit(".", 1)[-1] for line in podsecurity.violations(pod, podsecurity.RESTRICTED)]
    assert fields == ["volumes[3]", "allowPrivilegeEscalation", "runAsNonRoot", "seccompProfile", "drop", "add"]
    with pytest.raises(ValueError, match="unknown"):
        podsecurity.violations(pod, "strict")


def test_container_level_settings_suffice_without_pod_level_ones():
    pod = copy.deepcopy(GOOD)
    pod["spec"]["securityContext"] = {}
    container(pod)["securityContext"] |= {"runAsNonRoot": True, "seccompProfile": {"type": "Localhost"}}
    assert podsecurity.violations(pod) == []
