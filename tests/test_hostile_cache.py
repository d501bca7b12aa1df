"""A cache holding what others wrote into it (issue 28): bad manifests, a bomb, bad PyTorch generations.

Real ``compilecache warm`` and ``expire`` in fresh processes, real JAX on the CPU, real torch 2.13:
each warms a cache, then the cache gets what an untrusted writer can put there beside the good
warm-up. ``expire`` and ``warm`` must succeed and name each bad thing (output, ``--json``,
termination summary, the status message the operator makes of it), and training must still hit
what the good warm-up published. Before: ``expire`` and ``warm`` ended with ``AttributeError:
'str' object has no attribute 'get'``, the bomb was kept as sound, and one bad generation
stopped the trainer's whole copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import textwrap
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from compilecache.cache.cacheenv import REPORT, TERMINATION_LOG
from compilecache.cache.manifests import JAX_SCHEMA
from compilecache.controller import expiryjob
from compilecache.frameworks.jax.env import jax_cache_env, trainer_env
from jaxhelpers import clean_env, declare_trainer_plugin, entry_files, run_cli, run_trainer
from test_torch_warm import SCRIPT, WARM_THREADS, _train, torch_env
from torchhelpers import torch_warmer_or_skip

WORKLOAD = """
import jax, jax.numpy as jnp
from compilecache import Target

@jax.jit
def train_step(x):
    return jnp.tanh(x @ x.T).sum()

def targets():
    return [Target("train_step", train_step, (jax.ShapeDtypeStruct((16, 16), jnp.float32),))]
