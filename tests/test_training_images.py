"""The cache follows training's image (issue 33 item 2): status.images, a pod waits only for its own image.

Pure: images.advance/keep_only, the gate's rule (gates.reason_to_release) with generated records and pods,
the webhook's decision (admission.mutate), a pass whose referenced template moved to a new image (plan.plan),
and keepVersions ranking images in the expiry (cache/expiry.py). The operator on the local cluster is in
test_e2e.py (``test_a_new_training_image_is_warmed_while_pods_on_the_old_one_keep_hitting``).
"""

from __future__ import annotations

import copy
import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compilecache.cache.expiry import Policy, index_manifests, plan_expiry
from compilecache.cache.store import Listing, StoredFile
from compilecache.controller import admission, gates, images, jobs, plan, status
from compilecache.controller.api import Consumers, SpecError, parse_spec
from compilecache.controller.snapshot import Cache, Snapshot
from specs import OPEN_POLICY, cache, cluster
from test_template import training_pod_spec

OLD, NEW, OTHER = "registry.example/trainer:1.2", "registry.example/trainer:1.3", "registry.example/other:9"
NOW = "2026-11-27T10:00:00Z"
NOW_TIME = datetime.datetime(2026, 11, 27, 10, 0, tzinfo=datetime.UTC)
CONSUMERS = Consumers()  # gate on, 30 min


def following(**spec: Any) -> dict[str, Any]:
    """A cache that takes training's image from a referenced Job (no warmup.image)."""
    obj = cache(**spec)
    del obj["spec"]["warmup"]["image"]
    obj["spec"]["warmup"]["podTemplate"] = {"templateRef": {"kind": "Job", "name": "train"}, "container": "train"}
    return obj


def training_job(image: str) -> dict[str, Any]:
    pod = training_pod_spec()
    pod["containers"][0]["image"] = image
    return {"apiVersion": "batch/v1", "kind": "Job", "spec": {"template": {"spec": pod}}}


def gated_pod(image: str, name: str = "p", created: str = "2026-11-27T09:59:00Z") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {jobs.LABEL_CACHE: "llama"},
            "creationTimestamp": created,
        },
        "spec": {
            "schedulingGates": [{"name": admission.GATE}],
            "containers": [{"name": "train", "image": image}, {"name": "log", "image": "registry.example/logger:1"}],
        },
    }


def record(image: str, state: str, warmed: str | None = None) -> dict[str, Any]:
    return {"image": image, "state": state, "since": "2026-11-20T00:00:00Z", **({"warmedAt": warmed} if warmed else {})}


# --- status.images --------------------------------------------------------------------------------------


def test_a_new_image_is_warming_first_and_the_old_one_stays_ready_until_it_serves() -> None:
    old = [record(OLD, "Ready", "2026-11-20T00:00:00Z")]
    warming = images.advance(old, NEW, status.WARMING, settled=False, now=NOW)
    assert warming == [{"image": NEW, "state": "Warming", "since": NOW}, old[0]]
    later = "2026-11-27T11:00:00Z"
    ready = images.advance(warming, NEW, status.READY, settled=False, now=later)
    assert ready[0] == {"image": NEW, "state": "Ready", "since": later, "warmedAt": later} and ready[1] == old[0]
    # A pass that changes nothing keeps the record as it was (no status write).
    assert images.advance(ready, NEW, status.READY, settled=False, now="2026-11-28T00:00:00Z") == ready
    # Training moved on before 1.3 served: nothing waits for 1.3 any more.
    moved = images.advance(warming, OTHER, status.WARMING, settled=False, now=later)
    assert [r["image"] for r in moved] == [OTHER, OLD]
    # A warm-up that failed on every pool: Failed, and pods on it are not held.
    assert images.advance(old, NEW, status.FAILED, settled=True, now=NOW)[0]["state"] == "Failed"
    # A pass's own error (not settled) is not the image's failure.
    assert images.advance(old, NEW, status.FAILED, settled=False, now=NOW)[0]["state"] == "Warming"


def test_the_record_is_bounded_newest_first_and_expiry_drops_images_whose_entries_are_gone() -> None:
    old = [record(f"t:{i}", "Ready", f"2026-11-{i + 1:02d}T00:00:00Z") for i in range(20)]
    now = images.advance(old, NEW, status.READY, settled=False, now=NOW)
    assert len(now) == images.MAX_IMAGES and now[0]["image"] == NEW
    assert [r["image"] for r in now[1:4]] == ["t:19", "t:18", "t:17"]
    gone = {r["image"] for r in now} - {"t:18"}
    assert [r["image"] for r in images.keep_only(now, gone)] == [NEW, "t:18"]  # the current one stays


