"""Training's use keeps entries alive (issue 34 item 4): a trainer's ``used`` keys → ``status.lastUsed`` →
the expiry Job's ``--used`` → ``maxAge`` counts from the last use by training or warm-up.

The end-to-end test runs real JAX on the CPU: ``compilecache warm`` fills a cache, a training process
with the cache's environment hits one of its entries and writes its report, the operator's reader
folds that report into the record, and the expiry Job's own command (``expiryjob.expire_command``)
runs against the cache. The rest are the bounds: what a hostile report costs and can do.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compilecache.api import bounds, model
from compilecache.cache import lastuse
from compilecache.cache.expiry import ManifestIndex, Policy, index_manifests, plan_expiry
from compilecache.cache.store import Listing, StoredFile
from compilecache.controller import expiryjob, reports
from compilecache.controller.api import parse_cache
from compilecache.frameworks.jax.env import jax_cache_env, trainer_env
from compilecache.training.report import MAX_BYTES, SCHEMA, fit
from jaxhelpers import clean_env, entry_files, run_cli, write_module
from specs import cache

DAY = 86400.0
NOW = datetime(2026, 5, 10, 3, 0, tzinfo=UTC)  # an expiry at 03:00
TODAY = NOW.date().isoformat()
YESTERDAY = (NOW - timedelta(days=1)).date().isoformat()


def stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def entry(module: str, seed: int) -> str:
    return f"{module}-{seed:064x}-cache"


def finished_pod(message: str, finished_at: str) -> dict[str, Any]:
    """A training pod as the kubelet reports it once its container exited with ``message``."""
    terminated = {"exitCode": 0, "message": message, "finishedAt": finished_at}
    return {
        "status": {"phase": "Succeeded", "containerStatuses": [{"name": "train", "state": {"terminated": terminated}}]}
    }


def trainer_report(**fields: Any) -> str:
    return json.dumps({"schema": SCHEMA, "requests": 3, "hits": 3, "missed": [], "summary": "s"} | fields)


def listing(names: list[str], age: float) -> Listing:
    at = NOW.timestamp() - age
    return Listing(files=tuple(StoredFile(name, 100, at) for name in names), staging=(), temporary=())


# --- the plan: maxAge counts from the last use -------------------------------------------------


def test_an_entry_used_yesterday_survives_max_age_1d_and_an_unused_one_goes() -> None:
    used, unused = entry("jit_train_step", 1), entry("jit_eval_step", 2)
    record = lastuse.fold(None, [(YESTERDAY, [lastuse.use_key(used)])], TODAY, DAY)
    policy = Policy(max_age_seconds=DAY, used=lastuse.last_used(map(lastuse.parse_item, record)))
    plan = plan_expiry(listing([used, unused], 3 * DAY), ManifestIndex({}, {}), policy, NOW.timestamp())
    assert [(d.name, d.rule) for d in plan.deletions] == [(unused, "maxAge")]
    assert plan.deletions[0].reason.startswith("last produced 3d")
    # Used two days ago: older than 1d by today, whatever the hour it was used at.
    two_days = (NOW - timedelta(days=2)).date().isoformat()
    policy = Policy(max_age_seconds=DAY, used=lastuse.last_used([(two_days, [lastuse.use_key(used)])]))
    plan = plan_expiry(listing([used, unused], 3 * DAY), ManifestIndex({}, {}), policy, NOW.timestamp())
    assert sorted(d.name for d in plan.deletions) == sorted([used, unused])
    assert "last used by training 1d3h ago" in {d.reason.split(", ")[0] for d in plan.deletions}


def test_a_use_counts_like_a_warm_up_hit_in_max_size_order() -> None:
    old, new = entry("jit_a", 1), entry("jit_b", 2)
    manifests = [{"finished_at": stamp(NOW - timedelta(days=5)), "entries": [{"file": old}, {"file": new}]}]
    index = index_manifests(manifests)
    # Both produced 5 days ago; training used `old` yesterday: `new` is the least recently used.
    policy = Policy(max_size_bytes=100, used=lastuse.last_used([(YESTERDAY, [lastuse.use_key(old)])]))
    plan = plan_expiry(listing([old, new], 5 * DAY), index, policy, NOW.timestamp())
    assert [d.name for d in plan.deletions] == [new]


def torch_manifest(run_id: str, finished: str) -> dict[str, Any]:
    return {
        "schema": "compilecache.dev/torch-manifest/v1",
        "state": "complete",
        "run_id": run_id,
        "workload": "script:train.py",
        "finished_at": finished,
        "facts": {"torch": "2.13.0+cpu", "gpu": "cpu", "threads": 1},
        "entries": [{"file": "fxgraph/a", "size": 10, "sha256": "x"}],
    }


def test_a_pytorch_trainer_that_hit_reports_its_generations_and_their_use_outlives_max_age() -> None:
    from compilecache.frameworks.pytorch import hook
    from compilecache.frameworks.pytorch.cache import graph_counts
    from compilecache.frameworks.pytorch.expiry import plan_torch_expiry

    used_run, other_run = "20260501T000000Z-used", "20260501T000000Z-othr"
    manifests = {run: torch_manifest(run, "2026-05-01T00:00:00Z") | {"workload": run} for run in (used_run, other_run)}
    hit = graph_counts({"inductor": {"fxgraph_cache_hit": 2}})
    result = hook.verdict(hit, {}, [manifests[used_run]], {})
    assert lastuse.decode(result["used"]) == [lastuse.use_key(used_run)]
    assert "used" not in hook.verdict(
        graph_counts({"inductor": {"fxgraph_cache_miss": 1}}), {}, [manifests[used_run]], {}
    )

    report = reports.parse(json.dumps(result))
    assert report is not None
    record = lastuse.fold(None, [(YESTERDAY, report.used)], TODAY, DAY)
    generations = {run: [StoredFile(f"torch/{run}/fxgraph/a", 10, NOW.timestamp() - 9 * DAY)] for run in manifests}
    policy = Policy(max_age_seconds=DAY, used=lastuse.last_used(map(lastuse.parse_item, record)))
    plan = plan_torch_expiry(Listing(()), generations, manifests, policy, NOW.timestamp())
    assert [(d.name, d.rule) for d in plan.deletions] == [(f"torch/{other_run}", "maxAge")]


# --- the record: bounded, idempotent ----------------------------------------------------------

keys = st.text("0123456789abcdef", min_size=8, max_size=8)
days = st.dates(NOW.date() - timedelta(days=80), NOW.date() + timedelta(days=3)).map(lambda d: d.isoformat())


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(days, st.lists(keys, max_size=300)), max_size=20),
    st.none() | st.floats(0, 100 * DAY),
)
def test_the_record_is_bounded_idempotent_and_keeps_each_key_at_its_latest_day(
    uses: list[tuple[str, list[str]]], max_age: float | None
) -> None:
    record = lastuse.fold(None, uses, TODAY, max_age)
    assert len(record) <= lastuse.MAX_DAYS
    parsed = [lastuse.parse_item(item) for item in record]
    stored = [key for _, ks in parsed for key in ks]
    assert len(stored) == len(set(stored)) <= lastuse.MAX_RECORD
    assert all(day <= TODAY for day, _ in parsed)
    assert lastuse.fold(record, uses, TODAY, max_age) == record  # a pass that folds the same pods again
    assert lastuse.fold(record, [], TODAY, max_age) == record
    window = lastuse.MAX_DAYS if max_age is None else min(lastuse.MAX_DAYS, int(max_age // DAY) + 2)
    first = (NOW.date() - timedelta(days=window - 1)).isoformat()
    latest: dict[str, str] = {}
    for day, ks in uses:
        for key in ks:
            if day >= first:
                latest[key] = max(latest.get(key, ""), min(day, TODAY))
    if len(latest) <= lastuse.MAX_RECORD:
        assert {key: day for day, ks in parsed for key in ks} == latest
    for item in record:
        assert len(item) <= 11 + lastuse.MAX_RECORD * lastuse.KEY_CHARS


def test_the_record_keeps_the_newest_days_past_its_cap() -> None:
    old = [f"{i:08x}" for i in range(lastuse.MAX_RECORD)]
    new = [f"{i:08x}" for i in range(lastuse.MAX_RECORD, lastuse.MAX_RECORD + 10)]
    record = lastuse.fold(None, [(TODAY, new), ((NOW - timedelta(days=3)).date().isoformat(), old)], TODAY, None)
    parsed = dict(map(lastuse.parse_item, record))
    assert parsed[TODAY] == sorted(new) and len(parsed[(NOW - timedelta(days=3)).date().isoformat()]) == 2038


def test_the_status_holds_the_record_the_crd_admits() -> None:
    full = [f"{i:08x}" for i in range(lastuse.MAX_RECORD)]
    record = lastuse.fold(None, [(f"2026-04-{d:02d}", full[d * 50 : d * 50 + 50]) for d in range(1, 30)], TODAY, None)
    record = lastuse.fold(record, [(TODAY, full)], TODAY, None)  # one day holds the whole record
    for value in (record, lastuse.fold(None, [(f"2026-04-{d:02d}", full[d::40]) for d in range(1, 31)], TODAY, None)):
        assert bounds.violations({"lastUsed": value}) == []
        model.Status.model_validate({"lastUsed": value})
    with pytest.raises(ValueError, match="pattern"):  # what the CRD's pattern refuses, the operator never writes
        model.Status.model_validate({"lastUsed": ["2026-05-01=../x"]})


# --- hostile reports: bounded work, nothing kept that is not an entry ----------------------------


@pytest.mark.parametrize(
    "used",
    [
        "../x",
        "../../etc/passwd-cache",
        "A1B2C3D4",  # upper case: not what a trainer writes
        "abc",  # not a whole key
        "0" * (lastuse.KEY_CHARS * (lastuse.MAX_REPORTED + 1)),  # more keys than a report may hold
        ["a1b2c3d4"],
        12345678,
    ],
)
def test_a_report_whose_used_is_not_keys_is_refused_whole(used: Any) -> None:
    pod = finished_pod(trainer_report(used=used), stamp(NOW))
    counted, refused = reports.counted([pod])
    assert counted == [] and len(refused) == 1 and refused[0][1].startswith("used: ")


def test_a_huge_report_costs_bounded_work() -> None:
    # A megabyte of keys is refused by its length before any match: no regex runs over it.
    huge = "a" * (1 << 20)
    started = time.perf_counter()
    for _ in range(100):
        with pytest.raises(ValueError, match="more than"):
            lastuse.decode(huge)
    assert time.perf_counter() - started < 1.0
    # As many pods as a namespace holds, each with the most a report may name: linear, capped at the record.
    pods = [
        finished_pod(trainer_report(used="".join(f"{p:04x}{k:04x}" for k in range(lastuse.MAX_REPORTED))), stamp(NOW))
        for p in range(200)
    ]
    started = time.perf_counter()
    counted, refused = reports.counted(pods)
    record = reports.last_used(None, counted, stamp(NOW), 7 * DAY)
    assert time.perf_counter() - started < 10.0
    assert refused == [] and sum(len(lastuse.parse_item(item)[1]) for item in record) == lastuse.MAX_RECORD


def test_keys_that_name_no_entry_keep_nothing_and_delete_nothing() -> None:
    names = [entry("jit_f", 1), entry("jit_g", 2)]
    junk = [lastuse.use_key(name) for name in ("../x", "/etc/passwd", "jit_h-cache", "")] + ["ffffffff", "00000000"]
    junk = [key for key in junk if key not in {lastuse.use_key(n) for n in names}]
    record = lastuse.fold(None, [(TODAY, junk)], TODAY, DAY)
    policy = Policy(max_age_seconds=DAY, used=lastuse.last_used(map(lastuse.parse_item, record)))
    index = ManifestIndex({}, {})
    # Both old: both go, as without any use; young entries are never deleted, used or not.
    plan = plan_expiry(listing(names, 3 * DAY), index, policy, NOW.timestamp())
    assert sorted(d.name for d in plan.deletions) == sorted(names)
    assert plan_expiry(listing(names, 60), index, policy, NOW.timestamp()).deletions == ()
    assert plan.entries_before == 2  # a key never adds an entry, a path or a file to what is listed


def test_a_trainer_report_fits_its_termination_message_with_every_field_at_its_bound() -> None:
    names = [f"jit_{'f' * 150}_{i}" for i in range(10)]
    result = {
        "schema": SCHEMA,
        "requests": 10**12,
        "hits": 0,
        "misses": 10**12,
        "missed": [{"name": name, "reason": "r" * 300, "step": 10**9} for name in names],
        "summary": "s" * 1500,
        "step_fn": "t" * 100,
        "warmed_steps": "auto",
        **lastuse.report_fields(f"{i:08x}" for i in range(1000)),
    }
    fitted = fit(result)
    assert len(json.dumps(fitted).encode()) < MAX_BYTES
    report = reports.parse(json.dumps(fitted, separators=(",", ":")))
    assert report is not None
    assert len(report.used) + report.used_more == 1000 and report.used_more >= 1000 - lastuse.MAX_REPORTED


# --- the expiry Job's command -----------------------------------------------------------------


def test_the_expiry_job_passes_the_record_and_the_command_reads_it(tmp_path: Path) -> None:
    record = lastuse.fold(None, [(YESTERDAY, ["a1b2c3d4", "00ff00ff"]), (TODAY, ["deadbeef"])], TODAY, DAY)
    obj = cache("llama", lifecycle={"maxAge": "1d"}) | {"status": {"lastUsed": record}}
    job = expiryjob.expiry_job(obj, parse_cache(obj), ["w"])
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["command"][-4:] == ["--used", record[0], "--used", record[1]]
    # Without maxAge or maxSize nothing reads it: the command stays what older warmer images take.
    plain = cache("llama", lifecycle={"keepVersions": 1}) | {"status": {"lastUsed": record}}
    assert "--used" not in expiryjob.expire_command(parse_cache(plain), record)
    # The command refuses what is not a record, in one line.
    done = run_cli(["expire", "--cache-dir", str(tmp_path), "--used", "../x=abc"], clean_env())
    assert done.returncode == 2 and "--used" in done.stderr and "Traceback" not in done.stderr


# --- real JAX: a trainer's use, the record, the expiry Job's command -----------------------------

WORKLOAD = """
import jax, jax.numpy as jnp
from compilecache import Target

