"""kopf handlers: every trigger funnels into one locked, idempotent reconciliation per cache.

Level-triggered on purpose: watch events of the cache and of its Jobs, and a
periodic resync (for Nodes coming and going, and gate timeouts), all run the same
pass. A pass that failed is retried after a growing, bounded delay (``coalesce.Backoff``):
kopf does not retry event handlers, and the resync skips a cache while its retry waits.
CompileCaches are checked at apply time by the validating webhook (``validate_cache``: the
spec's own checks and the operator's policy, read at start-up). Training pods come in through
the mutating webhook (``mutate_pods``) and, while gated,
through ``pod_held``, which releases one pod whose cache is Ready or gone. No kopf
progress annotations and no finalizer are needed, so an uninstalled operator never
blocks the deletion of a CompileCache; owned Jobs go with it by ownerReference.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import logging
import os
from collections.abc import Mapping
from typing import Any, cast

import kopf

from compilecache.controller import admission, api, expiryjob, jobs, metrics, policy, webhook
from compilecache.controller.coalesce import Backoff, Coalescer
from compilecache.controller.kube import COMPILECACHES, PVCS, ApiError, Client
from compilecache.controller.plan import describe_error
from compilecache.controller.reconcile import reconcile, release_gates

logger = logging.getLogger(__name__)

CACHES = (api.GROUP, api.VERSION, api.PLURAL)

# An explicit registry: the handlers are the same whichever registry was kopf's default
# when this module was first imported (tests run other operators in the same process).
registry = kopf.OperatorRegistry()
RESYNC_SECONDS_ENV = "COMPILECACHE_RESYNC_SECONDS"
DEFAULT_RESYNC_SECONDS = 60.0
PASS_WORKERS = 4  # passes of different caches at once (one cache never runs two: the coalescer)


@kopf.on.login(registry=registry)
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The same credentials as the API client's: the pod's service account, else the kubeconfig."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup(registry=registry)
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Build the API client once (its first build is slow), then start the periodic resync."""
    # Our own Events tell what happened to a cache; kopf's per-handler messages would be noise there.
    settings.posting.level = logging.WARNING
    # The chart owns the MutatingWebhookConfiguration; the operator only serves it.
    try:
        config = webhook.config_from_env(os.environ)
    except webhook.ConfigError as exc:
        raise kopf.PermanentError(str(exc)) from None
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
    memo.known = set()
    memo.passes = Coalescer()
    memo.backoff = Backoff()
    memo.loop = asyncio.get_running_loop()
    memo.retries = {}  # (namespace, name) → the asyncio.TimerHandle of its pending retry
    memo.workers = concurrent.futures.ThreadPoolExecutor(PASS_WORKERS, thread_name_prefix="compilecache-pass")
    interval = float(os.environ.get(RESYNC_SECONDS_ENV, DEFAULT_RESYNC_SECONDS))
    memo.resync = asyncio.create_task(_resync_forever(memo, interval))


