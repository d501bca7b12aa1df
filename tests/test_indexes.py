"""Passes read from watch-fed indexes (``controller/indexes.py``): what is kept, and that a pass lists nothing.

First the pure parts: which objects each index keeps and under which key, what a projection drops,
and that a Node's heartbeat changes nothing a pass reads. Then the reader's hop into the event loop,
from a worker thread, and that it fails (not hangs) once the loop is gone. Then the real operator
(kopf, the handlers) on the API emulator over HTTP, counting its own API requests
(``compilecache_api_requests_total``): a steady-state pass lists nothing, whatever changes; and a
Node that comes reaches the caches without waiting for their resync.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kopf.testing import KopfRunner

from compilecache.controller import expectations, expiryjob, handlers, indexes, jobs, metrics
from compilecache.controller.api import TemplateRef, parse_spec
from compilecache.controller.kube import Client
from compilecache.controller.pools import resolve_pools
from compilecache.controller.reconcile import reconcile
from compilecache.controller.snapshot import ApiReader, Cache, Snapshot
from compilecache.local import jobrunner
from specs import cache, cache_spec, cluster, node
from test_operator import (
    NS,
    SUMMARY,
    create_cache,
    finish,
    finish_expiry,
    running_operator,
    status_of,
    wait_jobs,
    wait_phase,
)
from test_operator_metrics import warm_pod

pytestmark = pytest.mark.emulator


def warmup_job(name: str = "llama") -> dict[str, Any]:
    """A warm-up Job as the operator makes it, with the metadata the API server adds."""
    obj = cache(name)
    spec = parse_spec(obj["spec"])
    [pool, *_] = resolve_pools(spec, cluster())
    job = jobs.warmup_job(obj, spec, pool)
    job["metadata"] |= {"namespace": NS, "uid": "job-uid", "managedFields": [{"manager": "kube-controller-manager"}]}
    return job


# --- what each index keeps ------------------------------------------------------------------------------


def test_a_warm_up_job_is_kept_under_its_cache_without_its_pod_template() -> None:
    job = warmup_job()
    [(key, kept)] = indexes.job_entries(job).items()
    assert key == (indexes.WARMUP_JOBS, NS, "llama")
    assert "template" not in kept["spec"] and "managedFields" not in kept["metadata"]
    assert kept["metadata"]["labels"] == job["metadata"]["labels"]
    assert kept["spec"]["backoffLimit"] == job["spec"]["backoffLimit"]


def test_an_expiry_job_is_kept_under_the_cache_it_expires_and_a_foreign_job_not_at_all() -> None:
    job = {"metadata": {"name": "e", "namespace": NS, "labels": {expiryjob.LABEL_EXPIRY_OF: "llama"}}}
    assert list(indexes.job_entries(job)) == [(indexes.EXPIRY_JOBS, NS, "llama")]
    assert indexes.job_entries({"metadata": {"name": "training", "namespace": NS, "labels": {"app": "x"}}}) == {}


def test_a_warm_up_pod_is_kept_under_its_job_and_a_training_pod_under_its_cache() -> None:
    job = warmup_job()
    pod = jobrunner.pod_for(job) | {"status": {"phase": "Running"}}  # as the Job controller makes it
    pod["metadata"] |= {"name": "w-1", "namespace": NS}
    [(key, kept)] = indexes.pod_entries(pod).items()
    assert key == (indexes.JOB_PODS, NS, job["metadata"]["name"])
    image = job["spec"]["template"]["spec"]["containers"][0]["image"]
    assert kept["spec"]["containers"] == [{"image": image}] and kept["status"] == {"phase": "Running"}

    training = {
        "metadata": {"name": "t", "namespace": NS, "labels": {jobs.LABEL_CACHE: "llama"}},
        "spec": {
            "containers": [{"name": "c", "image": "t:1", "env": [{"name": "TOKEN", "value": "secret"}]}],
            "schedulingGates": [],
        },
    }
    [(key, kept)] = indexes.pod_entries(training).items()
    assert key == (indexes.TRAINING_PODS, NS, "llama")
    # A pod's environment is never kept; its images are (a pod waits only for its own: images.py).
    assert kept["spec"] == {"schedulingGates": [], "containers": [{"image": "t:1"}]}
    # Any other pod of the cluster costs nothing: a Job's pod that is not one of ours, a bare pod.
    other = {"metadata": {"name": "o", "namespace": NS, "labels": {"job-name": "nightly-etl"}}, "spec": {}}
    assert indexes.pod_entries(other) == {} and indexes.pod_entries({"metadata": {"name": "b"}}) == {}


def test_a_nodes_heartbeat_changes_nothing_a_pass_reads_but_its_labels_and_gpus_do() -> None:
    base = node("n0", "NVIDIA-H100-80GB-HBM3", 8)
    beat = base | {
        "metadata": base["metadata"] | {"annotations": {"node.alpha.kubernetes.io/ttl": "0"}, "resourceVersion": "9"},
        "status": base["status"]
        | {"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-11-27T01:00:00Z"}]},
    }
    beat["status"]["images"] = [{"names": ["registry.example/big:1"], "sizeBytes": 10**10}]
    # What handlers.node_changed compares: equal, so the heartbeat wakes no cache.
    assert indexes.node_entries(beat) == indexes.node_entries(base)
    relabelled = base | {"metadata": base["metadata"] | {"labels": {**base["metadata"]["labels"], "team": "a"}}}
    assert indexes.node_entries(relabelled) != indexes.node_entries(base)
    fewer = base | {"status": {"allocatable": {**base["status"]["allocatable"], "nvidia.com/gpu": "4"}}}
    assert indexes.node_entries(fewer) != indexes.node_entries(base)
    cordoned = base | {"spec": {"unschedulable": True}}
    assert indexes.node_entries(cordoned) != indexes.node_entries(base)
    [kept] = indexes.node_entries(beat).values()
    assert "images" not in kept["status"] and "conditions" not in kept["status"]


def reader_of(loop: asyncio.AbstractEventLoop, client: Client | None = None, **held: Any) -> indexes.IndexedReader:
    """A reader over hand-made indexes (``jobs=``, ``pods=``, ``nodes=``... as the fields of ``indexes.Indexes``)."""
    found = indexes.Indexes(**{f.name: held.get(f.name, {}) for f in dataclasses.fields(indexes.Indexes)})
    return indexes.IndexedReader(found, loop, client)  # type: ignore[arg-type]  # None: no template read by GET


# --- the reader: a worker asks the loop ------------------------------------------------------------------


@pytest.fixture
def looping() -> Iterator[tuple[asyncio.AbstractEventLoop, threading.Thread]]:
    """An event loop running in its own thread, as kopf's does beside the pass workers."""
    running = asyncio.new_event_loop()
    thread = threading.Thread(target=running.run_forever, daemon=True)
    thread.start()
    yield running, thread
    if not running.is_closed():
        running.call_soon_threadsafe(running.stop)
        thread.join(timeout=10)
        running.close()