def targets():
    spec = jax.ShapeDtypeStruct((16, 16), jnp.float32)
    return [
        Target("train_step", jax.jit(lambda x, y: jnp.tanh(x @ y).sum()), (spec, spec)),
        Target("eval_step", jax.jit(lambda x: jnp.cos(x) * 2.0), (spec,)),
    ]
"""

TRAIN = """
import workload
step = workload.targets()[0]  # training runs its train step; nothing evaluates today
step.fn.lower(*step.args).compile()
"""

_TIME = re.compile(r'"(\d{4}-\d{2}-\d{2}T[0-9:.]+(?:Z|\+00:00))"')


def age(cache_dir: Path, days: float) -> None:
    """Make the warm-up ``days`` old: its entries' mtimes and every time its manifests record."""
    then = datetime.now(UTC) - timedelta(days=days)
    for manifest in (cache_dir / ".compilecache" / "manifests").glob("*.json"):
        manifest.write_text(_TIME.sub(f'"{stamp(then)}"', manifest.read_text()))
    for name in entry_files(cache_dir):
        os.utime(cache_dir / name, (then.timestamp(), then.timestamp()))


@pytest.mark.slow
@pytest.mark.jax
def test_an_entry_training_used_yesterday_survives_max_age_1d_without_a_warm_up(tmp_path: Path) -> None:
    modules = write_module(tmp_path / "mods", "workload", WORKLOAD)
    (modules / "train.py").write_text(TRAIN)
    cache_dir = tmp_path / "cache"
    warmed = run_cli(
        ["warm", "--cache-dir", str(cache_dir), "--workload", "workload:targets", "--no-verify"],
        clean_env(pythonpath=[modules]),
    )
    assert warmed.returncode == 0, warmed.stderr
    assert len(entry_files(cache_dir)) == 2
    age(cache_dir, 3)

    # A training process with the cache's environment (as the webhook gives it) hits train_step.
    termination = tmp_path / "termination-log"
    termination.touch()
    env = trainer_env(jax_cache_env(str(cache_dir)), read_only=True) | {
        "COMPILECACHE_TERMINATION_LOG": str(termination)
    }
    trained = subprocess.run(
        [sys.executable, str(modules / "train.py")],
        env=clean_env(env, [modules]),
        cwd=modules,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert trained.returncode == 0, trained.stderr
    message = termination.read_text()
    used_entry = next(name for name in entry_files(cache_dir) if lastuse.use_key(name) in json.loads(message)["used"])

    # The pod finished yesterday; the operator's pass today folds its report into status.lastUsed.
    now = datetime.now(UTC)
    counted, refused = reports.counted([finished_pod(message, stamp(now - timedelta(days=1)))])
    assert refused == [] and counted[0].hits == counted[0].requests == 1
    record = reports.last_used(None, counted, stamp(now), DAY)
    assert [lastuse.parse_item(item)[0] for item in record] == [(now - timedelta(days=1)).date().isoformat()]

    # The expiry Job's own command, with the cache's lifecycle and that record, as the Job runs it.
    obj = cache("llama", lifecycle={"maxAge": "1d", "verify": True})
    spec = parse_cache(obj)
    log = tmp_path / "expire.termination-log"
    command = [
        str(cache_dir) if value == spec.cache_dir else str(log) if value == expiryjob.TERMINATION_LOG else value
        for value in expiryjob.expire_command(spec, record)
    ]
    assert command[0] == "compilecache"
    expired = run_cli(command[1:], clean_env())
    assert expired.returncode == 0, expired.stderr
    assert entry_files(cache_dir) == [used_entry]  # used yesterday: kept; used by no one for 3 days: gone
    summary = expiryjob.parse_summary(log.read_text())
    assert summary is not None and summary["deleted"]["maxAge"] == 1 and summary["after"]["entries"] == 1

    # Without the record (the old rule: warm-up re-production only) both would have gone.
    again = run_cli(["expire", "--cache-dir", str(cache_dir), "--max-age", "1d", "--dry-run", "--json"], clean_env())
    assert again.returncode == 0, again.stderr
    assert [d["name"] for d in json.loads(again.stdout)["deletions"]] == [used_entry]
