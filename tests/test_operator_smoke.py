"""The real `compilecache operator` command, as a subprocess, against the API emulator."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from specs import cache_spec, cluster

pytestmark = [pytest.mark.slow, pytest.mark.emulator]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_operator_command_creates_jobs_and_keeps_kopf_options(kube, tmp_path: Path):
    for node in cluster():
        kube.create("v1/nodes", node)
        kube.patch("v1/nodes", node["metadata"]["name"], {"status": node["status"]}, subresource="status")
    port = _free_port()
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig), "COMPILECACHE_RESYNC_SECONDS": "1"}
    command = [sys.executable, "-m", "compilecache.cli", "operator", "--standalone", "-A"]
    command += [f"--liveness=http://127.0.0.1:{port}/healthz"]
    log = (tmp_path / "operator.log").open("w+")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        body = {"metadata": {"name": "llama"}, "spec": cache_spec()}
        kube.create("compilecache.dev/v1alpha1/compilecaches", body, "default")
        # Both Jobs: one pass creates them one after the other, a list may fall in between.
        jobs = kube.wait_for(
            lambda: (len(found := kube.list("batch/v1/jobs", "default")) == 2 and found) or process.poll(), timeout=30
        )
        assert process.poll() is None, "the operator exited"
        assert len(jobs) == 2
        status = kube.wait_for(
            lambda: (kube.get("compilecache.dev/v1alpha1/compilecaches", "llama", "default") or {}).get("status"),
            timeout=10,
        )
        assert status["phase"] == "Warming"
        # kopf's own --liveness option went through the wrapper.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
            assert answer.status == 200
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
        log.seek(0)
        output = log.read()
    assert code == 0, output
    assert "Traceback" not in output, output


def test_operator_help_lists_the_passthrough():
    answer = subprocess.run(
        [sys.executable, "-m", "compilecache.cli", "operator", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "kopf run" in answer.stdout