def test_a_worker_reads_the_indexes_through_the_loop_and_gets_a_copy_in_name_order(looping) -> None:
    loop, _ = looping
    key = (indexes.WARMUP_JOBS, NS, "llama")
    store: dict[Any, Any] = {key: [{"metadata": {"name": "b"}}, {"metadata": {"name": "a"}}]}
    reader = reader_of(loop, jobs=store)
    with concurrent.futures.ThreadPoolExecutor(1) as worker:
        found = worker.submit(reader.warmup_jobs, NS, "llama").result(timeout=10)
        assert [job["metadata"]["name"] for job in found] == ["a", "b"]
        assert worker.submit(reader.expiry_jobs, NS, "llama").result(timeout=10) == ()
        assert worker.submit(reader.claim, NS, "jax-cache").result(timeout=10) is None


def test_a_read_once_the_loop_is_closed_fails_at_once(looping) -> None:
    loop, thread = looping
    reader = reader_of(loop)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)
    assert not thread.is_alive(), "the loop did not stop"
    loop.close()
    with pytest.raises(RuntimeError):  # the operator is stopping: the pass fails, it does not hang
        reader.nodes()


def test_an_audit_finds_what_the_indexes_hold_that_the_api_deleted_and_the_reader_forgets_it(
    kube_env: Any, looping
) -> None:
    """kopf keeps an entry whose DELETED event it missed (a relist after a 410 or a pause): an audit finds it."""
    loop, _ = looping

    def job(name: str, **meta: str) -> dict[str, Any]:
        made = warmup_job()
        del made["metadata"]["ownerReferences"]  # no cache in this API: its garbage collector would take them
        return made | {"metadata": made["metadata"] | {"name": name, **meta}}

    live = kube_env.create("batch/v1/jobs", job("llama-live"), NS)  # the API assigns its uid
    deleted = job("llama-gone", uid="gone-uid")
    key = (indexes.WARMUP_JOBS, NS, "llama")
    held: dict[Any, Any] = {key: [indexes.slim_job(live), indexes.slim_job(deleted)]}
    client = Client.from_environment()
    reader = reader_of(loop, client, jobs=held)
    audited = indexes.Audit(reader)
    assert len(audited.warmup_jobs(NS, "llama")) == 2
    assert audited.claim(NS, "jax-cache") is None
    kube_env.create("batch/v1/jobs", job("llama-new"), NS)  # in the API's answer, not in memory's: not a deletion
    assert audited.deleted(ApiReader(client)) == {"gone-uid"}
    reader.forget({"gone-uid"})
    assert [job["metadata"]["uid"] for job in reader.warmup_jobs(NS, "llama")] == [live["metadata"]["uid"]]
    client.close()


