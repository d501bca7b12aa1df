"""What warm-up and training pods report back through their termination messages, into the status."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compilecache.controller import reports, status
from compilecache.controller.plan import plan
from compilecache.controller.snapshot import Cache, Snapshot
from compilecache.jobtools.warm import TERMINATION_LIMIT, TERMINATION_SCHEMA, termination_summary
from specs import cache, cluster


def _report(targets: int, name_length: int = 20) -> dict:
    return {
        "ok": True,
        "entries": targets,
        "bytes": 1000 * targets,
        "verify": {"hits": targets, "requests": targets},
        "targets": [
            {"name": f"t{i}".ljust(name_length, "x"), "compile_seconds": 0.5, "entries_written": ["a"], "bytes": 1000}
            for i in range(targets)
        ],
    }


def _pod(container: str, message: str, *, exit_code: int = 0, finished: str = "2026-01-01T00:00:10Z", init=False):
    state = {
        "name": container,
        "state": {"terminated": {"exitCode": exit_code, "message": message, "finishedAt": finished}},
    }
    key = "initContainerStatuses" if init else "containerStatuses"
    return {"metadata": {"name": "p", "labels": {"job-name": "j"}}, "status": {key: [state]}}


def test_small_report_keeps_every_target():
    summary = json.loads(termination_summary(_report(3)))
    assert summary["schema"] == TERMINATION_SCHEMA
    assert (summary["entries"], summary["bytes"], summary["compileSeconds"]) == (3, 3000, 1.5)
    assert summary["verify"] == {"hits": 3, "requests": 3}
    assert [t["entries"] for t in summary["targets"]] == [1, 1, 1]
    assert "targetsOmitted" not in summary


@settings(derandomize=True, max_examples=60)
@given(st.integers(0, 2000), st.integers(1, 300), st.text(max_size=5000))
def test_a_report_that_does_not_fit_is_summarised_never_cut(targets, name_length, error):
    report = _report(targets, name_length) | {"error": error or None, "ok": not error}
    text = termination_summary(report)
    assert len(text.encode()) <= TERMINATION_LIMIT
    summary = json.loads(text)  # whole JSON, always
    assert summary["entries"] == targets and summary["bytes"] == 1000 * targets  # totals survive
    assert len(summary["targets"]) + summary.get("targetsOmitted", 0) == targets


def test_warm_report_adds_containers_and_counts_a_retried_container_once():
    one = termination_summary(_report(2))
    two = termination_summary(_report(3))
    pods = [
        _pod("warm-0", one, init=True),
        _pod("warm", two, finished="2026-01-01T00:00:05Z"),
        _pod("warm", two, finished="2026-01-01T00:00:09Z"),  # a retry of the same container
        _pod("warm", "Traceback ... (a log tail)", exit_code=1),
    ]
    report = status.warm_report(pods)
    assert report is not None
    assert (report["entries"], report["bytes"], report["verifyHits"], report["verifyRequests"]) == (5, 5000, 5, 5)
    assert report["compileSeconds"] == 2.5 and len(report["targets"]) == 5
    assert status.warm_report([_pod("warm", "not json")]) is None


def test_failed_pool_says_the_summary_error():
    from compilecache.controller.pools import Pool

    pool = Pool(
        name="h100",
        node_selector={},
        tolerations=(),
        gpu_resource="nvidia.com/gpu",
        nodes=2,
        gpus_per_node=8,
        gpus_per_pod=1,
        workloads=(),
    )
    job = {
        "metadata": {"name": "j"},
        "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]},
    }
    message = termination_summary({"ok": False, "error": "verify failed: train_step missed", "targets": []})
    entry = status.pool_status(pool, "j", job, None, [_pod("warm", message, exit_code=3)])
    assert entry["message"].startswith("verify failed: train_step missed (")
    assert entry["reason"] == "BackoffLimitExceeded"


def _warmed():
    """A cache, its succeeded warm-up Jobs and their pods with a summary each: the plan's status."""
    obj = cache()
    first = plan(Snapshot(Cache.read(obj), nodes=tuple(cluster())), "2026-01-01T00:00:00Z")
    jobs = [c.manifest for c in first.creates if c.resource.plural == "jobs"]
    done = []
    pods = []
    for index, job in enumerate(jobs):
        name = job["metadata"]["name"]
        done.append(
            job
            | {
                "status": {
                    "startTime": "2026-01-01T00:00:00Z",
                    "completionTime": "2026-01-01T00:01:00Z",
                    "conditions": [{"type": "Complete", "status": "True"}],
                }
            }
        )
        pod = _pod("warm", termination_summary(_report(index + 2)))
        pod["metadata"]["labels"]["job-name"] = name
        pods.append(pod)
    obj["status"] = dict(first.status)
    return obj, done, pods


