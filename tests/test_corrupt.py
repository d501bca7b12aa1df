"""A corrupt entry is named as corrupt by the trainer and replaced by the next warm (issue 21 item 4).

Real JAX on the CPU, the real ``compilecache warm`` and a real training process that loads the
trainer plugin as a training image does. The entry's bytes are damaged as a torn write or a bad
disk would: cut short, one byte flipped (zlib's "incorrect data check" when JAX reads it), or a
sound zlib stream whose executable does not parse ("Failed to parse SerializedXlaExecutableMetadata"),
listed in a manifest or not.
"""

from __future__ import annotations

import json
import shutil
import textwrap
import zlib
from pathlib import Path
from typing import Any

import pytest

from compilecache.cache.cacheenv import REPORT, TERMINATION_LOG
from compilecache.cache.entries import entry_name
from compilecache.cache.store import MANIFESTS_DIR, Listing, StoredFile
from compilecache.controller import reports as consumer_report
from compilecache.frameworks.jax import verdict
from compilecache.frameworks.jax.compiler import TargetRun
from compilecache.frameworks.jax.env import jax_cache_env, trainer_env
from compilecache.frameworks.jax.warm import UNREADABLE, unreadable_entries
from jaxhelpers import clean_env, declare_trainer_plugin, entry_files, run_cli, run_trainer
from test_trainer import WORKLOAD  # the same AOT workload the trainer's own tests warm

TRAIN = """
import jax, jax.numpy as jnp
import corruptwl
corruptwl.train_step(jnp.ones((16, 16), jnp.float32)).block_until_ready()
"""


def test_a_miss_whose_entry_was_present_is_entry_corrupt_not_another_key() -> None:
    tally = verdict.Tally(requests=2, hits=0, missed=["jit_train_step", "jit_eval"], corrupt={0})
    result = verdict.verdict(tally, {}, [{"entries": [{"file": "jit_eval-" + "0" * 64 + "-cache"}]}])
    assert result["missed"][0] == {"name": "train_step", "reason": verdict.ENTRY_CORRUPT}, result
    assert result["missed"][1]["reason"] == verdict.KEY_DIFFERS, result
    assert f"train_step ({verdict.ENTRY_CORRUPT})" in result["summary"], result["summary"]
    assert verdict.ENTRY_CORRUPT.startswith("entry corrupt")


def test_the_warm_replaces_a_published_entry_jax_missed_although_it_was_there() -> None:
    there, absent, damaged = (f"jit_{name}-{digit * 64}" for name, digit in (("a", "1"), ("b", "2"), ("c", "3")))
    listing = Listing(files=tuple(StoredFile(entry_name(key), 10, 0.0) for key in (there, damaged)))
    run = TargetRun("wl", "t", keys_missed=[there, absent, damaged], keys_hit=[])
    damaged_entries = {entry_name(damaged): "zlib stream is corrupt"}  # replaced already, for its own reason
    assert unreadable_entries(listing, [run], damaged_entries) == {entry_name(there): UNREADABLE}
    assert unreadable_entries(listing, [TargetRun("wl", "t", keys_hit=[there])], {}) == {}
    assert UNREADABLE.startswith("entry corrupt")


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "unparsable":  # a sound zlib stream and a plausible header; the executable does not parse
        path.write_bytes(zlib.compress(b"\x00\x00\x00\x01" + b"not an executable" * 64))
    else:  # one byte of the compressed body: the stream's checksum no longer matches
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(flipped))


def _train(cache: Path, code: Path, plugin: Path, termination: Path) -> tuple[dict[str, Any], str]:
    env = trainer_env(jax_cache_env(str(cache)), read_only=True) | {TERMINATION_LOG: str(termination), REPORT: "1"}
    return run_trainer(code / "train.py", clean_env(env, [plugin, code]), termination)


@pytest.mark.slow
@pytest.mark.jax
@pytest.mark.parametrize(
    ("how", "listed"),
    [("truncated", True), ("flipped", True), ("flipped", False), ("unparsable", False), ("unparsable", True)],
)
def test_a_corrupt_entry_is_named_by_the_trainer_and_replaced_by_the_next_warm(
    tmp_path: Path, how: str, listed: bool
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "corruptwl.py").write_text(textwrap.dedent(WORKLOAD))
    (code / "train.py").write_text(textwrap.dedent(TRAIN))
    plugin = declare_trainer_plugin(tmp_path / "plugin")
    cache = tmp_path / "cache"
    warm = ["warm", "--cache-dir", str(cache), "--workload", "corruptwl:targets", "--verify"]
    first = run_cli(warm, clean_env({}, [code]))
    assert first.returncode == 0, first.stderr
    [entry] = [cache / name for name in entry_files(cache) if name.startswith("jit_train_step-")]
    _damage(entry, how)
    if not listed:  # an entry no manifest records (a manifest lost, or a writer other than the warm)
        shutil.rmtree(cache / MANIFESTS_DIR)

    report, stderr = _train(cache, code, plugin, tmp_path / "termination-log")
    assert "Error reading persistent compilation cache entry" in stderr, stderr  # JAX's own warning
    missed = {item["name"]: item["reason"] for item in report["missed"]}
    assert missed.get("train_step") == verdict.ENTRY_CORRUPT, report  # jnp.ones' programs: "not warmed"
    assert "train_step (entry corrupt" in str(report["summary"]), report
    # What status.consumers.lastMissReason takes from the termination message: the first miss.
    parsed = consumer_report.parse(json.dumps(report))
    assert parsed is not None and parsed.miss_reason == f"train_step: {verdict.ENTRY_CORRUPT}", parsed

    second = run_cli(warm, clean_env({}, [code]))
    assert second.returncode == 0, second.stdout + second.stderr  # verify passed
    assert f"replacing damaged entry {entry.name}: " in second.stdout, second.stdout

    report, stderr = _train(cache, code, plugin, tmp_path / "termination-log")
    assert "train_step" not in {item["name"] for item in report["missed"]}, report
    assert int(report["hits"]) >= 1, report
