"""The multi-host key questions, on this machine's CPU: do two processes of one job ask for the same
cache keys, and does one process compiling for a mock topology produce the keys an N-process run asks for?

One command::

    .venv/bin/python bench/multihost_keys.py

It starts, with the product's cache settings (``jax_cache_env``) on empty caches, the programs of
``tests/groupharness.py`` (a sharded train step and an update over a 2x2 mesh):

* a group of 2 processes x 2 CPU devices joined with ``jax.distributed`` on 127.0.0.1 (gloo), as
  two pods of one training Job: each process's keys, per program, and the key components
  (``jax/_src/cache_key.py``) that differ between them;
* one process with all 4 devices, the stand-in for a single warm-up process compiling the
  group's program: its keys against each group process's;
* a probe of ``jax_mock_gpu_topology`` (``1x2x2``: 2 hosts of 2 devices) in a CPU process: how
  many devices and processes JAX then reports. In jax 0.10.2 the flag (and ``mock_num_gpu_processes``)
  only feeds the GPU plugin's client options (``jax/_src/xla_bridge.py``
  ``_options_from_jax_configs``, for cuda and rocm); the CPU client has no mock topology, so on the
  CPU the single process can only stand in with 4 real host devices.

Prints ``key=value`` lines (parsed by ``tests/test_bench_multihost_keys.py``, CI's smoke run) and
one answer per question. The programs, processes and comparison are the same on a GPU machine,
but the group runs on the CPU (``groupharness.cpu_env``): the GPU answers, with a real mock
topology, are still to be measured (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "operator"), str(REPO / "tests")]

from groupharness import cpu_env, distributed_cpu_problem, run_group  # noqa: E402

MOCK = "1x2x2"  # <slices> x <hosts per slice> x <devices per host>: the group's shape
PROBE = """
import json, jax
print(json.dumps({"devices": len(jax.devices()), "local": len(jax.local_devices()),
                  "processes": jax.process_count(), "backend": jax.default_backend()}))
"""


def differing(one: Mapping[str, Any], other: Mapping[str, Any]) -> dict[str, list[str]]:
    """Per program: the key components whose hashes differ between two processes' results ([] = same key)."""
    found = {}
    for name, target in one["targets"].items():
        mine, theirs = target["components"], other["targets"][name]["components"]
        found[name] = sorted(c for c in set(mine) | set(theirs) if mine.get(c) != theirs.get(c))
    return found


def same_keys(one: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    """Whether two processes asked for exactly the same keys, program by program."""
    return all(target["keys"] == other["targets"][name]["keys"] for name, target in one["targets"].items())


def mock_probe(scratch: Path) -> dict[str, Any]:
    """What a CPU process reports with ``JAX_MOCK_GPU_TOPOLOGY`` set (2 host devices of its own)."""
    env = cpu_env(scratch / "probe-cache", 2, {"JAX_MOCK_GPU_TOPOLOGY": MOCK})
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def measure(scratch: Path) -> dict[str, Any]:
    """Run the group, the single process and the probe; their results."""
    started = time.monotonic()
    group_cache, single_cache = scratch / "group-cache", scratch / "single-cache"
    group_cache.mkdir(parents=True)
    single_cache.mkdir()
    group = run_group(group_cache, processes=2, devices_per_process=2, model_dir=scratch / "model")
    (single,) = run_group(single_cache, processes=1, devices_per_process=4, model_dir=scratch / "model")
    probe = mock_probe(scratch)
    return {"group": group, "single": single, "probe": probe, "seconds": time.monotonic() - started}


def _components(found: Mapping[str, Sequence[str]]) -> str:
    return ";".join(f"{name}:{','.join(parts) or 'none'}" for name, parts in sorted(found.items()))


def report(found: Mapping[str, Any]) -> list[str]:
    """The ``key=value`` lines and the two answers."""
    group, single, probe = found["group"], found["single"], found["probe"]
    processes = same_keys(group[0], group[1])
    lines = [
        f"multihost-keys question=processes group=2x2 programs={len(group[0]['targets'])} "
        f"same_keys={'yes' if processes else 'no'} differing={_components(differing(group[0], group[1]))}",
    ]
    # A mock topology shows as more global devices than this process holds (the other hosts' are mocked).
    mocked = "error" not in probe and probe["devices"] > probe["local"]
    for index, member in enumerate(group):
        lines.append(
            f"multihost-keys question=single-process stand_in=1x4 process={index} "
            f"same_keys={'yes' if same_keys(single, member) else 'no'} "
            f"differing={_components(differing(single, member))}"
        )
    shown = probe.get("error") or f"devices={probe['devices']} local={probe['local']} processes={probe['processes']}"
    lines.append(
        f"multihost-keys probe=mock-topology jax_mock_gpu_topology={MOCK} backend={probe.get('backend', '?')} {shown} "
        f"applies={'yes' if mocked else 'no'}"
    )
    lines.append(
        "answer: two processes of one job ask for the same keys: "
        + ("yes" if processes else f"no (they differ in {_components(differing(group[0], group[1]))})")
    )
    stand_in = any(same_keys(single, member) for member in group)
    lines.append(
        "answer: one process produces the keys an N-process run asks for: "
        + (
            "yes, for some process"
            if stand_in
            else "no: one 4-device process hits no process of the 2x2 group"
            + ("" if mocked else f"; jax_mock_gpu_topology does not apply to the {probe.get('backend', 'cpu')} client")
        )
    )
    lines.append(f"multihost-keys seconds={found['seconds']:.1f}")
    return lines


def main() -> int:
    problem = distributed_cpu_problem()
    if problem:
        print(f"multihost-keys skipped: {problem}")
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-multihost-keys-") as folder:
        print("\n".join(report(measure(Path(folder)))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
