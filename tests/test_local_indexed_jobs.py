"""Multi-host Jobs on the local cluster: Indexed Jobs, headless Services, anti-affinity, the cluster DNS.

The manifests have the shape the operator's multi-host warm-ups use (issue 12: an Indexed Job
with ``backoffLimit: 0``, a headless Service selecting a label unique to the Job, required pod
anti-affinity on ``kubernetes.io/hostname``, ``JAX_COORDINATOR_ADDRESS=<job>-0.<service>:<port>``),
written out here by hand; small ``python -c`` programs stand in for ``compilecache warm``. Everything
goes through the API emulator over HTTP and the real Job runner, scheduler and kubelet.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compilecache.local.cluster import LocalCluster
from compilecache.local.nodes import NodePool
from test_local_cluster import finished

pytestmark = [pytest.mark.slow, pytest.mark.emulator]

NS = "default"
JOBS, PODS, SERVICES = "batch/v1/jobs", "v1/pods", "v1/services"
JOB_LABEL = "compilecache.dev/warmup-job"
INDEX = "batch.kubernetes.io/job-completion-index"
PORT = 8476

# Process 0 listens on the coordinator's port and waits for one line; process 1 connects to the
# coordinator's address as the pod's env names it (rewritten by the kubelet) and sends its index.
# Both write what they saw to their termination message.
PEERS = """
import json, os, socket, sys
index = int(os.environ["JOB_COMPLETION_INDEX"])
host, port = os.environ["JAX_COORDINATOR_ADDRESS"].rsplit(":", 1)
seen = {"index": index, "address": os.environ["JAX_COORDINATOR_ADDRESS"], "node": os.environ["NODE"],
        "pod": os.environ["POD_NAME"], "processes": os.environ["COMPILECACHE_NUM_PROCESSES"]}
if index == 0:
    server = socket.create_server((host, int(port)))
    server.settimeout(60)
    conn, _ = server.accept()
    seen["received"] = conn.makefile().readline().strip()
else:
    for attempt in range(600):  # process 0 may not listen yet: retry, as JAX's client does
        try:
            conn = socket.create_connection((host, int(port)), timeout=5)
            break
        except socket.gaierror as error:  # the name did not resolve: no retry helps here
            sys.exit(f"cannot resolve {host}: {error}")
        except OSError:
            import time; time.sleep(0.1)
    else:
        sys.exit("process 0 never listened")
    conn.sendall(f"hello from {index}\\n".encode())
    seen["sent"] = True
open(os.environ["MESSAGE"], "w").write(json.dumps(seen))
"""


def multihost(name: str, code: str, hosts: int = 2, port: int = PORT, pool: str = "h100") -> list[dict[str, Any]]:
    """The headless Service and the Indexed Job of a multi-host run (the contract's shape)."""
    selector = {JOB_LABEL: name}
    service = {
        "metadata": {"name": name},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": selector},
    }
    env = [
        {"name": "JAX_COORDINATOR_ADDRESS", "value": f"{name}-0.{name}:{port}"},
        {"name": "COMPILECACHE_NUM_PROCESSES", "value": str(hosts)},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "MESSAGE", "value": "/dev/termination-log"},  # a whole value: the kubelet maps the path
    ]
    container = {"name": "warm", "image": "ignored:1", "command": ["python", "-c", code], "env": env}
    anti = {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": selector}, "topologyKey": "kubernetes.io/hostname"}
        ]
    }
    pod_spec = {
        "restartPolicy": "Never",
        "subdomain": name,
        "nodeSelector": {"nvidia.com/gpu.product": f"NVIDIA-{pool.upper()}"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"podAntiAffinity": anti},
        "containers": [container],
    }
    job = {
        "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed",
            "completions": hosts,
            "parallelism": hosts,
            "backoffLimit": 0,
            "template": {"metadata": {"labels": selector}, "spec": pod_spec},
        },
    }
    return [service, job]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("cluster")
    pools = [
        NodePool("h100", "NVIDIA-H100", count=2, gpus=8),  # a multi-host pool: 2 nodes
        NodePool("l4", "NVIDIA-L4", count=1, gpus=1),  # a pool too small for 2 hosts
        NodePool("cpu", "", count=1, gpus=0),
    ]
    with LocalCluster(root, workdir=root, pools=pools) as running:
        yield running


