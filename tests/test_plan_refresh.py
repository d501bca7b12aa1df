"""plan(): refreshes of a Ready cache, pass by pass with times (no server).

A manual rewarm (``compilecache.dev/rewarm``) keeps a Ready cache serving as a scheduled
refresh does; a schedule shorter than a warm-up never deletes a running Job (CronJob's
``concurrencyPolicy: Forbid``): the slot is skipped, recorded in status and as one Event.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from compilecache.controller import jobs, plan, status
from compilecache.controller.kube import JOBS
from compilecache.controller.snapshot import Cache, Snapshot
from specs import cache, cluster

CLAIM = {"metadata": {"name": "jax-cache", "labels": {"compilecache.dev/cache": "llama"}}, "status": {"phase": "Bound"}}
SUMMARY = {"schema": "compilecache.dev/expiry/v1", "ok": True, "after": {"entries": 2, "bytes": 2048}}


def job_of(create: plan.Create) -> dict[str, Any]:
    """The Job as the API returns it once its pod runs."""
    job = copy.deepcopy(dict(create.manifest))
    job["status"] = {"startTime": "2026-11-21T10:00:00Z", "active": 1}
    return job


def expiry_pod(job: dict[str, Any]) -> dict[str, Any]:
    terminated = {"exitCode": 0, "finishedAt": "2026-11-21T10:00:00Z", "message": json.dumps(SUMMARY)}
    name = job["metadata"]["name"]
    return {
        "metadata": {"name": f"{name}-x", "labels": {"job-name": name}},
        "status": {"containerStatuses": [{"name": "expire", "state": {"terminated": terminated}}]},
    }


class Cluster:
    """A cache's Jobs as the Job controller leaves them, and its recorded status, pass after pass."""

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj
        self.jobs: dict[str, dict[str, Any]] = {}
        self.expiry: dict[str, dict[str, Any]] = {}
        self.status: dict[str, Any] = {}

    def step(self, now: str) -> plan.Plan:
        obj = copy.deepcopy(self.obj) | {"status": copy.deepcopy(self.status)}
        pods = tuple(expiry_pod(job) for job in self.expiry.values() if job["status"].get("conditions"))
        snapshot = Snapshot(
            Cache.read(obj),
            claim=CLAIM,
            nodes=tuple(cluster()),
            jobs=tuple(self.jobs.values()),
            expiry_jobs=tuple(self.expiry.values()),
            expiry_pods=pods,
        )
        decided = plan.plan(snapshot, now)
        for delete in decided.deletes:
            self.jobs.pop(delete.name, None)
            self.expiry.pop(delete.name, None)
        for create in decided.creates:
            if create.resource == JOBS:
                labels = create.manifest["metadata"].get("labels") or {}
                target = self.expiry if any("expiry" in key for key in labels) else self.jobs
                target[create.name] = job_of(create)
        self.status = dict(decided.status)
        return decided

    def finish(self, which: dict[str, dict[str, Any]]) -> None:
        for job in which.values():
            job["status"] = {"active": 0, "conditions": [{"type": "Complete", "status": "True"}]}

    def ready(self, now: str) -> plan.Plan:
        """Finish the warm-ups, then the expiry: the passes that take the cache to Ready."""
        self.finish(self.jobs)
        self.step(now)
        self.finish(self.expiry)
        decided = self.step(now)
        assert decided.status["phase"] == status.READY, decided.status["message"]
        return decided


def test_a_manual_rewarm_of_a_ready_cache_keeps_it_ready_while_it_refreshes() -> None:
    run = Cluster(cache())
    run.step("2026-11-21T10:00:00Z")
    run.ready("2026-11-21T10:01:00Z")
    before = set(run.jobs)
    run.obj["metadata"]["annotations"] = {jobs.ANNOTATION_REWARM: "now"}
    decided = run.step("2026-11-21T10:02:00Z")
    created = {c.name for c in decided.creates if c.resource == JOBS}
    assert len(created) == 2 and not created & before  # every pool runs again
    assert decided.status["phase"] == status.READY and decided.status["message"].startswith("ready; refreshing")
    assert next(c for c in decided.status["conditions"] if c["type"] == "Ready")["status"] == "True"
    run.ready("2026-11-21T10:03:00Z")
    assert "refreshing" not in run.status["message"]