@kopf.on.cleanup(registry=registry)
async def stop(memo: kopf.Memo, **_: Any) -> None:
    """Stop the periodic resync and the retries; make passes still running end at their next API call."""
    client = memo.get("client")
    if client is not None:
        client.close()
    for handle in (memo.get("retries") or {}).values():
        handle.cancel()
    server = memo.get("metrics_server")
    if server is not None:
        server.shutdown()
        server.server_close()
    workers = memo.get("workers")
    if workers is not None:
        workers.shutdown(wait=False, cancel_futures=True)  # the pass in flight ends at its next call
    task = memo.get("resync")
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@kopf.on.event(*CACHES, registry=registry)
def cache_changed(type: str, namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    """The cache was created, changed (spec, annotations or our own status) or listed at start-up."""
    assert namespace is not None  # CompileCaches are namespaced
    if type == "DELETED":
        memo.known.discard((namespace, name))
        _reconcile(memo, namespace, name)  # releases the pods still waiting for it
        return
    memo.known.add((namespace, name))
    _reconcile(memo, namespace, name)


@kopf.on.event("batch", "v1", "jobs", labels={jobs.LABEL_CACHE: kopf.PRESENT}, registry=registry)
def job_changed(namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    """A warm-up Job started, progressed, finished or went away: refresh its cache."""
    assert namespace is not None  # Jobs are namespaced
    _reconcile(memo, namespace, labels[jobs.LABEL_CACHE])


@kopf.on.event("batch", "v1", "jobs", labels={expiryjob.LABEL_EXPIRY_OF: kopf.PRESENT}, registry=registry)
def expiry_job_changed(namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    """An expiry Job progressed or finished: refresh its cache (the next phase depends on it)."""
    assert namespace is not None  # Jobs are namespaced
    _reconcile(memo, namespace, labels[expiryjob.LABEL_EXPIRY_OF])


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
    mutated = _admit(memo.client, pod)
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
    old = kwargs.get("old")  # kopf passes old and operation to webhooks; its WebhookFn type omits them
    if kwargs.get("operation") == "UPDATE" and old is not None and old.get("spec") == body.get("spec"):
        return
    cache = dict(body)
    refused = policy.admission_violations(cache, memo.policy, _claim(memo.client, cache))
    if refused:
        # 422 as for the CRD's own schema; kube-apiserver passes a webhook's code on to the client.
        raise kopf.AdmissionError(policy.describe(refused), code=422)


def _claim(client: Client, cache: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The existing claim the cache names, if any; on an API error none (the pass checks it again)."""
    name, namespace = policy.claim_name(cache), (cache.get("metadata") or {}).get("namespace")
    if name is None or not namespace:
        return None
    try:
        return client.get(PVCS, name, namespace)
    except ApiError as exc:
        logger.warning("Reading claim %s/%s to admit a cache failed, the pass checks it: %s", namespace, name, exc)
        return None


def _admit(client: Client, pod: dict[str, Any]) -> admission.Mutation:
    namespace = (pod.get("metadata") or {}).get("namespace")
    if not namespace:  # the API server sets it before admission; nothing to look up without it
        metrics.METRICS.admission("unchanged")
        return admission.Mutation(pod=pod)
    try:
        mutated = admission.admit(pod, client.list(COMPILECACHES, namespace))
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


@kopf.on.event("v1", "pods", labels={jobs.LABEL_CACHE: kopf.PRESENT}, when=_held, registry=registry)
def pod_held(
    type: str | None, body: kopf.Body, namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any
) -> None:
    """A pod held by our gate was created or changed: release it at once if its cache is Ready or gone.

    Covers a pod admitted just before its cache turned Ready (the cache's pass may have listed
    the pods before this one existed); a pod past its gateTimeout (e.g. after an operator outage)
    goes too. Timeouts of waiting pods are found by the cache's periodic passes. No per-cache
    lock: a release tests the gates it read, so a concurrent pass makes it fail, not repeat.
    """
    assert namespace is not None  # Pods are namespaced
    if type == "DELETED":
        return
    _submit(memo, _release_one, memo, namespace, labels[jobs.LABEL_CACHE], copy.deepcopy(dict(body)))


def _release_one(memo: kopf.Memo, namespace: str, name: str, pod: dict[str, Any]) -> None:
    try:
        cache = memo.client.get(COMPILECACHES, name, namespace)
    except ApiError as exc:
        logger.error("Reading cache %s/%s for a gated pod failed, will retry on resync: %s", namespace, name, exc)
        return
    phase = (cache.get("status") or {}).get("phase") if cache is not None else None
    release_gates(memo.client, namespace, name, cache, phase=phase, pods=[pod], policy=memo.policy)


def _reconcile(memo: kopf.Memo, namespace: str, name: str) -> None:
    # Job events and cache events arrive on different kopf workers; the coalescer runs one
    # pass at a time per cache and folds a burst of triggers into one more pass.
    _submit(memo, memo.passes.trigger, (namespace, name), lambda key: _pass(memo, namespace, name))


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


def _pass(memo: kopf.Memo, namespace: str, name: str) -> None:
    key = (namespace, name)
    error: BaseException | None
    try:
        error = reconcile(memo.client, namespace, name, policy=memo.policy).error
    except Exception as exc:  # the cache could not even be read (reconcile records everything else)
        error = exc
    if error is None:
        memo.backoff.succeeded(key)
        return
    if memo.client.closed:  # stopping: no retry, and no noise
        return
    delay = memo.backoff.failed(key)
    if delay is None:  # a retry is armed already; this pass was another trigger's
        logger.warning("Reconciling %s/%s failed again: %s", namespace, name, describe_error(error))
        return
    # A traceback only for what is not an API answer: that is a bug to report.
    logger.error(
        "Reconciling %s/%s failed (%d in a row), retrying in %gs: %s",
        namespace,
        name,
        memo.backoff.failures(key),
        delay,
        describe_error(error),
        exc_info=None if isinstance(error, ApiError) else error,
    )
    try:
        memo.loop.call_soon_threadsafe(_arm_retry, memo, key, delay)
    except RuntimeError:  # the loop closed meanwhile: the operator stopped
        memo.backoff.succeeded(key)


def _arm_retry(memo: kopf.Memo, key: tuple[str, str], delay: float) -> None:
    """(In the loop.) Retry ``key`` in ``delay`` seconds."""
    if memo.client.closed:
        return
    previous = memo.retries.pop(key, None)
    if previous is not None:
        previous.cancel()
    memo.retries[key] = memo.loop.call_later(delay, _retry, memo, key)


def _retry(memo: kopf.Memo, key: tuple[str, str]) -> None:
    memo.retries.pop(key, None)
    memo.backoff.due(key)
    _reconcile(memo, *key)


async def _resync_forever(memo: kopf.Memo, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        for namespace, name in sorted(memo.known):
            if memo.backoff.pending((namespace, name)):  # failing: its own retry comes, with backoff
                continue
            _reconcile(memo, namespace, name)
