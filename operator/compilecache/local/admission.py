"""Admission as kube-apiserver does it, for the local cluster: mutating (Pods, Jobs) and validating (creations).

A created Job goes through one mutating webhook only, Kueue's (the local stand-in's: ``kueue.py``),
which suspends it when it names a LocalQueue.

Every MutatingWebhookConfiguration stored in the local API server is consulted for each
new Pod: configurations in name order, their webhooks in order (as kube-apiserver's
``generic/webhook`` dispatcher does), each one called when its ``rules`` (CREATE of v1
pods), ``namespaceSelector`` (against the namespace's labels, which always include
``kubernetes.io/metadata.name``) and ``objectSelector`` (against the pod's labels) match.
The call is an ``admission.k8s.io/v1`` AdmissionReview POSTed over HTTPS to
``clientConfig.url``, trusting only ``clientConfig.caBundle``, within ``timeoutSeconds``
(default 10); a JSONPatch in the answer is applied before the next webhook sees the pod.
A failed call follows ``failurePolicy``: ``Ignore`` admits the pod unchanged, ``Fail``
(the default) refuses it with the error kube-apiserver would give.

Validating admission (:func:`validate`): every ValidatingWebhookConfiguration's webhooks whose
``rules`` include the CREATE of the object's resource and whose selectors match are called the
same way, after mutation; a denial refuses the creation with the webhook's ``status.code`` (403
when it gives none) and ``admission webhook "NAME" denied the request: MESSAGE``, as
kube-apiserver's ``webhookerrors.ToStatusErr`` does. Only creations are sent (no UPDATE).

Limits: ``clientConfig.service`` cannot be reached (the local cluster has no Services), so
such a webhook counts as a failed call; ``reinvocationPolicy`` is not applied (each webhook
is called once); ``matchConditions`` and ``matchPolicy: Equivalent`` conversions are not evaluated.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import ssl
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import jsonpatch

from compilecache.local import kueue
from compilecache.local.apiserver import Body, KubeEmulator, kube_error

CONFIGURATIONS = "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
VALIDATING_CONFIGURATIONS = "admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set on every Namespace by the API server since 1.21
DEFAULT_TIMEOUT = 10  # seconds, the v1 default of timeoutSeconds
POD_GVK = {"group": "", "version": "v1", "kind": "Pod"}
POD_GVR = {"group": "", "version": "v1", "resource": "pods"}


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector as the API server reads it: absent or ``{}`` selects everything."""
    if not selector:
        return True
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        present = key in labels
        matched = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,  # an absent label is "not in"
            "Exists": present,
            "DoesNotExist": not present,
        }.get(operator)
        if not matched:  # an unknown operator is an invalid selector: it selects nothing
            return False
    return True


def rules_match(rules: Sequence[Mapping[str, Any]] | None) -> bool:
    """Whether ``rules`` include the CREATE of a v1 Pod (``*`` matches anything)."""

    def has(values: Sequence[str] | None, wanted: str) -> bool:
        return values is not None and ("*" in values or wanted in values)

    return any(
        has(rule.get("operations"), "CREATE")
        and has(rule.get("apiGroups"), "")
        and has(rule.get("apiVersions"), "v1")
        and has(rule.get("resources"), "pods")
        and rule.get("scope", "*") in ("*", "Namespaced")
        for rule in rules or []
    )


def webhooks_to_call(
    configurations: Sequence[Mapping[str, Any]], pod: Mapping[str, Any], namespace_labels: Mapping[str, str]
) -> list[Mapping[str, Any]]:
    """The webhooks that a new ``pod`` goes through, in the order kube-apiserver calls them."""
    pod_labels = (pod.get("metadata") or {}).get("labels") or {}
    chosen = []
    for configuration in sorted(configurations, key=lambda c: c["metadata"]["name"]):
        for webhook in configuration.get("webhooks") or []:
            if (
                rules_match(webhook.get("rules"))
                and selector_matches(webhook.get("namespaceSelector"), namespace_labels)
                and selector_matches(webhook.get("objectSelector"), pod_labels)
            ):
                chosen.append(webhook)
    return chosen


