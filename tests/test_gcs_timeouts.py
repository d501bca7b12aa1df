"""A dead GCS endpoint fails ``expire`` and ``warm`` quickly, with one line, instead of hanging.

Real sockets on the loopback, real gcsfs and aiohttp in a fresh ``compilecache`` process:
an endpoint that accepts connections and never answers, and a closed port.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

import gcsemulator
from compilecache.cache.errors import WarmError
from compilecache.cache.store import DEFAULT_GCS_TIMEOUT_SECONDS, GCS_TIMEOUT_ENV, gcs_timeout
from jaxhelpers import REPO, clean_env

# The tests pass a short budget so that CI does not wait the default; one test runs the default.
SHORT = 1.5


@pytest.fixture
def silent() -> Iterator[str]:
    """A listening socket that the kernel completes handshakes for, and nobody ever reads."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


@pytest.fixture
def closed() -> str:
    """A loopback port with nothing listening: connections are refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def run(
    argv: list[str], endpoint: str, budget: float | None, bound: float
) -> tuple[subprocess.CompletedProcess[str], float]:
    env = clean_env({**gcsemulator.ENV, "STORAGE_EMULATOR_HOST": endpoint})
    if budget is not None:
        env[GCS_TIMEOUT_ENV] = str(budget)
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "compilecache.cli", *argv],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=bound,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"compilecache {argv[0]} still running after {bound:g}s against a dead endpoint {endpoint}")
    return done, time.monotonic() - started


def one_error_line(done: subprocess.CompletedProcess[str], command: str) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(f"compilecache {command}: error: ")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    return errors[0]


@pytest.mark.slow
@pytest.mark.parametrize("endpoint", ["silent", "closed"])
def test_expire_fails_fast_on_a_dead_endpoint(endpoint: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue(endpoint)
    done, seconds = run(["expire", "--cache-dir", "gs://b/p"], url, SHORT, bound=30)
    assert done.returncode == 2, done.stderr
    line = one_error_line(done, "expire")
    assert "gs://b/p: list: GCS did not answer within 1.5s of a failed request; gave up after " in line, line
    # The time it states is the time that passed, not the limit.
    stated = float(line.split("gave up after ")[1].split("s ")[0])
    assert SHORT <= stated <= seconds, (stated, seconds, line)
    assert seconds < SHORT + 12, f"took {seconds:.1f}s"


@pytest.mark.slow
def test_warm_fails_fast_on_a_dead_endpoint_before_compiling(silent: str) -> None:
    done, seconds = run(["warm", "--cache-dir", "gs://b/p", "--workload", "never.imported:targets"], silent, SHORT, 30)
    assert done.returncode == 2, done.stderr
    assert "gs://b/p: list: GCS did not answer" in one_error_line(done, "warm")
    assert seconds < SHORT + 12, f"took {seconds:.1f}s"


@pytest.mark.slow
def test_the_default_budget_ends_expire_within_a_minute(silent: str) -> None:
    done, seconds = run(["expire", "--cache-dir", "gs://b/p"], silent, None, bound=60)
    assert done.returncode == 2, done.stderr
    assert f"GCS did not answer within {DEFAULT_GCS_TIMEOUT_SECONDS:g}s" in one_error_line(done, "expire")
    assert DEFAULT_GCS_TIMEOUT_SECONDS <= seconds < 60


@pytest.mark.parametrize("text", ["0", "-1", "soon", "7200"])
def test_a_bad_budget_is_a_one_line_error(text: str) -> None:
    with pytest.raises(WarmError, match=GCS_TIMEOUT_ENV):
        gcs_timeout({GCS_TIMEOUT_ENV: text})
    assert gcs_timeout({}) == DEFAULT_GCS_TIMEOUT_SECONDS and gcs_timeout({GCS_TIMEOUT_ENV: " 2.5 "}) == 2.5
