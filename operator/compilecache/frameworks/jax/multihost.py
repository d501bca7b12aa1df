"""``compilecache warm`` as one process of an N-process group (a multi-host warm-up Job).

JAX hashes the devices of the whole group into every cache key, and on the CPU each process's
key differs from the others' (docs/multihost.md), so every process of the warm-up compiles,
stages *its own* entries, publishes them and verifies them. This module holds what that needs:

* :func:`group_from`: who we are (N, k, the coordinator), from flags and the Job's environment;
  a pure function with one-line errors.
* :class:`Coordination`: the warmers' own group on the coordinator's ``port``. It is JAX's
  coordination service and client (gRPC, the key-value store ``jax.distributed`` uses), started
  directly: no backend, no devices, no collectives. Process 0 shares the run id through it, and
  every phase ends in :meth:`Coordination.agree`: each process posts ``ok`` or why it failed,
  and waits (bounded) until all have posted ``ok``. Processes leave it, and the compile's JAX
  group, in one order whatever happened (:meth:`Coordination.abandon`), process 0 last.
* :func:`join_jax`: where JAX itself must see the N processes (compiling, verifying) it joins a
  ``jax.distributed`` group on ``port + offset`` (:data:`COMPILE_PORT`, :data:`SCRIPT_PORT`,
  :data:`VERIFY_PORT`); groups never share a port, and phases never overlap (a phase starts
  after the previous one's agreement), so a port's old group has always ended.
* :func:`install_own_key_writer`: JAX writes cache entries from process 0 only
  (``jax/_src/compiler.py`` ``_cache_write``); in the other processes a wrapper does what JAX
  does in process 0, with the key that process asked for.

The warmer never runs a collective: compiling needs the group's devices, not gloo.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from compilecache.cache.cacheenv import (
    GROUP_CONNECT_TIMEOUT,
    GROUP_COORDINATOR,
    GROUP_PORTS,
    GROUP_PROCESS_ID,
    GROUP_PROCESSES,
    JOB_COMPLETION_INDEX,
)
from compilecache.cache.errors import WarmError, one_line
from compilecache.frameworks.jax.compiler import WRITE_FAILED

# Bounds, in seconds (environment variables, for tests and unusual clusters).
ENV_CONNECT_TIMEOUT = GROUP_CONNECT_TIMEOUT
ENV_PHASE_TIMEOUT = "COMPILECACHE_GROUP_PHASE_TIMEOUT"
ENV_HEARTBEAT_TIMEOUT = "COMPILECACHE_GROUP_HEARTBEAT_TIMEOUT"

# Port offsets from the coordinator's port (the Job reserves port..port+3 for each container).
COORDINATION_PORT = 0
COMPILE_PORT = 1  # --workload: compiled in the warmer's own process
SCRIPT_PORT = 2  # --script: the entrypoint's own jax.distributed.initialize
VERIFY_PORT = GROUP_PORTS - 1  # the fresh verify processes (workloads, then the script: one after the other)

_KEY_PREFIX = "compilecache/"
_POLL_MS = 1000  # each wait on the key-value store; the phase deadline bounds the whole
# Between another process's "left" and the drop of its connection it runs no Python but the drop
# itself; this covers its being descheduled on a loaded node (see Coordination.abandon).
_LEAVE_GRACE_S = 1.0
_WRITE_PARAMS = ("cache_key", "compile_time_secs", "module_name", "backend", "executable", "host_callbacks")

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Timeouts:
    """How long a group waits, in seconds."""

    connect: int = 300  # every process must reach the coordinator (pods start minutes apart)
    phase: int = 7200  # the slowest process's compile (a large step compiles for tens of minutes)
    heartbeat: int = 60  # a process silent this long is dead: every other one fails
    shutdown: int = 30  # leaving a group waits this long for the others


@dataclass(frozen=True)
class Group:
    """This warmer's place in a group of ``processes``."""

    processes: int
    process_id: int
    host: str
    port: int
    timeouts: Timeouts = Timeouts()

    def address(self, offset: int) -> str:
        """``host:port+offset``: the coordinator of one of the warmer's groups."""
        return f"{self.host}:{self.port + offset}"

    def describe(self) -> str:
        """``process 1 of 2``."""
        return f"process {self.process_id} of {self.processes}"


