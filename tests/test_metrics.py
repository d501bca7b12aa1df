"""The metrics' own rules, on a fresh Metrics (its own registry): what a status sets, what counts once, what goes."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from compilecache.controller import handlers, metrics, metricsfeed, podstate, reports


def samples(m: metrics.Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(m.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


CACHE = (("name", "c"), ("namespace", "ns"))
STATUS = {
    "phase": "Ready",
    "cache": {
        "entries": 7,
        "bytes": 700,
        "lastExpired": "2026-01-01T00:10:00Z",
        "lastDeleted": {"maxAge": 2, "odd": 1},
    },
    "pools": [
        {
            "state": "Succeeded",
            "startedAt": "2026-01-01T00:00:00Z",
            "finishedAt": "2026-01-01T00:04:00Z",
            "compileSeconds": 3,
        },
        {
            "state": "Succeeded",
            "startedAt": "2026-01-01T00:01:00Z",
            "finishedAt": "2026-01-01T00:05:00Z",
            "compileSeconds": 4,
        },
        {"state": "Failed", "startedAt": "2025-01-01T00:00:00Z", "finishedAt": "2027-01-01T00:00:00Z"},
    ],
    "consumers": {"gated": 2, "released": 1},
}


def pod(uid: str, *, requests: int = 0, hits: int = 0, released: str | None = None) -> dict:
    meta: dict = {"name": f"p-{uid}", "uid": uid, "annotations": {}}
    if released:
        meta["annotations"]["compilecache.dev/released"] = released
    body: dict = {"metadata": meta, "status": {"phase": "Running"}}
    if requests:
        message = json.dumps({"schema": reports.SCHEMA, "requests": requests, "hits": hits, "misses": requests - hits})
        state = {"name": "t", "state": {"terminated": {"exitCode": 0, "message": message}}}
        body["status"] = {"phase": "Succeeded", "containerStatuses": [state]}
    return body


def test_a_status_sets_the_cache_series_and_a_pod_counts_once():
    m = metrics.Metrics()
    pods = [
        pod("a", requests=10, hits=7),
        pod("b", released="GateTimeout 2026-01-01T00:00:05Z"),
        pod("c", released="CacheReady x"),
    ]
    for _ in range(3):  # three passes see the same cache and pods
        metricsfeed.observe_cache(m, "ns", "c", STATUS, pods)
    got = samples(m)
    assert got[("compilecache_cache_phase", tuple(sorted((*CACHE, ("phase", "Ready")))))] == 1
    assert sum(v for (n, _), v in got.items() if n == "compilecache_cache_phase") == 1  # one phase at a time
    assert got[("compilecache_cache_entries", CACHE)] == 7 and got[("compilecache_cache_bytes", CACHE)] == 700
    assert got[("compilecache_warmup_last_duration_seconds", CACHE)] == 300  # 00:00 → 00:05, the failed pool aside
    assert got[("compilecache_warmup_last_finished_timestamp_seconds", CACHE)] == 1767225900
    assert got[("compilecache_warmup_last_compile_seconds", CACHE)] == 7
    assert got[("compilecache_expiry_deleted_entries_total", tuple(sorted((*CACHE, ("rule", "maxAge")))))] == 2
    assert got[("compilecache_expiry_deleted_entries_total", tuple(sorted((*CACHE, ("rule", "other")))))] == 1
    assert got[("compilecache_consumers_gated_pods", CACHE)] == 2
    assert got[("compilecache_gate_timeouts_total", CACHE)] == 1
    assert got[("compilecache_training_compile_requests_total", CACHE)] == 10
    assert got[("compilecache_training_cache_hits_total", CACHE)] == 7

    # A new expiry run counts again; this pass's own gateTimeout release counts before its annotation is read.
    metricsfeed.observe_cache(
        m, "ns", "c", STATUS | {"cache": STATUS["cache"] | {"lastExpired": "2026-01-02T00:00:00Z"}}, pods
    )
    m.count_gate_timeouts("ns", "c", [podstate.pod_uid(pod("d")), podstate.pod_uid(pod("b"))])
    got = samples(m)
    assert got[("compilecache_expiry_deleted_entries_total", tuple(sorted((*CACHE, ("rule", "maxAge")))))] == 4
    assert got[("compilecache_gate_timeouts_total", CACHE)] == 2


def test_a_forgotten_cache_has_no_series_left_and_others_keep_theirs():
    m = metrics.Metrics()
    metricsfeed.observe_cache(m, "ns", "c", STATUS, [pod("a", requests=1, hits=1)])
    metricsfeed.observe_cache(m, "ns", "other", STATUS)
    m.forget("ns", "c")
    names = {dict(labels).get("name") for _, labels in samples(m)}
    assert "c" not in names and "other" in names
    m.forget("ns", "never-seen")  # nothing to remove: no error


def test_remembered_pods_are_bounded(monkeypatch: pytest.MonkeyPatch):
    m = metrics.Metrics()
    for i in range(metrics.REMEMBERED_PODS + 50):
        metricsfeed.observe_cache(m, "ns", "c", {"phase": "Ready"}, [pod(str(i), requests=1, hits=1)])
    assert len(m._seen[("ns", "c")].pods) == metrics.REMEMBERED_PODS
    assert samples(m)[("compilecache_training_compile_requests_total", CACHE)] == metrics.REMEMBERED_PODS + 50


def test_operator_wide_series_have_bounded_labels():
    m = metrics.Metrics()
    m.api_error("GET", 404)
    m.admission("gated")
    m.admission("something new")  # not a known outcome: counted as error, never a new label value
    got = samples(m)
    assert got[("compilecache_api_errors_total", (("code", "404"), ("verb", "get")))] == 1
    assert got[("compilecache_webhook_admissions_total", (("outcome", "error"),))] == 1
    assert {dict(labels)["outcome"] for name, labels in got if name == "compilecache_webhook_admissions_total"} <= set(
        metrics.ADMISSION_OUTCOMES
    )


def test_admission_outcome():
    plain = {"metadata": {"name": "p"}, "spec": {"containers": []}}
    gated = {
        "metadata": {"name": "p"},
        "spec": {"containers": [], "schedulingGates": [{"name": "compilecache.dev/warm"}]},
    }
    mounted = {"metadata": {"name": "p"}, "spec": {"containers": [], "volumes": [{"name": "compilecache"}]}}
    assert handlers._outcome(plain, plain) == "unchanged"
    assert handlers._outcome(plain, gated) == "gated"
    assert handlers._outcome(plain, mounted) == "mutated"


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, ("0.0.0.0", 8000)),
        ({metrics.PORT_ENV: "0"}, ("0.0.0.0", 0)),
        ({metrics.PORT_ENV: "9090", metrics.ADDR_ENV: "::"}, ("::", 9090)),
    ],
)
def test_port_from_env(environ, expected):
    assert metrics.port_from_env(environ) == expected


@pytest.mark.parametrize("bad", ["-1", "65536", "http", "80 80"])
def test_port_from_env_names_the_variable(bad):
    with pytest.raises(ValueError, match=metrics.PORT_ENV):
        metrics.port_from_env({metrics.PORT_ENV: bad})


def test_serve_answers_metrics_over_http_and_a_busy_port_is_not_fatal():
    import socket
    import urllib.request

    m = metrics.Metrics()
    metricsfeed.observe_cache(m, "ns", "c", {"phase": "Warming"})
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = metrics.serve("127.0.0.1", port, m)
    assert server is not None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{metrics.PATH}", timeout=5) as answer:
            assert 'compilecache_cache_phase{name="c",namespace="ns",phase="Warming"} 1.0' in answer.read().decode()
        assert metrics.serve("127.0.0.1", port, metrics.Metrics()) is None  # taken: logged, not raised
    finally:
        server.shutdown()
        server.server_close()
    assert metrics.serve("127.0.0.1", 0, m) is None  # 0: off


def test_build_info_names_the_installed_versions_and_outlives_every_cache():
    import platform
    import tomllib

    import kopf  # noqa: F401  (its metadata is what the label reads)

    m = metrics.Metrics()
    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    assert project["name"] == metrics.DISTRIBUTION
    expected = {
        "version": project["version"],
        "python": platform.python_version(),
        "kopf": importlib.metadata.version("kopf"),
    }
    key = ("compilecache_build_info", tuple(sorted(expected.items())))
    assert samples(m)[key] == 1
    metricsfeed.observe_cache(m, "ns", "c", STATUS)
    m.forget("ns", "c")
    assert [name for name, _ in samples(m) if name.startswith("compilecache_build")] == ["compilecache_build_info"]


def test_every_metric_is_listed_in_the_docs():
    """docs/observability.md names each family the operator serves (with its _total where a counter)."""
    docs = (Path(__file__).resolve().parent.parent / "docs" / "observability.md").read_text()
    m = metrics.Metrics()
    metricsfeed.observe_cache(m, "ns", "c", STATUS, [pod("1", requests=2, hits=1)])
    m.api_error("GET", 404)
    m.admission("gated")
    m.reconcile.labels("success").observe(0.1)
    names = {family.name + ("_total" if family.type == "counter" else "") for family in m.registry.collect()}
    assert "compilecache_build_info" in names
    assert sorted(name for name in names if f"`{name}" not in docs) == []
