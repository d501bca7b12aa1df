"""The lifecycle policy: a listing, the run manifests, a policy and ``now`` → what to delete and why.

Pure functions, no I/O: :mod:`compilecache.jobtools.expirecmd` lists the store, reads
the manifests, checks the entries' bytes when asked (``damaged``) and deletes
what :func:`plan_expiry` returns. Rules, in the order that names a deletion's
reason (an entry is deleted once, for the first rule that takes it):

1. ``integrity``: with ``verify``, entries whose bytes are unsound or no longer match
   the manifest's sha256 (found by the caller) and ``-atime`` sidecars without their
   entry; always, what an interrupted run left (:func:`leftovers`: staging dirs older
   than the staging grace period, temporary files older than the grace period), which
   the warmer deletes too;
2. ``keepVersions``: per platform (backend, device kind) the entries of all but the
   N most recently warmed images (the image each run manifest records: the warm-up Job's,
   ``cacheenv.IMAGE``); an entry several images wrote or hit stays while one of them is kept,
   since they share it. Entries of runs that recorded no image (older warmers, a run outside
   a Job) are ranked by their (jax, jaxlib) build instead. Per platform, because an H100 pool
   and an A100 pool are different builds that are both current: ranking them together
   would drop one pool's entries whenever the other pool warmed last;
3. ``maxAge``: entries not written, re-produced (a hit in a run manifest) or used by training
   (``Policy.used``: the operator's record of the trainers' reports, :mod:`compilecache.cache.lastuse`)
   within the age;
4. ``maxSize``: least recently produced or used first, until the rest fits.

Entries in no manifest (written by someone else) have no known build and no
digest: only ``maxAge``, ``maxSize`` and the byte checks can remove them. A warm run
records its entries in a *pending* manifest before it publishes them, so a run that
failed after publishing left its entries recorded: they are treated like any other. Nothing
modified within the grace period is deleted, so a run in flight is never cut.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from compilecache.cache import lastuse
from compilecache.cache.entries import ATIME_SUFFIX, ENTRY_SUFFIX
from compilecache.cache.store import Listing, StoredFile

INTEGRITY = "integrity"
KEEP_VERSIONS = "keepVersions"
MAX_AGE = "maxAge"
MAX_SIZE = "maxSize"
RULES = (INTEGRITY, KEEP_VERSIONS, MAX_AGE, MAX_SIZE)

DEFAULT_GRACE_SECONDS = 600.0
# A local warm run keeps its staging dir for the whole run, and a long GPU compile
# may write nothing into it for a while: wait as long as a warm-up Job may run (its default deadline).
DEFAULT_STAGING_GRACE_SECONDS = 7200.0


class Build(NamedTuple):
    """What JAX hashes into every key besides the program: entries of different builds never hit each other."""

    jax: str
    jaxlib: str
    backend: str
    device_kind: str

    @property
    def platform(self) -> tuple[str, str]:
        """Backend and device kind: builds are ranked against others on the same platform."""
        return self.backend, self.device_kind


@dataclass(frozen=True)
class Policy:
    """The lifecycle settings (``spec.lifecycle``) and the grace periods."""

    max_age_seconds: float | None = None
    max_size_bytes: int | None = None
    keep_versions: int | None = None
    verify: bool = False
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    staging_grace_seconds: float = DEFAULT_STAGING_GRACE_SECONDS
    # Training's last use: use key (lastuse.use_key of an entry's name) → POSIX seconds.
    used: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Deletion:
    """One file (or staging dir) to delete, the rule that takes it and a one-line reason."""

    name: str
    size: int
    rule: str
    reason: str


@dataclass(frozen=True)
class Version:
    """Entries of one build left after expiry."""

    build: Build
    entries: int
    bytes: int


@dataclass(frozen=True)
class Plan:
    """The outcome of the policy: deletions, totals before and after, and what is left per build and image."""

    deletions: tuple[Deletion, ...]
    entries_before: int
    bytes_before: int
    entries_after: int
    bytes_after: int
    versions: tuple[Version, ...]
    notes: tuple[str, ...] = ()
    # Image → entries left that it wrote or hit, the most recently warmed first, less the images keepVersions
    # dropped (an entry they share with a kept one stays, but they are no longer served: status.images).
    images: tuple[tuple[str, int], ...] = ()
    # The images run manifests name of which no entry is left, or that keepVersions dropped, the most recently
    # warmed first: only these are known to be gone (runs that recorded no image say nothing of theirs).
    images_gone: tuple[str, ...] = ()

    def deleted_by_rule(self) -> dict[str, int]:
        """How many deletions each rule made (every rule listed, zero included)."""
        counts = dict.fromkeys(RULES, 0)
        for deletion in self.deletions:
            counts[deletion.rule] += 1
        return counts


@dataclass
class EntryRecord:
    """What the manifests say about one entry file."""

    build: Build | None = None
    produced_at: float = 0.0  # latest write or hit recorded, POSIX seconds
    sha256: str | None = None  # of the latest write that published the file
    written_at: float = field(default=-1.0, repr=False)
    images: set[str] = field(default_factory=set)  # the images of the runs that wrote or hit it


# An image as keepVersions ranks it: on one platform (backend, device kind).
PlacedImage = tuple[str, tuple[str, str]]


@dataclass(frozen=True)
class ManifestIndex:
    """The manifests folded into one record per entry, and when each build and image was last warmed."""

    entries: Mapping[str, EntryRecord]
    builds_seen: Mapping[Build, float]
    images_seen: Mapping[PlacedImage, float] = field(default_factory=dict)


def index_manifests(manifests: Iterable[Mapping[str, Any]]) -> ManifestIndex:
    """Fold run manifests (``manifest.build_manifest``) into per-entry records; unknown fields are ignored."""
    records: dict[str, EntryRecord] = defaultdict(EntryRecord)
    seen: dict[Build, float] = {}
    images_seen: dict[PlacedImage, float] = {}
    times = _TimeParser()
    for manifest in manifests:
        run_build = _build(manifest)
        finished = times(manifest.get("finished_at"))
        if run_build is not None:
            seen[run_build] = max(seen.get(run_build, 0.0), finished)
        image = manifest.get("image") if isinstance(manifest.get("image"), str) else None
        if image and run_build is not None:
            placed = (image, run_build.platform)
            images_seen[placed] = max(images_seen.get(placed, 0.0), finished)
        else:
            image = None  # a run on no known platform cannot be ranked: its entries go by their build
        for entry in manifest.get("entries") or []:
            name = entry.get("file")
            if not isinstance(name, str):
                continue
            record = records[name]
            at = times(entry.get("written_at")) or finished
            record.build = _build(entry) or run_build or record.build
            if image:
                record.images.add(image)
            record.produced_at = max(record.produced_at, at)
            # published: false means another run's file was kept: this run's bytes are not the file's.
            if entry.get("published", True) and entry.get("sha256") and at >= record.written_at:
                record.sha256, record.written_at = str(entry["sha256"]), at
        for hit in manifest.get("hits") or []:
            name = hit.get("file")
            if not isinstance(name, str):
                continue
            record = records[name]
            record.produced_at = max(record.produced_at, times(hit.get("at")) or finished)
            record.build = record.build or run_build
            if image:
                record.images.add(image)
    return ManifestIndex(dict(records), seen, images_seen)


def expected_digests(index: ManifestIndex) -> dict[str, str]:
    """Entry name → the sha256 its manifest recorded (for the caller's byte checks)."""
    return {name: record.sha256 for name, record in index.entries.items() if record.sha256}


def plan_expiry(
    listing: Listing,
    index: ManifestIndex,
    policy: Policy,
    now: float,
    damaged: Mapping[str, str] | None = None,
) -> Plan:
    """Decide what to delete. ``damaged``: entry name → why its bytes are unsound (checked by the caller)."""
    damaged = damaged or {}
    # The store lists only entry and sidecar names (``store.is_cache_file``): the suffix tells them apart.
    entries = {item.name: item for item in listing.files if item.name.endswith(ENTRY_SUFFIX)}
    sidecars = {item.name: item for item in listing.files if item.name.endswith(ATIME_SUFFIX)}

    def sidecar_size(name: str) -> int:
        sidecar = sidecars.get(_sidecar_of(name))
        return sidecar.size if sidecar else 0

    def young(item: StoredFile, grace: float) -> bool:
        return now - item.mtime < grace

    # Computed once per entry: the rules below look them up many times (100 000 entries in ~1 s).
    size_of = {name: item.size + sidecar_size(name) for name, item in entries.items()}
    records = index.entries
    produced_at = {
        name: max(item.mtime, records[name].produced_at) if name in records else item.mtime
        for name, item in entries.items()
    }
    # Training's use counts as a production: only for entries that exist (a key is a lookup, never a path).
    used = dict(lastuse.used_at(entries, policy.used))
    for name, at in used.items():
        produced_at[name] = max(produced_at[name], min(at, now))

    deletions: list[Deletion] = []
    taken: set[str] = set()
    dropped_images: set[str] = set()  # older than keepVersions' newest: gone from status.images too

    def take(item: StoredFile, rule: str, reason: str) -> None:
        taken.add(item.name)
        deletions.append(Deletion(item.name, size_of[item.name], rule, reason))

    candidates = [item for item in entries.values() if not young(item, policy.grace_seconds)]
    if policy.verify:
        for item in candidates:
            if item.name in damaged:
                take(item, INTEGRITY, damaged[item.name])
        for sidecar in sidecars.values():
            if _entry_of(sidecar.name) not in entries and not young(sidecar, policy.grace_seconds):
                deletions.append(Deletion(sidecar.name, sidecar.size, INTEGRITY, "-atime sidecar without its entry"))
    deletions += leftovers(listing, policy, now)

    if policy.keep_versions is not None:
        kept_builds = newest_builds(index.builds_seen, policy.keep_versions)
        dropped = {
            build: f"build jax {build.jax}/jaxlib {build.jaxlib} on {build.backend} {build.device_kind} "
            f"is older than the {policy.keep_versions} newest on that platform"
            for build in index.builds_seen
            if build not in kept_builds
        }
        kept_images = newest_images(index.images_seen, policy.keep_versions)
        dropped_images = {image for image, _ in index.images_seen} - {image for image, _ in kept_images}
        for item in candidates:
            record = records.get(item.name)
            if item.name in taken or not record:
                continue
            if record.images:
                platform = record.build.platform if record.build else ("", "")
                if not any((image, platform) in kept_images for image in record.images):
                    shown = ", ".join(sorted(record.images)[:3])[:300]
                    take(
                        item,
                        KEEP_VERSIONS,
                        f"image {shown} is older than the {policy.keep_versions} newest warmed on that platform",
                    )
            elif record.build in dropped:
                take(item, KEEP_VERSIONS, dropped[record.build])

    if policy.max_age_seconds is not None:
        for item in candidates:
            since = now - produced_at[item.name]
            if item.name not in taken and since > policy.max_age_seconds:
                what = (
                    "used by training" if min(used.get(item.name, -1.0), now) >= produced_at[item.name] else "produced"
                )
                take(item, MAX_AGE, f"last {what} {_age(since)} ago, maxAge {_age(policy.max_age_seconds)}")

    notes: list[str] = []
    if policy.max_size_bytes is not None:
        remaining = sum(size for name, size in size_of.items() if name not in taken)
        # Least recently produced first; the name breaks ties so that a plan is reproducible.
        for item in sorted((i for i in candidates if i.name not in taken), key=lambda i: (produced_at[i.name], i.name)):
            if remaining <= policy.max_size_bytes:
                break
            take(
                item, MAX_SIZE, f"least recently produced ({_age(now - produced_at[item.name])} ago) while over maxSize"
            )
            remaining -= size_of[item.name]
        if remaining > policy.max_size_bytes:
            notes.append(
                f"still {remaining - policy.max_size_bytes} bytes over maxSize: "
                f"entries younger than the grace period ({_age(policy.grace_seconds)}) are kept"
            )

    left = [item for name, item in entries.items() if name not in taken]
    left_images = tuple(pair for pair in _images(left, index) if pair[0] not in dropped_images)
    return Plan(
        deletions=tuple(deletions),
        entries_before=len(entries),
        bytes_before=sum(size_of.values()),
        entries_after=len(left),
        bytes_after=sum(size_of[item.name] for item in left),
        versions=_versions(left, index, size_of),
        notes=tuple(notes),
        images=left_images,
        images_gone=_images_gone(index, {image for image, _ in left_images}),
    )


def leftovers(listing: Listing, policy: Policy, now: float) -> list[Deletion]:
    """Staging dirs and temporary files an interrupted run left: untouched for their grace period.

    A run in flight keeps its own (a staging dir's time moves with each entry JAX writes, a
    temporary manifest lives for one write) and removes them itself when it fails; only a
    killed process leaves them, and the next warm or expiry deletes them.
    """
    found = []
    for run in listing.staging:
        if now - run.mtime >= policy.staging_grace_seconds:
            age = _age(now - run.mtime)
            found.append(Deletion(run.name, run.size, INTEGRITY, f"staging left by a run, untouched for {age}"))
    for item in listing.temporary:
        if now - item.mtime >= policy.grace_seconds:
            why = f"temporary file of a write never finished, {_age(now - item.mtime)} old"
            found.append(Deletion(item.name, item.size, INTEGRITY, why))
    return found


def newest_builds(seen: Mapping[Build, float], keep: int) -> set[Build]:
    """The ``keep`` most recently warmed builds of each platform (ties: the higher version strings)."""
    by_platform: dict[tuple[str, str], list[Build]] = defaultdict(list)
    for build in seen:
        by_platform[build.platform].append(build)
    kept: set[Build] = set()
    for builds in by_platform.values():
        builds.sort(key=lambda b: (seen[b], b.jaxlib, b.jax), reverse=True)
        kept.update(builds[:keep])
    return kept


def newest_images(seen: Mapping[PlacedImage, float], keep: int) -> set[PlacedImage]:
    """The ``keep`` most recently warmed images of each platform (ties: the image names, for a stable plan)."""
    by_platform: dict[tuple[str, str], list[PlacedImage]] = defaultdict(list)
    for placed in seen:
        by_platform[placed[1]].append(placed)
    kept: set[PlacedImage] = set()
    for images in by_platform.values():
        images.sort(key=lambda placed: (seen[placed], placed[0]), reverse=True)
        kept.update(images[:keep])
    return kept


def _images(left: Sequence[StoredFile], index: ManifestIndex) -> tuple[tuple[str, int], ...]:
    counts: dict[str, int] = defaultdict(int)
    for item in left:
        record = index.entries.get(item.name)
        for image in record.images if record else ():
            counts[image] += 1
    last: dict[str, float] = defaultdict(float)
    for (image, _), at in index.images_seen.items():
        last[image] = max(last[image], at)
    return tuple(sorted(counts.items(), key=lambda pair: (last[pair[0]], pair[0]), reverse=True))


def _images_gone(index: ManifestIndex, left: Collection[str]) -> tuple[str, ...]:
    last: dict[str, float] = defaultdict(float)
    for (image, _), at in index.images_seen.items():
        last[image] = max(last[image], at)
    return tuple(sorted((image for image in last if image not in left), key=lambda i: (last[i], i), reverse=True))


def _versions(left: Sequence[StoredFile], index: ManifestIndex, size_of: Mapping[str, int]) -> tuple[Version, ...]:
    counts: dict[Build, list[int]] = defaultdict(lambda: [0, 0])
    for item in left:
        record = index.entries.get(item.name)
        if record and record.build:
            counts[record.build][0] += 1
            counts[record.build][1] += size_of[item.name]
    order = sorted(counts, key=lambda b: (index.builds_seen.get(b, 0.0), b), reverse=True)
    return tuple(Version(build, counts[build][0], counts[build][1]) for build in order)


def _build(document: Mapping[str, Any]) -> Build | None:
    values = [document.get(key) for key in ("jax", "jaxlib", "backend", "device_kind")]
    strings = [value for value in values if isinstance(value, str) and value]
    return Build(*strings) if len(strings) == len(values) else None


def _sidecar_of(entry: str) -> str:
    return entry[: -len(ENTRY_SUFFIX)] + ATIME_SUFFIX


def _entry_of(sidecar: str) -> str:
    return sidecar[: -len(ATIME_SUFFIX)] + ENTRY_SUFFIX


def _age(seconds: float) -> str:
    """``3d4h``, ``12m``, ``40s``: how long, for reasons humans read."""
    seconds = max(0, int(seconds))
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    if seconds or not parts:
        parts.append(f"{seconds}s")
    return "".join(parts[:2])


class _TimeParser:
    """RFC 3339 text → POSIX seconds (0 for missing or bad), memoised: a run's entries share one time."""

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}

    def __call__(self, text: Any) -> float:
        if not isinstance(text, str):
            return 0.0
        value = self._seen.get(text)
        if value is None:
            try:
                value = datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
            except ValueError:
                value = 0.0
            self._seen[text] = value
        return value