def group_from(
    processes: int | None, process_id: int | None, coordinator: str | None, env: Mapping[str, str]
) -> Group | None:
    """The group from flags (``None``: not given), else the environment; ``None`` for one process."""
    count = processes if processes is not None else _whole(env, GROUP_PROCESSES, default=1)
    if count < 1:
        raise WarmError(f"--num-processes / ${GROUP_PROCESSES} must be at least 1, got {count}")
    if count == 1:
        return None
    if process_id is None:
        name = GROUP_PROCESS_ID if env.get(GROUP_PROCESS_ID) else JOB_COMPLETION_INDEX
        if not env.get(name):
            raise WarmError(
                f"{count} processes asked, but no process id: give --process-id, ${GROUP_PROCESS_ID} "
                f"or ${JOB_COMPLETION_INDEX} (an Indexed Job sets it)"
            )
        process_id = _whole(env, name, default=0)
    if not 0 <= process_id < count:
        raise WarmError(f"process id {process_id} is outside 0..{count - 1} for {count} processes")
    address = coordinator or env.get(GROUP_COORDINATOR)
    if not address:
        raise WarmError(
            f"{count} processes asked, but no coordinator: give --coordinator HOST:PORT or ${GROUP_COORDINATOR}"
        )
    host, _, port_text = address.rpartition(":")
    if not host or not port_text.isdigit() or not 0 < int(port_text) <= 65535 - VERIFY_PORT:
        raise WarmError(f"coordinator {address!r} is not HOST:PORT (port 1..{65535 - VERIFY_PORT})")
    timeouts = Timeouts(
        connect=_whole(env, ENV_CONNECT_TIMEOUT, default=Timeouts.connect),
        phase=_whole(env, ENV_PHASE_TIMEOUT, default=Timeouts.phase),
        heartbeat=_whole(env, ENV_HEARTBEAT_TIMEOUT, default=Timeouts.heartbeat),
    )
    return Group(count, process_id, host, int(port_text), timeouts)


def _whole(env: Mapping[str, str], name: str, *, default: int) -> int:
    text = env.get(name)
    if not text:
        return default
    try:
        return int(text)
    except ValueError as error:
        raise WarmError(f"${name} must be a whole number, got {text!r}") from error


def script_env(group: Group) -> dict[str, str]:
    """What a ``--script`` reads to join its group (it calls ``jax.distributed.initialize``)."""
    return {
        GROUP_COORDINATOR: group.address(SCRIPT_PORT),
        GROUP_PROCESSES: str(group.processes),
        GROUP_PROCESS_ID: str(group.process_id),
    }


def verify_script_env(group: Group) -> dict[str, str]:
    """The same for the script's fresh verify run."""
    return {**script_env(group), GROUP_COORDINATOR: group.address(VERIFY_PORT)}


def group_request(group: Group, offset: int, *, ordered_leave: bool = False) -> dict[str, Any]:
    """A child's request field: the group it joins with :func:`join_jax`.

    With ``ordered_leave`` the group has no shutdown barrier (a shutdown timeout of 0): each
    process's :func:`leave_jax` disconnects at once and the service is told, so the warmer's own
    group can order the leaving (:meth:`Coordination.leave_compile_group`, :meth:`Coordination.abandon`),
    which a barrier that a failed process never reaches cannot.
    """
    return {
        "coordinator": group.address(offset),
        "processes": group.processes,
        "process_id": group.process_id,
        "connect": group.timeouts.connect,
        "heartbeat": group.timeouts.heartbeat,
        "shutdown": 0 if ordered_leave else group.timeouts.shutdown,
    }


def single_process_message(processes: int) -> str:
    """Why a script that never joined its group cannot warm for ``processes``."""
    return (
        f"the script ran as a single process, but {processes} were asked: it must call "
        f"jax.distributed.initialize(coordinator_address=os.environ['{GROUP_COORDINATOR}'], "
        f"num_processes=int(os.environ['{GROUP_PROCESSES}']), process_id=int(os.environ['{GROUP_PROCESS_ID}'])) "
        "before it compiles"
    )


def join_jax(request: Mapping[str, Any], *, own_keys: bool = True) -> None:
    """Join the ``jax.distributed`` group a :func:`group_request` names; with ``own_keys``, every
    process writes its own entries (:func:`install_own_key_writer`).

    Call after the cache options are set and before anything compiles.
    """
    if own_keys:
        install_own_key_writer()
    import jax

    try:
        jax.distributed.initialize(
            coordinator_address=request["coordinator"],
            num_processes=int(request["processes"]),
            process_id=int(request["process_id"]),
            initialization_timeout=int(request["connect"]),
            heartbeat_timeout_seconds=int(request["heartbeat"]),
            shutdown_timeout_seconds=int(request["shutdown"]),
            # Everything is given: never probe the cluster (on Kubernetes JAX would ask the API).
            cluster_detection_method="deactivate",
        )
    except Exception as error:  # JaxRuntimeError: a peer never came, the port is taken...
        raise WarmError(
            f"cannot join the JAX group at {request['coordinator']} as process {request['process_id']} of "
            f"{request['processes']}: {one_line(error)}"
        ) from error


