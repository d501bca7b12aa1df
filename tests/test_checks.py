"""Issue 32, item 2: the operator as the controller of Kueue AdmissionChecks (``controller/checks.py``).

The decisions (pure, and over generated Workloads), the writes against the API emulator over real HTTP
with the operator's own client, the webhook's side (a pod Kueue started through the check is not gated),
the Workload index, and the registration of the handlers (only where ``COMPILECACHE_KUEUE`` is on).
"""

from __future__ import annotations

import copy
import datetime
from typing import Any

import kopf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compilecache.controller import admission, checks, gates, handlers, indexes
from compilecache.controller.kube import ADMISSION_CHECKS, WORKLOADS, Client
from compilecache.controller.snapshot import Cache
from specs import OPEN_POLICY, cache
from test_indexes import (
    held,
    looping,  # noqa: F401  (a fixture: an event loop in its own thread, as kopf's)
)

NOW = datetime.datetime(2026, 11, 27, 10, 0, 0, tzinfo=datetime.UTC)
OURS = frozenset({"compilecache-warm"})
NS = "default"


def stamp(seconds_ago: float) -> str:
    return (NOW - datetime.timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def with_phase(obj: dict[str, Any], phase: str | None, **status: Any) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    if phase is not None:
        obj["status"] = {"phase": phase, **status}
    return obj


def workload(
    *pod_sets: tuple[str, dict[str, str]],
    checks_: list[dict[str, Any]] | None = None,
    reserved: bool = True,
    name: str = "job-train-1a2b3",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Workload as Kueue writes it: pod sets (name, template labels; the cache's image), its checks, QuotaReserved."""
    sets = pod_sets or (("main", {"compilecache.dev/cache": "llama"}),)
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
        "spec": {
            "queueName": "training",
            "podSets": [
                {
                    "name": set_name,
                    "count": 1,
                    "template": {
                        "metadata": {"labels": labels, **({"annotations": annotations} if annotations else {})},
                        "spec": {"containers": [{"name": "train", "image": "registry.example/trainer:1.2"}]},
                    },
                }
                for set_name, labels in sets
            ],
        },
        "status": {
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "True" if reserved else "False",
                    "reason": "QuotaReserved" if reserved else "Pending",
                    "message": "",
                    # Reserved before the check turned Pending (as after an eviction's reset): the check's time counts.
                    "lastTransitionTime": stamp(3600),
                }
            ],
            "admissionChecks": checks_
            if checks_ is not None
            else [{"name": "compilecache-warm", "state": "Pending", "message": "", "lastTransitionTime": stamp(60)}],
        },
    }


def decide_first(wl: dict[str, Any], caches: list[dict[str, Any]], **kwargs: Any) -> checks.Decision:
    [(index, check)] = checks.pending(wl, OURS)
    return checks.decide(wl, index, check, caches, now=NOW, policy=kwargs.pop("policy", OPEN_POLICY), **kwargs)


# --- decisions ---------------------------------------------------------------------------------------


def test_a_ready_cache_lets_the_workload_through_and_asks_kueue_to_annotate_its_pods() -> None:
    decision = decide_first(workload(), [with_phase(cache(), "Ready")])
    assert decision.reason == gates.CACHE_READY
    assert decision.entry is not None and decision.entry["state"] == "Ready"
    assert decision.entry["message"].startswith("CacheReady: ")
    assert decision.entry["podSetUpdates"] == [
        {"name": "main", "annotations": {admission.ANNOTATION_RELEASED: "CacheReady 2026-11-27T10:00:00Z"}}
    ]
    test, replace = decision.patch
    assert test == {
        "op": "test",
        "path": "/status/admissionChecks/0",
        "value": workload()["status"]["admissionChecks"][0],
    }
    assert replace["op"] == "replace" and replace["value"] == decision.entry


def test_a_warming_cache_holds_the_check_and_says_so_once() -> None:
    warming = with_phase(cache(), "Warming")
    decision = decide_first(workload(), [warming])
    assert decision.reason is None and decision.caches == ("llama",)
    assert decision.entry is not None and decision.entry["state"] == "Pending"
    assert decision.entry["message"] == (
        "waiting for CompileCache llama (Warming; at most its gateTimeout, 1800s) to be Ready before the pods start"
    )
    assert decision.entry["lastTransitionTime"] == stamp(60)  # still Pending: the time it turned Pending stands
    # Written once: with that message already there, the next pass writes nothing.
    again = workload(checks_=[decision.entry])
    assert decide_first(again, [warming]).patch == ()