def test_recorded_reads_only_well_formed_entries() -> None:
    written = {"images": [record(OLD, "Ready"), {"image": 3, "state": "Ready"}, {"image": "x", "state": "Gone"}, "x"]}
    assert images.recorded(written) == (record(OLD, "Ready"),)
    assert images.recorded({"images": "nonsense"}) == () and images.recorded(None) == ()


# --- the gate's rule ----------------------------------------------------------------------------------------


def reason(pod_image: str, warmed: list[dict[str, Any]], phase: str, current: str | None, **kw: Any) -> str | None:
    return gates.reason_to_release(
        gated_pod(pod_image), CONSUMERS, phase=phase, now=NOW_TIME, warmed=warmed, current=current, **kw
    )


def test_each_pod_waits_only_for_its_own_image() -> None:
    warmed = [record(NEW, "Warming"), record(OLD, "Ready")]
    assert reason(OLD, warmed, status.WARMING, NEW) == gates.IMAGE_WARMED  # its entries are served
    assert reason(NEW, warmed, status.WARMING, NEW) is None  # its warm-up runs: it waits
    assert reason(OTHER, warmed, status.WARMING, NEW) == gates.UNWARMED_IMAGE  # nothing to wait for
    # Outside a pass, with a templateRef no one has read: a pod on an image not recorded waits for the pass.
    assert reason(OTHER, warmed, status.WARMING, None) is None
    assert reason(OTHER, [record(OLD, "Ready")], status.READY, None) is None  # even on a stale Ready
    # A pinned cache whose spec moved to NEW before a pass recorded it: its pods wait.
    assert reason(NEW, [record(OLD, "Ready")], status.READY, NEW) is None
    ready = [record(NEW, "Ready"), record(OLD, "Ready")]
    assert reason(NEW, ready, status.READY, NEW) == gates.CACHE_READY
    assert reason(OTHER, ready, status.READY, NEW) == gates.UNWARMED_IMAGE
    # A status from before status.images: as before, the phase decides.
    assert reason(OTHER, [], status.READY, None) == gates.CACHE_READY
    assert reason(OTHER, [], status.WARMING, None) is None


@settings(max_examples=300, deadline=None)
@given(
    states=st.lists(st.sampled_from(images.STATES), min_size=0, max_size=3),
    pod_at=st.integers(min_value=0, max_value=4),
    current_at=st.one_of(st.none(), st.integers(min_value=0, max_value=4)),
    phase=st.sampled_from(status.PHASES),
    settled=st.booleans(),
    age=st.sampled_from([0.0, 10.0, 1799.0, 1800.0, 1e6]),
    gate=st.booleans(),
)
def test_the_gate_never_holds_a_pod_for_another_image_and_never_lets_one_go_cold_before_its_image_warmed(
    states: list[str], pod_at: int, current_at: int | None, phase: str, settled: bool, age: float, gate: bool
) -> None:
    names = [f"registry.example/t:{i}" for i in range(5)]
    warmed = [record(names[i], state) for i, state in enumerate(states)]
    current = names[current_at] if current_at is not None else None
    pod = gated_pod(names[pod_at], created=(NOW_TIME - datetime.timedelta(seconds=age)).strftime("%Y-%m-%dT%H:%M:%SZ"))
    consumers = Consumers(gate=gate, gate_timeout_seconds=1800.0)
    why = gates.reason_to_release(
        pod, consumers, phase=phase, now=NOW_TIME, settled=settled, warmed=warmed, current=current
    )
    mine = next((r for r in warmed if r["image"] == names[pod_at]), None)
    if mine is not None and mine["state"] == "Ready":
        assert why in (gates.CACHE_READY, gates.CACHE_DEGRADED, gates.IMAGE_WARMED)  # served: never held
    if why == gates.UNWARMED_IMAGE:  # let go cold only when it is known that nothing warms its image
        assert warmed and mine is None and current is not None and current != names[pod_at]
    # Held for no longer than gateTimeout, and not at all with the gate off.
    if age >= 1800.0 or not gate:
        assert why is not None
    # A pod on the image being warmed is released before its warm-up only by the timeout, the gate's
    # switch, or a warm-up that failed everywhere: never as if the cache served it.
    if mine is not None and mine["state"] == "Warming":
        assert why in (None, gates.GATE_TIMEOUT, gates.GATE_DISABLED, gates.CACHE_FAILED)


# --- the webhook ------------------------------------------------------------------------------------------


def admit(pod_image: str, obj: dict[str, Any]) -> admission.Mutation:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "train-", "namespace": "default", "labels": {jobs.LABEL_CACHE: "llama"}},
        "spec": {"containers": [{"name": "train", "image": pod_image}]},
    }
    return admission.mutate(pod, obj, rules=OPEN_POLICY)