def leave_jax() -> None:
    """Leave the ``jax.distributed`` group (bounded by its shutdown timeout; at once without one)."""
    import jax

    jax.distributed.shutdown()


def joined_processes() -> int:
    """How many processes the ``jax.distributed`` group of this process has (1: none joined)."""
    if "jax" not in sys.modules:
        return 1
    from jax._src import distributed

    # Not the client: a script may shut its group down before it returns.
    if distributed.global_state.coordinator_address is None:
        return 1
    return int(distributed.global_state.num_processes or 1)


def install_own_key_writer() -> None:
    """Make every process of a group write the entries it compiles, under its own keys.

    JAX's ``_cache_write`` returns at once outside process 0. The wrapper keeps JAX's own
    function for process 0 and, elsewhere, applies the same checks (host callbacks, the minimum
    compile time; the minimum size is checked inside) and calls the same
    ``compilation_cache.put_executable_and_time``. Private JAX: anything missing or changed
    fails the warm-up here, rather than warming process 0 only.
    """
    try:
        from jax._src import compilation_cache, compiler, config, distributed
    except ImportError as error:
        raise WarmError(f"this JAX has no internals a multi-process warm-up needs: {error}") from error
    original = getattr(compiler, "_cache_write", None)
    if getattr(original, "compilecache_own_keys", False):
        return
    put = getattr(compilation_cache, "put_executable_and_time", None)
    min_time = getattr(config, "persistent_cache_min_compile_time_secs", None)
    if original is None or put is None or min_time is None or not hasattr(distributed, "global_state"):
        raise WarmError(
            "this JAX lacks jax._src.compiler._cache_write, compilation_cache.put_executable_and_time or "
            "config.persistent_cache_min_compile_time_secs: a multi-process warm-up cannot write every "
            "process's entries"
        )
    if tuple(inspect.signature(original).parameters) != _WRITE_PARAMS:
        raise WarmError(
            f"jax._src.compiler._cache_write takes {tuple(inspect.signature(original).parameters)}, "
            f"not {_WRITE_PARAMS}: a multi-process warm-up cannot write every process's entries with this JAX"
        )

    def write(
        cache_key: str,
        compile_time_secs: float,
        module_name: str,
        backend: Any,
        executable: Any,
        host_callbacks: Any,
    ) -> None:
        if not distributed.global_state.process_id or host_callbacks:
            # Process 0 (or one process), or a program JAX never caches: JAX's own decision.
            original(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks)
            return
        if compile_time_secs < min_time.value:
            return
        try:
            put(cache_key, module_name, executable, backend, int(compile_time_secs))
        except Exception as error:
            # As JAX's own _cache_write does (same text): the warmer fails the run on it (CacheEvents).
            warnings.warn(f"{WRITE_FAILED} for '{module_name}': {one_line(error)}", stacklevel=2)

    write.compilecache_own_keys = True  # type: ignore[attr-defined]
    compiler._cache_write = write


class GroupFailed(WarmError):
    """Another process of the group failed or died: this one stops (nothing of it published after)."""


