"""kopf handlers: one kopf daemon per CompileCache runs its idempotent reconciliation passes.

Level-triggered on purpose: watch events of the cache and of its Jobs wake the cache's
daemon (``passes``), which runs one pass at a time (a burst of triggers folds into one more
pass, and a triggered pass waits ``COALESCE_SECONDS`` for the rest of its burst), one every
``COMPILECACHE_RESYNC_SECONDS`` (± ``RESYNC_JITTER``) without triggers (for what wakes no pass: gate
timeouts, stuck pods, claims and PodTemplates that appear or change, training pods' reports),
and after a failed pass one more after a growing, bounded delay (``retry_delay``). A Node
that comes, goes or changes what pools read wakes every cache, ``SWEEP_BATCH`` at a time
(``node_changed``); its heartbeats wake none. Passes read what they need from kopf's
indexes (``job_index`` ... ``pod_template_index``, ``indexes.py``), fed by one watch per kind,
so that a pass costs the same whatever the fleet's size. kopf's own daemons, not hand-written
timers: kopf stops them when peering pauses the operator (another replica is active) and
starts them again on resume, so nothing periodic runs in a standby replica, except the gate
watchdog (``watchdog.py``), the safety valve every replica runs on purpose.
CompileCaches are checked at apply time by the validating webhook (``validate_cache``: the
spec's own checks and the operator's policy, read at start-up). Training pods come in through
the mutating webhook (``mutate_pods``), which every replica serves, and, while gated, through
``pod_held``, which releases one pod whose cache is Ready or gone. No kopf progress annotations
and no finalizer (see ``_without_finalizers``), so an uninstalled operator never blocks the
deletion of a CompileCache; owned Jobs go with it by ownerReference.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import copy
import dataclasses
import datetime
import logging
import os
import random
from collections.abc import Callable, Mapping
from typing import Any, cast

import kopf

from compilecache.api import bounds
from compilecache.controller import (
    admission,
    api,
    checks,
    expectations,
    expiryjob,
    indexes,
    jobs,
    kube,
    metrics,
    policy,
    watchdog,
    webhook,
)
from compilecache.controller.kube import COMPILECACHES, PVCS, ApiError, Client
from compilecache.controller.plan import describe_error
from compilecache.controller.reconcile import Outcome, reconcile, release_gates

logger = logging.getLogger(__name__)

CACHES = (api.GROUP, api.VERSION, api.PLURAL)

# An explicit registry: the handlers are the same whichever registry was kopf's default
# when this module was first imported (tests run other operators in the same process).
registry = kopf.OperatorRegistry()
RESYNC_SECONDS_ENV = "COMPILECACHE_RESYNC_SECONDS"
AUDIT_SECONDS_ENV = "COMPILECACHE_AUDIT_SECONDS"
DEFAULT_RESYNC_SECONDS = 60.0
# Set by `compilecache operator` from kopf's -A/-n options (runner.py): JSON null (all) or names.
WATCHDOG_NAMESPACES_ENV = "COMPILECACHE_WATCHDOG_NAMESPACES"
# Passes of different caches at once (one cache never runs two: its daemon). A pass waits on the API
# server most of its time, and the API server takes writes in parallel (etcd commits them in groups).
PASS_WORKERS_ENV, DEFAULT_PASS_WORKERS = "COMPILECACHE_PASS_WORKERS", 8
# A triggered pass waits this long first, so that a burst of events for one cache (its Jobs created,
# its status recorded) makes one pass; triggers during a pass fold into one more pass after it.
COALESCE_SECONDS = 0.1
# A resync comes every period ± this fraction, so that caches that started together (a fleet
# restart, a leader change) do not keep passing together.
RESYNC_JITTER = 0.1
# A Node change concerns every cache (pools are resolved from all Nodes): their passes are woken this
# many at a time, with this pause between, not all at once (1000 caches: over 5 s).
SWEEP_BATCH, SWEEP_PAUSE_SECONDS = 50, 0.25
# A peer's entry in the peering object expires this long after its last keep-alive; kopf renews
# it every lifetime − (5..10) s. A replica that was SIGKILLed stops renewing, and a standby
# replica takes over at that expiry: within 20 s (kopf's default, 60 s, is past the 30 s promised).
PEERING_LIFETIME_SECONDS = 20
# How long a daemon that kopf stops for a pause may finish the pass in flight (then it is cancelled).
PAUSE_GRACE_SECONDS = 60.0
RETRY_FIRST_SECONDS, RETRY_LIMIT_SECONDS = 1.0, 300.0


@kopf.on.login(registry=registry)
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The same credentials as the API client's: the pod's service account, else the kubeconfig."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


def _indexing(entries: Callable[[kopf.Body], dict[indexes.Key, Any]]) -> Callable[..., Any]:
    # async, so that kopf calls it in its loop: a sync one would cost a thread hop per event, for every
    # pod of the cluster.
    async def index(body: kopf.Body, **_: Any) -> dict[indexes.Key, Any]:
        return entries(body)

    return index


# Indexes (``indexes.py``): what passes read, from one watch per kind; a handler gets each by its id.
for _kind in indexes.KINDS:
    kopf.index(*_kind.resource, id=_kind.index, registry=registry)(_indexing(_kind.entries))


@kopf.on.startup(registry=registry)
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Build the API client once (its first build is slow), then start the gate watchdog."""
    # Before kopf's watches start (they start once the startup handlers returned): one CompileCache as
    # deep as the API server stores it must not end the watch stream, nor fail every read of it.
    bounds.read_json_as_deep_as_the_api_server()
    # Our own Events tell what happened to a cache; kopf's per-handler messages would be noise there.
    settings.posting.level = logging.WARNING
    # Read by kopf's peering tasks, which start after the startup handlers (kopf's running.py
    # starts every root task, peering included, only once these returned).
    settings.peering.lifetime = PEERING_LIFETIME_SECONDS
    # The chart owns the MutatingWebhookConfiguration; the operator only serves it.
    try:
        config = webhook.config_from_env(os.environ)
        served = watchdog.parse_namespaces(os.environ.get(WATCHDOG_NAMESPACES_ENV))
    except (webhook.ConfigError, ValueError) as exc:
        raise kopf.PermanentError(str(exc)) from None
    try:
        workers = int(os.environ.get(PASS_WORKERS_ENV, DEFAULT_PASS_WORKERS))
        if not 1 <= workers <= kube.MAX_CONNECTIONS:
            raise ValueError(f"not from 1 to {kube.MAX_CONNECTIONS}")
    except ValueError as exc:
        raise kopf.PermanentError(f"{PASS_WORKERS_ENV}={os.environ.get(PASS_WORKERS_ENV)!r}: {exc}") from None
    settings.admission.managed = None
    try:
        memo.policy = policy.from_env(os.environ)
    except policy.PolicyError as exc:
        raise kopf.PermanentError(f"the operator's policy cannot be used: {exc}") from None
    settings.admission.server = webhook.server(config)
    if config.mode != webhook.OFF:
        logger.info("Serving the pod webhook (%s) at %s:%d%s.", config.mode, config.addr, config.port, webhook.PATH)
    try:
        addr, port = metrics.port_from_env(os.environ)
    except ValueError as exc:
        raise kopf.PermanentError(str(exc)) from None
    memo.metrics_server = metrics.serve(addr, port)
    memo.client = await asyncio.to_thread(Client.from_environment)
    memo.triggers = {}  # (namespace, name) → the asyncio.Event that wakes the cache's daemon
    memo.locks = {}  # (namespace, name) → an asyncio.Lock: one pass at a time, even across daemons
    memo.nodes_seen = {}  # Node name → what pools read of it, to wake the caches only when that changed
    memo.sweep = None  # the task waking every cache after a Node change, while it runs
    memo.sweep_again = False  # another Node changed during the sweep: one more after it
    memo.resync_seconds = float(os.environ.get(RESYNC_SECONDS_ENV, DEFAULT_RESYNC_SECONDS))
    memo.audit_seconds = float(os.environ.get(AUDIT_SECONDS_ENV, indexes.AUDIT_SECONDS))
    memo.forgotten = collections.OrderedDict()  # uids the audits found deleted (indexes.IndexedReader)
    memo.workers = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="compilecache-pass")
    # Not a kopf daemon or timer, by design: it runs while kopf's peering pauses the operator.
    memo.watchdog = None
    if served is not None:
        memo.watchdog = asyncio.create_task(watchdog.run_forever(memo.client, served, memo.workers, policy=memo.policy))