def test_an_audit_finds_a_pod_template_the_api_deleted_and_made_again(kube_env, looping) -> None:
    """A PodTemplate comes from memory too: one deleted and made again in a watch's gap leaves kopf both."""
    loop, _ = looping
    pod = {"containers": [{"name": "train", "image": "registry.example/trainer:1.2"}]}
    made = kube_env.create("v1/podtemplates", {"metadata": {"name": "training"}, "template": {"spec": pod}}, NS)
    gone = made | {"metadata": made["metadata"] | {"uid": "gone-uid"}}
    key = (indexes.POD_TEMPLATE, NS, "training")
    held_templates: dict[Any, Any] = {key: [indexes.slim_pod_template(gone), indexes.slim_pod_template(made)]}
    client = Client.from_environment()
    reader = reader_of(loop, client, pod_templates=held_templates)
    audited = indexes.Audit(reader)
    ref = TemplateRef("PodTemplate", "training")
    assert audited.template(NS, ref)["metadata"]["uid"] == "gone-uid"  # the older entry, first in kopf's store
    assert audited.deleted(ApiReader(client)) == {"gone-uid"}
    reader.forget({"gone-uid"})
    assert reader.template(NS, ref)["metadata"]["uid"] == made["metadata"]["uid"]
    client.close()


# --- the real operator ---------------------------------------------------------------------------------


def requests_made() -> dict[tuple[str, str], float]:
    """The operator's API requests so far, by (verb, resource), from its own metrics."""
    return {
        (sample.labels["verb"], sample.labels["resource"]): sample.value
        for family in metrics.METRICS.registry.collect()
        if family.name == "compilecache_api_requests"
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def passes_made() -> float:
    return sum(
        sample.value
        for family in metrics.METRICS.registry.collect()
        if family.name == "compilecache_reconcile_duration_seconds"
        for sample in family.samples
        if sample.name.endswith("_count")
    )


def lists(before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]) -> dict[str, float]:
    return {r: n - before.get((v, r), 0) for (v, r), n in after.items() if v == "list" and n > before.get((v, r), 0)}


@pytest.fixture
def nodes(kube_env: Any) -> list[dict[str, Any]]:
    created = []
    for item in cluster():
        kube_env.create("v1/nodes", item)
        created.append(
            kube_env.patch("v1/nodes", item["metadata"]["name"], {"status": item["status"]}, subresource="status")
        )
    return created


