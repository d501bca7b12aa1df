"""The expiry Job and what it tells (pure functions, no I/O).

After every pool of a generation warmed, the operator runs ``compilecache expire``
once as a Job: mounting the claim read-write (PVC), or as the cache's service
account (GCS). The command writes a compact JSON summary to its container's
termination message; the operator reads it from the Job's pod status, so the Job
needs no API credentials. The Job's name hashes the warm-up Jobs it follows and
``spec.lifecycle``: a re-warm or a lifecycle change runs expiry again, nothing else does. It
gets ``status.lastUsed`` (the entries training used, by day: :mod:`compilecache.cache.lastuse`)
as arguments, as the record stood when the Job was made; a later use counts at the next expiry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from compilecache import frameworks
from compilecache.cache import lastuse, units
from compilecache.cache.errors import cut
from compilecache.controller import images, jobs, podstate, queueing, status
from compilecache.controller import runtime as runtime_
from compilecache.controller.api import CacheSpec

LABEL_EXPIRY_OF = "compilecache.dev/expiry-of"  # on expiry Jobs and pods (not LABEL_CACHE: no gate, no pool)
CONTAINER = "expire"
TERMINATION_LOG = "/dev/termination-log"
EXPIRED_CONDITION = "Expired"
BACKOFF_LIMIT = 2
# The expire command checks entries a few at a time, each as a stream with bounded inflation (at most
# 1 MiB inflated held at once, cache/entries.py): measured 35-71 MiB at its peak on small caches (bench/
# bounded_verify.py). What grows with the cache is its listing and manifests (up to 16 MiB of JSON each,
# about 10x that as Python objects): the limit leaves room for them. No accelerator: it compiles nothing.
RESOURCES: Mapping[str, Mapping[str, str]] = {
    "requests": {"cpu": "250m", "memory": "256Mi"},
    "limits": {"memory": "2Gi"},
}


@dataclass(frozen=True)
class Outcome:
    """Where the expiry of this generation stands: the phase, why, and the summary when it succeeded."""

    phase: str  # status.EXPIRING, status.READY or status.FAILED
    reason: str
    message: str
    summary: Mapping[str, Any] | None = field(default=None)
    finished_at: str | None = None


def expiry_hash(spec: CacheSpec, warmup_jobs: Sequence[str]) -> str:
    """A short hash of the warm-up Jobs this expiry follows and the lifecycle it applies."""
    lifecycle = spec.lifecycle
    material = {
        "warmups": sorted(warmup_jobs),
        "lifecycle": [lifecycle.max_age_seconds, lifecycle.max_size_bytes, lifecycle.keep_versions, lifecycle.verify],
        "cacheDir": spec.cache_dir,
    }
    return jobs.digest(material)


def expire_command(spec: CacheSpec, last_used: Sequence[object] | None = None) -> list[str]:
    """``compilecache expire`` with the cache's lifecycle, in the syntax its own parser reads.

    Durations go through ``units.format_duration`` (``14d`` became ``1.2096e+06s`` with
    ``:g``, which ``expire`` refused); sizes are whole bytes; ``--verify``/``--no-verify`` is
    always explicit, so the Job does what the spec says whatever the CLI's default. A PyTorch
    cache's entries are Inductor's (``--framework pytorch``), with the same lifecycle flags.
    ``last_used``: ``status.lastUsed``, the entries training used by day, as ``--used DAY=KEYS``.
    """
    lifecycle = spec.lifecycle
    command = ["compilecache", "expire"]
    # The framework's own flags: none for JAX, whose command stays what older warmer images take.
    command += frameworks.get(spec.framework).expire_flags
    command += ["--cache-dir", spec.cache_dir]
    if lifecycle.max_age_seconds is not None:
        command += ["--max-age", units.format_duration(lifecycle.max_age_seconds)]
    if lifecycle.max_size_bytes is not None:
        command += ["--max-size", str(lifecycle.max_size_bytes)]
    if lifecycle.keep_versions is not None:
        command += ["--keep-versions", str(lifecycle.keep_versions)]
    command += ["--verify" if lifecycle.verify else "--no-verify", "--termination-log", TERMINATION_LOG]
    # Training's last use (status.lastUsed, cache/lastuse.py): maxAge and maxSize count from it. Only where
    # the lifecycle reads it: a cache without either runs the command older warmer images take.
    if lifecycle.max_age_seconds is not None or lifecycle.max_size_bytes is not None:
        command += lastuse.arguments(last_used)
    return command


def expiry_job(
    cache: Mapping[str, Any],
    spec: CacheSpec,
    warmup_jobs: Sequence[str],
    *,
    run_as_user: int | None = jobs.RUN_AS_USER,
    runtime: runtime_.Runtime | None = None,
) -> dict[str, Any]:
    """The expiry Job: the warm-up image, identity, pull Secrets and pod security, the cache read-write,
    and resources of its own (:data:`RESOURCES`); with a ``runtime``, its package injected (as the warm-up's)."""
    meta = cache["metadata"]
    name = meta["name"]
    digest = expiry_hash(spec, warmup_jobs)
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}]
    mounts = [{"name": "tmp", "mountPath": jobs.TMP_DIR}]
    if spec.pvc is not None:
        volumes.append({"name": "cache", "persistentVolumeClaim": {"claimName": spec.pvc.claim_name}})
        mounts.append({"name": "cache", "mountPath": spec.mount_path})
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.warmup.image,
        "command": runtime_.command(runtime, expire_command(spec, (cache.get("status") or {}).get("lastUsed"))),
        "env": [{"name": "TMPDIR", "value": jobs.TMP_DIR}, {"name": "HOME", "value": jobs.TMP_DIR}],
        "volumeMounts": mounts,
        "securityContext": jobs.container_security_context(),
        "resources": {kind: dict(values) for kind, values in RESOURCES.items()},
        # The summary on success; the log's tail if the command crashed before writing it.
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if spec.warmup.image_pull_policy:
        container["imagePullPolicy"] = spec.warmup.image_pull_policy
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": jobs.pod_security_context(run_as_user),
        "containers": [container],
        "volumes": volumes,
        # Who it is and what it pulls: the warm-up's, which wrote what it reads and deletes.
        **jobs.identity(spec),
    }
    if runtime is not None:
        runtime_.inject(pod_spec, [container], runtime, jobs.container_security_context())
    labels = {**jobs.common_labels(name, "expiry"), LABEL_EXPIRY_OF: name, jobs.LABEL_ROLE: "expiry"}
    stem = f"{name}-expire"[: jobs.NAME_MAX - jobs.HASH_LENGTH - 1].rstrip("-.")
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"{stem}-{digest}",
            "namespace": meta.get("namespace"),
            "labels": labels,
            "annotations": {jobs.ANNOTATION_SPEC_HASH: digest},
            "ownerReferences": [jobs.owner_reference(cache)],
        },
        # No ttlSecondsAfterFinished: the finished Job (one per cache; the operator deletes
        # older ones) and its pod are the record the status is read from.
        "spec": {
            "backoffLimit": BACKOFF_LIMIT,
            "activeDeadlineSeconds": spec.warmup.active_deadline_seconds,
            "podFailurePolicy": jobs.POD_FAILURE_POLICY,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
    return queueing.apply(manifest, spec, expiry=True)


def termination_message(pods: Sequence[Mapping[str, Any]]) -> str | None:
    """The expire container's termination message of the newest terminated pod (a Job may retry)."""
    return status.termination_message(pods, CONTAINER)


def parse_summary(message: str | None) -> dict[str, Any] | None:
    """The summary JSON (``expirecmd.termination_message``), or ``None`` for anything else (a log tail).

    The expiry runs in the cache author's image, which can write its own summary: one whose values
    are of the wrong type or that ``status.cache`` cannot hold raises :class:`status.BadReport`.
    """
    summary = status.parse_report(message)
    if summary is not None:
        status.within(cache_status(summary, {}, None, None), "cache")
    return summary


def outcome(
    job: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
    now: str | None = None,
    events: podstate.Events | None = None,
    capacity_seconds: float = podstate.STUCK_DEADLINE_SECONDS,
) -> Outcome:
    """The expiry's phase from its Job's state and its pod's termination message; while it runs,
    what its pod is stuck on (``podstate``, with the autoscaler's ``events`` on a pod that waits for a
    node): Failed with that reason once past its deadline at ``now``."""
    if job is None:
        return Outcome(status.EXPIRING, "ExpiryJobCreated", "expiring: the expiry Job was created")
    state = status.job_state(job)
    message = termination_message(pods)
    try:
        summary, refused = parse_summary(message), ""
    except status.BadReport as exc:
        summary, refused = None, f"its summary was refused, nothing of it is counted: {exc}"
    if state["state"] == status.POOL_SUCCEEDED and refused:
        finished = state.get("finishedAt")
        return Outcome(status.READY, status.REPORT_REFUSED, f"warmed and expired; {refused}", None, finished)
    if state["state"] == status.POOL_SUCCEEDED:
        return Outcome(status.READY, "Expired", describe(summary), summary, state.get("finishedAt"))
    if state["state"] == status.POOL_FAILED:
        detail = (
            refused
            or str((summary or {}).get("error") or "")
            or status.last_line(message)
            or state.get("message")
            or "the expiry Job failed"
        )
        return Outcome(status.FAILED, "ExpiryFailed", f"expiry failed: {detail}", summary, state.get("finishedAt"))
    stuck = status.stuck(pods, now, events, capacity_seconds)
    if stuck.get("state") == status.POOL_FAILED:
        return Outcome(status.FAILED, stuck["reason"], f"expiry failed: {stuck['message']}")
    if stuck:
        return Outcome(status.EXPIRING, stuck["reason"], f"expiring: the expiry pod is stuck: {stuck['message']}")
    return Outcome(status.EXPIRING, "ExpiryRunning", "expiring: applying the lifecycle to the warmed cache")


def describe(summary: Mapping[str, Any] | None) -> str:
    """One line for ``status.message`` and the condition: what expiry did."""
    if summary is None:
        return "warmed and expired (no summary: the expiry pod is gone)"
    deleted = {rule: count for rule, count in (summary.get("deleted") or {}).items() if count}
    after = summary.get("after") or {}
    what = ", ".join(f"{count} by {rule}" for rule, count in deleted.items()) or "nothing"
    return (
        f"warmed and expired: deleted {what}; "
        f"{after.get('entries', 0)} entries ({units.format_bytes(int(after.get('bytes') or 0))})"
        f"{set_aside(summary)}"
    )


def set_aside(summary: Mapping[str, Any]) -> str:
    """``; 2 malformed manifests set aside, unused until removed: evil.json (entries[0]: …)``, or nothing.

    The summary is a pod's word: only well-typed items are shown, each cut short, at most three.
    """
    items = summary.get("malformedManifests")
    if not isinstance(items, list) or not items:
        return ""
    omitted = summary.get("malformedOmitted")
    count = len(items) + (omitted if isinstance(omitted, int) and 0 < omitted < 10**6 else 0)
    shown = [
        f"{cut(item['name'], 60)} ({cut(item['reason'], 120)})"
        for item in items[:3]
        if isinstance(item, Mapping) and isinstance(item.get("name"), str) and isinstance(item.get("reason"), str)
    ]
    more = f", +{count - len(shown)} more" if count > len(shown) else ""
    noun = "manifest" if count == 1 else "manifests"
    return (
        f"; {count} malformed {noun} set aside in .compilecache/manifests, unused until removed: "
        f"{', '.join(shown)}{more}"
    )


def cache_status(
    summary: Mapping[str, Any] | None, previous: Mapping[str, Any], last_warmed: str | None, last_expired: str | None
) -> dict[str, Any]:
    """``status.cache`` after expiry, with what the last expiry deleted by rule (``lastDeleted``, for the
    metrics); without a summary the last counts stand. A value of the wrong type is :class:`status.BadReport`."""
    result = dict(previous)
    if summary is not None:
        after = status.mapping(summary.get("after"), "after")
        entries, size = (
            status.count(after.get("entries"), "after.entries"),
            status.count(after.get("bytes"), "after.bytes"),
        )
        result |= {"entries": entries, "bytes": size, "size": units.format_bytes(size)}
        versions = status.listed(summary.get("versions"), "versions")
        result["versions"] = [dict(status.mapping(each, f"versions[{i}]")) for i, each in enumerate(versions)][:64]
        deleted = status.mapping(summary.get("deleted"), "deleted")
        result["lastDeleted"] = {str(rule)[:63]: status.count(n, f"deleted.{rule}") for rule, n in deleted.items()}
    if last_warmed:
        result["lastWarmed"] = last_warmed
    at = status.text(summary.get("at"), "at") if summary is not None else ""
    if last_expired or at:
        result["lastExpired"] = last_expired or at
    return result


def images_kept(records: Sequence[Mapping[str, Any]], summary: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """``status.images`` after an expiry: without the earlier images the summary says are gone (``expirecmd``'s
    ``imagesGone``: runs recorded them and none of their entries is left). An image the summary does not name
    stays: its runs may have recorded no image (warmed before the upgrade that records it), so the expiry
    cannot tell. A summary without the list (an older warmer image, PyTorch's expiry, cut to fit) forgets none.

    The summary is a pod's word: only strings an image reference can be count, at most ``images.MAX_IMAGES``.
    """
    items = (summary or {}).get("imagesGone")
    if not isinstance(items, list):
        return [dict(record) for record in records]
    gone = frozenset(
        item for item in items[: images.MAX_IMAGES] if isinstance(item, str) and 0 < len(item) <= images.IMAGE_MAX
    )
    return images.keep_only(records, gone)


def last_warmed(pools: Sequence[Mapping[str, Any]]) -> str | None:
    """When the last pool of this generation finished warming (RFC 3339 strings sort by time)."""
    times = [
        str(pool["finishedAt"])
        for pool in pools
        if pool.get("state") == status.POOL_SUCCEEDED and pool.get("finishedAt")
    ]
    return max(times) if times else None
