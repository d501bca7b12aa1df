"""The pod webhook over real HTTPS: the operator in-process, fed AdmissionReviews as the API server sends them.

The server certificate is signed by a CA made here with the ``openssl`` command; the
client verifies against that CA (and a client without it is refused). Caches live on
the API emulator; one is made Ready by playing the Job controller.
"""

from __future__ import annotations

import base64
import copy
import json
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from kopf.testing import KopfRunner

from compilecache.controller import admission, handlers, policy, webhook
from compilecache.frameworks.jax.env import jax_cache_env, trainer_env
from conftest import SESSION_KUBECONFIG, KubeClient, running_emulator, write_kubeconfig
from specs import cache_spec, cluster
from test_operator import NS, create_cache, wait_jobs, wait_phase, warm_and_expire

pytestmark = [pytest.mark.slow, pytest.mark.emulator]

GCS = {
    "gcs": {
        "bucket": "my-caches",
        "prefix": "caches/llama",
        "serviceAccountName": "cache-writer",
        "readerServiceAccountName": "cache-reader",
    }
}
GATE = {"name": "compilecache.dev/warm"}
# The default policy, and the GCS accounts the llama-gcs cache names (examples/cache-gcs.yaml's values).
POLICY = {"serviceAccounts": {"allow": ["default", "cache-writer", "cache-reader"]}}


# --- environment contract (pure) ------------------------------------------------------------------------


def test_config_defaults_to_off() -> None:
    assert webhook.config_from_env({}) == webhook.WebhookConfig(mode="off", addr="0.0.0.0", port=9443)


def test_config_tls_and_selfsigned() -> None:
    tls = webhook.config_from_env(
        {
            "COMPILECACHE_WEBHOOK": "tls",
            "COMPILECACHE_WEBHOOK_CERT_FILE": "/certs/tls.crt",
            "COMPILECACHE_WEBHOOK_KEY_FILE": "/certs/tls.key",
            "COMPILECACHE_WEBHOOK_ADDR": "127.0.0.1",
            "COMPILECACHE_WEBHOOK_PORT": "8443",
        }
    )
    assert (tls.mode, tls.addr, tls.port, tls.cert_file, tls.key_file) == (
        "tls",
        "127.0.0.1",
        8443,
        "/certs/tls.crt",
        "/certs/tls.key",
    )
    dev = webhook.config_from_env(
        {"COMPILECACHE_WEBHOOK": "SelfSigned", "COMPILECACHE_WEBHOOK_HOST": "host.k3d.internal"}
    )
    assert (dev.mode, dev.host, dev.port) == ("selfsigned", "host.k3d.internal", 9443)


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"COMPILECACHE_WEBHOOK": "on"}, "COMPILECACHE_WEBHOOK "),
        ({"COMPILECACHE_WEBHOOK": "tls"}, "COMPILECACHE_WEBHOOK_CERT_FILE"),
        ({"COMPILECACHE_WEBHOOK": "tls", "COMPILECACHE_WEBHOOK_CERT_FILE": "c"}, "COMPILECACHE_WEBHOOK_KEY_FILE"),
        ({"COMPILECACHE_WEBHOOK_PORT": "http"}, "COMPILECACHE_WEBHOOK_PORT"),
        ({"COMPILECACHE_WEBHOOK_PORT": "70000"}, "COMPILECACHE_WEBHOOK_PORT"),
    ],
)
def test_config_errors_name_the_variable(environ: dict[str, str], variable: str) -> None:
    with pytest.raises(webhook.ConfigError, match=variable):
        webhook.config_from_env(environ)


def test_review_shape_check() -> None:
    assert webhook.review_problem(review(pod())) is None
    assert webhook.review_problem([]) == "an AdmissionReview must be a JSON object"
    assert webhook.review_problem({"kind": "AdmissionReview"}) == "request is missing"
    broken = review(pod())
    del broken["request"]["resource"]
    assert webhook.review_problem(broken) == "request.resource (group, version, resource) is missing"


# --- over HTTPS -----------------------------------------------------------------------------------------


