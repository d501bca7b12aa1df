"""Training's pod template in a warm-up: read the object ``podTemplate.templateRef`` names (pure, no I/O).

``spec.warmup.podTemplate`` gives a warm-up what training sees at startup (docs/resource.md):
inline (parsed by ``api.parse_pod_template`` with the rest of the spec), or by reference to a
PodTemplate, Job or JobSet of the cache's namespace. The pass reads the referenced object in its
observe step (``snapshot.observe``) and :func:`resolve` turns it into the parsed spec's
``warmup.pod_template``, so that the plan, the policy and ``jobs.warmup_job`` see one typed value
whichever way the template came. ``jobs.py`` merges it into the warm-up pod.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from compilecache.controller import api
from compilecache.controller.api import CacheSpec, SpecError, TemplateRef
from compilecache.controller.kube import JOBS, Resource

PODTEMPLATES = Resource("v1", "podtemplates")
JOBSETS = Resource("jobset.x-k8s.io/v1alpha2", "jobsets")
REF_FIELD = "spec.warmup.podTemplate.templateRef"


def resource_of(ref: TemplateRef) -> Resource:
    """The API resource of the kind a reference names."""
    return {"PodTemplate": PODTEMPLATES, "Job": JOBS, "JobSet": JOBSETS}[ref.kind]


def pod_spec_of(ref: TemplateRef, obj: Mapping[str, Any], container: str | None) -> tuple[str, Mapping[str, Any]]:
    """Where the pod spec sits in the referenced object (a field path for messages) and the spec itself.

    PodTemplate: ``template.spec``; Job: ``spec.template.spec``; JobSet: the pod spec of the first
    replicated Job that has ``container`` (the first one when no container is named).
    """
    if ref.kind == "PodTemplate":
        return "template.spec", ((obj.get("template") or {}).get("spec") or {})
    if ref.kind == "Job":
        return "spec.template.spec", (((obj.get("spec") or {}).get("template") or {}).get("spec") or {})
    replicated = (obj.get("spec") or {}).get("replicatedJobs") or []
    for index, job in enumerate(replicated):
        pod = (((job.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
        names = {c.get("name") for c in pod.get("containers") or [] if isinstance(c, Mapping)}
        if container is None or container in names:
            return f"spec.replicatedJobs[{index}].template.spec.template.spec", pod
    return "spec.replicatedJobs", {}


def resolve(spec: CacheSpec, obj: Mapping[str, Any] | None) -> CacheSpec:
    """``spec`` with the referenced template in ``warmup.pod_template`` (unchanged without a reference).

    Raises :class:`SpecError` naming ``spec.warmup.podTemplate.templateRef`` when the object is
    ``None`` (it does not exist) or its pod spec cannot be used; the message says where in it.
    """
    source = spec.warmup.template
    if source is None or source.ref is None:
        return spec
    ref = source.ref
    if obj is None:
        raise SpecError(REF_FIELD, f"{ref.describe()} does not exist in the cache's namespace")
    where, pod_spec = pod_spec_of(ref, obj, source.container)
    origin = f"{REF_FIELD} ({ref.describe()}: {where})"
    template = api.parse_pod_template(pod_spec, origin, source.container)
    api.check_template(template, spec.warmup.image, spec.mount_path)
    return dataclasses.replace(spec, warmup=dataclasses.replace(spec.warmup, pod_template=template))