def test_past_gate_timeout_the_check_turns_ready_anyway_counted_from_when_it_turned_pending() -> None:
    warming = with_phase(cache(consumers={"gateTimeout": "10m"}), "Warming")
    fresh = workload(
        checks_=[{"name": "compilecache-warm", "state": "Pending", "message": "", "lastTransitionTime": stamp(599)}]
    )
    assert decide_first(fresh, [warming]).reason is None
    old = workload(
        checks_=[{"name": "compilecache-warm", "state": "Pending", "message": "", "lastTransitionTime": stamp(600)}]
    )
    decision = decide_first(old, [warming])
    assert decision.reason == gates.GATE_TIMEOUT
    assert "was not Ready within gateTimeout (600s)" in decision.entry["message"]  # type: ignore[index]


def test_gate_timeout_counts_from_the_quota_reservation_not_from_when_kueue_listed_the_check() -> None:
    # Kueue lists a ClusterQueue's checks Pending as soon as it knows the Workload's ClusterQueue, before any
    # quota (workload_controller.go: reconcileSyncAdmissionChecks runs ahead of the QuotaReserved test;
    # syncAdmissionCheckConditions stamps a new check with the clock), and a check still Pending keeps its
    # time through an eviction (resetChecksOnEviction skips it). A Workload that queued for two hours must
    # not find its gateTimeout spent the moment it gets its quota.
    warming = with_phase(cache(consumers={"gateTimeout": "10m"}), "Warming")
    queued_long = workload(
        checks_=[{"name": "compilecache-warm", "state": "Pending", "message": "", "lastTransitionTime": stamp(7200)}]
    )
    queued_long["status"]["conditions"][0]["lastTransitionTime"] = stamp(60)  # quota reserved a minute ago
    assert decide_first(queued_long, [warming]).reason is None
    queued_long["status"]["conditions"][0]["lastTransitionTime"] = stamp(600)
    assert decide_first(queued_long, [warming]).reason == gates.GATE_TIMEOUT


def test_the_policy_caps_the_gate_timeout_of_a_workload_as_of_a_pod() -> None:
    from compilecache.controller.policy import parse

    capped = parse({"maxGateTimeout": "5m"})
    warming = with_phase(cache(consumers={"gateTimeout": "2h"}), "Warming")
    old = workload(
        checks_=[{"name": "compilecache-warm", "state": "Pending", "message": "", "lastTransitionTime": stamp(300)}]
    )
    assert decide_first(old, [warming], policy=capped).reason == gates.GATE_TIMEOUT
    assert decide_first(old, [warming], policy=OPEN_POLICY).reason is None


@pytest.mark.parametrize(
    ("phase", "status", "reason"),
    [
        ("Degraded", {}, gates.CACHE_DEGRADED),
        ("Failed", {"pools": [{"name": "a", "state": "Failed"}]}, gates.CACHE_FAILED),
    ],
)
def test_a_settled_cache_lets_it_through_as_it_releases_a_pod(phase: str, status: dict[str, Any], reason: str) -> None:
    assert decide_first(workload(), [with_phase(cache(), phase, **status)]).reason == reason


def test_a_failed_pass_without_pools_still_holds_it_as_it_holds_a_pod() -> None:
    assert decide_first(workload(), [with_phase(cache(), "Failed")]).reason is None


def test_a_workload_without_a_cache_goes_at_once_and_its_pods_get_no_annotation() -> None:
    plain = workload(("main", {"app": "train"}))
    decision = decide_first(plain, [with_phase(cache(), "Warming")])
    assert decision.reason == checks.NO_CACHE
    assert decision.entry is not None and "podSetUpdates" not in decision.entry
    assert decision.entry["message"] == "NoCache: the Workload's pods use no CompileCache"


def test_a_workload_naming_a_missing_cache_goes_at_once() -> None:
    decision = decide_first(workload(("main", {"compilecache.dev/cache": "gone"})), [with_phase(cache(), "Warming")])
    assert decision.reason == gates.CACHE_DELETED
    # Its pods are still annotated: they name a cache, and must not be held if it comes back meanwhile.
    assert decision.entry is not None and decision.entry["podSetUpdates"][0]["name"] == "main"


