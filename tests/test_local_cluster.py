"""The local cluster on its own: Jobs run as real processes, gates hold pods, webhooks admit them.

Small ``python -c`` containers stand in for the product's commands; the end-to-end tests
(``test_e2e.py``) run the real ones.
"""

from __future__ import annotations

import base64
import http.server
import json
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compilecache.local import certs
from compilecache.local.client import KubeError
from compilecache.local.cluster import LocalCluster, webhook_configuration

pytestmark = [pytest.mark.slow, pytest.mark.emulator]

NS = "default"
JOBS, PODS, PVCS = "batch/v1/jobs", "v1/pods", "v1/persistentvolumeclaims"
CONFIGS = "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("cluster")
    with LocalCluster(root, workdir=root, namespaces={NS: {"team": "ml"}}) as running:
        yield running


def python_job(name: str, code: str, **spec: Any) -> dict[str, Any]:
    """A Job whose container runs ``python -c CODE`` (``spec`` keys: pod spec, container or Job fields)."""
    container = {"name": "main", "image": "ignored:1", "command": ["python", "-c", code]}
    container |= spec.pop("container", {})
    pod_spec = {"restartPolicy": "Never", "containers": [container], **spec.pop("pod", {})}
    return {"metadata": {"name": name}, "spec": {"backoffLimit": 0, "template": {"spec": pod_spec}, **spec}}


def finished(cluster: LocalCluster, name: str, timeout: float = 60) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        job = cluster.client.get(JOBS, name, NS) or {}
        types = {c["type"] for c in (job.get("status") or {}).get("conditions") or []}
        return job if types & {"Complete", "Failed"} else None

    result: dict[str, Any] = cluster.client.wait_for(done, timeout=timeout)
    return result


def pods_of(cluster: LocalCluster, job: str) -> list[dict[str, Any]]:
    return cluster.client.list(PODS, NS, label_selector=f"job-name={job}")


def terminated(pod: dict[str, Any]) -> dict[str, Any]:
    state: dict[str, Any] = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    return state