@dataclass
class Webhook:
    kube: KubeClient
    url: str
    context: ssl.SSLContext  # trusts only the test CA


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate for 127.0.0.1 signed by it: (ca.crt, tls.crt, tls.key)."""
    key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=test-ca", cwd=folder
    )
    _openssl("req", *key, "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=compilecache-webhook", cwd=folder)
    (folder / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    _openssl(
        "x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "tls.crt", "-days", "1", "-extfile", "ext.cnf", cwd=folder,
    )  # fmt: skip
    return folder / "ca.crt", folder / "tls.crt", folder / "tls.key"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_listening(url: str, context: ssl.SSLContext, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            post(url, context, b"{}")
            return
        except (ConnectionError, urllib.error.URLError) as exc:
            if isinstance(exc, urllib.error.HTTPError):
                return  # an HTTP answer: it listens
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def post(url: str, context: ssl.SSLContext, data: bytes) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    with opener.open(request, timeout=10) as answer:
        return answer.status, json.loads(answer.read())


@pytest.fixture(scope="module")
def hook() -> Iterator[Webhook]:
    """One emulator and one operator serving TLS on 127.0.0.1 for the module; caches llama, llama-gcs, ready."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command makes the test certificates")
    folder = Path(tempfile.mkdtemp(prefix="webhook-test-"))
    ca, cert, key = make_certificates(folder)
    port = free_port()
    with running_emulator(folder) as runner, pytest.MonkeyPatch.context() as env:
        write_kubeconfig(SESSION_KUBECONFIG, runner.url)
        env.setenv("KUBECONFIG", str(SESSION_KUBECONFIG))
        env.setenv(handlers.RESYNC_SECONDS_ENV, "0.5")
        env.setenv("COMPILECACHE_WEBHOOK", "tls")
        env.setenv("COMPILECACHE_WEBHOOK_CERT_FILE", str(cert))
        env.setenv("COMPILECACHE_WEBHOOK_KEY_FILE", str(key))
        env.setenv("COMPILECACHE_WEBHOOK_ADDR", "127.0.0.1")
        env.setenv("COMPILECACHE_WEBHOOK_PORT", str(port))
        env.setenv(policy.POLICY_ENV, json.dumps(POLICY))
        kube = KubeClient(runner)
        for node in cluster():
            kube.create("v1/nodes", node)
            kube.patch("v1/nodes", node["metadata"]["name"], {"status": node["status"]}, subresource="status")
        for name, labels in (("payroll-db-data", {}), ("shared", {policy.CLAIM_OPT_IN_LABEL: "true"})):
            kube.create("v1/persistentvolumeclaims", {"metadata": {"name": name, "labels": labels}, "spec": {}}, NS)
        try:
            with KopfRunner(["run", "--standalone", "-A"], registry=handlers.registry, timeout=30) as operator:
                create_cache(kube)  # Warming for good: nobody finishes its Jobs
                create_cache(kube, name="llama-gcs", storage=GCS)
                create_cache(
                    kube, name="ready", storage={"pvc": {"claimName": "ready-cache", "create": {"size": "1Gi"}}}
                )
                wait_jobs(kube, 2, "ready")
                warm_and_expire(kube, "ready")
                wait_phase(kube, "Warming", "llama")
                context = ssl.create_default_context(cafile=str(ca))
                url = f"https://127.0.0.1:{port}{webhook.PATH}"
                wait_listening(url, context)
                yield Webhook(kube, url, context)
            assert operator.exception is None, operator.output
            assert "Traceback" not in operator.output, operator.output
        finally:
            SESSION_KUBECONFIG.unlink(missing_ok=True)
            shutil.rmtree(folder, ignore_errors=True)


def pod(cache: str | None = "llama", **spec: Any) -> dict[str, Any]:
    labels = {"app": "train"} | ({"compilecache.dev/cache": cache} if cache else {})
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "train-", "namespace": NS, "labels": labels},
        "spec": {
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "containers": [
                {"name": "train", "image": "registry.example/trainer:1.2", "command": ["python", "train.py"]}
            ],
            "restartPolicy": "Never",
        },
    }
    body["spec"].update(spec)
    return body


POD_KIND = ({"group": "", "version": "v1", "kind": "Pod"}, {"group": "", "version": "v1", "resource": "pods"})