def with_status(obj: dict[str, Any], phase: str, warmed: list[dict[str, Any]]) -> dict[str, Any]:
    return {**copy.deepcopy(obj), "status": {"phase": phase, "images": warmed}}


def test_the_webhook_holds_a_pod_only_for_an_image_being_warmed_or_not_yet_read() -> None:
    refreshing = with_status(following(), status.WARMING, [record(NEW, "Warming"), record(OLD, "Ready")])
    assert not gates.is_gated(admit(OLD, refreshing).pod)  # served now
    assert gates.is_gated(admit(NEW, refreshing).pod)  # its warm-up runs
    unknown = admit(OTHER, refreshing)  # the template may have moved to it: the next pass tells
    assert gates.is_gated(unknown.pod) and any("next pass" in w for w in unknown.warnings), unknown.warnings
    ready = with_status(following(), status.READY, [record(OLD, "Ready")])
    assert not gates.is_gated(admit(OLD, ready).pod)
    # A fresh cache (no pass yet): every pod waits, as before.
    assert gates.is_gated(admit(OTHER, following()).pod)
    # A pinned image: a pod on another is never held (nothing will warm it), only warned about.
    pinned = cache()
    assert gates.is_gated(admit("registry.example/trainer:1.2", pinned).pod)
    other = admit(OTHER, pinned)
    assert not gates.is_gated(other.pod) and any("warm-up's image" in w for w in other.warnings)
    # The pinned spec moved to a new image its pass has not recorded yet: pods on it wait.
    moved = with_status(cache(), status.READY, [record(OLD, "Ready")])
    moved["spec"]["warmup"]["image"] = NEW
    assert gates.is_gated(admit(NEW, moved).pod)
    assert not gates.is_gated(admit(OLD, moved).pod)


# --- a pass ------------------------------------------------------------------------------------------------


