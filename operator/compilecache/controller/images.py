"""Training's images and the cache (``status.images``): which it warmed, which it warms now, where a pod stands.

The cache follows training's image when ``spec.warmup.image`` is unset (``api.Warmup.image_from_template``):
the warm-up runs the image of training's pod template (``template.resolve``), and an image bump in that
template changes the spec hash, so the pass starts warm-ups for the new image. Each pass records the image it
warms now (:func:`advance`), first in the list: ``Warming`` until its phase serves (Ready or Degraded), then
``Ready``, or ``Failed`` once its warm-up failed on every pool. The images warmed before stay ``Ready`` while
the cache keeps their entries (:func:`keep_only`: the expiry Job reports the images whose entries are gone):

* a training pod on a ``Ready`` image starts at once, whatever the cache warms now;
* a pod on the ``Warming`` image waits for it (the scheduling gate, ``gates.py``; Kueue's check, ``checks.py``);
* a pod on any other image waits for nothing: it is released (reason :data:`UNWARMED_IMAGE`), counted in
  ``status.consumers.unwarmedImage`` and a metric, and gets a Warning Event. An admission warning would go to
  the Job or JobSet controller that created it, where no person reads it.

A pinned cache (``warmup.image`` set) records its one image the same way. Images are compared as the
kubelet resolves them (:func:`same_image`: Docker Hub's defaults filled in, digests where both have
one). Pure functions: ``reconcile.py`` posts the Events, ``metricsfeed.py`` sets the gauge.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from compilecache.controller.api import CacheSpec
from compilecache.controller.status import FAILED, SERVING

WARMING = "Warming"
READY = "Ready"
STATES = (WARMING, READY, FAILED)
MAX_IMAGES = 16  # status.images' bound in the CRD: the current image and the 15 newest warmed before
MAX_POD_IMAGES = 64  # a pod's containers looked at: bounded work per pod, whatever a pod spec holds
IMAGE_MAX = 1024  # the CRD's bound on an image reference (api.model.IMAGE_MAX)
UNWARMED_IMAGE = "UnwarmedImage"  # the gate's release reason and the pod's Event
IMAGE_WARMED = "ImageWarmed"  # released while another image warms: the cache holds this one's entries


def same_image(a: str, b: str) -> bool:
    """Whether two image references name the same image: by digest where both have one, else by
    name and tag, with Docker Hub's default registry and ``latest`` tag filled in (as the kubelet
    does). ``t:1@sha256:…`` and ``t:1`` agree (a tag pinned by digest); a bare digest and a tag do
    not, since which digest a tag names is unknown here."""
    (name_a, tag_a, digest_a), (name_b, tag_b, digest_b) = _image_parts(a), _image_parts(b)
    if digest_a and digest_b:
        return digest_a == digest_b
    return (name_a, tag_a) == (name_b, tag_b)


def _image_parts(reference: str) -> tuple[str, str, str]:
    name, _, digest = reference.strip().partition("@")
    tag = ""
    slash = name.rfind("/")
    if ":" in name[slash + 1 :]:  # a colon after the last slash is a tag; before it, a registry port
        name, _, tag = name.rpartition(":")
    first, _, rest = name.partition("/")
    if not rest or ("." not in first and ":" not in first and first != "localhost"):
        name = "docker.io/" + name  # no registry host: Docker Hub (distribution/reference's rule)
    if name.startswith("docker.io/") and name.count("/") == 1:
        name = name.replace("docker.io/", "docker.io/library/", 1)
    return name, tag or ("" if digest else "latest"), digest


def pod_images(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The images of the pod's containers (not its init containers: training runs in the others)."""
    containers = (pod.get("spec") or {}).get("containers") or []
    found = [c.get("image") for c in containers[:MAX_POD_IMAGES] if isinstance(c, Mapping)]
    return tuple(dict.fromkeys(str(image) for image in found if isinstance(image, str) and image))