@pytest.fixture
def operator(kube_env: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[KopfRunner]:
    """The real operator, with a resync too long to matter: what happens, events made happen."""
    with running_operator(monkeypatch, 3600) as runner:
        yield runner


@pytest.mark.slow
def test_passes_list_nothing_while_caches_warm_and_a_job_changes(kube_env, nodes, operator) -> None:
    before = requests_made()
    for index in range(3):
        create_cache(kube_env, f"c{index}", storage={"pvc": {"claimName": f"cache-{index}", "create": {"size": "1Gi"}}})
    created = {f"c{index}": wait_jobs(kube_env, 2, f"c{index}") for index in range(3)}
    for index in range(3):
        kube_env.wait_for(lambda name=f"c{index}": status_of(kube_env, name).get("phase") == "Warming")
    steady, passes = requests_made(), passes_made()

    # One Job changes: its cache's pass reads the new state from memory and records it.
    job = created["c1"]["nvidia-h100-80gb-hbm3"]
    finish(kube_env, job, succeeded=False)
    failed = kube_env.wait_for(
        lambda: next(
            (p for p in status_of(kube_env, "c1").get("pools") or [] if p.get("state") == "Failed"),
            None,
        )
    )
    assert failed["job"] == job["metadata"]["name"]
    assert passes_made() > passes
    after = requests_made()
    assert lists(steady, after) == {}, "a steady-state pass listed from the API"
    assert lists(before, after) == {}, "the passes of new caches listed from the API"
    # What the passes did ask: the cache itself, and writes.
    verbs = {verb for (verb, _), n in after.items() if n > before.get((verb, _), 0)}
    assert verbs <= {"get", "create", "patch"}, verbs
    assert after[("create", "jobs")] - before.get(("create", "jobs"), 0) == 6


@pytest.mark.slow
def test_a_node_that_comes_reaches_every_cache_without_waiting_for_the_resync(kube_env, nodes, operator) -> None:
    for name in ("a", "b"):
        create_cache(kube_env, name, storage={"pvc": {"claimName": f"cache-{name}", "create": {"size": "1Gi"}}})
        wait_jobs(kube_env, 2, name)
    # A heartbeat changes nothing a pass reads: no pass, and so no new Job.
    beat = {
        "status": {"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-11-27T01:00:00Z"}]}
    }
    kube_env.patch("v1/nodes", nodes[0]["metadata"]["name"], beat, subresource="status")
    b200 = node("b200-0", "NVIDIA-B200", 8)
    kube_env.create("v1/nodes", b200)
    kube_env.patch("v1/nodes", "b200-0", {"status": b200["status"]}, subresource="status")
    for name in ("a", "b"):  # the resync is an hour away: the Node's event woke them
        jobs_ = wait_jobs(kube_env, 3, name)
        assert "nvidia-b200" in jobs_
    wait_phase(kube_env, "Warming", "a")


@pytest.mark.slow
def test_a_pod_template_a_cache_names_reaches_its_warm_ups_from_the_index(kube_env, nodes, operator) -> None:
    """A PodTemplate holds its pod spec in ``template``, not ``spec``: the index must keep it."""
    pod = {
        "containers": [
            {"name": "train", "image": cache_spec()["warmup"]["image"], "env": [{"name": "DATA", "value": "/d"}]}
        ]
    }
    kube_env.create("v1/podtemplates", {"metadata": {"name": "training"}, "template": {"spec": pod}}, NS)
    warmup = cache_spec()["warmup"] | {"podTemplate": {"templateRef": {"kind": "PodTemplate", "name": "training"}}}
    create_cache(kube_env, warmup=warmup)
    settled = kube_env.wait_for(
        lambda: status_of(kube_env).get("phase") in ("Warming", "Failed") and status_of(kube_env)
    )
    assert settled["phase"] == "Warming", settled.get("message")
    for job in wait_jobs(kube_env, 2).values():
        env = job["spec"]["template"]["spec"]["containers"][0].get("env") or []
        assert {"name": "DATA", "value": "/d"} in env, env