def test_a_podselector_chooses_for_a_workload_as_for_a_pod() -> None:
    selecting = with_phase(cache(consumers={"podSelector": {"matchLabels": {"team": "ml"}}}), "Warming")
    opted_in = workload(("main", {"compilecache.dev/inject": "true", "team": "ml"}))
    assert decide_first(opted_in, [selecting]).caches == ("llama",)
    not_opted_in = workload(("main", {"team": "ml"}))
    assert decide_first(not_opted_in, [selecting]).reason == checks.NO_CACHE


def test_gate_off_lets_it_through() -> None:
    decision = decide_first(workload(), [with_phase(cache(consumers={"gate": False}), "Warming")])
    assert decision.reason == gates.GATE_DISABLED


def test_pod_sets_of_two_caches_wait_for_both_and_only_theirs_are_annotated() -> None:
    ready = with_phase(cache("a"), "Ready")
    warming = with_phase(cache("b"), "Warming")
    wl = workload(
        ("driver", {"app": "x"}),
        ("workers", {"compilecache.dev/cache": "a"}),
        ("evals", {"compilecache.dev/cache": "b"}),
    )
    assert decide_first(wl, [ready, warming]).caches == ("b",)
    decision = decide_first(wl, [ready, with_phase(cache("b"), "Degraded")])
    assert decision.reason == gates.CACHE_DEGRADED  # the one that matters most
    assert [u["name"] for u in decision.entry["podSetUpdates"]] == ["workers", "evals"]  # type: ignore[index]


def test_a_pod_set_already_carrying_the_annotation_gets_no_update_kueue_would_refuse() -> None:
    wl = workload(annotations={admission.ANNOTATION_RELEASED: "set by hand"})
    decision = decide_first(wl, [with_phase(cache(), "Ready")])
    assert decision.reason == gates.CACHE_READY and "podSetUpdates" not in decision.entry  # type: ignore[operator]


def test_only_our_pending_checks_on_reserved_quota_are_ours_to_decide() -> None:
    theirs = {"name": "prov", "state": "Pending", "message": "", "lastTransitionTime": stamp(1)}
    ready = {"name": "compilecache-warm", "state": "Ready", "message": "x", "lastTransitionTime": stamp(1)}
    assert checks.pending(workload(checks_=[theirs]), OURS) == []
    assert checks.pending(workload(checks_=[theirs, ready]), OURS) == []
    assert checks.pending(workload(reserved=False), OURS) == []
    mine = workload(checks_=[theirs, {**ready, "state": "Pending"}])
    assert [index for index, _ in checks.pending(mine, OURS)] == [1]
    assert decide_first(mine, [with_phase(cache(), "Ready")]).patch[0]["path"] == "/status/admissionChecks/1"


# --- generated Workloads -----------------------------------------------------------------------------