def test_a_schedule_shorter_than_the_warm_up_skips_slots_and_never_deletes_a_running_job() -> None:
    run = Cluster(cache(schedule="* * * * *"))
    first = run.step("2026-11-21T10:00:30Z")
    started = set(run.jobs)
    assert len(started) == 2 and first.status[plan.LAST_SCHEDULE] == "2026-11-21T10:00:00Z"

    # The 10:01 slot comes while the 10:00 warm-up runs: skipped, once, and nothing is deleted or added.
    skipped = run.step("2026-11-21T10:01:10Z")
    assert skipped.deletes == () and skipped.creates == ()
    assert set(run.jobs) == started and skipped.status["phase"] == status.WARMING
    assert skipped.status[plan.LAST_SKIPPED] == "2026-11-21T10:01:00Z"
    assert skipped.status[plan.LAST_SCHEDULE] == "2026-11-21T10:00:00Z"
    assert [e.reason for e in skipped.events].count(plan.SCHEDULE_SKIPPED) == 1
    again = run.step("2026-11-21T10:01:40Z")
    assert again.events == () and again.deletes == () and again.creates == ()

    # The warm-up ends within the skipped slot: the slot stays skipped, the cache settles Ready.
    run.ready("2026-11-21T10:01:50Z")
    assert set(run.jobs) == started

    # The next slot comes while nothing runs: a refresh, and the cache keeps serving.
    refresh = run.step("2026-11-21T10:02:05Z")
    assert {d.name for d in refresh.deletes} >= started  # finished ones, superseded
    assert len([c for c in refresh.creates if c.resource == JOBS]) == 2
    assert refresh.status["phase"] == status.READY and refresh.status[plan.LAST_SCHEDULE] == "2026-11-21T10:02:00Z"


def test_a_slot_that_comes_while_the_expiry_runs_is_skipped_too() -> None:
    run = Cluster(cache(schedule="*/5 * * * *"))
    run.step("2026-11-21T10:00:30Z")
    run.finish(run.jobs)
    expiring = run.step("2026-11-21T10:04:00Z")
    assert expiring.status["phase"] == status.EXPIRING and len(run.expiry) == 1
    slot = run.step("2026-11-21T10:05:10Z")
    assert slot.creates == () and slot.deletes == () and slot.status["phase"] == status.EXPIRING
    assert slot.status[plan.LAST_SKIPPED] == "2026-11-21T10:05:00Z"


def test_a_change_of_what_is_compiled_still_replaces_a_running_job() -> None:
    run = Cluster(cache(schedule="* * * * *"))
    run.step("2026-11-21T10:00:30Z")
    started = set(run.jobs)
    run.obj["spec"]["warmup"]["image"] = "registry.example/trainer:1.3"
    changed = run.step("2026-11-21T10:01:10Z")
    assert {d.name for d in changed.deletes} == started
    assert plan.LAST_SKIPPED not in changed.status


def test_concurrency_policy_replace_replaces_the_running_jobs_at_a_new_slot() -> None:
    run = Cluster(cache(schedule="* * * * *", concurrencyPolicy="Replace"))
    run.step("2026-11-21T10:00:30Z")
    started = set(run.jobs)
    replaced = run.step("2026-11-21T10:01:10Z")
    assert {d.name for d in replaced.deletes} == started
    assert len([c for c in replaced.creates if c.resource == JOBS]) == 2
    assert plan.LAST_SKIPPED not in replaced.status
    assert replaced.status[plan.LAST_SCHEDULE] == "2026-11-21T10:01:00Z"
