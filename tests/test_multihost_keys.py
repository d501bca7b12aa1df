"""Which cache keys a multi-process JAX run computes on the CPU, measured with real jax over loopback.

Issue 12 asks whether a warm-up can serve multi-host training. These tests start real
``jax.distributed`` groups (2 processes x 2 CPU devices, gloo collectives on 127.0.0.1) and a
single process with 4 CPU devices, all compiling the same sharded step over a 2x2 mesh into one
cache with the product's settings (:func:`compilecache.frameworks.jax.env.jax_cache_env`), and count
each process's cache requests and hits with the warmer's own counter
(:class:`compilecache.frameworks.jax.compiler.CacheEvents`: the ``jax.monitoring`` events and the
per-component key hashes JAX logs). What they found, as asserted below (jax/jaxlib 0.10.2):

- A fresh 2x2 run on a 2x2 cache: process 0 hits every entry; process 1 hits none. The two
  processes hash the same HLO and compile options; only ``accelerator_config`` differs, because
  on the CPU ``xla_client.get_topology_for_devices`` describes the calling process's own devices
  (ids 2048.. in process 1), whatever devices it is given. JAX writes only from process 0, so
  process 1's keys never reach the cache and it recompiles on every run.
- A 1-process 4-device warm-up hits no process of a 2x2 run: same HLO, but ``compile_options``
  (the device assignment, ids 0-3 against 0, 1, 2048, 2049: JAX strips it from the key on GPU
  only) and ``accelerator_config`` differ.

docs/multihost.md says what this means for the operator.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from groupharness import distributed_cpu_problem, hits, run_group
from jaxhelpers import entry_files

# In CI: the multi-host design rests on these answers (docs/multihost.md). A JAX release that changes
# them (keys that match across processes, writes from every process) fails here, not in training.
pytestmark = [pytest.mark.slow, pytest.mark.jax]

# Key components that JAX hashes (jax/_src/cache_key.py get(), in its order).
COMPONENTS = (
    "computation",
    "jax_lib version",
    "backend version",
    "XLA flags",
    "compile_options",
    "accelerator_config",
    "compression",
    "custom_hook",
)


@pytest.fixture(scope="module", autouse=True)
def _distributed_cpu() -> None:
    problem = distributed_cpu_problem()
    if problem:
        pytest.skip(problem)


def differing(one: dict[str, Any], other: dict[str, Any]) -> dict[str, list[str]]:
    """Per target: the key components whose hashes differ between two processes' results."""
    found = {}
    for name, target in one["targets"].items():
        theirs = other["targets"][name]["components"]
        assert set(target["components"]) == set(theirs) == set(COMPONENTS), "JAX's key components changed"
        found[name] = [c for c in COMPONENTS if target["components"][c] != theirs[c]]
    return found


def test_a_fresh_two_by_two_run_hits_in_process_0_only(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    warm = run_group(cache, processes=2, devices_per_process=2)
    assert warm[0]["device_ids"] == [0, 1, 2048, 2049]  # process 1's devices are numbered from 2048
    assert all(hits(result) == {"step": (1, 0), "update": (1, 0)} for result in warm)
    written = sorted(key for target in warm[0]["targets"].values() for key in target["written"])
    assert len(written) == 2 and entry_files(cache) == [f"{key}-cache" for key in written]
    assert not any(target["written"] for target in warm[1]["targets"].values())  # JAX writes from 0 only

    train = run_group(cache, processes=2, devices_per_process=2)

    # The answer: process 0 hits every entry, process 1 none, on every fresh run.
    assert hits(train[0]) == {"step": (1, 1), "update": (1, 1)}
    assert hits(train[1]) == {"step": (1, 0), "update": (1, 0)}
    # Why: process 1 asks for keys that differ from process 0's in the topology fingerprint alone
    # (same HLO, same compile options, same device assignment).
    assert differing(train[0], train[1]) == {"step": ["accelerator_config"], "update": ["accelerator_config"]}
    assert all(train[1]["targets"][name]["keys"] != train[0]["targets"][name]["keys"] for name in ("step", "update"))
    # ... and its keys are the same on every run, so the cache never gets them (only 0 writes).
    assert all(train[1]["targets"][name]["keys"] == warm[1]["targets"][name]["keys"] for name in ("step", "update"))
    assert entry_files(cache) == [f"{key}-cache" for key in written]
    # The executables process 0 loaded from the cache ran the cross-process all-reduce: both agree.
    assert train[0]["value"] == train[1]["value"] == warm[0]["value"]


def test_a_one_process_four_device_warm_up_does_not_hit_a_two_by_two_run(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (single,) = run_group(cache, processes=1, devices_per_process=4)
    assert single["device_ids"] == [0, 1, 2, 3]
    assert hits(single) == {"step": (1, 0), "update": (1, 0)}
    warmed = entry_files(cache)
    assert len(warmed) == 2

    train = run_group(cache, processes=2, devices_per_process=2)

    # The answer: not one hit in any process.
    assert [hits(result) for result in train] == [{"step": (1, 0), "update": (1, 0)}] * 2
    # Why: the program is the same, but the device assignment (0-3 against 0, 1, 2048, 2049; JAX
    # strips it from the key on GPU only) and the topology fingerprint are not.
    same_program = {
        "step": ["compile_options", "accelerator_config"],
        "update": ["compile_options", "accelerator_config"],
    }
    assert differing(single, train[0]) == same_program
    assert differing(single, train[1]) == same_program
    # Process 0 of the 2x2 run wrote its own entries beside the unused ones.
    assert len(entry_files(cache)) == 4 and set(warmed) < set(entry_files(cache))
    assert train[0]["value"] == train[1]["value"] == single["value"]


def test_every_process_hits_when_every_process_of_the_warm_up_writes_its_own_keys(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    warm = run_group(cache, processes=2, devices_per_process=2, write_own_keys=True)
    own = {
        index: sorted(key for target in result["targets"].values() for key in target["keys"])
        for index, result in enumerate(warm)
    }
    assert entry_files(cache) == sorted(f"{key}-cache" for key in own[0] + own[1])  # 2 programs x 2 processes

    train = run_group(cache, processes=2, devices_per_process=2)  # plain JAX, as training runs

    # The remedy: a warm-up that writes each process's own keys serves every process of a run of
    # the same shape, and the loaded executables run the cross-process step correctly.
    assert [hits(result) for result in train] == [{"step": (1, 1), "update": (1, 1)}] * 2
    assert [sorted(k for t in result["targets"].values() for k in t["keys"]) for result in train] == [own[0], own[1]]
    assert train[0]["value"] == train[1]["value"] == warm[0]["value"]