CACHE_NAMES = ("a", "b", "c")
PHASES = (None, "Pending", "Warming", "Expiring", "Ready", "Degraded", "Failed")
label_sets = st.one_of(
    st.just({"app": "x"}),
    st.sampled_from((*CACHE_NAMES, "missing")).map(lambda n: {"compilecache.dev/cache": n}),
    st.just({"compilecache.dev/inject": "true", "team": "ml"}),
    st.just({"compilecache.dev/inject": "false", "compilecache.dev/cache": "a"}),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sets=st.lists(label_sets, min_size=1, max_size=10),
    phases=st.tuples(*(st.sampled_from(PHASES) for _ in CACHE_NAMES)),
    gate=st.tuples(*(st.booleans() for _ in CACHE_NAMES)),
    selector=st.sampled_from((*CACHE_NAMES, None)),
    age=st.integers(min_value=0, max_value=4000),
)
def test_generated_workloads_are_ready_exactly_when_the_gate_would_release_each_pod(
    sets: list[dict[str, str]], phases: tuple[str | None, ...], gate: tuple[bool, ...], selector: str | None, age: int
) -> None:
    caches = []
    for name, phase, gate_on in zip(CACHE_NAMES, phases, gate, strict=True):
        consumers: dict[str, Any] = {"gate": gate_on, "gateTimeout": "1h"}
        if name == selector:
            consumers["podSelector"] = {"matchLabels": {"team": "ml"}}
        caches.append(with_phase(cache(name, consumers=consumers), phase))
    check = {"name": "compilecache-warm", "state": "Pending", "message": "", "lastTransitionTime": stamp(age)}
    wl = workload(*((f"set-{i}", labels) for i, labels in enumerate(sets)), checks_=[check])
    decision = decide_first(wl, caches)
    # The same rule as a gated pod of each pod set that uses a cache, created when the check turned Pending.
    held = []
    for pod_set in wl["spec"]["podSets"][: checks.MAX_POD_SETS]:
        pod = {**checks.pod_of(wl, pod_set), "spec": {"schedulingGates": [{"name": admission.GATE}]}}
        choice = admission.choose_cache(pod, caches)
        if choice.name is None:
            continue
        chosen = next(c for c in caches if c["metadata"]["name"] == choice.name)
        pod["metadata"]["creationTimestamp"] = stamp(age)
        why = gates.reason_to_release(
            pod,
            Cache.read(chosen).consumers,
            phase=(chosen.get("status") or {}).get("phase"),
            now=NOW,
            settled=False,
        )
        if why is None:
            held.append(choice.name)
    assert (decision.reason is None) == bool(held), (decision, held)
    assert set(decision.caches) >= set(held)
    if decision.entry is not None:
        # What Kueue's CRD admits: the state enum, a message under 32768, at most 8 pod set updates, each
        # naming a pod set of the Workload, additive only.
        assert decision.entry["state"] in ("Pending", "Ready")
        assert len(decision.entry["message"]) <= 32768
        updates = decision.entry.get("podSetUpdates") or []
        assert len(updates) <= 8
        names = [p["name"] for p in wl["spec"]["podSets"]]
        assert all(u["name"] in names for u in updates)
        assert len({u["name"] for u in updates}) == len(updates)
        assert decision.patch[0] == {"op": "test", "path": "/status/admissionChecks/0", "value": check}


# --- the AdmissionCheck's Active condition ------------------------------------------------------------


def test_activate_sets_active_once_per_generation() -> None:
    ac = {
        "metadata": {"name": "compilecache-warm", "generation": 1},
        "spec": {"controllerName": checks.CONTROLLER_NAME},
    }
    [add] = checks.activate(ac, NOW) or []
    assert add["path"] == "/status" and add["value"]["conditions"][0]["status"] == "True"
    ac["status"] = add["value"]
    assert checks.activate(ac, NOW) is None
    ac["metadata"]["generation"] = 2
    patch = checks.activate(ac, NOW + datetime.timedelta(hours=1))
    assert patch is not None and patch[0]["op"] == "test"
    active = patch[1]["value"][0]
    assert active["observedGeneration"] == 2
    assert active["lastTransitionTime"] == "2026-11-27T10:00:00Z"  # it was True: no transition


def test_only_admission_checks_naming_our_controller_are_ours() -> None:
    assert checks.is_ours({"spec": {"controllerName": "compilecache.dev/warm"}})
    assert not checks.is_ours({"spec": {"controllerName": "kueue.x-k8s.io/provisioning-request"}})
    assert indexes.admission_check_entries({"metadata": {"name": "x"}, "spec": {"controllerName": "other"}}) == {}


# --- against the API emulator, with the operator's client ----------------------------------------------


def create_workload(kube: Any, body: dict[str, Any], *, real_clock: bool = False) -> dict[str, Any]:
    """Store the Workload. ``real_clock``: its times moved from :data:`NOW` to the wall clock's now, ages kept,
    for a pass (``reconcile``), which decides at the real time: else past 10:30 on NOW's day, every
    check would have waited longer than gateTimeout."""
    status = body.pop("status")
    if real_clock:
        offset = datetime.datetime.now(datetime.UTC) - NOW
        for item in [*status.get("conditions", []), *status.get("admissionChecks", [])]:
            when = datetime.datetime.fromisoformat(item["lastTransitionTime"].replace("Z", "+00:00"))
            item["lastTransitionTime"] = (when + offset).strftime("%Y-%m-%dT%H:%M:%SZ")
    kube.create(WORKLOADS.api_version + "/workloads", body, NS)
    return kube.patch(
        WORKLOADS.api_version + "/workloads", body["metadata"]["name"], {"status": status}, NS, subresource="status"
    )