def test_a_pass_warms_training_s_new_image_while_pods_on_the_old_one_go_and_others_go_cold() -> None:
    obj = following()
    first = plan.plan(
        Snapshot(Cache.read(obj), policy=OPEN_POLICY, nodes=tuple(cluster()), template=training_job(OLD)), NOW
    )
    assert first.status["images"] == [{"image": OLD, "state": "Warming", "since": NOW}]
    old_jobs = {c.manifest["metadata"]["name"] for c in first.creates if c.resource.plural == "jobs"}
    assert old_jobs and all(
        c.manifest["spec"]["template"]["spec"]["containers"][0]["image"] == OLD
        for c in first.creates
        if c.resource.plural == "jobs"
    )
    # Served for OLD, then training's Job moved to NEW.
    served = with_status(obj, status.READY, [record(OLD, "Ready", "2026-11-26T00:00:00Z")])
    served["status"]["specHash"] = first.status["specHash"]
    pods = (gated_pod(OLD, "on-old"), gated_pod(NEW, "on-new"), gated_pod(OTHER, "on-other"))
    snapshot = Snapshot(
        Cache.read(served), policy=OPEN_POLICY, nodes=tuple(cluster()), template=training_job(NEW), pods=pods
    )
    second = plan.plan(snapshot, NOW)
    assert second.status["phase"] == status.WARMING and second.status["specHash"] != first.status["specHash"]
    assert [r["image"] for r in second.status["images"]] == [NEW, OLD]
    assert second.status["images"][0]["state"] == "Warming" and second.status["images"][1]["state"] == "Ready"
    new_jobs = [c.manifest for c in second.creates if c.resource.plural == "jobs"]
    assert new_jobs and not {job["metadata"]["name"] for job in new_jobs} & old_jobs
    assert all(job["spec"]["template"]["spec"]["containers"][0]["image"] == NEW for job in new_jobs)
    env = {e["name"]: e["value"] for e in new_jobs[0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["COMPILECACHE_IMAGE"] == NEW  # what the run manifests record
    assert {r.pod: r.reason for r in second.releases} == {
        "on-old": gates.IMAGE_WARMED,
        "on-other": gates.UNWARMED_IMAGE,
    }


def test_without_warmup_image_or_template_the_spec_is_refused_and_a_template_without_image_too() -> None:
    obj = cache()
    del obj["spec"]["warmup"]["image"]
    with pytest.raises(SpecError) as caught:
        parse_spec(obj["spec"])
    assert caught.value.field == "spec.warmup" and "podTemplate" in caught.value.message
    inline = cache()
    del inline["spec"]["warmup"]["image"]
    pod = training_pod_spec()
    del pod["containers"][0]["image"]
    inline["spec"]["warmup"]["podTemplate"] = {"spec": pod, "container": "train"}
    with pytest.raises(SpecError) as caught:
        parse_spec(inline["spec"])
    assert caught.value.field == "spec.warmup.podTemplate.spec.containers[0].image"
    # With an image the inline template gives it; a pinned warmup.image wins over it.
    pod["containers"][0]["image"] = NEW
    assert parse_spec(inline["spec"]).warmup.image == NEW
    assert parse_spec(inline["spec"]).warmup.image_from_template
    inline["spec"]["warmup"]["image"] = OLD
    assert parse_spec(inline["spec"]).warmup.image == OLD


# --- keepVersions per image ------------------------------------------------------------------------------


def manifest(image: str | None, finished: str, files: list[str], hits: list[str] = ()) -> dict[str, Any]:
    return {
        "schema": "compilecache.dev/manifest/v1",
        "run_id": f"r-{finished}",
        "finished_at": finished,
        **({"image": image} if image else {}),
        "jax": "0.4.30",
        "jaxlib": "0.4.30",
        "backend": "gpu",
        "device_kind": "NVIDIA H100",
        "entries": [{"file": f, "size": 10} for f in files],
        "hits": [{"file": f} for f in hits],
    }


def test_keep_versions_keeps_the_entries_of_the_newest_images_and_those_they_share() -> None:
    day = 86400.0
    names = ["a-1-cache", "shared-1-cache", "b-1-cache", "c-1-cache", "legacy-1-cache"]
    listing = Listing(files=tuple(StoredFile(n, 10, 0.0) for n in names))
    manifests = [
        manifest(None, "2026-11-01T00:00:00Z", ["legacy-1-cache"]),  # an older warmer: no image recorded
        manifest("t:1", "2026-11-02T00:00:00Z", ["a-1-cache", "shared-1-cache"]),
        manifest("t:2", "2026-11-03T00:00:00Z", ["b-1-cache"], hits=["shared-1-cache"]),
        manifest("t:3", "2026-11-04T00:00:00Z", ["c-1-cache"]),
    ]
    now = datetime.datetime(2026, 11, 5, tzinfo=datetime.UTC).timestamp()
    result = plan_expiry(listing, index_manifests(manifests), Policy(keep_versions=2, grace_seconds=day), now)
    deleted = {d.name: d.reason for d in result.deletions}
    # t:1 is older than the two newest images (t:2, t:3): its own entry goes, the one t:2 hit stays.
    assert set(deleted) == {"a-1-cache"}, deleted
    assert "image t:1 is older than the 2 newest" in deleted["a-1-cache"]
    # The legacy entry has no image: ranked by its build, which t:3's run warmed last, so it stays.
    assert dict(result.images) == {"t:2": 2, "t:3": 1}  # what status.images keeps (t:1 was dropped)
    assert [image for image, _ in result.images] == ["t:3", "t:2"]  # the most recently warmed first


def test_an_image_whose_runs_recorded_no_image_is_not_forgotten_while_its_entries_stay() -> None:
    """After an upgrade, status.images records the image the cache served, but its entries were written by a
    warmer that recorded no image in its run manifests: the expiry cannot say they are gone, so the image
    stays (its pods go as ImageWarmed, not as never warmed). On the old code it left status.images as soon
    as the next image's expiry ran, and its pods were counted and evented as on an image never warmed."""
    import json

    from compilecache.controller import expiryjob
    from compilecache.jobtools import expirecmd

    listing = Listing(files=tuple(StoredFile(n, 10, 0.0) for n in ("old-1-cache", "new-1-cache", "gone-1-cache")))
    manifests = [
        manifest(None, "2026-11-01T00:00:00Z", ["old-1-cache"]),  # OLD's warm-up, before the upgrade
        manifest("registry.example/gone:1", "2026-11-02T00:00:00Z", ["gone-1-cache"]),
        manifest(NEW, "2026-11-04T00:00:00Z", ["new-1-cache"]),
    ]
    now = datetime.datetime(2026, 11, 5, tzinfo=datetime.UTC).timestamp()
    result = plan_expiry(listing, index_manifests(manifests), Policy(keep_versions=1, grace_seconds=86400.0), now)
    assert {d.name for d in result.deletions} == {"gone-1-cache"}  # an older image than the one kept
    document = expirecmd.result_document("gs://b/c", result, dry_run=False, now=now)
    summary = json.loads(expirecmd.termination_message(document))
    records = [
        record(NEW, "Ready", "2026-11-04T00:00:00Z"),
        record(OLD, "Ready", "2026-11-03T00:00:00Z"),
        record("registry.example/gone:1", "Ready", "2026-11-02T00:00:00Z"),
    ]
    kept = expiryjob.images_kept(records, summary)
    assert [r["image"] for r in kept] == [NEW, OLD]  # gone:1's entries were removed; OLD's are unknown, kept
    # A summary without the list (an older expiry, or cut to fit) forgets nothing.
    assert expiryjob.images_kept(records, {"entries": 3}) == records
