"""Findings of the adversarial review of issue 28's change: each test reproduces one and fails on that code.

Each test drives the real functions the operator, the jobs and the trainer call (``plan.plan``,
``policy.admission_violations``, ``admission.admit``, ``manifests.parse_manifest``,
``torchstore.fetch`` on a real ``LocalStore``) with what a hostile cache author, pod or cache file
can send, and asserts the promise of issue 28 that the change was meant to keep.
"""

from __future__ import annotations

import hashlib
import json
import time
import tracemalloc
from pathlib import Path
from typing import Any, cast

import kopf
import pytest

from compilecache.cache import manifests
from compilecache.cache.store import LocalStore
from compilecache.cache.torchcache import generation_dir
from compilecache.cache.torchstore import fetch
from compilecache.controller import admission, expiryjob, handlers, jobs, policy, status
from compilecache.controller.api import parse_cache
from compilecache.controller.kube import Client
from compilecache.controller.plan import plan
from compilecache.controller.snapshot import Cache, Snapshot
from specs import cache, cache_spec, cluster

T0 = "2026-01-01T00:00:00Z"
TERMINATION_MESSAGE_MAX = 4096  # what the kubelet keeps of a container's termination message
HUGE = 10**400  # JSON's integers have no bound; Python's float() stops near 1.8e308


# --- 1. a pod's report with an integer past a float's range crashes every pass ---------------------


def _warm_pod(message: str, job: str) -> dict[str, Any]:
    terminated = {"exitCode": 0, "message": message, "finishedAt": "2026-01-01T00:00:10Z"}
    return {
        "metadata": {"name": f"{job}-x", "labels": {"job-name": job}},
        "status": {"containerStatuses": [{"name": "warm", "state": {"terminated": terminated}}]},
    }


def test_a_warm_up_summary_with_seconds_past_a_floats_range_is_refused_not_a_failed_pass() -> None:
    """``status.number`` checks ``value < inf`` (true for any int) then calls ``float()``: OverflowError.

    The warm-up runs in the cache author's image and script, which write its termination message.
    The pass raises, ``plan.failed`` marks the cache Failed ("the operator's pass failed, retrying"),
    and every later pass reads the same pod again (``needs_report``): the status is frozen, which is
    the issue's suspected case (a) and item 5 ("refused, named, and never reaches a status patch").
    """
    message = json.dumps(
        {"schema": status.WARM_SCHEMA, "ok": True, "entries": 1, "bytes": 1, "compileSeconds": HUGE, "targets": []}
    )
    assert len(message) < TERMINATION_MESSAGE_MAX  # the kubelet delivers it whole
    obj: dict[str, Any] = cache()
    first = plan(Snapshot(Cache.read(obj), nodes=tuple(cluster())), T0)
    job = next(create.manifest for create in first.creates if create.resource.plural == "jobs")
    conditions = [{"type": "Complete", "status": "True"}]
    done = dict(job) | {"status": {"startTime": T0, "completionTime": "2026-01-01T00:00:30Z", "conditions": conditions}}
    obj["status"] = dict(first.status)
    snapshot = Snapshot(
        Cache.read(obj),
        nodes=tuple(cluster()),
        jobs=(done,),
        warmup_pods=(_warm_pod(message, job["metadata"]["name"]),),
    )
    new = plan(snapshot, T0)  # raised OverflowError: int too large to convert to float
    refused = [pool for pool in new.status["pools"] if pool.get("reason") == status.REPORT_REFUSED]
    assert refused and "compileSeconds" in refused[0]["message"], new.status["pools"]


