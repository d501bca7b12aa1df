"""Serving the webhooks (pods, CompileCaches): their configuration from environment variables, and kopf's HTTPS server.

In a cluster the Helm chart provides the Service and the MutatingWebhookConfiguration
and the ValidatingWebhookConfiguration (kopf does not register itself:
``settings.admission.managed = None``); the chart points them at
``https://<service>:<port>/mutate-pods`` and ``/validate-compilecaches`` (kopf routes by handler id).

    COMPILECACHE_WEBHOOK            off (default) | tls | selfsigned
    COMPILECACHE_WEBHOOK_ADDR       listen address, default 0.0.0.0
    COMPILECACHE_WEBHOOK_PORT       listen port, default 9443
    COMPILECACHE_WEBHOOK_CERT_FILE  tls: the server certificate (PEM, with its chain)
    COMPILECACHE_WEBHOOK_KEY_FILE   tls: its private key (PEM)
    COMPILECACHE_WEBHOOK_HOST       selfsigned: the host name the certificate is made for
    COMPILECACHE_WEBHOOK_CA_DUMP    selfsigned (optional): write the generated CA here, for clients

Certificate files are re-read by kopf when they change (cert-manager renewals).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import kopf

MODE_ENV = "COMPILECACHE_WEBHOOK"
ADDR_ENV = "COMPILECACHE_WEBHOOK_ADDR"
PORT_ENV = "COMPILECACHE_WEBHOOK_PORT"
CERT_ENV = "COMPILECACHE_WEBHOOK_CERT_FILE"
KEY_ENV = "COMPILECACHE_WEBHOOK_KEY_FILE"
HOST_ENV = "COMPILECACHE_WEBHOOK_HOST"
CA_DUMP_ENV = "COMPILECACHE_WEBHOOK_CA_DUMP"

OFF, TLS, SELFSIGNED = "off", "tls", "selfsigned"
DEFAULT_ADDR = "0.0.0.0"  # all interfaces: the Service reaches the pod on its own IP
DEFAULT_PORT = 9443
HANDLER_ID = "mutate-pods"  # kopf serves a handler at /<id>: this is the chart's webhook path
PATH = f"/{HANDLER_ID}"
# The validating webhook of CompileCaches (the spec's checks and the operator's policy).
VALIDATE_ID = "validate-compilecaches"
VALIDATE_PATH = f"/{VALIDATE_ID}"
# kopf parses each AdmissionReview and copies its object on its event loop (kopf/_kits/webhooks.py
# _serve: json.loads; kopf/_cogs/structs/patches.py as_json_patch: a deepcopy even when nothing is
# patched), at a cost that grows with the object's values: a template of 250,000 empty lists held
# the loop 470 ms. Past these bounds a review is answered without kopf: a pod admitted as it is (it
# only trains without its cache), anything else refused. A real CompileCache or training pod is a
# few KiB and a few hundred values; aiohttp's own cap is 1 MiB.
MAX_REVIEW_BYTES = 512 * 1024
MAX_OBJECT_VALUES = 20_000


class ConfigError(ValueError):
    """A bad webhook setting; the message names the variable."""


@dataclass(frozen=True)
class WebhookConfig:
    """How to serve the webhook; ``mode`` off serves nothing."""

    mode: str = OFF
    addr: str = DEFAULT_ADDR
    port: int = DEFAULT_PORT
    cert_file: str | None = None
    key_file: str | None = None
    host: str | None = None
    ca_dump: str | None = None


def config_from_env(environ: Mapping[str, str]) -> WebhookConfig:
    """Read the ``COMPILECACHE_WEBHOOK*`` variables; raise :class:`ConfigError` naming a bad one."""
    mode = (environ.get(MODE_ENV) or OFF).strip().lower()
    if mode not in (OFF, TLS, SELFSIGNED):
        raise ConfigError(f"{MODE_ENV} must be {OFF}, {TLS} or {SELFSIGNED}, got {mode!r}")
    port_text = (environ.get(PORT_ENV) or str(DEFAULT_PORT)).strip()
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(f"{PORT_ENV} must be a port number (1-65535), got {port_text!r}")
    config = WebhookConfig(
        mode=mode,
        addr=(environ.get(ADDR_ENV) or DEFAULT_ADDR).strip(),
        port=int(port_text),
        cert_file=environ.get(CERT_ENV) or None,
        key_file=environ.get(KEY_ENV) or None,
        host=environ.get(HOST_ENV) or None,
        ca_dump=environ.get(CA_DUMP_ENV) or None,
    )
    if mode == TLS and not (config.cert_file and config.key_file):
        raise ConfigError(f"{MODE_ENV}={TLS} needs {CERT_ENV} and {KEY_ENV}")
    return config


def server(config: WebhookConfig) -> kopf.WebhookServerProtocol:
    """The kopf webhook server for ``config``; for ``off``, one that serves nothing.

    kopf refuses to start with admission handlers and no server, so "off" is a server
    that never listens rather than none at all.
    """
    if config.mode == OFF:
        return _no_server
    if config.mode == TLS:
        return CheckedWebhookServer(
            addr=config.addr, port=config.port, certfile=config.cert_file, pkeyfile=config.key_file
        )
    # kopf generates a self-signed certificate for host and addr (needs the `certbuilder` package).
    return CheckedWebhookServer(addr=config.addr, port=config.port, host=config.host, cadump=config.ca_dump)


def review_problem(review: Any) -> str | None:
    """What makes ``review`` not an AdmissionReview request that kopf can answer, or ``None``.

    kopf answers most malformed reviews with 400 itself; a review without ``request`` or
    ``request.resource`` would end in a KeyError and a bare 500 there.
    """
    if not isinstance(review, Mapping):
        return "an AdmissionReview must be a JSON object"
    if review.get("kind") != "AdmissionReview":
        return f"kind must be AdmissionReview, got {review.get('kind')!r}"
    request = review.get("request")
    if not isinstance(request, Mapping):
        return "request is missing"
    if not isinstance(request.get("uid"), str) or not request["uid"]:
        return "request.uid is missing"
    resource = request.get("resource")
    if not isinstance(resource, Mapping) or not all(isinstance(resource.get(k), str) for k in ("group", "version")):
        return "request.resource (group, version, resource) is missing"
    if not isinstance(resource.get("resource"), str):
        return "request.resource.resource is missing"
    if not isinstance(request.get("object") or request.get("oldObject"), Mapping):
        return "request.object is missing"
    return None


def too_many_values(obj: Any) -> str | None:
    """Why an object is past :data:`MAX_OBJECT_VALUES` JSON values (each object, list, string, number), or None.

    Counted without recursion, each list's and object's members before they are walked, so the count
    stops at the bound whatever the object holds.
    """
    count, stack = 0, [obj]
    while stack:
        item = stack.pop()
        count += 1
        if isinstance(item, Mapping):
            count += len(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            count += len(item)
            stack.extend(item)
        if count > MAX_OBJECT_VALUES:
            return f"the object holds more than {MAX_OBJECT_VALUES} JSON values, more than the operator reads"
    return None


def answer_without_kopf(review: Mapping[str, Any], problem: str) -> dict[str, Any]:
    """The AdmissionReview answer to a review past the bounds: a pod as it is, with a warning; else refused."""
    request = review["request"]
    response: dict[str, Any] = {"uid": request["uid"]}
    if request["resource"]["resource"] == "pods":
        response |= {"allowed": True, "warnings": [f"compilecache: pod admitted unchanged: {problem}"]}
    else:
        response |= {"allowed": False, "status": {"code": 422, "message": problem}}
    return {
        "apiVersion": review.get("apiVersion", "admission.k8s.io/v1"),
        "kind": "AdmissionReview",
        "response": response,
    }


class CheckedWebhookServer(kopf.WebhookServer):
    """kopf's HTTPS webhook server, answering a malformed AdmissionReview with 400 and the reason, and one past
    :data:`MAX_REVIEW_BYTES` or :data:`MAX_OBJECT_VALUES` before kopf parses or copies it."""

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        """Serve ``fn`` behind a check of each review's shape and size."""

        async def checked(request: Any, **kwargs: Any) -> Any:
            problem = review_problem(request)
            if problem is not None:
                # aiohttp turns this into the HTTP answer; the API server then applies failurePolicy.
                raise aiohttp.web.HTTPBadRequest(reason=problem)
            payload = request["request"]
            too_large = too_many_values(payload.get("object") or payload.get("oldObject"))
            if too_large is not None:
                return answer_without_kopf(request, too_large)
            return await fn(request, **kwargs)

        async for client_config in super().__call__(checked):
            yield client_config

    @staticmethod
    async def _serve(fn: kopf.WebhookFn, request: aiohttp.web.Request) -> aiohttp.web.Response:
        """kopf's own serving of one request, unless its body is past :data:`MAX_REVIEW_BYTES`: then 413
        before a byte of it is parsed (kube-apiserver sends a Content-Length; the API server then applies
        the webhook's failurePolicy: a pod is admitted as it is, a CompileCache refused)."""
        length = request.content_length
        if length is not None and length > MAX_REVIEW_BYTES:
            raise aiohttp.web.HTTPRequestEntityTooLarge(max_size=MAX_REVIEW_BYTES, actual_size=length)
        return await kopf.WebhookServer._serve(fn, request)


async def _no_server(fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
    """A webhook "server" that never listens and never yields a client config."""
    import asyncio

    await asyncio.Event().wait()
    yield kopf.WebhookClientConfig()  # pragma: no cover  (never reached; makes this a generator)
