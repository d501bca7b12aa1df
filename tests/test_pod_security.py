"""The pods the operator creates pass the ``restricted`` Pod Security Standard (``tests/podsecurity.py``).

Checked on what the passes really create (``plan.plan`` run pass after pass, the cluster playing
along): single-host and multi-host warm-up Jobs, script workloads (init containers), GCS and PVC
caches, and the expiry Job. ``test_operator.py`` checks the Jobs the running operator created.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from compilecache.controller import expiryjob, plan, policy
from compilecache.controller.snapshot import Cache, Snapshot
from podsecurity import violations
from specs import cache, cache_spec, cluster, node

NOW = "2026-11-22T10:00:00Z"
FINISHED = {"status": {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}}
GCS = {"gcs": {"bucket": "my-caches", "prefix": "p", "serviceAccountName": "cache-writer"}}
# The default policy, with the GCS cache's writer allowed.
RULES = policy.parse({"serviceAccounts": {"allow": ["default", "cache-writer"]}})
BOUND = {"status": {"phase": "Bound"}}
EXPIRY_OF = expiryjob.LABEL_EXPIRY_OF
SCRIPT = {"name": "exact", "script": "train.py", "steps": 2, "args": ["--model", "small"]}


def created_jobs(obj: dict[str, Any], nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every Job the passes create for ``obj`` until it is Ready: warm-ups, then the expiry."""
    snap = Snapshot(Cache.read(obj), nodes=tuple(nodes), policy=RULES)
    made: list[dict[str, Any]] = []
    for _ in range(4):
        decided = plan.plan(snap, NOW)
        assert decided.status["phase"] != "Failed", decided.status
        jobs = [dict(c.manifest) for c in decided.creates if c.manifest["kind"] == "Job"]
        claims = [dict(c.manifest) | BOUND for c in decided.creates if c.manifest["kind"] == "PersistentVolumeClaim"]
        if not decided.creates:
            break
        made += jobs
        expiry = [job | FINISHED for job in jobs if EXPIRY_OF in job["metadata"]["labels"]]
        warmups = [job | FINISHED for job in jobs if EXPIRY_OF not in job["metadata"]["labels"]]
        snap = dataclasses.replace(
            snap,
            cache=Cache.read(obj | {"status": dict(decided.status)}),
            claim=claims[0] if claims else snap.claim,
            jobs=snap.jobs + tuple(warmups),
            expiry_jobs=snap.expiry_jobs + tuple(expiry),
        )
    return made


def multihost_nodes() -> list[dict[str, Any]]:
    return [*cluster(), node("h100-3", "NVIDIA-H100-80GB-HBM3", 8)]


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(cache_spec(), id="pvc-discover-entrypoint"),
        pytest.param(cache_spec(storage=GCS), id="gcs"),
        pytest.param(
            cache_spec(warmup=cache_spec()["warmup"] | {"workloads": [SCRIPT, *cache_spec()["warmup"]["workloads"]]}),
            id="script-init-containers",
        ),
        pytest.param(
            cache_spec(warmup=cache_spec()["warmup"] | {"topologies": [{"hosts": 1}, {"hosts": 2}]}),
            id="multi-host",
        ),
    ],
)
def test_every_job_the_passes_create_passes_restricted(spec: dict[str, Any]) -> None:
    jobs = created_jobs(cache(**spec), multihost_nodes())
    kinds = {"expiry" if EXPIRY_OF in j["metadata"]["labels"] else "warmup" for j in jobs}
    assert kinds == {"warmup", "expiry"}, [j["metadata"]["name"] for j in jobs]
    for job in jobs:
        assert violations(job["spec"]["template"]["spec"]) == [], job["metadata"]["name"]


# --- the checker fails where it must (every control it checks) ----------------------------------------------


def _good() -> dict[str, Any]:
    jobs = created_jobs(cache(), cluster())
    spec: dict[str, Any] = copy.deepcopy(jobs[0]["spec"]["template"]["spec"])
    assert violations(spec) == []
    return spec


def _container(spec: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = spec["containers"][0]
    return container


BREAKS = {
    "hostNetwork": lambda s: s.update(hostNetwork=True),
    "hostPath": lambda s: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
    "privileged": lambda s: _container(s)["securityContext"].update(privileged=True),
    "escalation": lambda s: _container(s)["securityContext"].pop("allowPrivilegeEscalation"),
    "root": lambda s: (s["securityContext"].pop("runAsNonRoot"), _container(s)["securityContext"].pop("runAsNonRoot")),
    "uid 0": lambda s: _container(s)["securityContext"].update(runAsUser=0),
    "no seccomp": lambda s: s["securityContext"].pop("seccompProfile"),
    "unconfined seccomp": lambda s: s["securityContext"].update(seccompProfile={"type": "Unconfined"}),
    "capabilities kept": lambda s: _container(s)["securityContext"].pop("capabilities"),
    "capability added": lambda s: _container(s)["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]),
    "hostPort": lambda s: _container(s).update(ports=[{"containerPort": 80, "hostPort": 80}]),
    "procMount": lambda s: _container(s)["securityContext"].update(procMount="Unmasked"),
    "selinux": lambda s: s["securityContext"].update(seLinuxOptions={"type": "spc_t"}),
    "sysctl": lambda s: s["securityContext"].update(sysctls=[{"name": "kernel.msgmax", "value": "1"}]),
    "init container": lambda s: s.update(initContainers=[{"name": "i", "image": "x"}]),
}


@pytest.mark.parametrize("name", list(BREAKS))
def test_the_checker_refuses_each_control(name: str) -> None:
    spec = _good()
    BREAKS[name](spec)
    assert violations(spec) != []