def test_entries_and_size_show_as_soon_as_the_warm_up_reported():
    obj, done, pods = _warmed()
    assert status.needs_report(done[0], obj["status"]["pools"])  # succeeded, not yet recorded: read its pods
    new = plan(
        Snapshot(Cache.read(obj), nodes=tuple(cluster()), jobs=tuple(done), warmup_pods=tuple(pods)),
        "2026-01-01T00:02:00Z",
    )
    pools = new.status["pools"]
    assert sorted(pool["entries"] for pool in pools) == [2, 3]
    assert new.status["cache"]["entries"] == 5 and new.status["cache"]["size"]
    assert new.status["phase"] == "Expiring"
    # Recorded: the next pass reads no pod, and the report stands without them.
    assert not any(status.needs_report(job, pools) for job in done)
    obj["status"] = dict(new.status)
    again = plan(Snapshot(Cache.read(obj), nodes=tuple(cluster()), jobs=tuple(done)), "2026-01-01T00:03:00Z")
    assert [pool["entries"] for pool in again.status["pools"]] == [pool["entries"] for pool in pools]
    assert again.status["cache"]["entries"] == 5


def _trainer_pod(uid: str, message: str, phase: str = "Succeeded", finished: str = "2026-01-01T00:00:10Z"):
    return {
        "metadata": {"name": f"train-{uid}", "uid": uid, "labels": {"compilecache.dev/cache": "c"}},
        "status": {
            "phase": phase,
            "containerStatuses": [
                {"name": "train", "state": {"terminated": {"exitCode": 0, "message": message, "finishedAt": finished}}}
            ],
        },
    }


def _verdict(requests: int, hits: int, missed=()) -> str:
    return json.dumps(
        {
            "schema": reports.SCHEMA,
            "requests": requests,
            "hits": hits,
            "misses": requests - hits,
            "missed": [{"name": n, "reason": r} for n, r in missed],
            "summary": f"compilecache: {hits}/{requests} compiles hit",
        }
    )


def test_trainer_report_is_the_last_line_of_its_schema():
    text = (
        "some other output\n" + _verdict(26, 10, [("train_step", "arg 3 sharding differs")]) + '\n{"schema": "other"}\n'
    )
    report = reports.parse(text)
    assert report is not None and (report.requests, report.hits) == (26, 10)
    assert report.miss_reason == "train_step: arg 3 sharding differs"
    for other in ("", "plain text", "{broken", '{"schema": "other", "requests": 1, "hits": 1}'):
        assert reports.parse(other) is None
    with pytest.raises(status.BadReport, match="requests: -1 is not a count"):  # of the schema, out of range
        reports.parse('{"schema": "compilecache.dev/trainer/v1", "requests": -1, "hits": 0}')


def test_consumer_counts_over_finished_training_pods():
    pods = [
        _trainer_pod("a", _verdict(26, 10, [("train_step", "not warmed")]), finished="2026-01-01T00:00:10Z"),
        _trainer_pod("b", _verdict(4, 4), phase="Failed", finished="2026-01-01T00:00:20Z"),
        _trainer_pod("c", _verdict(9, 9), phase="Running"),  # not finished: its file may still change
        _trainer_pod("d", "Error: OOM"),
    ]
    assert reports.totals(reports.counted(pods)[0]) == {
        "hits": 14,
        "requests": 30,
        "lastMissReason": f"train_step: not warmed: {reports.NOT_WARMED_FIX}",
    }
    assert reports.totals(reports.counted([])[0]) == {}


def test_printer_columns_entries_and_size_resolve_on_the_status_after_the_warm_up():
    """``kubectl get cc``'s Entries and Size columns read fields the status has before any expiry ran."""
    from pathlib import Path

    import yaml

    crd = yaml.safe_load((Path(__file__).resolve().parent.parent / "crds" / "compilecache.yaml").read_text())
    [version] = crd["spec"]["versions"]
    columns = {column["name"]: column for column in version["additionalPrinterColumns"]}
    obj, done, pods = _warmed()
    new = plan(
        Snapshot(Cache.read(obj), nodes=tuple(cluster()), jobs=tuple(done), warmup_pods=tuple(pods)),
        "2026-01-01T00:02:00Z",
    )
    assert new.status["phase"] == "Expiring"

    def resolve(path: str):
        value: object = {"status": dict(new.status)}
        for part in path.lstrip(".").split("."):
            assert isinstance(value, dict) and part in value, f"{path} does not resolve at {part!r}"
            value = value[part]
        return value

    assert resolve(columns["Entries"]["jsonPath"]) == 5 and columns["Entries"]["type"] == "integer"
    from compilecache.cache.units import format_bytes

    assert resolve(columns["Size"]["jsonPath"]) == format_bytes(5000) and columns["Size"]["type"] == "string"