def test_sync_writes_only_our_check_and_leaves_another_controllers(kube_env: Any) -> None:
    client = Client.from_environment()
    theirs = {"name": "prov", "state": "Pending", "message": "waiting", "lastTransitionTime": stamp(5)}
    ours = {"name": "compilecache-warm", "state": "Pending", "message": "", "lastTransitionTime": stamp(5)}
    stored = create_workload(kube_env, workload(checks_=[theirs, ours]))
    waiting = checks.sync(client, NS, [stored], [with_phase(cache(), "Warming")], OURS, now=NOW, policy=OPEN_POLICY)
    assert waiting == {"llama": 1}
    read = kube_env.get("kueue.x-k8s.io/v1beta2/workloads", stored["metadata"]["name"], NS)
    assert read["status"]["admissionChecks"][0] == theirs
    assert read["status"]["admissionChecks"][1]["message"].startswith("waiting for CompileCache llama")
    assert checks.sync(client, NS, [read], [with_phase(cache(), "Ready")], OURS, now=NOW, policy=OPEN_POLICY) == {}
    done = kube_env.get("kueue.x-k8s.io/v1beta2/workloads", stored["metadata"]["name"], NS)["status"]["admissionChecks"]
    assert done[0] == theirs
    assert done[1]["state"] == "Ready" and done[1]["podSetUpdates"][0]["name"] == "main"


def test_a_check_changed_since_it_was_read_is_left_to_the_next_pass(kube_env: Any) -> None:
    client = Client.from_environment()
    stored = create_workload(kube_env, workload())
    # Kueue (or another replica) changed the entry after the operator read it.
    changed = copy.deepcopy(stored["status"])
    changed["admissionChecks"][0]["lastTransitionTime"] = stamp(1)
    kube_env.patch(
        "kueue.x-k8s.io/v1beta2/workloads", stored["metadata"]["name"], {"status": changed}, NS, subresource="status"
    )
    checks.sync(client, NS, [stored], [with_phase(cache(), "Ready")], OURS, now=NOW, policy=OPEN_POLICY)
    read = kube_env.get("kueue.x-k8s.io/v1beta2/workloads", stored["metadata"]["name"], NS)
    assert read["status"]["admissionChecks"][0]["state"] == "Pending"  # the stale decision was not written


def test_activate_check_against_the_api(kube_env: Any) -> None:
    client = Client.from_environment()
    body = {"metadata": {"name": "compilecache-warm"}, "spec": {"controllerName": checks.CONTROLLER_NAME}}
    created = kube_env.create("kueue.x-k8s.io/v1beta2/admissionchecks", body)
    checks.activate_check(client, created, NOW)
    read = client.get(ADMISSION_CHECKS, "compilecache-warm")
    assert read is not None
    [active] = read["status"]["conditions"]
    assert (active["type"], active["status"], active["reason"]) == ("Active", "True", "Active")
    checks.activate_check(client, read, NOW)  # nothing to do: no write
    assert (
        client.get(ADMISSION_CHECKS, "compilecache-warm")["metadata"]["resourceVersion"]
        == read["metadata"]["resourceVersion"]
    )  # type: ignore[index]


def test_a_workload_gone_before_the_write_is_left_alone(kube_env: Any) -> None:
    client = Client.from_environment()
    gone = workload(name="never-created")
    assert checks.sync(client, NS, [gone], [with_phase(cache(), "Ready")], OURS, now=NOW, policy=OPEN_POLICY) == {}


def test_a_failed_write_from_a_workload_event_is_retried_where_no_cache_pass_would(
    kube_env: Any,
    looping: Any,  # noqa: F811  (the fixture imported above)
) -> None:
    # A namespace with no CompileCache has no pass to decide again: the Workload's own event is the only
    # one (Kueue writes the Workload no more while the check is Pending, and kopf does not retry event
    # handlers). One refused write there (an API server restarting: 503) must not leave it holding its
    # quota for ever.
    import asyncio
    import concurrent.futures
    import time

    import faultproxy
    from compilecache.local.server import write_kubeconfig
    from conftest import SESSION_KUBECONFIG

    loop, _ = looping
    stored = create_workload(kube_env, workload(("main", {"app": "train"})))  # its pods use no cache
    name = stored["metadata"]["name"]
    workers = concurrent.futures.ThreadPoolExecutor(2)
    with faultproxy.running(kube_env.url) as proxy:
        proxy.reset({1: 503})  # the first write, the check's, is refused
        write_kubeconfig(SESSION_KUBECONFIG, proxy.url)
        client = Client.from_environment()
        memo = kopf.Memo(client=client, workers=workers, policy=OPEN_POLICY)
        served = {(indexes.OUR_CHECKS, None, None): [{"name": "compilecache-warm"}]}
        event = handlers.workload_changed(type=None, body=stored, namespace=NS, memo=memo, admission_check_index=served)
        asyncio.run_coroutine_threadsafe(event, loop).result(timeout=10)
        deadline = time.monotonic() + 30
        state = "Pending"
        while time.monotonic() < deadline:
            read = kube_env.get(WORKLOADS.api_version + "/workloads", name, NS)
            state = read["status"]["admissionChecks"][0]["state"]
            if state == "Ready":
                break
            time.sleep(0.2)
        client.close()
        workers.shutdown(cancel_futures=True)
        assert state == "Ready", f"the check is still {state} after its write was refused once: {proxy.writes}"
        assert len(proxy.writes) == 2, proxy.writes