def review(pod: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    """The AdmissionReview request for the creation of ``pod`` in ``namespace``."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": POD_GVK,
            "resource": POD_GVR,
            "requestKind": POD_GVK,
            "requestResource": POD_GVR,
            "name": (pod.get("metadata") or {}).get("name") or "",
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "local-cluster", "groups": ["system:authenticated"]},
            "object": copy.deepcopy(dict(pod)),
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def apply_response(pod: Body, sent: Mapping[str, Any], answer: Any) -> Body:
    """The pod after one webhook's answer; raises ``ValueError`` for an answer the API server rejects."""
    if not isinstance(answer, Mapping) or answer.get("kind") != "AdmissionReview":
        raise ValueError("the answer is not an AdmissionReview")
    response = answer.get("response")
    if not isinstance(response, Mapping) or response.get("uid") != sent["request"]["uid"]:
        raise ValueError("the answer's response.uid does not match the request's")
    if not response.get("allowed"):
        raise PermissionError(((response.get("status") or {}).get("message")) or "denied")
    if "patch" not in response:
        return pod
    if response.get("patchType") != "JSONPatch":
        raise ValueError(f"unsupported patchType {response.get('patchType')!r}")
    try:
        operations = json.loads(base64.b64decode(response["patch"]))
        patched: Body = jsonpatch.apply_patch(pod, operations, in_place=False)
    except (ValueError, binascii.Error, jsonpatch.JsonPatchException) as exc:
        raise ValueError(f"the patch cannot be applied: {exc}") from exc
    return patched


async def admit(emulator: KubeEmulator, namespace: str, pod: Body) -> Body:
    """The local API server's admission: ``pod`` through every matching webhook (``Admission``).

    A Job goes only through Kueue's Job webhook (the stand-in's, ``kueue.suspend_on_create``), and only
    where Kueue is (some ClusterQueue exists: elsewhere a queue label means nothing, as without Kueue).
    """
    if pod.get("kind") == "Job":
        return kueue.suspend_on_create(pod) if emulator.live(kueue.CLUSTER_QUEUES) else pod
    namespaces = {ns["metadata"]["name"]: ns for ns in emulator.live("v1/namespaces")}
    labels = {**((namespaces.get(namespace) or {}).get("metadata", {}).get("labels") or {})}
    labels[NAMESPACE_NAME_LABEL] = namespace
    for webhook in webhooks_to_call(emulator.live(CONFIGURATIONS), pod, labels):
        sent = review(pod, namespace)
        try:
            answer = await _post(webhook, sent)
            pod = apply_response(pod, sent, answer)
        except PermissionError as exc:
            raise kube_error(
                403, "Forbidden", f'admission webhook "{webhook["name"]}" denied the request: {exc}'
            ) from None
        except Exception as exc:
            if webhook.get("failurePolicy", "Fail") == "Ignore":
                continue
            message = f'Internal error occurred: failed calling webhook "{webhook["name"]}": {exc}'
            raise kube_error(500, "InternalError", message) from exc
    return pod


async def _post(webhook: Mapping[str, Any], sent: Mapping[str, Any]) -> Any:
    client_config = webhook.get("clientConfig") or {}
    url = client_config.get("url")
    if not url:
        raise ValueError("the local cluster has no Services: only clientConfig.url can be called")
    context = ssl.create_default_context()
    if client_config.get("caBundle"):
        context = ssl.create_default_context(cadata=base64.b64decode(client_config["caBundle"]).decode())
    timeout = aiohttp.ClientTimeout(total=float(webhook.get("timeoutSeconds") or DEFAULT_TIMEOUT))
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout, trust_env=False) as session,
            session.post(url, json=sent, ssl=context) as answer,
        ):
            if answer.status != 200:
                raise ValueError(f"expected response code 200, got {answer.status}")
            return await answer.json(content_type=None)
    except TimeoutError as exc:  # aiohttp's total timeout
        raise ValueError("context deadline exceeded") from exc


def resource_rules_match(rules: Sequence[Mapping[str, Any]] | None, gvr: Mapping[str, str]) -> bool:
    """Whether ``rules`` include the CREATE of the namespaced resource ``gvr`` (``*`` matches anything)."""

    def has(values: Sequence[str] | None, wanted: str) -> bool:
        return values is not None and ("*" in values or wanted in values)

    return any(
        has(rule.get("operations"), "CREATE")
        and has(rule.get("apiGroups"), gvr["group"])
        and has(rule.get("apiVersions"), gvr["version"])
        and has(rule.get("resources"), gvr["resource"])
        and rule.get("scope", "*") in ("*", "Namespaced")
        for rule in rules or []
    )


async def validate(emulator: KubeEmulator, namespace: str, gvr: Mapping[str, str], kind: str, obj: Body) -> None:
    """The local API server's validating admission of creating ``obj``; raises the refusal kube-apiserver gives."""
    namespaces = {ns["metadata"]["name"]: ns for ns in emulator.live("v1/namespaces")}
    labels = {**((namespaces.get(namespace) or {}).get("metadata", {}).get("labels") or {})}
    labels[NAMESPACE_NAME_LABEL] = namespace
    object_labels = (obj.get("metadata") or {}).get("labels") or {}
    for configuration in sorted(emulator.live(VALIDATING_CONFIGURATIONS), key=lambda c: c["metadata"]["name"]):
        for webhook in configuration.get("webhooks") or []:
            if not (
                resource_rules_match(webhook.get("rules"), gvr)
                and selector_matches(webhook.get("namespaceSelector"), labels)
                and selector_matches(webhook.get("objectSelector"), object_labels)
            ):
                continue
            sent = review(obj, namespace)
            gvk = {"group": gvr["group"], "version": gvr["version"], "kind": kind}
            sent["request"] |= {"kind": gvk, "resource": dict(gvr), "requestKind": gvk, "requestResource": dict(gvr)}
            try:
                answer = await _post(webhook, sent)
                response = answer.get("response") if isinstance(answer, Mapping) else None
                if not isinstance(response, Mapping) or response.get("uid") != sent["request"]["uid"]:
                    raise ValueError("the answer's response.uid does not match the request's")
            except Exception as exc:
                if webhook.get("failurePolicy", "Fail") == "Ignore":
                    continue
                message = f'Internal error occurred: failed calling webhook "{webhook["name"]}": {exc}'
                raise kube_error(500, "InternalError", message) from exc
            if not response.get("allowed"):
                status = response.get("status") or {}
                message = (
                    f'admission webhook "{webhook["name"]}" denied the request: {status.get("message") or "denied"}'
                )
                code = int(status.get("code") or 403)
                raise kube_error(code, "Invalid" if code == 422 else "Forbidden", message)