def test_an_expiry_summary_with_bytes_past_a_floats_range_is_refused_not_a_failed_pass() -> None:
    """``expiryjob.cache_status`` formats ``after.bytes`` (``units.format_bytes``: ``count / factor``) before
    ``status.within`` checks its range: OverflowError escapes ``outcome``, which catches only BadReport."""
    summary = {
        "schema": "compilecache.dev/expiry/v1",
        "ok": True,
        "at": "2026-01-01T00:05:00Z",
        "after": {"entries": 1, "bytes": HUGE},
    }
    message = json.dumps(summary)
    assert len(message) < TERMINATION_MESSAGE_MAX
    job = {"metadata": {"name": "e"}, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    terminated = {"exitCode": 0, "message": message, "finishedAt": "2026-01-01T00:05:00Z"}
    pod = {
        "metadata": {"name": "e-x"},
        "status": {"containerStatuses": [{"name": "expire", "state": {"terminated": terminated}}]},
    }
    outcome = expiryjob.outcome(job, [pod])  # raised OverflowError: integer division result too large
    assert (outcome.phase, outcome.reason, outcome.summary) == (status.READY, status.REPORT_REFUSED, None)
    assert "after.bytes" in outcome.message or "cache.bytes" in outcome.message, outcome.message


# --- 2. a PyTorch manifest's file check is quadratic in the depth of its paths ----------------------


def test_a_one_megabyte_pytorch_manifest_is_checked_in_well_under_a_second() -> None:
    """``manifests._torch_files`` joins every prefix of every path (``"/".join(parts[:depth])``): O(parts^2)
    per entry. A path may hold 4096 bytes, so 2048 parts; a 1 MiB manifest of such paths took ~3.5 s,
    a 16 MiB one (the size the reader still takes) 57 s, and the manifest is *accepted*. The expiry Job,
    ``warm`` and every training pod's copy (the trainer's hook) parse every manifest at start."""
    deep = "/".join(["a"] * 2046)
    entries = [{"file": f"{deep}/{index:x}", "sha256": "0" * 64} for index in range(250)]
    data = json.dumps({"schema": manifests.TORCH_SCHEMA, "run_id": "r1", "entries": entries}).encode()
    assert len(data) <= 1 << 20
    started = time.perf_counter()
    manifests.parse_manifest("deep.json", data)
    elapsed = time.perf_counter() - started
    assert elapsed < 1.0, f"a {len(data)}-byte manifest took {elapsed:.2f} s to check"


# --- 3. the training template's bound does not count empty objects and lists ----------------------


def test_a_megabyte_training_template_of_empty_objects_is_refused_at_admission() -> None:
    """``api.check_bounded`` charges keys and strings only: ``{}`` and ``[]`` cost nothing, so a
    ``podTemplate.spec`` (free-form in the CRD) of ~1 MB of them is admitted. Measured with
    ``bench/admission_load.py``'s harness on the real operator: 240k empty lists (an AdmissionReview
    just under aiohttp's 1 MiB) are *allowed*, answered in 0.95 s, and stall kopf's event loop
    337 ms (67x a benign cache's), against "a 1 MB value in any field ... refused ... in under a
    second" and "never blocked for more than 100 ms"; every pass then walks it again."""
    warmup = cache()["spec"]["warmup"]
    template = {"containers": [{"name": "train", "image": warmup["image"]}], "affinity": {"x": [{}] * 250_000}}
    obj = cache(warmup=warmup | {"podTemplate": {"spec": template}})
    assert len(json.dumps(obj)) > 1_000_000
    started = time.perf_counter()
    found = policy.admission_violations(obj, policy.DEFAULT)
    elapsed = time.perf_counter() - started
    assert any(path.startswith("spec.warmup.podTemplate.spec") for path, _ in found), found
    assert elapsed < 1.0, f"{elapsed:.2f} s"


# --- 4. the trainer's PyTorch copy reads each listed file whole, whatever its size -----------------


def test_the_pytorch_copy_never_holds_a_file_far_larger_than_its_manifest_says(tmp_path: Path) -> None:
    """``torchstore.fetch`` reads each file with ``store.read`` (whole, 8 at a time) and only then compares
    its sha256: a file the manifest lists at 16 bytes but that holds 64 MiB costs the *training*
    process 64 MiB (8 such: 512 MiB), and real kernels of hundreds of MB cost that legitimately.
    Item 4 bounds entry reads by streaming; the trainer's copy was left reading whole files."""
    root = tmp_path / "cache"
    generation = root / generation_dir("r1")
    generation.mkdir(parents=True)
    (generation / "kernel.bin").write_bytes(b"\0" * (64 << 20))
    listed = b"0123456789abcdef"
    entry = {"file": "kernel.bin", "size": len(listed), "sha256": hashlib.sha256(listed).hexdigest()}
    manifest = {"schema": manifests.TORCH_SCHEMA, "run_id": "r1", "state": "complete", "entries": [entry]}
    assert not isinstance(manifests.parse_manifest("r1.json", json.dumps(manifest).encode()), manifests.Malformed)
    tracemalloc.start()
    try:
        result = fetch(LocalStore(root), [manifest], tmp_path / "local")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.files == 0 and list(result.refused or {}) == ["torch/r1/kernel.bin"]
    assert peak < 16 << 20, f"the copy held {peak >> 20} MiB for a file listed at {len(listed)} bytes"


# --- 5. one cache's reader may be another cache's writer -------------------------------------------


def test_the_pod_webhook_never_hands_a_training_pod_the_writer_of_another_gcs_cache() -> None:
    """The reader is checked against its own cache's writers only. With the policy docs/security.md
    gives for examples/cache-gcs.yaml (``allow: [default, cache-writer, cache-reader]``), a second cache
    whose reader is ``cache-writer`` is admitted, and its training pods run as the first cache's
    writer: docs/gcs.md says "The writer is never handed out by the operator"."""
    rules = policy.parse({"serviceAccounts": {"allow": ["default", "cache-writer", "cache-reader"]}})
    first = cache(
        name="llama",
        storage={"gcs": {"bucket": "my-caches", "prefix": "llama", "serviceAccountName": "cache-writer",
                         "readerServiceAccountName": "cache-reader"}},
    )  # fmt: skip
    second = cache(
        name="other",
        uid="uid-2",
        storage={"gcs": {"bucket": "my-caches", "prefix": "other", "serviceAccountName": "cache-reader",
                         "readerServiceAccountName": "cache-writer"}},
    )  # fmt: skip
    assert policy.admission_violations(first, rules) == []
    pod = {
        "metadata": {"namespace": "default", "labels": {jobs.LABEL_CACHE: "other"}},
        "spec": {"containers": [{"name": "train", "image": "registry.example/trainer:1.2"}]},
    }
    admitted = admission.admit(pod, [first, second], rules=rules).pod
    writers = admission.writer_accounts(parse_cache(first))
    assert writers == {"cache-writer"}
    assert admitted["spec"].get("serviceAccountName") not in writers, admitted["spec"]


# --- 6. one labelled pod holds the operator's event loop for seconds ----------------------------------


@pytest.mark.emulator
def test_one_training_pod_cannot_hold_the_operators_event_loop(kube_env: Any) -> None:
    """``handlers.mutate_pods`` runs in kopf's thread pool, but it hands kopf a function (``_become``) and
    kopf builds the JSON patch on its event loop (``serve_admission_request`` -> ``Patch.as_json_patch``:
    a deepcopy of the pod, the function, ``jsonpatch.JsonPatch.from_diff`` over the whole pod). The
    mutation adds the cache's env to every container, so the patch grows with the containers: a pod
    of 20,000 one-line containers (a 670 KB AdmissionReview, under aiohttp's 1 MiB) gets a 16.9 MB
    patch. Measured on the real operator (``compilecache operator`` with its TLS webhook, the
    harness of ``bench/admission_load.py``, /healthz polled every 5 ms): the loop stood still
    2.2-3.4 s per such pod (a benign pod: 2-3 ms). Anyone who may create a pod with the opt-in label
    can send it; the mutating webhook runs before the pod's own validation."""
    body = {"apiVersion": "compilecache.dev/v1alpha1", "kind": "CompileCache", "metadata": {"name": "llama"}}
    kube_env.create("compilecache.dev/v1alpha1/compilecaches", body | {"spec": cache_spec()}, "default")
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": "default", "labels": {jobs.LABEL_CACHE: "llama"}},
        "spec": {"containers": [{"name": f"c{index}", "image": "x"} for index in range(20_000)]},
    }
    client = Client.from_environment()
    try:
        memo = kopf.Memo(client=client, policy=policy.DEFAULT)
        patch = kopf.Patch(body=kopf.Body(cast(kopf.RawBody, pod)))
        mutate = cast(Any, handlers.mutate_pods)  # kopf's decorator types it as a WebhookFn of every kwarg
        mutate(body=kopf.Body(cast(kopf.RawBody, pod)), patch=patch, warnings=[], memo=memo)  # kopf's thread pool
    finally:
        client.close()
    started = time.perf_counter()
    ops = patch.as_json_patch()  # what kopf then runs on its event loop
    on_the_loop = time.perf_counter() - started
    assert on_the_loop < 0.1, f"{on_the_loop:.2f} s on the event loop for a patch of {len(json.dumps(ops))} bytes"