def review(obj: dict[str, Any], kind: tuple[dict[str, str], dict[str, str]] = POD_KIND) -> dict[str, Any]:
    """An AdmissionReview as kube-apiserver sends it for an object (a pod, by default) created by the Job
    controller; ``kind``: the object's group/version/kind and group/version/resource."""
    gvk, gvr = kind
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "namespace": NS,
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:job-controller",
                "uid": str(uuid.uuid4()),
                "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"],
            },
            "object": obj,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def admit(hook: Webhook, obj: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """POST a review of ``obj``; return the response payload and ``obj`` with its patch applied."""
    sent = review(obj)
    status, answer = post(hook.url, hook.context, json.dumps(sent).encode())
    assert status == 200
    assert (answer["apiVersion"], answer["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    response: dict[str, Any] = answer["response"]
    assert response["uid"] == sent["request"]["uid"]
    assert response["allowed"] is True, response  # never refuses a pod
    patched = obj
    if "patch" in response:
        assert response["patchType"] == "JSONPatch"
        patched = jsonpatch.apply_patch(obj, json.loads(base64.b64decode(response["patch"])))
    return response, patched


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value") for item in container.get("env", [])}


def test_a_client_without_the_ca_is_refused(hook: Webhook) -> None:
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        post(hook.url, ssl.create_default_context(), json.dumps(review(pod())).encode())


def test_pvc_cache_not_ready_gets_volume_env_and_gate(hook: Webhook) -> None:
    response, mutated = admit(hook, pod())
    spec = mutated["spec"]
    assert spec["volumes"] == [
        {"name": "compilecache", "persistentVolumeClaim": {"claimName": "jax-cache", "readOnly": True}}
    ]
    container = spec["containers"][0]
    assert container["volumeMounts"] == [
        {"name": "compilecache", "mountPath": "/var/cache/compilecache", "readOnly": True}
    ]
    assert env_of(container) == trainer_env(jax_cache_env("/var/cache/compilecache"), read_only=True)
    assert spec["schedulingGates"] == [GATE]
    assert any("scheduling gate" in warning for warning in response["warnings"])
    # The pod runs the cache's warmup.image: no warning about its image.
    assert not any("warm-up's image" in warning for warning in response["warnings"])


def test_ready_cache_gets_no_gate(hook: Webhook) -> None:
    _, mutated = admit(hook, pod("ready"))
    assert mutated["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "ready-cache"
    assert "schedulingGates" not in mutated["spec"]


def test_gcs_cache_gets_the_gs_dir_and_its_reader_service_account(hook: Webhook) -> None:
    _, mutated = admit(hook, pod("llama-gcs"))
    spec = mutated["spec"]
    assert env_of(spec["containers"][0]) == trainer_env(jax_cache_env("gs://my-caches/caches/llama"), read_only=True)
    assert (spec["serviceAccountName"], spec["serviceAccount"]) == ("cache-reader", "cache-reader")
    assert "volumes" not in spec and spec["schedulingGates"] == [GATE]


def test_re_admission_adds_nothing(hook: Webhook) -> None:
    _, once = admit(hook, pod())
    response, twice = admit(hook, once)
    assert "patch" not in response and twice == once


def test_users_env_and_volume_are_kept_and_annotated(hook: Webhook) -> None:
    own = pod(volumes=[{"name": "compilecache", "emptyDir": {}}])
    own["spec"]["containers"][0]["env"] = [{"name": "JAX_COMPILATION_CACHE_DIR", "value": "/scratch"}]
    response, mutated = admit(hook, own)
    assert mutated["spec"]["volumes"] == [{"name": "compilecache", "emptyDir": {}}]
    container = mutated["spec"]["containers"][0]
    assert "volumeMounts" not in container
    assert env_of(container)["JAX_COMPILATION_CACHE_DIR"] == "/scratch"
    assert env_of(container)["JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"] == "none"
    skipped = mutated["metadata"]["annotations"]["compilecache.dev/skipped"]
    assert "volume compilecache" in skipped and "env JAX_COMPILATION_CACHE_DIR" in skipped
    assert any("JAX_COMPILATION_CACHE_DIR" in warning for warning in response["warnings"])


def test_unknown_cache_is_admitted_unchanged_with_a_warning(hook: Webhook) -> None:
    response, mutated = admit(hook, pod("lama"))
    assert "patch" not in response and mutated == pod("lama")
    assert response["warnings"] == ["CompileCache 'lama' does not exist here; the pod runs without a cache"]


def test_pod_without_the_label_is_left_alone(hook: Webhook) -> None:
    response, mutated = admit(hook, pod(None))
    assert "patch" not in response and "warnings" not in response and mutated == pod(None)


def test_malformed_reviews_get_an_error_answer_and_the_server_goes_on(hook: Webhook) -> None:
    for data in (b"not json", b"[]", json.dumps({"kind": "AdmissionReview", "request": {"uid": "u"}}).encode()):
        with pytest.raises(urllib.error.HTTPError) as error:
            post(hook.url, hook.context, data)
        assert error.value.code == 400, data
    no_user = review(pod())
    del no_user["request"]["userInfo"]
    with pytest.raises(urllib.error.HTTPError) as error:
        post(hook.url, hook.context, json.dumps(no_user).encode())
    assert error.value.code == 400
    # A pod the mutation cannot read is admitted unchanged, not refused.
    odd = pod()
    odd["spec"]["containers"] = "not a list"
    response, mutated = admit(hook, copy.deepcopy(odd))
    assert mutated == odd and "admitted unchanged" in response["warnings"][0]
    admit(hook, pod())  # still serving


# --- the validating webhook of CompileCaches -----------------------------------------------------------------


def cache_review(obj: dict[str, Any], operation: str = "CREATE", old: dict[str, Any] | None = None) -> dict[str, Any]:
    """An AdmissionReview as kube-apiserver sends it for ``kubectl apply`` of a CompileCache."""
    gvk = {"group": "compilecache.dev", "version": "v1alpha1", "kind": "CompileCache"}
    gvr = {"group": "compilecache.dev", "version": "v1alpha1", "resource": "compilecaches"}
    sent = review(obj)
    sent["request"] |= {
        "kind": gvk,
        "resource": gvr,
        "requestKind": gvk,
        "requestResource": gvr,
        "name": obj["metadata"]["name"],
        "operation": operation,
        "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
        "oldObject": old,
    }
    return sent


def validate(hook: Webhook, obj: dict[str, Any], operation: str = "CREATE", old: Any = None) -> dict[str, Any]:
    sent = cache_review(obj, operation, old)
    url = hook.url.replace(webhook.PATH, webhook.VALIDATE_PATH)
    status, answer = post(url, hook.context, json.dumps(sent).encode())
    assert status == 200 and answer["response"]["uid"] == sent["request"]["uid"]
    response: dict[str, Any] = answer["response"]
    assert "patch" not in response  # validating only
    return response


def compilecache(name: str = "new", **spec: Any) -> dict[str, Any]:
    meta = {"name": name, "namespace": NS, "uid": str(uuid.uuid4()), "generation": 1}
    spec.setdefault("storage", {"pvc": {"claimName": f"{name}-cache", "create": {"size": "1Gi"}}})  # its own
    return {
        "apiVersion": "compilecache.dev/v1alpha1",
        "kind": "CompileCache",
        "metadata": meta,
        "spec": cache_spec(**spec),
    }


def refused(response: dict[str, Any], field: str) -> str:
    assert response["allowed"] is False, response
    assert response["status"]["code"] == 422
    message: str = response["status"]["message"]
    assert message.startswith(f"{field}: ") or f"; {field}: " in message, message
    return message


def test_validating_webhook_admits_a_cache_the_policy_allows(hook: Webhook) -> None:
    assert validate(hook, compilecache())["allowed"] is True
    assert validate(hook, compilecache(storage=GCS))["allowed"] is True  # its writer and reader are in this policy
    shared = {"pvc": {"claimName": "shared"}}  # an existing claim that opted in
    assert validate(hook, compilecache(storage=shared))["allowed"] is True


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"image": "attacker.example/anything:latest"}, "spec.warmup.image"),
        ({"serviceAccountName": "namespace-admin"}, "spec.warmup.serviceAccountName"),
        (
            {"discover": {"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}},
            "spec.warmup.discover.tolerations[0]",
        ),
        (
            {"pools": [{"name": "cp", "nodeSelector": {"kubernetes.io/hostname": "control-plane-0"}}]},
            "spec.warmup.pools[0].nodeSelector.kubernetes.io/hostname",
        ),
    ],
)
def test_validating_webhook_refuses_what_the_policy_forbids_naming_the_field(
    hook: Webhook, change: dict[str, Any], field: str
) -> None:
    warmup = cache_spec()["warmup"] | change
    refused(validate(hook, compilecache(warmup=warmup)), field)


def test_validating_webhook_refuses_a_foreign_claim(hook: Webhook) -> None:
    """issue 19: an existing claim that has not opted in, even with create (which only creates what is missing)."""
    storage = {"pvc": {"claimName": "payroll-db-data", "create": {"size": "1Gi"}}}
    message = refused(validate(hook, compilecache(storage=storage)), "spec.storage.pvc.claimName")
    assert "payroll-db-data" in message and policy.CLAIM_OPT_IN_LABEL in message


def test_validating_webhook_refuses_what_the_crd_cel_cannot_afford(hook: Webhook) -> None:
    """A workload naming an undeclared pool: the CRD admits it (CEL cost), the webhook does not."""
    warmup = cache_spec()["warmup"]
    warmup.pop("discover")
    warmup["pools"] = [{"name": "h100", "nodeSelector": {"nvidia.com/gpu.present": "true"}}]
    warmup["workloads"][0]["pools"] = ["b200"]
    refused(validate(hook, compilecache(warmup=warmup)), "spec.warmup.workloads[0].pools[0]")


def test_validating_webhook_lets_an_unchanged_spec_be_updated(hook: Webhook) -> None:
    """A cache admitted under an older policy keeps taking labels and annotations; a spec change is checked."""
    bad = compilecache(warmup=cache_spec()["warmup"] | {"image": "attacker.example/anything:latest"})
    relabelled = copy.deepcopy(bad)
    relabelled["metadata"]["labels"] = {"team": "ml"}
    assert validate(hook, relabelled, "UPDATE", old=bad)["allowed"] is True
    changed = copy.deepcopy(bad)
    changed["spec"]["warmup"]["image"] = "attacker/other:1"  # a short name
    refused(validate(hook, changed, "UPDATE", old=compilecache()), "spec.warmup.image")


# --- reviews past the bounds are answered before kopf parses or copies them (issue 28) -----------------


def test_a_review_past_the_byte_bound_is_refused_before_it_is_parsed(hook: Webhook) -> None:
    """kopf parses and copies a review on its event loop: one over ``MAX_REVIEW_BYTES`` gets 413 unread, and the
    API server applies the webhook's failurePolicy (a pod admitted as it is, a CompileCache refused)."""
    big = compilecache(warmup=cache_spec()["warmup"] | {"image": "." * webhook.MAX_REVIEW_BYTES})
    url = hook.url.replace(webhook.PATH, webhook.VALIDATE_PATH)
    with pytest.raises(urllib.error.HTTPError) as refused_early:
        post(url, hook.context, json.dumps(cache_review(big, "CREATE", None)).encode())
    assert refused_early.value.code == 413
    admit(hook, pod())  # still serving


def test_an_object_of_too_many_values_is_answered_without_kopf(hook: Webhook) -> None:
    """Under the byte bound, but more values than a real object has: a cache is refused naming the bound, a pod
    admitted unchanged with a warning. On the old code kopf copied 250,000 empty lists on its loop (470 ms)."""
    template = {"containers": [{"name": "train", "image": cache_spec()["warmup"]["image"]}]}
    template["affinity"] = {"x": [[]] * (webhook.MAX_OBJECT_VALUES + 1)}
    heavy = compilecache(warmup=cache_spec()["warmup"] | {"podTemplate": {"spec": template}})
    response = validate(hook, heavy)
    assert response["allowed"] is False and response["status"]["code"] == 422
    assert f"more than {webhook.MAX_OBJECT_VALUES} JSON values" in response["status"]["message"]
    crowded = pod(affinity={"x": [[]] * (webhook.MAX_OBJECT_VALUES + 1)})
    answer, admitted = admit(hook, crowded)
    assert admitted == crowded and "patch" not in answer
    assert any("admitted unchanged" in warning for warning in answer["warnings"]), answer


def test_a_pod_of_more_containers_than_the_webhook_mutates_is_admitted_unchanged(hook: Webhook) -> None:
    crowded = pod(containers=[{"name": f"c{i}", "image": "trainer:1.2"} for i in range(admission.MAX_CONTAINERS + 1)])
    answer, admitted = admit(hook, crowded)
    assert admitted == crowded
    assert any(f"more than the {admission.MAX_CONTAINERS} the webhook mutates" in w for w in answer["warnings"])