# --- the webhook, the index, the registration -----------------------------------------------------------


def test_a_pod_kueue_started_through_the_check_gets_the_cache_but_no_gate() -> None:
    pod = {
        "metadata": {
            "name": "train-0",
            "namespace": NS,
            "labels": {"compilecache.dev/cache": "llama"},
            "annotations": {admission.ANNOTATION_RELEASED: "GateTimeout 2026-11-27T10:00:00Z"},
        },
        "spec": {"containers": [{"name": "train", "image": "registry.example/trainer:1.2"}]},
    }
    warming = with_phase(cache(), "Warming")
    mutated = admission.admit(pod, [warming], rules=OPEN_POLICY)
    assert not gates.is_gated(mutated.pod)
    assert any(v.get("name") == admission.VOLUME for v in mutated.pod["spec"].get("volumes") or [])
    unmarked = copy.deepcopy(pod)
    del unmarked["metadata"]["annotations"]
    assert gates.is_gated(admission.admit(unmarked, [warming], rules=OPEN_POLICY).pod)  # as before without Kueue


def test_the_workload_index_keeps_what_decisions_read_and_only_workloads_with_a_pending_check() -> None:
    wl = workload(annotations={"big": "x" * 10_000, admission.ANNOTATION_RELEASED: "r"})
    [(key, slim)] = indexes.workload_entries(wl).items()
    assert key == (indexes.WAITING_WORKLOADS, NS, None)
    template_meta = slim["spec"]["podSets"][0]["template"]["metadata"]
    assert template_meta == {
        "labels": {"compilecache.dev/cache": "llama"},
        "annotations": {admission.ANNOTATION_RELEASED: "r"},
    }
    assert slim["status"]["admissionChecks"] == wl["status"]["admissionChecks"]
    assert checks.decide(slim, 0, slim["status"]["admissionChecks"][0], [with_phase(cache(), "Ready")], now=NOW) == (
        checks.decide(wl, 0, wl["status"]["admissionChecks"][0], [with_phase(cache(), "Ready")], now=NOW)
    )
    admitted = workload(
        checks_=[{"name": "compilecache-warm", "state": "Ready", "message": "", "lastTransitionTime": stamp(1)}]
    )
    assert indexes.workload_entries(admitted) == {}


def test_the_kueue_handlers_are_registered_only_on_demand_and_add_no_finalizer() -> None:
    assert checks.enabled({"COMPILECACHE_KUEUE": "true"}) and not checks.enabled({})
    resources = {h.selector.any_name for h in handlers.registry._watching.get_all_handlers() if h.selector}
    assert "workloads" not in resources  # the module's own registry serves no Kueue kind by itself
    fresh = kopf.OperatorRegistry()
    handlers.serve_admission_checks(fresh)
    watched = {h.selector.any_name for h in fresh._watching.get_all_handlers() if h.selector}
    indexed = {h.id for h in fresh._indexing.get_all_handlers()}
    assert watched == {"workloads", "admissionchecks"}
    assert indexed == {"workload_index", "admission_check_index"}
    assert not fresh._spawning.get_all_handlers()


# --- a pass of the cache, reading the operator's indexes --------------------------------------------------