@kopf.on.cleanup(registry=registry)
async def stop(memo: kopf.Memo, **_: Any) -> None:
    """Stop the watchdog; make passes still running end at their next API call."""
    client = memo.get("client")
    if client is not None:
        client.close()
    server = memo.get("metrics_server")
    if server is not None:
        server.shutdown()
        server.server_close()
    workers = memo.get("workers")
    if workers is not None:
        workers.shutdown(wait=False, cancel_futures=True)  # the pass in flight ends at its next call
    task = memo.get("watchdog")
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@kopf.on.event(*CACHES, registry=registry)
async def cache_changed(namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    """The cache was created, changed (spec, annotations or our own status), listed, or deleted.

    A deleted cache's daemon keeps running (no finalizer: see ``_without_finalizers``); this
    wakes it for its last pass, which releases the pods still waiting and ends the daemon.
    """
    assert namespace is not None  # CompileCaches are namespaced
    _wake(memo, namespace, name)


@kopf.on.event("batch", "v1", "jobs", labels={jobs.LABEL_CACHE: kopf.PRESENT}, registry=registry)
async def job_changed(namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    """A warm-up Job started, progressed, finished or went away: refresh its cache."""
    assert namespace is not None  # Jobs are namespaced
    _wake(memo, namespace, labels[jobs.LABEL_CACHE])


@kopf.on.event("batch", "v1", "jobs", labels={expiryjob.LABEL_EXPIRY_OF: kopf.PRESENT}, registry=registry)
async def expiry_job_changed(namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    """An expiry Job progressed or finished: refresh its cache (the next phase depends on it)."""
    assert namespace is not None  # Jobs are namespaced
    _wake(memo, namespace, labels[expiryjob.LABEL_EXPIRY_OF])


@kopf.on.event("v1", "nodes", registry=registry)
async def node_changed(type: str | None, name: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A Node came, went, or changed what pools read of it (labels, GPUs, taints): wake every cache, spread.

    kopf's watch also brings each Node's status heartbeats; those change nothing a pass reads and wake
    nothing. The initial listing wakes nothing either: every cache's daemon passes once as it starts.
    """
    seen: dict[str, Any] = memo.nodes_seen
    entry = None if type == "DELETED" else indexes.node_entries(body)
    before = seen.pop(str(name), None) if entry is None else seen.get(str(name))
    if entry is not None:
        seen[str(name)] = entry
    if type is None or entry == before:
        return
    _sweep(memo)


def _sweep(memo: kopf.Memo) -> None:
    """(In the loop.) Wake every cache's daemon, ``SWEEP_BATCH`` at a time; a sweep asked for during one follows it."""
    if memo.sweep is not None and not memo.sweep.done():
        memo.sweep_again = True
        return

    async def sweep() -> None:
        while True:
            memo.sweep_again = False
            for index, key in enumerate(list(memo.triggers)):
                if index and index % SWEEP_BATCH == 0:
                    await asyncio.sleep(SWEEP_PAUSE_SECONDS)
                _wake(memo, *key)
            if not memo.sweep_again:
                return

    memo.sweep = asyncio.create_task(sweep())


def _wake(memo: kopf.Memo, namespace: str, name: str) -> None:
    """(In the loop.) Ask the cache's daemon for a pass; a daemon not started yet finds it set."""
    _trigger(memo, (namespace, name)).set()


def _trigger(memo: kopf.Memo, key: tuple[str, str]) -> asyncio.Event:
    triggers: dict[tuple[str, str], asyncio.Event] = memo.triggers
    return triggers.setdefault(key, asyncio.Event())


def retry_delay(failures: int) -> float:
    """Seconds before retrying a pass after ``failures`` failed ones in a row: 1, 2, 4, ... at most 300.

    kopf does not retry event handlers, and the resync period either hammers a broken API or
    leaves a transient failure standing for a whole period.
    """
    return float(min(RETRY_LIMIT_SECONDS, RETRY_FIRST_SECONDS * 2 ** min(max(failures - 1, 0), 64)))


@kopf.daemon(
    *CACHES,
    id="passes",
    registry=registry,
    # Stopped for a pause, a daemon finishes its pass in flight (never two controllers' passes
    # at once); past this grace it is cancelled. At exit it does not wait (see _pass_until_exit).
    cancellation_backoff=PAUSE_GRACE_SECONDS,
    cancellation_timeout=5.0,
)
async def passes(
    namespace: str | None,
    name: str | None,
    uid: str | None,
    stopped: kopf.DaemonStopped,
    memo: kopf.Memo,
    **kwargs: Any,
) -> None:
    """Run the cache's passes until it is gone or kopf stops the daemon (pause, exit, deletion)."""
    assert namespace is not None and name is not None  # CompileCaches are namespaced and named
    found = indexes.Indexes.of(kwargs)  # kopf hands every index to a handler as a keyword, by its id
    loop = asyncio.get_running_loop()
    reader = indexes.IndexedReader(found, loop, memo.client, memo.forgotten)
    # The first audit comes at a random point of the period: caches that start together audit apart.
    audit_at = loop.time() + memo.audit_seconds * random.uniform(0.5, 1.5)
    key = (namespace, name)
    trigger = _trigger(memo, key)
    lock = cast(dict[tuple[str, str], asyncio.Lock], memo.locks).setdefault(key, asyncio.Lock())
    failures = 0
    expected: expectations.Expected = {}  # what its passes created and the indexes did not show yet
    delay = 0.0  # the first pass at once: a cache seen at start-up, after a resume, or new
    first = True
    while True:
        triggered = await _until(trigger, stopped, delay)
        if triggered and not first and not stopped:  # let the rest of a burst of events come
            await _until(asyncio.Event(), stopped, COALESCE_SECONDS)
        first = False
        if stopped and not _deleted(stopped):  # paused or exiting: the next active replica passes
            _leave(stopped, namespace, name)
            return
        trigger.clear()
        audit = loop.time() >= audit_at
        if audit:
            audit_at = loop.time() + memo.audit_seconds * random.uniform(1 - RESYNC_JITTER, 1 + RESYNC_JITTER)
        async with lock:
            outcome = await _pass_until_exit(memo, namespace, name, uid, stopped, reader, audit, expected)
        if outcome is None or stopped:  # exiting, or this was the deleted cache's last pass
            _leave(stopped, namespace, name)
            return
        if outcome.status is None or outcome.uid != uid:  # gone, or deleted and created again
            return
        expected = outcome.expected
        if outcome.error is None:
            failures, delay = 0, memo.resync_seconds * random.uniform(1 - RESYNC_JITTER, 1 + RESYNC_JITTER)
            continue
        if memo.client.closed:  # stopping: no retry, and no noise
            return
        failures += 1
        delay = retry_delay(failures)
        # A traceback only for what is not an API answer: that is a bug to report.
        logger.error(
            "Reconciling %s/%s failed (%d in a row), retrying in %gs: %s",
            namespace,
            name,
            failures,
            delay,
            describe_error(outcome.error),
            exc_info=None if isinstance(outcome.error, ApiError) else outcome.error,
        )


def _leave(stopped: kopf.DaemonStopped, namespace: str, name: str) -> None:
    """Paused: drop the cache's metrics, which the active replica reports now (a standby's would go stale)."""
    if kopf.DaemonStoppingReason.OPERATOR_PAUSING in (stopped.reason or kopf.DaemonStoppingReason(0)):
        metrics.METRICS.forget(namespace, name)


def _deleted(stopped: kopf.DaemonStopped) -> bool:
    """Whether kopf stops the daemon because the cache is being deleted (it then gets a last pass)."""
    return kopf.DaemonStoppingReason.RESOURCE_DELETED in (stopped.reason or kopf.DaemonStoppingReason(0))


def _exiting(stopped: kopf.DaemonStopped) -> bool:
    return kopf.DaemonStoppingReason.OPERATOR_EXITING in (stopped.reason or kopf.DaemonStoppingReason(0))


async def _until(trigger: asyncio.Event, stopped: kopf.DaemonStopped, delay: float) -> bool:
    """Wait until the trigger is set, kopf stops the daemon, or ``delay`` seconds passed; whether it was set."""

    async def stopping() -> None:
        await stopped.wait()

    waits = {asyncio.ensure_future(trigger.wait()), asyncio.ensure_future(stopping())}
    try:
        await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
    return trigger.is_set()


async def _pass_until_exit(
    memo: kopf.Memo,
    namespace: str,
    name: str,
    uid: str | None,
    stopped: kopf.DaemonStopped,
    reader: indexes.IndexedReader,
    audit: bool = False,
    expected: expectations.Expected | None = None,
) -> Outcome | None:
    """Run one pass on the operator's workers; ``None`` if the operator exits meanwhile.

    A pause waits for the pass (the next active replica must not overlap it). An exit does not:
    kopf runs the cleanup (``stop``) only once every daemon returned, and a pass blocked on an
    unreachable API would hold the shutdown for the timeouts of its calls; at cleanup the
    client is closed, and the pass ends at its next call.
    """
    loop = asyncio.get_running_loop()
    try:
        future = loop.run_in_executor(
            memo.workers, _pass, memo.client, memo.policy, namespace, name, uid, reader, audit, expected or {}
        )
    except RuntimeError:  # the workers were shut down: the operator is stopping
        return None

    async def exiting() -> None:
        await stopped.wait()
        while not _exiting(stopped):  # paused: keep waiting for the pass, unless an exit follows
            await asyncio.sleep(0.2)

    watch: asyncio.Future[Any] = asyncio.ensure_future(exiting())
    waits: set[asyncio.Future[Any]] = {future, watch}
    try:
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    return future.result() if future in done else None


def _pass(
    client: Client,
    rules: policy.Policy,
    namespace: str,
    name: str,
    uid: str | None,
    reader: indexes.IndexedReader,
    audit: bool,
    expected: expectations.Expected,
) -> Outcome:
    """(On a worker.) One pass; a cache that could not even be read is a failed pass with no status known."""
    try:
        return reconcile(client, namespace, name, policy=rules, reader=reader, audit=audit, expected=expected)
    except Exception as exc:  # reconcile records everything else in the status
        return Outcome({}, exc, uid)


@kopf.on.mutate(
    "v1",
    "pods",
    id=webhook.HANDLER_ID,
    operations=["CREATE"],
    side_effects=False,
    ignore_failures=True,
    registry=registry,
)
def mutate_pods(body: kopf.Body, patch: kopf.Patch, warnings: list[str], memo: kopf.Memo, **_: Any) -> None:
    """Give a new training pod its cache (``admission.py``); fail open on any trouble."""
    pod = copy.deepcopy(dict(body))
    mutated = _admit(memo.client, pod, memo.policy)
    warnings.extend(mutated.warnings)
    if mutated.pod != pod:
        # kopf diffs the body after this function against the original into the JSON patch.
        patch.fns.append(lambda raw: _become(raw, mutated.pod))


@kopf.on.validate(
    api.GROUP,
    api.VERSION,
    api.PLURAL,
    id=webhook.VALIDATE_ID,
    operations=["CREATE", "UPDATE"],
    side_effects=False,
    registry=registry,
)
def validate_cache(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """Refuse a CompileCache whose spec is invalid or asks for what the policy forbids, naming the field.

    An UPDATE that leaves the spec as it was passes (labels, annotations, a rewarm): a cache
    admitted under an older policy stays editable and deletable; the controller says it Failed.
    """
    # A plain function: kopf runs it in its thread pool (kopf/_core/actions/invocation.py), never on the
    # event loop; and since a thread that computes holds the interpreter lock, what it does is bounded
    # too: every field has a bound the model checks first, every pattern is matched in linear time.
    old = kwargs.get("old")  # kopf passes old and operation to webhooks; its WebhookFn type omits them
    if kwargs.get("operation") == "UPDATE" and old is not None and old.get("spec") == body.get("spec"):
        return
    cache = dict(body)
    namespace = (cache.get("metadata") or {}).get("namespace")
    refused = policy.admission_violations(cache, memo.policy, lambda name: _claim(memo.client, name, namespace))
    if refused:
        # 422 as for the CRD's own schema; kube-apiserver passes a webhook's code on to the client.
        raise kopf.AdmissionError(policy.describe(refused), code=422)


def _claim(client: Client, name: str, namespace: str | None) -> Mapping[str, Any] | None:
    """The existing claim a valid cache names, if any; on an API error none (the pass checks it again)."""
    if not namespace:
        return None
    try:
        return client.get(PVCS, name, namespace)
    except ApiError as exc:
        logger.warning("Reading claim %s/%s to admit a cache failed, the pass checks it: %s", namespace, name, exc)
        return None


def _admit(client: Client, pod: dict[str, Any], rules: policy.Policy) -> admission.Mutation:
    namespace = (pod.get("metadata") or {}).get("namespace")
    if not namespace:  # the API server sets it before admission; nothing to look up without it
        metrics.METRICS.admission("unchanged")
        return admission.Mutation(pod=pod)
    try:
        mutated = admission.admit(pod, client.list(COMPILECACHES, namespace), rules=rules)
    except Exception as exc:
        # A pod must never be refused because of the cache: it would only train slower without it.
        # Names only in the log: a pod's environment may hold secrets.
        meta = pod.get("metadata") or {}
        # No traceback unless debugging: a malformed pod is the sender's problem, not an operator crash.
        logger.error(
            "Admitting pod %s/%s unchanged after an error: %s: %s",
            namespace,
            meta.get("name") or "(new)",
            type(exc).__name__,
            exc,
            exc_info=logger.isEnabledFor(logging.DEBUG),
        )
        metrics.METRICS.admission("error")
        return admission.Mutation(pod=pod, warnings=(f"compilecache: pod admitted unchanged after an error: {exc}",))
    metrics.METRICS.admission(_outcome(pod, mutated.pod))
    return mutated


def _outcome(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """The admission's outcome for the metrics: gated (held until Ready), mutated, or unchanged."""
    if after == before:
        return "unchanged"
    held = any(gate.get("name") == admission.GATE for gate in (after.get("spec") or {}).get("schedulingGates") or [])
    return "gated" if held else "mutated"


def _become(raw: kopf.RawBody, pod: Mapping[str, Any]) -> None:
    target = cast(dict[str, Any], raw)  # kopf types the body as a TypedDict; it is a plain dict
    target.clear()
    target.update(copy.deepcopy(dict(pod)))


def _held(spec: kopf.Spec, **_: Any) -> bool:
    return any(gate.get("name") == admission.GATE for gate in spec.get("schedulingGates") or [])


@kopf.on.event("v1", "pods", when=_held, registry=registry)
async def pod_held(
    type: str | None, body: kopf.Body, namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any
) -> None:
    """A pod held by our gate was created or changed: release it at once if its cache is Ready or gone.

    Covers a pod admitted just before its cache turned Ready (the cache's pass may have listed
    the pods before this one existed); a pod past its gateTimeout (e.g. after an operator outage)
    goes too, and so does a pod whose ``compilecache.dev/cache`` label its owner removed (no cache
    lists it any more: ``gates.CACHE_LABEL_REMOVED``). Timeouts of waiting pods are found by the
    cache's periodic passes and by the gate watchdog. No per-cache lock: a release tests the gates
    it read, so a concurrent pass makes it fail, not repeat.

    A new held pod also asks its cache for a pass: a pod on an image the cache has not recorded
    waits for the pass that reads training's template now (``images.py``), which warms that image
    or lets the pod go; passes asked for together run once.
    """
    assert namespace is not None  # Pods are namespaced
    if type == "DELETED":
        return
    cache = str(labels.get(jobs.LABEL_CACHE) or "")
    if type == "ADDED" and (namespace, cache) in memo.triggers:  # a cache with a daemon: no key for any label
        _wake(memo, namespace, cache)
    _submit(memo, _release_one, memo, namespace, cache, copy.deepcopy(dict(body)))


def _release_one(memo: kopf.Memo, namespace: str, name: str, pod: dict[str, Any]) -> None:
    if not name:  # no cache to read: the pod waits for nothing
        release_gates(memo.client, namespace, name, None, phase=None, pods=[pod], policy=memo.policy)
        return
    try:
        cache = memo.client.get(COMPILECACHES, name, namespace)
    except ApiError as exc:
        logger.error("Reading cache %s/%s for a gated pod failed, will retry on resync: %s", namespace, name, exc)
        return
    phase = (cache.get("status") or {}).get("phase") if cache is not None else None
    release_gates(memo.client, namespace, name, cache, phase=phase, pods=[pod], policy=memo.policy)


def _submit(memo: kopf.Memo, fn: Any, *args: Any) -> None:
    """Run ``fn`` on the operator's own workers, not in kopf's handler thread.

    kopf waits for its sync handlers to return before it shuts down; a pass blocked on an
    unreachable API would hold the shutdown for the timeouts of every call it makes. Ours
    are not waited for: at cleanup the client is closed, and a pass in flight ends at its
    next call (the one in flight ends by its timeout).
    """
    try:
        memo.workers.submit(_logged, fn, *args)
    except RuntimeError:  # the workers were shut down: the operator is stopping
        logger.debug("Not starting %s: the operator is stopping.", getattr(fn, "__name__", fn))


def _logged(fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except Exception:  # a worker has no caller to raise to
        logger.exception("A pass failed unexpectedly.")


def serve_admission_checks(operator: kopf.OperatorRegistry) -> None:
    """Register the Kueue AdmissionCheck controller (``checks.py``) in ``operator``: its indexes and handlers.

    Only where ``COMPILECACHE_KUEUE`` is on (``runner.py`` asks; the chart sets it with ``kueue.enabled``):
    kopf watches every kind a handler names, and without the chart's grants a watch of Workloads is
    refused. Event handlers only, so no finalizer on Kueue's objects; kopf runs them in the active replica.
    Registered once per process: a registry has no way to take handlers back.
    """
    for kind in indexes.KUEUE_KINDS:
        kopf.index(*kind.resource, id=kind.index, registry=operator)(_indexing(kind.entries))
    kueue = (checks.GROUP, checks.VERSION)
    kopf.on.event(*kueue, "admissionchecks", when=_served, registry=operator)(admission_check_changed)
    kopf.on.event(*kueue, "workloads", when=_checks_pending, registry=operator)(workload_changed)


def _served(body: kopf.Body, **_: Any) -> bool:
    return checks.is_ours(body)


def _checks_pending(body: kopf.Body, **_: Any) -> bool:
    return indexes.has_pending_check(body)


async def admission_check_changed(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """One of our AdmissionChecks was created or changed: keep its ``Active`` condition true."""
    if type == "DELETED":
        return
    now = datetime.datetime.now(datetime.UTC)
    _submit(memo, checks.activate_check, memo.client, copy.deepcopy(dict(body)), now)


async def workload_changed(
    type: str | None, body: kopf.Body, namespace: str | None, memo: kopf.Memo, **kwargs: Any
) -> None:
    """A Workload with a Pending admission check changed: decide ours at once (a Workload whose pods use no
    cache, or a cache that is Ready, goes now; the passes of the namespace's caches decide again each time,
    which is how a timeout, a cache that turns Ready, or a write that failed here are handled).

    In the loop (async): it reads kopf's index of our checks, which kopf changes in the loop.
    """
    assert namespace is not None  # Workloads are namespaced
    if type == "DELETED":
        return
    ours = indexes.our_check_names(kwargs["admission_check_index"])
    workload = indexes.slim_workload(body)
    if checks.pending(workload, ours):
        _submit(memo, _check_workload, memo, asyncio.get_running_loop(), namespace, workload, ours)


def _check_workload(
    memo: kopf.Memo,
    loop: asyncio.AbstractEventLoop,
    namespace: str,
    workload: Mapping[str, Any],
    ours: frozenset[str],
    failures: int = 0,
) -> None:
    """Decide one Workload's check; after an API error, again after ``retry_delay``.

    kopf does not retry event handlers, and where the namespace has no CompileCache no pass decides
    again: without the retry one refused call leaves the Workload holding its quota for ever. The retry
    may decide on a stale copy: its write tests the entry it read, so it fails (422) once another write
    came first, and ends (a Workload deleted meanwhile: 404).
    """
    try:
        caches = memo.client.list(COMPILECACHES, namespace)
        checks.sync(
            memo.client,
            namespace,
            [workload],
            caches,
            ours,
            now=datetime.datetime.now(datetime.UTC),
            policy=memo.policy,
        )
    except ApiError as exc:
        name = (workload.get("metadata") or {}).get("name")
        if exc.reason == kube.STOPPING:
            return
        delay = retry_delay(failures + 1)
        logger.error(
            "Setting the admission check of Workload %s/%s failed, retrying in %gs: %s", namespace, name, delay, exc
        )
        retry = (memo, _check_workload, memo, loop, namespace, workload, ours, failures + 1)
        with contextlib.suppress(RuntimeError):  # the loop is closed: the operator is stopping
            loop.call_soon_threadsafe(loop.call_later, delay, _submit, *retry)


def _without_finalizers(operator: kopf.OperatorRegistry) -> None:
    """Register the daemons without kopf's finalizer.

    kopf (1.45) gives every daemon a finalizer, so that it can stop the daemon when the object
    is deleted; its maintainer declined an option to drop it (nolar/kopf#896). A finalizer would
    make an uninstalled or paused operator block the deletion of every CompileCache. Here the
    daemon stops itself instead: the deleted cache's event wakes it, its pass finds the cache
    gone (releasing the pods that waited for it) and it returns. Replacing the handlers' flag in
    the registry is the only way in; ``tests/test_ha_units.py`` fails if kopf changes it.
    """
    spawning = operator._spawning
    spawning._handlers[:] = [dataclasses.replace(h, requires_finalizer=False) for h in spawning._handlers]


_without_finalizers(registry)