"""
TRAIN = """
import jax, jax.numpy as jnp
import hostilewl
hostilewl.train_step(jnp.ones((16, 16), jnp.float32)).block_until_ready()
"""
EVIL = b'{"entries":["x"]}\n'  # the reproduction, byte for byte
BOMB = zlib.compress(b"\x00\x00\x00\x01" + bytes(300 * 1024 * 1024), 9)  # 299 KiB that inflate to 300 MiB


def _json(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.mark.slow
@pytest.mark.jax
def test_jax_expire_and_warm_name_each_bad_thing_and_training_hits_the_good_entries(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "hostilewl.py").write_text(textwrap.dedent(WORKLOAD))
    (code / "train.py").write_text(textwrap.dedent(TRAIN))
    env = clean_env({}, [code])
    cache = tmp_path / "cache"
    warm = ["warm", "--cache-dir", str(cache), "--workload", "hostilewl:targets", "--verify"]
    first = run_cli(warm, env)
    assert first.returncode == 0, first.stderr
    good = entry_files(cache)

    manifests = cache / ".compilecache" / "manifests"
    (manifests / "evil.json").write_bytes(EVIL)
    huge = {"schema": JAX_SCHEMA, "run_id": "r1", "entries": [{"file": good[0], "size": 10**30}]}
    (manifests / "huge.json").write_text(json.dumps(huge))
    bomb = cache / f"jit_bomb-{'b' * 64}-cache"
    bomb.write_bytes(BOMB)
    past = time.time() - 3600  # older than expiry's grace: verified
    os.utime(bomb, (past, past))

    termination = tmp_path / "expiry-termination-log"
    result = _json(run_cli(["expire", "--cache-dir", str(cache), "--json", "--termination-log", str(termination)], env))
    reasons = {item["name"]: item["reason"] for item in result["malformedManifests"]}
    assert reasons == {
        "evil.json": "schema: expected compilecache.dev/manifest/v1 or compilecache.dev/torch-manifest/v1, got null",
        "huge.json": "entries[0].size: 1000000000000000000000000000000 is out of range (0 to 9007199254740991)",
    }, reasons
    [deletion] = result["deletions"]
    assert deletion["name"] == bomb.name and deletion["rule"] == "integrity", deletion
    assert "a compression bomb" in deletion["reason"], deletion
    assert entry_files(cache) == good and (manifests / "evil.json").read_bytes() == EVIL  # set aside, not deleted
    summary = json.loads(termination.read_text())
    assert [item["name"] for item in summary["malformedManifests"]] == ["evil.json", "huge.json"], summary
    status = expiryjob.describe(summary)  # what the operator puts in status.message and the Expired condition
    assert "2 malformed manifests set aside in .compilecache/manifests, unused until removed: evil.json (" in status

    report = tmp_path / "report.json"
    termination = tmp_path / "warm-termination-log"
    again = run_cli([*warm, "--report", str(report), "--termination-log", str(termination)], env)
    assert again.returncode == 0, again.stderr
    assert "  note: manifest evil.json set aside: schema: expected " in again.stdout, again.stdout
    assert "  note: manifest huge.json set aside: entries[0].size: " in again.stdout, again.stdout
    assert [item["name"] for item in json.loads(report.read_text())["malformedManifests"]] == ["evil.json", "huge.json"]
    assert [item["name"] for item in json.loads(termination.read_text())["malformedManifests"]] == [
        "evil.json",
        "huge.json",
    ]

    plugin = declare_trainer_plugin(tmp_path / "plugin")
    training = trainer_env(jax_cache_env(str(cache)), read_only=True)
    training |= {TERMINATION_LOG: str(tmp_path / "training-termination-log"), REPORT: "1"}
    trained, stderr = run_trainer(
        code / "train.py", clean_env(training, [plugin, code]), tmp_path / "training-termination-log"
    )
    assert "train_step" not in {item["name"] for item in trained["missed"]}, (trained, stderr)
    assert trained["hits"] >= 1, trained


# ---- PyTorch -------------------------------------------------------------------------------------


def _bad_generations(cache: Path, good: dict[str, Any]) -> None:
    """Beside the good warm-up: three malformed manifests, and a well-formed generation whose files clash
    with the good one's tree (a file where the good one has a folder), copied after it."""
    manifests = cache / ".compilecache" / "manifests"
    newer = {**good, "run_id": "20990101T000000Z-bad-00000001"}  # newer, same workload: taken if it were sound
    (manifests / "bad-facts.json").write_text(json.dumps({**newer, "facts": []}))
    nul = {**good, "run_id": "20990101T000000Z-bad-00000002", "workload": "script:other.py"}
    nul["entries"] = [{**good["entries"][0], "file": "a\x00b"}]
    (manifests / "bad-nul.json").write_text(json.dumps(nul))
    (manifests / "bad-run.json").write_text(json.dumps({**good, "run_id": "x/y", "workload": "script:third.py"}))

    folder = sorted({entry["file"].split("/")[0] for entry in good["entries"] if "/" in entry["file"]})[0]
    clash = cache / "torch" / "zzzz-clash"
    clash.mkdir(parents=True)
    entries = []
    for name, data in ((folder, b"a file where the good generation has a folder"), ("zz-extra.txt", b"extra")):
        (clash / name).write_bytes(data)
        entries.append({"file": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    clashing = {**good, "run_id": "zzzz-clash", "workload": "script:clash.py", "entries": entries}
    (manifests / "zzzz-clash.json").write_text(json.dumps(clashing))


@pytest.mark.slow
def test_pytorch_bad_generations_are_skipped_and_named_and_training_hits_the_good_one(tmp_path: Path) -> None:
    torch_warmer_or_skip("warm")
    cache = tmp_path / "cache"
    # No verify: the training run below is what shows the good generation hits.
    warm = ["warm", "--framework", "pytorch", "--cache-dir", str(cache), "--no-verify", "--script", str(SCRIPT)]
    warm += ["--steps", "1"]
    warm_env = torch_env({"OMP_NUM_THREADS": WARM_THREADS})  # the thread count is in Inductor's key on the CPU
    done = run_cli(warm, warm_env)
    assert done.returncode == 0, done.stderr + done.stdout
    [good_path] = (cache / ".compilecache" / "manifests").glob("*.json")
    good = json.loads(good_path.read_text())
    _bad_generations(cache, good)

    verdict, trained = _train(cache, tmp_path, WARM_THREADS)  # a training pod, as the webhook makes it
    local = tmp_path / "local-copy"
    for name in ("bad-facts.json", "bad-nul.json", "bad-run.json"):
        assert f"compilecache: manifest {name} set aside: " in trained.stderr, trained.stderr
    assert "1 files refused (torch/zzzz-clash/" in trained.stderr and "not copied: " in trained.stderr, trained.stderr
    assert verdict["requests"] >= 3 and verdict["hits"] == verdict["requests"], (verdict, trained.stderr)
    assert (local / "zz-extra.txt").read_bytes() == b"extra"  # the clashing generation's other file: copied

    result = _json(run_cli(["expire", "--framework", "pytorch", "--cache-dir", str(cache), "--json"], warm_env))
    reasons = {item["name"]: item["reason"] for item in result["malformedManifests"]}
    assert reasons == {
        "bad-facts.json": "facts: expected an object, got a list",
        "bad-nul.json": "entries[0].file: holds a NUL character",
        "bad-run.json": "run_id: 'x/y' is not a run id (letters, digits, '.', '_', '-')",
    }, reasons
    assert (cache / good["generation"]).is_dir()  # the good warm-up stands
    shutil.rmtree(local)
    assert run_cli(warm, warm_env).returncode == 0  # and warms again beside them