def test_a_pass_counts_the_workloads_that_wait_for_its_cache_and_an_audit_forgets_one_deleted_unseen(
    kube_env: Any,
    looping: Any,  # noqa: F811  (the fixture imported above)
) -> None:
    from compilecache.controller.reconcile import reconcile

    loop, _ = looping
    kube_env.create(
        "compilecache.dev/v1alpha1/compilecaches", {"metadata": {"name": "llama"}, "spec": cache()["spec"]}, NS
    )
    stored = create_workload(kube_env, workload(), real_clock=True)
    client = Client.from_environment()
    ours = {"metadata": {"name": "compilecache-warm"}, "spec": {"controllerName": checks.CONTROLLER_NAME}}

    def reader(workloads: list[dict[str, Any]]) -> indexes.IndexedReader:
        found = indexes.Indexes(
            {},
            {},
            {},
            {},
            {},
            {},
            held(workloads, indexes.workload_entries),
            held([ours], indexes.admission_check_entries),
        )
        return indexes.IndexedReader(found, loop, client)

    first = reconcile(client, NS, "llama", reader=reader([stored]), policy=OPEN_POLICY)
    assert first.status is not None and first.status["consumers"]["workloads"] == 1, first.status
    message = kube_env.get("kueue.x-k8s.io/v1beta2/workloads", stored["metadata"]["name"], NS)["status"][
        "admissionChecks"
    ][0]["message"]
    assert message.startswith("waiting for CompileCache llama ("), message
    # The Workload is deleted while the watch is down: memory still holds it, as kopf's index would.
    kube_env.delete("kueue.x-k8s.io/v1beta2/workloads", stored["metadata"]["name"], NS)
    stale = reader([stored])
    assert reconcile(client, NS, "llama", reader=stale, policy=OPEN_POLICY).status["consumers"]["workloads"] == 1  # type: ignore[index]
    audited = reconcile(client, NS, "llama", reader=stale, policy=OPEN_POLICY, audit=True)
    assert audited.status is not None and audited.status["consumers"]["workloads"] == 0, audited.status
    # Without Kueue's indexes (the operator does not serve checks) the status has no such count.
    plain = indexes.IndexedReader(indexes.Indexes({}, {}, {}, {}, {}, {}), loop, client)
    assert "workloads" not in (reconcile(client, NS, "llama", reader=plain, policy=OPEN_POLICY).status or {}).get(
        "consumers", {}
    )
    client.close()


def test_a_pass_lets_a_workload_on_an_image_training_s_template_does_not_run_go_at_once(
    kube_env: Any,
    looping: Any,  # noqa: F811  (the fixture imported above)
) -> None:
    """A cache following a referenced Job's image: a Workload whose pods run another image waits for nothing
    (the gate releases such a pod at once, UnwarmedImage); the pass, which read the Job, knows it. One on
    training's image waits for its warm-up. (On the old code the first stayed Pending until gateTimeout.)"""
    from compilecache.controller.reconcile import reconcile
    from test_training_images import NEW, OTHER, following, training_job

    loop, _ = looping
    job = training_job(NEW)
    job["metadata"] = {"name": "train"}
    kube_env.create("batch/v1/jobs", job, NS)
    kube_env.create("compilecache.dev/v1alpha1/compilecaches", {"metadata": {"name": "llama"}, **following()}, NS)
    on_other = workload(name="other-1")
    on_other["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["image"] = OTHER
    on_new = workload(name="new-1")
    on_new["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["image"] = NEW
    stored = [indexes.slim_workload(create_workload(kube_env, wl, real_clock=True)) for wl in (on_other, on_new)]
    client = Client.from_environment()
    ours = {"metadata": {"name": "compilecache-warm"}, "spec": {"controllerName": checks.CONTROLLER_NAME}}
    found = indexes.Indexes(
        {},
        {},
        {},
        {},
        {},
        {},
        held(stored, indexes.workload_entries),
        held([ours], indexes.admission_check_entries),
    )
    outcome = reconcile(client, NS, "llama", reader=indexes.IndexedReader(found, loop, client), policy=OPEN_POLICY)
    assert outcome.status is not None and [r["image"] for r in outcome.status["images"]] == [NEW], outcome.status
    states = {
        name: kube_env.get("kueue.x-k8s.io/v1beta2/workloads", name, NS)["status"]["admissionChecks"][0]
        for name in ("other-1", "new-1")
    }
    assert states["other-1"]["state"] == "Ready", states["other-1"]
    assert states["other-1"]["message"].startswith(gates.UNWARMED_IMAGE), states["other-1"]
    assert states["new-1"]["state"] == "Pending", states["new-1"]
    assert outcome.status["consumers"]["workloads"] == 1, outcome.status
    client.close()