@pytest.mark.slow
def test_the_periodic_audit_asks_the_api_and_forgets_nothing_that_exists(
    kube_env, nodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(handlers.RESYNC_SECONDS_ENV, "0.2")
    monkeypatch.setenv(handlers.AUDIT_SECONDS_ENV, "0.2")  # every pass or so audits
    before = requests_made()
    with KopfRunner(["run", "--standalone", "-A"], registry=handlers.registry, timeout=30) as runner:
        create_cache(kube_env)
        jobs_ = wait_jobs(kube_env, 2)
        kube_env.wait_for(lambda: lists(before, requests_made()).get("jobs", 0) >= 2, timeout=15)
        for job in jobs_.values():
            finish(kube_env, job, succeeded=True)
        wait_phase(kube_env, "Expiring")  # the audited passes still see the Jobs and move on
    assert runner.exception is None, runner.output
    assert "deleted while a watch was down" not in runner.output


# --- expectations: what a pass created, the next one counts on ---------------------------------------------


def test_an_expectation_stands_until_the_object_is_seen_or_too_old() -> None:
    job = {"metadata": {"name": "llama-h100-1"}}
    expected = {"jobs/llama-h100-1": 100.0, "persistentvolumeclaims/jax-cache": 100.0}
    none_seen = Snapshot(Cache.read(cache()))
    assert expectations.unseen(expected, none_seen, 101.0) == expected
    assert expectations.unseen(expected, dataclasses.replace(none_seen, jobs=(job,)), 101.0) == {
        "persistentvolumeclaims/jax-cache": 100.0
    }
    assert expectations.unseen(expected, none_seen, 100.0 + expectations.EXPECT_SECONDS) == {}


def test_a_pass_whose_indexes_lag_behind_its_creates_makes_them_once_and_lists_nothing(kube_env, looping) -> None:
    """The indexes never show what the first pass made (a watch that lags): the next pass counts on it."""
    loop, _ = looping
    kube_env.create(
        "compilecache.dev/v1alpha1/compilecaches", {"metadata": {"name": "llama"}, "spec": cache()["spec"]}, NS
    )
    held: dict[Any, Any] = {(indexes.NODES, None, None): [indexes.slim_node(item) for item in cluster()]}
    client = Client.from_environment()
    lagging = reader_of(loop, client, nodes=held)
    before = requests_made()
    first = reconcile(client, NS, "llama", reader=lagging)
    assert first.error is None and set(first.expected) == {
        "persistentvolumeclaims/jax-cache",
        *(f"jobs/{job['metadata']['name']}" for job in kube_env.list("batch/v1/jobs", NS)),
    }
    made = requests_made()
    second = reconcile(client, NS, "llama", reader=lagging, expected=first.expected)
    after = requests_made()
    assert second.error is None and second.expected == first.expected
    assert after.get(("create", "jobs")) == made.get(("create", "jobs")), "the second pass created again"
    assert lists(before, after) == {}, "a 409 made the pass read the API"
    assert second.status and second.status["phase"] == "Warming"
    # Without the expectations the same pass creates again, gets 409s, and lists from the API.
    third = reconcile(client, NS, "llama", reader=lagging)
    assert third.error is None and lists(after, requests_made()), "expected a 409 and a list"
    client.close()


def held(objects: list[dict[str, Any]], entries: Any) -> dict[Any, list[Any]]:
    """An index as kopf keeps it for ``objects``: each one's entries (``indexes.*_entries``) under their keys."""
    found: dict[Any, list[Any]] = {}
    for obj in objects:
        for key, kept in entries(obj).items():
            found.setdefault(key, []).append(kept)
    return found


def test_a_podtemplate_older_than_a_gated_pods_image_is_read_from_the_api(kube_env, looping) -> None:
    """Issue 33: training's PodTemplate moved to a new image and its pod came before the template's watch event.

    The pass must not release that pod cold as on an image never warmed, nor keep warming the old image: a
    gated pod on an image neither status.images nor the PodTemplate in memory names makes the pass read
    the PodTemplate from the API. Without such a pod the memory serves (no GET per pass)."""
    loop, _ = looping
    body = cache()
    del body["spec"]["warmup"]["image"]
    body["spec"]["warmup"]["podTemplate"] = {"templateRef": {"kind": "PodTemplate", "name": "train"}}
    kube_env.create(
        "compilecache.dev/v1alpha1/compilecaches", {"metadata": {"name": "llama"}, "spec": body["spec"]}, NS
    )
    old, new = "registry.example/trainer:1.2", "registry.example/trainer:1.3"

    def pod_template(image: str) -> dict[str, Any]:
        containers = [{"name": "train", "image": image}]
        return {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": "train", "namespace": NS},
            "template": {"spec": {"containers": containers}},
        }

    kube_env.create("v1/podtemplates", pod_template(new), NS)  # the API has the new image
    client = Client.from_environment()
    gated = {
        "metadata": {"name": "t", "namespace": NS, "labels": {jobs.LABEL_CACHE: "llama"}},
        "spec": {"schedulingGates": [{"name": "compilecache.dev/warm"}], "containers": [{"name": "c", "image": new}]},
    }

    def reader(pods: list[dict[str, Any]]) -> indexes.IndexedReader:
        found = indexes.Indexes(
            {},
            held(pods, indexes.pod_entries),
            held(cluster(), indexes.node_entries),
            {},
            {},
            held([pod_template(old)], indexes.pod_template_entries),  # memory: still the old image
        )
        return indexes.IndexedReader(found, loop, client)

    read = Cache.read(kube_env.get("compilecache.dev/v1alpha1/compilecaches", "llama", NS))
    ref = TemplateRef("PodTemplate", "train")
    from compilecache.controller.snapshot import observe

    calm = observe(reader([]), read, ())
    assert calm.template is not None and calm.template["template"]["spec"]["containers"][0]["image"] == old
    pods = reader([gated]).training_pods(NS, "llama")
    assert pods and pods[0]["spec"]["containers"] == [{"image": new}]
    fresh = observe(reader([gated]), read, pods)
    assert fresh.template is not None and fresh.template["template"]["spec"]["containers"][0]["image"] == new
    assert reader([]).template(NS, ref) is not None  # and from memory by default
    client.close()


def test_a_finished_jobs_pods_are_read_from_the_api_while_the_pod_index_still_shows_them_running(
    kube_env, looping
) -> None:
    """Pods and Jobs come by separate watches: the expiry Job's end may come before its pod's.

    The Job controller marks a Job finished only after its pods' final status, so a list then (the
    passes before the indexes) always read the pod's termination message, the expiry's summary.
    """
    loop, _ = looping
    kube_env.create(
        "compilecache.dev/v1alpha1/compilecaches", {"metadata": {"name": "llama"}, "spec": cache()["spec"]}, NS
    )
    client = Client.from_environment()
    nodes_held = held(cluster(), indexes.node_entries)

    def caught_up(pods: list[dict[str, Any]]) -> indexes.IndexedReader:
        found = indexes.Indexes(
            held(kube_env.list("batch/v1/jobs", NS), indexes.job_entries),
            held(pods, indexes.pod_entries),
            nodes_held,
            held(kube_env.list("v1/persistentvolumeclaims", NS), indexes.claim_entries),
            {},
            {},
        )
        return indexes.IndexedReader(found, loop, client)

    assert reconcile(client, NS, "llama", reader=caught_up([])).error is None  # the claim and 2 warm-up Jobs
    for job in kube_env.list("batch/v1/jobs", NS):
        warm_pod(kube_env, job, entries=2)
        finish(kube_env, job, succeeded=True)
    warmed = reconcile(client, NS, "llama", reader=caught_up(kube_env.list("v1/pods", NS)))
    assert warmed.error is None and warmed.status and warmed.status["phase"] == "Expiring", warmed.status
    [expiry] = kube_env.list("batch/v1/jobs", NS, f"{expiryjob.LABEL_EXPIRY_OF}=llama")
    finish_expiry(kube_env, expiry)
    # The pod index has not had the expiry pod's last event yet: it shows the pod as it ran.
    ran = {"phase": "Running", "containerStatuses": [{"name": "expire", "state": {"running": {}}}]}
    pods = [
        pod | {"status": ran} if pod["metadata"]["labels"].get(expiryjob.LABEL_EXPIRY_OF) else pod
        for pod in kube_env.list("v1/pods", NS)
    ]
    done = reconcile(client, NS, "llama", reader=caught_up(pods))
    client.close()
    assert done.error is None and done.status and done.status["phase"] == "Ready", done.status
    assert "no summary" not in done.status["message"], done.status["message"]
    assert done.status["cache"]["lastDeleted"] == SUMMARY["deleted"]


def test_a_pods_or_claims_own_labels_and_annotations_stay_out_of_memory_and_an_absent_map_stays_absent() -> None:
    """Anyone who may create pods may label thousands with a cache and 256 KiB of annotations each."""
    meta = {
        "name": "t",
        "namespace": NS,
        "labels": {jobs.LABEL_CACHE: "llama", "team": "x" * 63},
        "annotations": {"notes": "x" * 200_000, "compilecache.dev/released": "GateTimeout at 2026-11-27T01:00:00Z"},
    }
    [kept] = indexes.pod_entries({"metadata": meta, "spec": {}}).values()
    assert kept["metadata"]["labels"] == {jobs.LABEL_CACHE: "llama"}
    assert kept["metadata"]["annotations"] == {
        "compilecache.dev/released": meta["annotations"]["compilecache.dev/released"]
    }
    bare = {k: v for k, v in meta.items() if k != "annotations"}
    [kept] = indexes.pod_entries({"metadata": bare, "spec": {}}).values()
    assert "annotations" not in kept["metadata"]  # gates.release_patch adds the map itself then
    claim = {"metadata": {"name": "c", "namespace": NS, "labels": {"compilecache.dev/cache-claim": "true", "a": "b"}}}
    [kept] = indexes.claim_entries(claim).values()
    assert kept["metadata"]["labels"] == {"compilecache.dev/cache-claim": "true"}


def test_an_audit_does_not_forget_a_pod_that_moved_to_another_cache(kube_env: Any, looping) -> None:
    """Memory still shows a pod under cache a; the API has it relabelled for cache b: moved, not deleted."""
    loop, _ = looping
    moved = kube_env.create(
        "v1/pods",
        {
            "metadata": {"name": "t", "labels": {jobs.LABEL_CACHE: "b"}},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        },
        NS,
    )
    was = indexes.slim_pod(moved | {"metadata": moved["metadata"] | {"labels": {jobs.LABEL_CACHE: "a"}}})
    gone = {"metadata": {"name": "u", "namespace": NS, "uid": "gone-uid", "labels": {jobs.LABEL_CACHE: "a"}}}
    held: dict[Any, Any] = {(indexes.TRAINING_PODS, NS, "a"): [was, gone]}
    client = Client.from_environment()
    reader = reader_of(loop, client, pods=held)
    audited = indexes.Audit(reader)
    assert len(audited.training_pods(NS, "a")) == 2
    assert audited.deleted(ApiReader(client)) == {"gone-uid"}
    client.close()


@pytest.mark.parametrize("workers", ["0", "65", "many"])
def test_a_pass_worker_count_out_of_bounds_stops_the_operator_naming_it(
    kube_env, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, workers: str
) -> None:
    monkeypatch.setenv(handlers.PASS_WORKERS_ENV, workers)
    runner = KopfRunner(["run", "--standalone", "-A"], registry=handlers.registry, timeout=30, reraise=False)
    with runner:
        pass  # the startup handler refuses it: kopf stops on its own
    assert runner.exit_code != 0 and runner.exception is not None
    assert f"{handlers.PASS_WORKERS_ENV}={workers!r}" in caplog.text