def recorded(status: Mapping[str, Any] | None) -> tuple[Mapping[str, Any], ...]:
    """``status.images`` as recorded, without entries that are not well formed (the status is the operator's,
    but a user with status access, or an older operator, may have written anything)."""
    items = (status or {}).get("images")
    if not isinstance(items, list):
        return ()
    return tuple(
        item
        for item in items[:MAX_IMAGES]
        if isinstance(item, Mapping)
        and isinstance(item.get("image"), str)
        and 0 < len(item["image"]) <= IMAGE_MAX
        and item.get("state") in STATES
    )


def match(images: Sequence[str], records: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The first record (the current image first) of an image among ``images``, or None."""
    for record in records:
        if any(same_image(image, record["image"]) for image in images):
            return record
    return None


def advance(
    old: Sequence[Mapping[str, Any]], image: str, phase: str, *, settled: bool, now: str
) -> list[dict[str, Any]]:
    """``status.images`` after a pass that warms ``image`` and ends in ``phase``.

    The current image comes first; the images warmed before stay as they were (Ready), newest first.
    One that was ``Warming`` or ``Failed`` and is not current any more goes: training moved on
    before its warm-up served, so nothing of it is held for.
    """
    state = READY if phase in SERVING else FAILED if phase == FAILED and settled else WARMING
    before = next((record for record in old if record["image"] == image), None)
    current: dict[str, Any] = {"image": image, "state": state}
    if before is not None and before.get("state") == state and before.get("since"):
        current["since"] = before["since"]
    else:
        current["since"] = now
    warmed_at = now if state == READY and (before is None or before.get("state") != READY) else None
    if warmed_at is None and before is not None and before.get("warmedAt"):
        current["warmedAt"] = before["warmedAt"]
    elif warmed_at is not None:
        current["warmedAt"] = warmed_at
    others = [dict(record) for record in old if record["image"] != image and record.get("state") == READY]
    others.sort(key=lambda record: str(record.get("warmedAt") or ""), reverse=True)
    return [current, *others][:MAX_IMAGES]


def known(spec: CacheSpec | None) -> str | None:
    """The image the cache warms now as its spec says it, or None where only a pass can tell: a templateRef
    (training's image is read by the pass) or a spec that does not parse (None)."""
    return spec.warmup.image or None if spec is not None else None


def keep_only(records: Sequence[Mapping[str, Any]], gone: Collection[str]) -> list[dict[str, Any]]:
    """``records`` without the earlier images whose entries the expiry removed (``gone``: the images it
    found no entry of: ``expiryjob.images_kept``); the current image (first) stays whatever expiry found of it."""
    return [dict(record) for index, record in enumerate(records) if index == 0 or record["image"] not in gone]


def unwarmed(pods: Sequence[Mapping[str, Any]], records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The pods on no image in ``records`` (none while nothing is recorded: the first pass has not run)."""
    if not records:
        return []
    return [pod for pod in pods if (images := pod_images(pod)) and match(images, records) is None]


def unwarmed_message(cache: str, pod: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> str:
    """The Warning Event on a pod on an image the cache never warmed: what it runs, what the cache warmed."""
    runs = ", ".join(pod_images(pod)[:4])
    warmed = ", ".join(f"{r['image']} ({r['state']})" for r in records[:4])
    return (
        f"CompileCache {cache} never warmed the image this pod runs ({runs[:512]}); it holds {warmed[:512]}: "
        "the pod starts now and compiles what it runs. Point the cache's podTemplate at this pod's "
        "template (or set spec.warmup.image) to warm it"
    )


def event_name(pod: Mapping[str, Any]) -> str:
    """The pod's ``UnwarmedImage`` Event's own name: one Event per pod and image set, however many passes."""
    meta = pod.get("metadata") or {}
    material = f"{meta.get('uid') or meta.get('name')}/{','.join(pod_images(pod))}"
    digest = hashlib.sha256(material.encode()).hexdigest()[:16]
    return f"{str(meta.get('name') or 'pod')[: 253 - 17 - 9]}.unwarmed.{digest}"