def test_a_job_runs_its_command_with_env_mounts_and_termination_message(cluster: LocalCluster) -> None:
    cluster.client.create(PVCS, {"metadata": {"name": "data"}, "spec": {}}, NS)
    code = (
        "import os, sys; "
        "open(os.environ['WHERE'], 'w').write(os.environ['WHO'] + ' ' + os.environ['POD']); "
        "open(sys.argv[2] + '/x', 'w').write('s'); "
        "open(sys.argv[1], 'w').write('done: ' + os.environ['WHERE'])"
    )
    job = python_job(
        "writer",
        code,
        container={
            "args": ["/dev/termination-log", "/scratch"],
            "env": [
                {"name": "WHO", "value": "writer"},
                {"name": "WHERE", "value": "/data/out.txt"},
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            ],
            "volumeMounts": [{"name": "d", "mountPath": "/data"}, {"name": "s", "mountPath": "/scratch"}],
        },
        pod={"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}, {"name": "s", "emptyDir": {}}]},
    )
    cluster.client.create(JOBS, job, NS)
    done = finished(cluster, "writer")
    assert [c["type"] for c in done["status"]["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    assert done["status"]["succeeded"] == 1 and done["status"]["startTime"] and done["status"]["completionTime"]
    [pod] = pods_of(cluster, "writer")
    assert pod["status"]["phase"] == "Succeeded" and pod["spec"]["nodeName"] == "cpu-0"
    state = terminated(pod)
    assert (state["exitCode"], state["reason"]) == (0, "Completed")
    # The container saw its own paths; the message names the container path, mapped to the claim's folder.
    assert state["message"] == f"done: {cluster.claim_dir(NS, 'data') / 'out.txt'}"
    assert (cluster.claim_dir(NS, "data") / "out.txt").read_text() == f"writer {pod['metadata']['name']}"
    assert (cluster.client.get(PVCS, "data", NS) or {})["status"]["phase"] == "Bound"


def test_a_read_only_mount_cannot_be_written_and_the_claim_is_unchanged(cluster: LocalCluster) -> None:
    folder = cluster.claim_dir(NS, "shared")
    cluster.client.create(PVCS, {"metadata": {"name": "shared"}, "spec": {}}, NS)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "entry").write_text("compiled")
    code = (
        "import os, sys\n"
        "cache = sys.argv[1]\n"
        "print(open(cache + '/entry').read())\n"
        "for attempt in (lambda: open(cache + '/entry', 'a'), lambda: open(cache + '/new', 'w'),\n"
        "                lambda: os.chmod(cache + '/entry', 0o666), lambda: os.unlink(cache + '/entry')):\n"
        "    try:\n"
        "        attempt()\n"
        "    except OSError as e:\n"
        "        print('refused', e.errno)\n"
        "    else:\n"
        "        sys.exit('a write went through')\n"
    )
    mount = {"name": "c", "mountPath": "/cache", "readOnly": True}
    volume = {"name": "c", "persistentVolumeClaim": {"claimName": "shared"}}
    container = {"args": ["/cache"], "volumeMounts": [mount]}
    cluster.client.create(JOBS, python_job("reader", code, container=container, pod={"volumes": [volume]}), NS)
    done = finished(cluster, "reader")
    [pod] = pods_of(cluster, "reader")
    log = cluster.logs(NS, pod["metadata"]["name"], "main")
    assert done["status"].get("succeeded") == 1, log
    assert log.splitlines()[0] == "compiled" and log.count("refused") == 4, log
    assert sorted(p.name for p in folder.iterdir()) == ["entry"] and (folder / "entry").read_text() == "compiled"


def test_backoff_limit_retries_then_fails_with_the_log_tail(cluster: LocalCluster) -> None:
    code = "import sys; print('something broke'); sys.exit(3)"
    job = python_job("flaky", code, backoffLimit=1, container={"terminationMessagePolicy": "FallbackToLogsOnError"})
    cluster.client.create(JOBS, job, NS)
    done = finished(cluster, "flaky")
    assert done["status"]["failed"] == 2
    failed = next(c for c in done["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "BackoffLimitExceeded"
    states = [terminated(pod) for pod in pods_of(cluster, "flaky")]
    assert [(s["exitCode"], s["reason"], s["message"]) for s in states] == [(3, "Error", "something broke\n")] * 2


def test_active_deadline_kills_the_process(cluster: LocalCluster, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    cluster.client.create(JOBS, python_job("slow", code, activeDeadlineSeconds=2), NS)
    done = finished(cluster, "slow", timeout=30)
    failed = next(c for c in done["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "DeadlineExceeded"
    pid = int(cluster.client.wait_for(lambda: pid_file.exists() and pid_file.read_text()))
    cluster.client.wait_for(lambda: not Path(f"/proc/{pid}").exists(), timeout=10)
    assert pods_of(cluster, "slow") == []  # deleted by the Job controller


def test_a_gated_pod_waits_until_its_gates_are_gone(cluster: LocalCluster) -> None:
    pod = {
        "metadata": {"name": "gated"},
        "spec": {
            "schedulingGates": [{"name": "example.com/wait"}],
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "x", "command": ["python", "-c", "print('ran')"]}],
        },
    }
    cluster.client.create(PODS, pod, NS)

    def gated_condition() -> bool:
        status = (cluster.client.get(PODS, "gated", NS) or {}).get("status") or {}
        return any(c.get("reason") == "SchedulingGated" for c in status.get("conditions") or [])

    cluster.client.wait_for(gated_condition)  # the scheduler saw it and left it
    assert "ran" not in cluster.logs(NS, "gated", "main")
    assert (cluster.client.get(PODS, "gated", NS) or {})["status"]["phase"] == "Pending"
    cluster.client.patch(PODS, "gated", {"spec": {"schedulingGates": None}}, NS)
    cluster.client.wait_for(lambda: (cluster.client.get(PODS, "gated", NS) or {})["status"]["phase"] == "Succeeded")
    assert cluster.logs(NS, "gated", "main") == "ran\n"


# --- admission through a webhook over TLS -----------------------------------------------------------------


class _Hook(http.server.BaseHTTPRequestHandler):
    delay = 0.0
    calls: list[dict[str, Any]] = []  # noqa: RUF012  (shared by the server's handler instances)

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Hook.calls.append(review)
        time.sleep(_Hook.delay)  # a slow webhook, for timeoutSeconds
        patch = [{"op": "add", "path": "/metadata/labels/admitted", "value": "yes"}]
        response = {"uid": review["request"]["uid"], "allowed": True, "patchType": "JSONPatch"}
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
        body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that refuses our certificate hangs up: expected in one test


@pytest.fixture
def hook(tmp_path: Path) -> Iterator[tuple[str, bytes]]:
    """A webhook on 127.0.0.1 over TLS that labels pods ``admitted=yes``: (url, CA PEM)."""
    pem = certs.make(tmp_path)
    server = _Server(("127.0.0.1", 0), _Hook)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pem.cert, pem.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Hook.calls.clear()
    _Hook.delay = 0.0
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/mutate", pem.ca.read_bytes()
    finally:
        server.shutdown()
        server.server_close()


def configure(cluster: LocalCluster, url: str, ca: bytes, **fields: Any) -> None:
    for config in cluster.client.list(CONFIGS):
        cluster.client.delete(CONFIGS, config["metadata"]["name"])
    rule = {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}
    hooks = [{"name": "test.example.com", "rules": [rule], **fields}]
    cluster.client.create(CONFIGS, webhook_configuration(url, ca, hooks, name="test"))


def new_pod(name: str, **labels: str) -> dict[str, Any]:
    container = {"name": "main", "image": "x", "command": ["python", "-c", "pass"]}
    return {"metadata": {"name": name, "labels": labels}, "spec": {"restartPolicy": "Never", "containers": [container]}}


def test_a_matching_webhook_patches_the_pod(cluster: LocalCluster, hook: tuple[str, bytes]) -> None:
    configure(
        cluster,
        *hook,
        objectSelector={"matchLabels": {"app": "train"}},
        namespaceSelector={"matchLabels": {"team": "ml"}},
    )
    created = cluster.client.create(PODS, new_pod("a1", app="train"), NS)
    assert created["metadata"]["labels"]["admitted"] == "yes"
    [review] = _Hook.calls
    assert review["request"]["operation"] == "CREATE" and review["request"]["namespace"] == NS
    skipped = cluster.client.create(PODS, new_pod("a2", app="other"), NS)
    assert "admitted" not in skipped["metadata"]["labels"] and len(_Hook.calls) == 1


def test_the_namespace_selector_sees_the_namespace_labels(cluster: LocalCluster, hook: tuple[str, bytes]) -> None:
    configure(cluster, *hook, namespaceSelector={"matchLabels": {"team": "other"}})
    created = cluster.client.create(PODS, new_pod("n1"), NS)
    assert "admitted" not in (created["metadata"].get("labels") or {}) and not _Hook.calls


@pytest.mark.parametrize(("policy", "created"), [("Fail", False), ("Ignore", True)])
def test_failure_policy_on_an_unreachable_webhook(
    cluster: LocalCluster, hook: tuple[str, bytes], policy: str, created: bool
) -> None:
    configure(cluster, "https://127.0.0.1:1/mutate", hook[1], failurePolicy=policy)  # nobody listens on port 1
    name = f"unreachable-{policy.lower()}"
    if created:
        assert "admitted" not in (cluster.client.create(PODS, new_pod(name), NS)["metadata"].get("labels") or {})
    else:
        with pytest.raises(KubeError) as refused:
            cluster.client.create(PODS, new_pod(name), NS)
        assert refused.value.status == 500 and 'failed calling webhook "test.example.com"' in str(refused.value)
        assert cluster.client.get(PODS, name, NS) is None


def test_timeout_seconds_bounds_the_call(cluster: LocalCluster, hook: tuple[str, bytes]) -> None:
    configure(cluster, *hook, timeoutSeconds=1, failurePolicy="Fail")
    _Hook.delay = 3.0
    started = time.monotonic()
    with pytest.raises(KubeError, match="context deadline exceeded"):
        cluster.client.create(PODS, new_pod("timeout"), NS)
    assert time.monotonic() - started < 2.5


def test_a_client_that_does_not_trust_the_ca_bundle_fails(
    cluster: LocalCluster, hook: tuple[str, bytes], tmp_path: Path
) -> None:
    url, _ = hook
    other = certs.make(tmp_path / "other").ca.read_bytes()
    configure(cluster, url, other, failurePolicy="Fail")
    with pytest.raises(KubeError, match="certificate"):
        cluster.client.create(PODS, new_pod("untrusted"), NS)
