"""Run a group of N real processes on this machine, bounded, with their logs kept.

Multi-process JAX on the CPU (``jax.distributed`` over 127.0.0.1, gloo collectives) is what the
multi-host tests exercise. A group whose process blocks (a peer died, a rendezvous that never
completes) blocks the others, so every wait here is bounded and a test never hangs: each
process writes its output to a file (a pipe nobody drains while we wait on another process
could block its writer and stall the group); past the bound every straggler gets SIGABRT first,
so that Python's faulthandler (``PYTHONFAULTHANDLER=1``, set here) writes every thread's stack to
its log, and then SIGKILL; the failure message shows each process's exit status and log tail.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compilecache.frameworks.jax.env import jax_cache_env
from jaxhelpers import clean_env

# jax.distributed on the CPU needs the gloo collectives in jaxlib (jax/_src/xla_bridge.py
# make_cpu_client: jax_cpu_collectives_implementation, "gloo" by default).
CAPABILITY = """
import jax, jax.distributed
from jax._src import config
from jax._src.lib import _jax
assert hasattr(_jax, "make_gloo_tcp_collectives"), "jaxlib has no gloo collectives"
assert config.cpu_collectives_implementation.value == "gloo", config.cpu_collectives_implementation.value
"""

# What a straggler gets to write its stacks before it is killed.
_DUMP_GRACE_S = 5.0


def distributed_cpu_problem() -> str | None:
    """Why multi-process JAX cannot run on this CPU (a skip reason), or None."""
    done = subprocess.run(
        [sys.executable, "-c", CAPABILITY],
        env=clean_env({"JAX_PLATFORMS": "cpu"}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode == 0:
        return None
    lines = done.stderr.strip().splitlines() or ["(no output)"]
    return f"jax.distributed on the CPU (gloo collectives) is unavailable here: {lines[-1]}"


# The ports groups pick from start here: above the well-known and most registered services' ports.
FIXED_PORTS_FROM = 20000


def free_port(block: int = 1) -> int:
    """A port with ``block - 1`` free ports after it on 127.0.0.1, below the kernel's ephemeral range.

    Below it on purpose: the kernel hands the ports of that range to every outgoing connection and to
    every server that binds port 0 (the API and GCS emulators, the HTTP clients of the suite's other
    worker), so a port found free there was taken again before a group bound it (seen in CI: "Failed
    to add port to server" for the coordinator's). A port below the range is taken only by a process
    that asks for it by number: here, another group of the other worker, which picks at random among
    thousands. Free when asked, still: a clash fails the group at once, it does not hang.
    """
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(FIXED_PORTS_FROM, low - block)
        try:
            with contextlib.ExitStack() as stack:
                for offset in range(block):
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", port + offset))
            return port
        except OSError:
            continue
    raise AssertionError(f"no block of {block} free ports found below {low}")


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's ``ip_local_port_range``; 32768 elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def cpu_env(cache: Path, devices_per_process: int, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A clean environment with the product's cache settings, N CPU devices per process, stacks on abort."""
    return clean_env(
        {
            **jax_cache_env(str(cache), xla_flags=f"--xla_force_host_platform_device_count={devices_per_process}"),
            "JAX_PLATFORMS": "cpu",
            "PYTHONFAULTHANDLER": "1",
            "PYTHONUNBUFFERED": "1",
            **(extra or {}),
        }
    )


@dataclass
class Finished:
    """One process of a group, after the group ended."""

    index: int
    returncode: int
    log: Path
    killed: bool  # still running at the bound

    def tail(self, chars: int = 4000) -> str:
        """The end of its log."""
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else "(no log)"


def run_processes(
    commands: Sequence[Sequence[str]],
    envs: Sequence[Mapping[str, str]],
    run_dir: Path,
    timeout: float,
    cwd: Path | None = None,
) -> list[Finished]:
    """Start every command at once, wait at most ``timeout`` seconds for all, return how each ended.

    Process *i* writes stdout and stderr to ``run_dir/i.log``.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    started: list[tuple[subprocess.Popen[bytes], Path]] = []
    for index, (command, env) in enumerate(zip(commands, envs, strict=True)):
        log_path = run_dir / f"{index}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                list(command), env=dict(env), cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        started.append((proc, log_path))
    deadline = time.monotonic() + timeout
    for proc, _ in started:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    stragglers = [proc for proc, _ in started if proc.poll() is None]
    # SIGABRT to the whole session (the warmer's children too): faulthandler writes the stacks.
    for proc in stragglers:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGABRT)
    grace = time.monotonic() + _DUMP_GRACE_S
    for proc in stragglers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.1, grace - time.monotonic()))
    for proc, _ in started:
        # Whatever is left of any session: nothing of a group outlives its test.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return [
        Finished(index, proc.returncode, log_path, proc in stragglers) for index, (proc, log_path) in enumerate(started)
    ]


def explain(finished: Sequence[Finished], what: str, timeout: float) -> str:
    """Every process's exit and log tail, for an assertion message."""
    parts = []
    for one in finished:
        state = f"killed at the {timeout:.0f} s bound" if one.killed else f"exited {one.returncode}"
        parts.append(f"--- {what}: process {one.index} {state}; log {one.log}:\n{one.tail()}")
    return "\n".join(parts)


def require_success(finished: Sequence[Finished], what: str, timeout: float) -> None:
    """Fail the test, with every log, unless every process exited 0 in time."""
    if any(one.killed or one.returncode != 0 for one in finished):
        raise AssertionError(explain(finished, what, timeout))


# One process of a plain-JAX group (a "training run"): joins it (when there is more than one),
# compiles a sharded train step and an update over a 2x2 mesh of all global devices, runs the
# step once (the executable, cached or not, must run its cross-process all-reduce), and writes
# one JSON file. faulthandler dumps its stacks into its log before the harness's bound.
WORKER = """
import faulthandler, json, sys
faulthandler.dump_traceback_later(float(sys.argv[7]), exit=False)
import jax

processes, process_id, coordinator, init_timeout = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
write_own_keys = sys.argv[5] == "write-own-keys"
result_path = sys.argv[6]
if processes > 1:
    jax.distributed.initialize(
        coordinator_address=coordinator, num_processes=processes, process_id=process_id,
        initialization_timeout=init_timeout, heartbeat_timeout_seconds=init_timeout,
        shutdown_timeout_seconds=init_timeout, cluster_detection_method="deactivate",
    )

import numpy as np
import jax.numpy as jnp
from compilecache.frameworks.jax.compiler import CacheEvents, TargetRun
import mhmodel

model = mhmodel.Model()
targets = {}
compiled = {}
with CacheEvents() as events:
    for name, fn, args in model.programs():
        run = TargetRun("multihost", name)
        with events.attribute_to(run):
            compiled[name] = fn.lower(*args).compile()
        if write_own_keys and process_id != 0 and run.keys_missed:
            # What JAX itself does in process 0 only (jax/_src/compiler.py _cache_write), with the
            # key this process asked for: its entry, under its own key, in the shared cache.
            from jax._src import compilation_cache, xla_bridge
            compilation_cache.put_executable_and_time(
                run.keys_missed[0], name, compiled[name].runtime_executable(), xla_bridge.get_backend(), 1,
            )
        targets[name] = {
            "requests": run.requests,
            "hits": run.hits,
            "keys": sorted(set(run.keys_hit) | set(run.keys_missed)),
            "written": run.keys_written,
            "components": run.key_components,
        }

value = model.run_step(compiled["step"])
result = {
    "process_index": jax.process_index(),
    "process_count": jax.process_count(),
    "device_ids": [device.id for device in jax.devices()],
    "value": value,
    "targets": targets,
}
# A file, not stdout: gloo's C++ logging shares stdout and may flush after our line.
with open(result_path, "w") as out:
    json.dump(result, out)
faulthandler.cancel_dump_traceback_later()
"""

# The programs, shared by the training worker and the warmer's workload (so both compile the
# same functions, named alike: the module name is part of the HLO and so of the key). Import
# it only after jax.distributed has started: the mesh spans every process's devices.
MODEL = """
import numpy as np
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


def loss(w, x):
    return jnp.tanh(x @ w).sum()


def update(w, g):
    return w - 0.1 * g


class Model:
    def __init__(self):
        # 2x2 over 4 devices (2 processes x 2, or 1 x 4); 1x2 over one process's 2 devices.
        self.mesh = Mesh(np.array(jax.devices()).reshape(-1, 2), ("data", "model"))
        self.w_sharding = NamedSharding(self.mesh, P(None, "model"))
        self.x_sharding = NamedSharding(self.mesh, P("data", None))
        self.step = jax.jit(jax.value_and_grad(loss), in_shardings=(self.w_sharding, self.x_sharding))
        self.update = jax.jit(
            update, in_shardings=(self.w_sharding, self.w_sharding), out_shardings=self.w_sharding
        )
        self.W = jax.ShapeDtypeStruct((16, 16), jnp.float32, sharding=self.w_sharding)
        self.X = jax.ShapeDtypeStruct((8, 16), jnp.float32, sharding=self.x_sharding)

    def programs(self):
        return [("step", self.step, (self.W, self.X)), ("update", self.update, (self.W, self.W))]

    def run_step(self, step):
        w = jax.make_array_from_callback(
            (16, 16), self.w_sharding, lambda index: np.ones((16, 16), np.float32)[index]
        )
        x = jax.make_array_from_callback(
            (8, 16), self.x_sharding, lambda index: np.full((8, 16), 0.01, np.float32)[index]
        )
        value, _ = step(w, x)
        return float(np.asarray(value.addressable_data(0)))


def targets():
    # The warmer's workload: the same two programs, as compilecache Targets.
    from compilecache import Target

    model = Model()
    return [Target(name, fn, args) for name, fn, args in model.programs()]
"""

# jax.distributed.initialize's own bound on meeting the coordinator (its default is 300 s).
INIT_TIMEOUT_S = 30
# A training group must finish in this; a healthy one takes a few seconds on 2 shared cores.
GROUP_TIMEOUT_S = 90


def write_model(folder: Path) -> Path:
    """``mhmodel.py`` in ``folder``; returns the folder (put it on PYTHONPATH)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mhmodel.py").write_text(MODEL)
    return folder


def run_group(
    cache: Path,
    processes: int,
    devices_per_process: int,
    *,
    write_own_keys: bool = False,
    model_dir: Path | None = None,
) -> list[dict[str, Any]]:
    """Start ``processes`` fresh plain-JAX processes (one group) on ``cache``; their results by process id.

    ``write_own_keys``: every process other than 0 also writes its entries under its own keys
    (JAX writes from process 0 only), as a warmer could.
    """
    mode = "write-own-keys" if write_own_keys else "jax-default"
    coordinator = f"127.0.0.1:{free_port()}"
    run_dir = Path(os.path.realpath(cache.parent)) / f"group-{processes}x{devices_per_process}-{time.monotonic_ns()}"
    model_dir = write_model(model_dir or run_dir / "model")
    env = cpu_env(cache, devices_per_process, {"PYTHONPATH": f"{model_dir}{os.pathsep}{clean_env()['PYTHONPATH']}"})
    commands = [
        [
            sys.executable,
            "-c",
            WORKER,
            str(processes),
            str(index),
            coordinator,
            str(INIT_TIMEOUT_S),
            mode,
            str(run_dir / f"{index}.json"),
            str(GROUP_TIMEOUT_S - 10),
        ]
        for index in range(processes)
    ]
    finished = run_processes(commands, [env] * processes, run_dir, GROUP_TIMEOUT_S)
    require_success(finished, f"{processes}x{devices_per_process} training group", GROUP_TIMEOUT_S)
    results = [json.loads((run_dir / f"{index}.json").read_text()) for index in range(processes)]
    assert [result["process_index"] for result in results] == list(range(processes))
    assert all(result["process_count"] == processes for result in results)
    return results


def hits(result: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """Per target of a worker's result: (cache requests, cache hits)."""
    return {name: (target["requests"], target["hits"]) for name, target in result["targets"].items()}