def create(cluster: LocalCluster, objects: list[dict[str, Any]]) -> None:
    service, job = objects
    cluster.client.create(SERVICES, service, NS)  # the Service first: the local DNS reads it at container start
    cluster.client.create(JOBS, job, NS)


def pods_of(cluster: LocalCluster, job: str) -> list[dict[str, Any]]:
    pods = cluster.client.list(PODS, NS, label_selector=f"job-name={job}")
    return sorted(pods, key=lambda pod: int(pod["metadata"]["annotations"][INDEX]))


def message(pod: dict[str, Any]) -> dict[str, Any]:
    state = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    result: dict[str, Any] = json.loads(state["message"])
    return result


def logs(cluster: LocalCluster, job: str) -> str:
    return "\n".join(
        f"--- {p['metadata']['name']}:\n{cluster.logs(NS, p['metadata']['name'], 'warm')}"
        for p in pods_of(cluster, job)
    )


def test_an_indexed_job_runs_one_pod_per_node_and_its_processes_reach_process_0(cluster: LocalCluster) -> None:
    create(cluster, multihost("mh-ok", PEERS))
    done = finished(cluster, "mh-ok", timeout=90)
    assert done["status"]["succeeded"] == 2, logs(cluster, "mh-ok")
    assert done["status"]["completedIndexes"] == "0,1"
    assert [c["type"] for c in done["status"]["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    pods = pods_of(cluster, "mh-ok")
    assert len(pods) == 2
    for index, pod in enumerate(pods):
        meta = pod["metadata"]
        assert meta["name"].startswith(f"mh-ok-{index}-") and len(meta["name"]) == len("mh-ok-0-") + 5
        assert meta["labels"][INDEX] == meta["annotations"][INDEX] == str(index)
        assert meta["labels"]["batch.kubernetes.io/job-name"] == meta["labels"]["job-name"] == "mh-ok"
        assert (
            meta["labels"]["controller-uid"]
            == meta["labels"]["batch.kubernetes.io/controller-uid"]
            == done["metadata"]["uid"]
        )
        assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == (f"mh-ok-{index}", "mh-ok")
    # One pod per node: the required anti-affinity on kubernetes.io/hostname.
    assert sorted(pod["spec"]["nodeName"] for pod in pods) == ["h100-0", "h100-1"]
    zero, one = (message(pod) for pod in pods)
    assert (zero["index"], one["index"]) == (0, 1)
    assert zero["processes"] == one["processes"] == "2"
    assert {zero["node"], one["node"]} == {"h100-0", "h100-1"}
    # Both saw the same rewritten address: this machine, a port of the Job's own block.
    assert zero["address"] == one["address"] and zero["address"].startswith("127.0.0.1:")
    assert int(zero["address"].rsplit(":", 1)[1]) != PORT
    assert zero["received"] == "hello from 1" and one["sent"] is True


def test_two_multihost_jobs_at_once_get_distinct_ports(cluster: LocalCluster) -> None:
    # Same coordinator port in both manifests: on one machine they would collide without the port blocks.
    # The 2-node pool holds one pod of each Job per node: the anti-affinity is per Job.
    create(cluster, multihost("mh-a", PEERS))
    create(cluster, multihost("mh-b", PEERS))
    a, b = finished(cluster, "mh-a", timeout=90), finished(cluster, "mh-b", timeout=90)
    assert a["status"]["succeeded"] == 2, logs(cluster, "mh-a")
    assert b["status"]["succeeded"] == 2, logs(cluster, "mh-b")
    port_a = int(message(pods_of(cluster, "mh-a")[0])["address"].rsplit(":", 1)[1])
    port_b = int(message(pods_of(cluster, "mh-b")[0])["address"].rsplit(":", 1)[1])
    assert abs(port_a - port_b) >= 4  # blocks of 4 ports (the warmer uses port..port+3) do not overlap


def test_a_job_with_more_hosts_than_nodes_leaves_a_pod_unschedulable(cluster: LocalCluster) -> None:
    wait = "import time; time.sleep(120)"
    create(cluster, multihost("mh-small", wait, pool="l4"))

    def pending() -> dict[str, Any] | None:
        pods = pods_of(cluster, "mh-small")
        stuck = [
            (pod, condition)
            for pod in pods
            for condition in (pod.get("status") or {}).get("conditions") or []
            if condition["type"] == "PodScheduled" and condition["status"] == "False"
        ]
        return {"pods": pods, "stuck": stuck} if len(pods) == 2 and stuck else None

    seen = cluster.client.wait_for(pending, timeout=30)
    [(pod, condition)] = seen["stuck"]
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
    assert condition["reason"] == "Unschedulable"
    assert condition["message"].startswith("0/4 nodes are available: ")
    assert "1 node(s) didn't match pod anti-affinity rules" in condition["message"], condition["message"]
    placed = next(p for p in seen["pods"] if p is not pod)
    assert placed["spec"]["nodeName"] == "l4-0"
    job = cluster.client.get(JOBS, "mh-small", NS) or {}
    assert not job["status"].get("conditions")  # neither complete nor failed: it waits for a node
    cluster.client.delete(JOBS, "mh-small", NS)  # owner GC deletes both pods; the runner kills the sleeper


def test_a_failed_process_fails_the_job_and_its_peer_is_killed(cluster: LocalCluster, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    # Process 1 fails once process 0 runs (it waits for process 0's pid file: a file both processes see).
    code = (
        "import os, sys, time\n"
        f"pid_file = {str(pid_file)!r}\n"
        "if os.environ['JOB_COMPLETION_INDEX'] == '1':\n"
        "    for _ in range(600):\n"
        "        if os.path.exists(pid_file):\n"
        "            sys.exit(1)\n"
        "        time.sleep(0.1)\n"
        "    sys.exit('process 0 never started')\n"
        "open(pid_file + '.tmp', 'w').write(str(os.getpid()))\n"
        "os.rename(pid_file + '.tmp', pid_file)\n"
        "time.sleep(300)\n"
    )
    create(cluster, multihost("mh-fail", code))
    done = finished(cluster, "mh-fail", timeout=60)
    failed = next(c for c in done["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "BackoffLimitExceeded" and done["status"]["failed"] == 1
    assert not done["status"].get("completedIndexes")
    # Process 0 was waiting on its peer: the Job controller deleted its pod, the kubelet killed it.
    pid = int(cluster.client.wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=30))
    cluster.client.wait_for(lambda: not Path(f"/proc/{pid}").exists(), timeout=30)
    [left] = pods_of(cluster, "mh-fail")
    assert left["metadata"]["annotations"][INDEX] == "1" and left["status"]["phase"] == "Failed"


def test_without_its_headless_service_the_names_do_not_resolve(cluster: LocalCluster) -> None:
    _, job = multihost("mh-nosvc", PEERS)
    cluster.client.create(JOBS, job, NS)  # no Service: a real cluster's DNS has no record either
    done = finished(cluster, "mh-nosvc", timeout=90)
    assert any(c["type"] == "Failed" for c in done["status"]["conditions"]), done["status"]
    assert "mh-nosvc-0.mh-nosvc" in logs(cluster, "mh-nosvc")  # left as written: nothing resolves it


# Real jax.distributed through the rewritten address: process 0 runs JAX's coordination service on
# the Job's port (it binds [::]:<port>), process 1 joins it; both see 2 processes. No collectives run
# (the gloo rendezvous is the warmer's test's business): this checks the local cluster's side only.
JAX_GROUP = """
import json, os
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax
jax.distributed.initialize(
    coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
    num_processes=int(os.environ["COMPILECACHE_NUM_PROCESSES"]),
    process_id=int(os.environ["JOB_COMPLETION_INDEX"]),
    initialization_timeout=60,
)
address = os.environ["JAX_COORDINATOR_ADDRESS"]
seen = {"index": jax.process_index(), "processes": jax.process_count(), "address": address}
jax.distributed.shutdown()
open(os.environ["MESSAGE"], "w").write(json.dumps(seen))
"""


@pytest.mark.jax
def test_jax_distributed_meets_its_coordinator_through_the_cluster_dns(cluster: LocalCluster) -> None:
    create(cluster, multihost("mh-jax", JAX_GROUP))
    done = finished(cluster, "mh-jax", timeout=180)
    assert done["status"]["succeeded"] == 2, logs(cluster, "mh-jax")
    seen = [message(pod) for pod in pods_of(cluster, "mh-jax")]
    assert [(s["index"], s["processes"]) for s in seen] == [(0, 2), (1, 2)]
    assert seen[0]["address"] == seen[1]["address"] and seen[0]["address"].startswith("127.0.0.1:")