class Coordination:
    """The warmers' own group: a run id from process 0, and bounded agreements between phases."""

    def __init__(self, group: Group) -> None:
        self.group = group
        self._service: Any = None
        self._client: Any = None
        self._stopped = False  # the run is over: the watcher must not read the service's end as a loss
        self._failing = False  # this process failed: its own news is no reason to stop
        # After settle() the watcher ends nothing: publishing is all or nothing, and every later
        # wait of the main thread is bounded and reports a peer's failure itself.
        self.busy = threading.Lock()
        self._settled = False
        self._watcher: threading.Thread | None = None
        self._leaving = threading.Lock()  # the main thread and the watcher may both leave

    def connect(self) -> None:
        """Start (process 0) and join the group; fails if not all processes come in time."""
        from jax._src.lib import _jax

        group, timeouts = self.group, self.group.timeouts
        address = group.address(COORDINATION_PORT)
        try:
            if group.process_id == 0:
                self._service = _jax.get_distributed_runtime_service(
                    f"[::]:{group.port + COORDINATION_PORT}",
                    group.processes,
                    heartbeat_timeout=timeouts.heartbeat,
                    shutdown_timeout=timeouts.shutdown,
                )
            self._client = _jax.get_distributed_runtime_client(
                address,
                group.process_id,
                init_timeout=timeouts.connect,
                heartbeat_timeout=timeouts.heartbeat,
                shutdown_timeout=timeouts.shutdown,
                shutdown_on_destruction=False,
            )
            self._client.connect()
        except Exception as error:
            raise WarmError(
                f"{group.describe()}: cannot form the warm-up group at {address} within {timeouts.connect}s: "
                f"{one_line(error)}"
            ) from error

    def share(self, name: str, value: str | None) -> str:
        """Process 0's ``value`` in every process (``value`` is ignored elsewhere)."""
        key = f"{_KEY_PREFIX}share/{name}"
        if self.group.process_id == 0:
            assert value is not None
            try:
                self._client.key_value_set(key, value)
            except Exception as error:
                raise GroupFailed(f"{self.group.describe()}: cannot share {name}: {one_line(error)}") from error
            return value
        deadline = time.monotonic() + self.group.timeouts.connect
        while True:
            found = self._wait_key(key, deadline, f"process 0's {name}")
            if found is not None:
                return found

    def agree(self, phase: str, work: Callable[[], T]) -> T:
        """Run ``work``, post its outcome, and return only once every process has done so, ``ok``.

        Our own failure is raised (the caller reports it, then tells the others: :meth:`fail`); another
        process's failure, or a process silent past the bounds, raises :class:`GroupFailed`.
        """
        result = work()  # a failure here is the caller's to report, then to post (fail)
        self.post(phase, "ok")
        self.wait(phase)
        return result

    def fail(self, error: BaseException) -> None:
        """Tell the others this process failed (whatever phase they wait in), best effort.

        They learn why only while process 0's service runs: :meth:`abandon` keeps it up until
        each has left.
        """
        if self._failing:
            return
        self._failing = True
        why = str(error) if isinstance(error, WarmError) else one_line(error)
        self.post("failed", f"failed: {why}")
        with contextlib.suppress(Exception):  # ALREADY_EXISTS: another process failed first
            self._client.key_value_set(
                f"{_KEY_PREFIX}abort", f"process {self.group.process_id} of {self.group.processes} failed: {why}"[:2000]
            )

    def watch(self, on_abort: Callable[[str], None]) -> None:
        """Call ``on_abort(why)`` from a thread once another process failed or the group is lost.

        The main thread may be inside XLA (compiling) or JAX (waiting for the devices of a
        peer that will never come) for a long time: only a thread sees the news in time.
        """

        def run() -> None:
            while not self._stopped:
                try:
                    news: str = self._client.blocking_key_value_get(f"{_KEY_PREFIX}abort", _POLL_MS)
                except Exception as error:
                    text = one_line(error)
                    if _timed_out(text):
                        continue
                    if self._stopped or self._failing:
                        return
                    with self.busy:
                        if self._settled:
                            return
                        on_abort(
                            f"{self.group.describe()}: lost the warm-up group at "
                            f"{self.group.address(COORDINATION_PORT)} (process 0 ended or the network failed): {text}"
                        )
                    return
                if self._stopped or self._failing:
                    return
                with self.busy:
                    if self._settled:
                        return
                    on_abort(news)
                return

        self._watcher = threading.Thread(target=run, name="compilecache-group-watch", daemon=True)
        self._watcher.start()

    def settle(self) -> None:
        """From now on this process finishes what it does (it publishes next): stop the watcher's aborts."""
        with self.busy:
            self._settled = True

    def post(self, phase: str, outcome: str) -> None:
        """This process's outcome of ``phase``: ``ok`` or ``failed: why``. Best effort when failing."""
        try:
            self._client.key_value_set(f"{_KEY_PREFIX}{phase}/{self.group.process_id}", outcome[:2000])
        except Exception as error:
            if outcome == "ok":
                raise GroupFailed(f"{self.group.describe()}: cannot post {phase}: {one_line(error)}") from error

    def wait(self, phase: str) -> None:
        """Until every process posted ``ok`` for ``phase``; :class:`GroupFailed` on a failure or the bound."""
        deadline = time.monotonic() + self.group.timeouts.phase
        for peer in range(self.group.processes):
            key = f"{_KEY_PREFIX}{phase}/{peer}"
            while True:
                outcome = self._wait_key(key, deadline, f"process {peer} to finish {phase}") or self._failure(peer)
                if outcome is not None:
                    break
            if outcome != "ok":
                raise GroupFailed(f"process {peer} of {self.group.processes} {outcome}")

    def _failure(self, peer: int) -> str | None:
        """What ``peer`` posted when it failed, if it did."""
        try:
            found: str = self._client.key_value_try_get(f"{_KEY_PREFIX}failed/{peer}")
            return found
        except Exception:  # NOT_FOUND: it has not failed; a lost group shows in the next wait
            return None

    def _wait_key(self, key: str, deadline: float, what: str) -> str | None:
        """The value, or ``None`` after one short wait; raises past ``deadline`` or once the group is lost.

        A process that dies is noticed by JAX's coordination service after the heartbeat timeout;
        its client then ends this process at once (it takes no Python callback: jaxlib 0.10.2
        aborts on one), so the warmer writes its termination summary as a failure in advance.
        """
        left = deadline - time.monotonic()
        if left <= 0:
            raise GroupFailed(f"{self.group.describe()}: gave up waiting for {what}: the bound passed")
        try:
            value: str = self._client.blocking_key_value_get(key, int(min(_POLL_MS, left * 1000)) or 1)
            return value
        except Exception as error:
            text = one_line(error)
            if _timed_out(text):
                return None  # not there yet: wait again
            raise GroupFailed(
                f"{self.group.describe()}: lost the warm-up group at {self.group.address(COORDINATION_PORT)} "
                f"while waiting for {what} (process 0 ended or the network failed): {text}"
            ) from error

    def leave_compile_group(self) -> None:
        """Leave the compile's ``jax.distributed`` group (joined with ``ordered_leave``), process 0 last.

        Process 0 hosts its service, and a process still connected when it ends is aborted: the
        others leave, then say so; process 0 leaves once all have. :class:`GroupFailed` as in :meth:`wait`.
        """
        if self.group.process_id != 0:
            leave_jax()
            self.post("left-compile", "ok")
            return
        self.post("left-compile", "ok")
        self.wait("left-compile")
        leave_jax()

    def close(self) -> None:
        """Leave together (every process has finished): a bounded barrier, then :meth:`abandon`'s leave."""
        self._stopped = True
        if self._watcher is not None:
            # Never leave it inside a call into jaxlib: a thread still there when Python exits
            # aborts the process ("FATAL: exception not rethrown"); its waits last _POLL_MS.
            self._watcher.join(timeout=10 * _POLL_MS / 1000)
        if self._client is not None:
            try:
                self._client.wait_at_barrier(f"{_KEY_PREFIX}done", self.group.timeouts.connect * 1000)
            except Exception as error:  # all work is done and agreed: say it, never fail the run for it
                log.warning("leaving the warm-up group: %s", one_line(error))
        self.abandon()

    def abandon(self) -> None:
        """Leave the group now, whether this process failed, another did, or all are done.

        A process whose connection is still open when process 0's services end is aborted by
        JAX's client (SIGABRT, whatever its own outcome). So each other process leaves the
        compile's JAX group, says it leaves, and drops its connection here at once (jaxlib
        0.10.2's shutdown of this client is local: the service is not told); process 0 waits for
        every word (bounded by the heartbeat timeout: a process silent that long is dead), leaves
        the JAX group, then keeps its service up a moment longer, for the last of them to drop
        theirs, before it ends.
        """
        with self._leaving:
            self._stopped = True  # a wait that our own shutdown cancels is no lost group
            if self._client is None:
                return
            # A group without a shutdown barrier (ordered_leave): each leaves it at once, process 0 last.
            if self.group.process_id != 0:
                if joined_processes() > 1:
                    with contextlib.suppress(Exception):
                        leave_jax()
                with contextlib.suppress(Exception):
                    self._client.key_value_set(f"{_KEY_PREFIX}left/{self.group.process_id}", "1")
            else:
                deadline = time.monotonic() + self.group.timeouts.heartbeat
                with contextlib.suppress(GroupFailed):  # past the bound, or the group is lost: nobody to wait for
                    for peer in range(1, self.group.processes):
                        while self._wait_key(f"{_KEY_PREFIX}left/{peer}", deadline, f"process {peer} to leave") is None:
                            pass
                if joined_processes() > 1:
                    with contextlib.suppress(Exception):
                        leave_jax()
            with contextlib.suppress(Exception):
                self._client.shutdown()
            if self._service is not None:
                time.sleep(_LEAVE_GRACE_S)
                with contextlib.suppress(Exception):
                    self._service.shutdown()
            self._client = self._service = None


def _timed_out(text: str) -> bool:
    """Whether a key-value wait ended by its own deadline (the key is not there yet), not by a lost group."""
    return "DEADLINE_EXCEEDED" in text or "Deadline" in text
