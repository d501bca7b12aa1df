"""The multi-host key questions: do two processes of one job ask for the same cache keys, and does
one process compiling for a mock topology produce the keys an N-process run asks for?

One command::

    .venv/bin/python bench/multihost_keys.py

It starts, with the product's cache settings (``jax_cache_env``) on empty caches, the programs of
``tests/groupharness.py`` (a sharded train step and an update over a 2x2 mesh):

* a group of 2 processes x 2 CPU devices joined with ``jax.distributed`` on 127.0.0.1 (gloo), as
  two pods of one training Job: each process's keys, per program, and the key components
  (``jax/_src/cache_key.py``) that differ between them;
* one process with all 4 devices, the stand-in for a single warm-up process compiling the
  group's program: its keys against each group process's;
* a probe of ``jax_mock_gpu_topology`` (``--mock``, ``1x2x1`` by default: 1 slice of 2 hosts of
  1 device) in a process on whatever backend JAX finds, the GPU where there is one: how many
  devices, local devices and processes JAX then reports, the backend, and the flag as JAX reads it
  back. It is a JAX *flag* (``config.string_flag`` in ``jax/_src/xla_bridge.py``), and
  ``string_flag`` (``jax/_src/config.py``) reads no environment variable, where JAX's config
  states read ``JAX_<NAME>``: so the probe sets it with ``jax.config.update`` before any backend
  starts (it only feeds the options of the client JAX creates, ``_options_from_jax_configs``, for
  cuda and rocm). The mock's devices per host must equal the host's local device count: on a
  1-GPU host ``1x2x1`` reports 2 devices, 1 local, 2 processes (measured on an H200, jax 0.11.2),
  and ``1x2x2`` is refused. The CPU client has no mock topology: with the flag set and read back,
  a CPU process of jax 0.10.2 still reports 1 device, 1 local, 1 process (measured with this
  repository's locked jax), so on the CPU the single process can only stand in with 4 real host
  devices.

Prints ``key=value`` lines (parsed by ``tests/test_bench_multihost_keys.py``, CI's smoke run) and
one answer per question. The groups run on the CPU on every machine (``groupharness.cpu_env``);
the probe runs on the GPU where there is one (docs/benchmarks.md has both machines' answers).
"""

from __future__ import annotations

import argparse
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

from groupharness import distributed_cpu_problem, run_group  # noqa: E402
from jaxhelpers import clean_env  # noqa: E402

# <slices> x <hosts per slice> x <devices per host>: 2 hosts, as the group has 2 processes; the
# devices per host must be the host's local device count (1 on a 1-GPU host; 1x2x8 on 8 GPUs).
MOCK = "1x2x1"
# The flag is read when JAX creates its client (xla_bridge._options_from_jax_configs): set after
# a backend started, it is stored but mocks nothing, so the probe says whether one had started.
PROBE = """
import json, sys
import jax
from jax._src import xla_bridge
started = xla_bridge.backends_are_initialized()
jax.config.update("jax_mock_gpu_topology", sys.argv[1])
print(json.dumps({"flag": jax.config.read("jax_mock_gpu_topology"), "started_before": started,
                  "devices": len(jax.devices()), "local": len(jax.local_devices()),
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


def mock_probe(mock: str) -> dict[str, Any]:
    """What a fresh process on JAX's own choice of backend reports with ``jax_mock_gpu_topology`` set to ``mock``."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mock], env=clean_env(), capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def measure(scratch: Path, mock: str = MOCK) -> dict[str, Any]:
    """Run the group, the single process and the probe of ``mock``; their results."""
    started = time.monotonic()
    group_cache, single_cache = scratch / "group-cache", scratch / "single-cache"
    group_cache.mkdir(parents=True)
    single_cache.mkdir()
    group = run_group(group_cache, processes=2, devices_per_process=2, model_dir=scratch / "model")
    (single,) = run_group(single_cache, processes=1, devices_per_process=4, model_dir=scratch / "model")
    probe = mock_probe(mock)
    return {"group": group, "single": single, "probe": {"mock": mock, **probe}, "seconds": time.monotonic() - started}


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
    shown = probe.get("error") or (
        f"flag={probe['flag'] or '(unset)'} set_before_backend={'no' if probe['started_before'] else 'yes'} "
        f"devices={probe['devices']} local={probe['local']} processes={probe['processes']}"
    )
    lines.append(
        f"multihost-keys probe=mock-topology jax_mock_gpu_topology={probe['mock']} "
        f"backend={probe.get('backend', '?')} {shown} applies={'yes' if mocked else 'no'}"
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
            + (
                f"; jax_mock_gpu_topology applies on {probe['backend']}, but the keys of a process under it are "
                "not compared here (docs/benchmarks.md)"
                if mocked
                else f"; jax_mock_gpu_topology does not apply to the {probe.get('backend', 'cpu')} client"
            )
        )
    )
    lines.append(f"multihost-keys seconds={found['seconds']:.1f}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mock", default=MOCK, help=f"the probe's jax_mock_gpu_topology (default {MOCK}; devices per host = local)"
    )
    args = parser.parse_args(argv)
    problem = distributed_cpu_problem()
    if problem:
        print(f"multihost-keys skipped: {problem}")
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-multihost-keys-") as folder:
        print("\n".join(report(measure(Path(folder), args.mock))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
