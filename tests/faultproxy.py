"""A real HTTP proxy in front of fake-gcs-server that refuses chosen writes, as GCS does at a quota.

Point ``STORAGE_EMULATOR_HOST`` at :attr:`FaultProxy.url`: every request is forwarded to the
emulator unchanged, except that the writes (POST, PUT, PATCH, DELETE) numbered in
:attr:`FaultProxy.refuse` (from 1, in the order they arrive) are answered with an error status
and GCS's JSON error body instead, never reaching the emulator. :attr:`FaultProxy.writes`
records each write (method, path and query, first bytes of the body) for a dry run to count.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

WRITES = ("POST", "PUT", "PATCH", "DELETE")
# What GCS answers when a project's quota is spent (403) or a rate limit is hit (429).
REASONS = {403: "quotaExceeded", 429: "rateLimitExceeded", 503: "backendError"}


class FaultProxy:
    """The proxy's state: where it forwards, which writes it refuses, what it saw."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream)
        self.refuse: dict[int, int] = {}  # write number → status to answer
        self.writes: list[str] = []
        self.lock = threading.Lock()
        self.url = ""

    def reset(self, refuse: dict[int, int] | None = None) -> None:
        with self.lock:
            self.refuse, self.writes = dict(refuse or {}), []


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_: object) -> None:  # quiet: the test reads proxy.writes
            pass

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if self.method in WRITES:
                with proxy.lock:
                    proxy.writes.append(f"{self.method} {self.path} {body[:600]!r}")
                    status = proxy.refuse.get(len(proxy.writes))
                if status is not None:
                    self._refuse(status)
                    return
            connection = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=30)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                connection.request(self.method, self.path, body=body or None, headers=headers)
                answer = connection.getresponse()
                data = answer.read()
                self.send_response(answer.status, answer.reason)
                head = self.command == "HEAD"  # no body: the upstream's Content-Length stands
                for key, value in answer.getheaders():
                    if key.lower() == "location":  # a resumable upload's data goes through the proxy too
                        value = value.replace(f"//{proxy.upstream.netloc}", f"//{urlsplit(proxy.url).netloc}")
                    if key.lower() not in ("transfer-encoding", "connection") and (
                        head or key.lower() != "content-length"
                    ):
                        self.send_header(key, value)
                if not head:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away (its process ended): nothing to answer
            finally:
                connection.close()

        def _refuse(self, status: int) -> None:
            reason = REASONS.get(status, "error")
            body = json.dumps(
                {"error": {"code": status, "message": f"injected {reason}", "errors": [{"reason": reason}]}}
            ).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        @property
        def method(self) -> str:
            return self.command

        do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

    return Handler


@contextmanager
def running(upstream: str) -> Iterator[FaultProxy]:
    """Serve a :class:`FaultProxy` for ``upstream`` (``http://host:port``) on a free loopback port."""
    proxy = FaultProxy(upstream)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(proxy))
    server.daemon_threads = True
    proxy.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="fault-proxy", daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
