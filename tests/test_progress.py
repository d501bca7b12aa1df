"""Progress while warming: the pod log shows each target or compile as it starts and ends, a
heartbeat during a long compile, and totals (compilecache.frameworks.jax.progress).

The heartbeat is tested without sleeping: the item stays open until the stream has received a
heartbeat line (a bounded wait on an event the stream sets), with a short period.
"""

from __future__ import annotations

import io
import re
import threading
from pathlib import Path

import pytest

from compilecache.frameworks.jax.progress import DEFAULT_PERIOD, PERIOD_ENV, Progress, period_from_env
from jaxhelpers import REPO, clean_env, run_cli


class Watched(io.StringIO):
    """A stream that says when a line containing ``wanted`` arrived."""

    def __init__(self, wanted: str) -> None:
        super().__init__()
        self.wanted = wanted
        self.seen = threading.Event()

    def write(self, text: str) -> int:
        if self.wanted in text:
            self.seen.set()
        return super().write(text)


def test_an_item_has_a_start_an_end_and_a_heartbeat_while_it_runs() -> None:
    out = Watched("still compiling")
    with Progress(out=out, period=0.01, entry_bytes=lambda keys: 100 * len(keys)) as progress:
        progress.begin("k", "train:targets step", 2, 5)
        assert out.seen.wait(timeout=10), f"no heartbeat within 10 s: {out.getvalue()!r}"
        progress.end("k", outcome="1/1 compiled", keys_written=["a", "b"], seconds=95.25)
    lines = out.getvalue().splitlines()
    assert lines[0] == "[2/5] compiling train:targets step"
    assert re.fullmatch(r"\[2/5\] still compiling train:targets step: \d+ s", lines[1]), lines
    assert lines[-1] == "[2/5] done train:targets step: 95.25s, 1/1 compiled, 2 entries written (200 bytes)"
    assert progress.totals("targets") == "1 targets in 95.25s: 2 entries (200 bytes) written"


def test_no_heartbeat_after_the_item_ended() -> None:
    out = Watched("compiled")
    with Progress(out=out, period=3600) as progress:
        progress.begin(1, "x")
        progress.end(1, outcome="compiled", keys_written=["a"], seconds=0.5)
    assert "still" not in out.getvalue() and "(" not in out.getvalue().splitlines()[-1]  # no size: unknown


def test_the_period_comes_from_the_environment() -> None:
    assert period_from_env({PERIOD_ENV: "0.5"}) == 0.5
    assert period_from_env({}) == DEFAULT_PERIOD == 30.0
    assert period_from_env({PERIOD_ENV: "soon"}) == period_from_env({PERIOD_ENV: "-1"}) == DEFAULT_PERIOD


@pytest.mark.slow
@pytest.mark.jax
def test_a_warm_logs_every_target_with_index_seconds_bytes_and_totals(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    argv = ["warm", "--cache-dir", str(cache), "--workload", "examples.workloads.transformer:targets", "--no-verify"]
    done = run_cli(argv, clean_env({PERIOD_ENV: "0.05"}))
    assert done.returncode == 0, done.stderr
    log = done.stdout
    names = ["init_state", "train_step"]
    for index, name in enumerate(names, 1):
        assert f"[{index}/2] compiling examples.workloads.transformer:targets {name}\n" in log, log
        done_line = re.search(
            rf"\[{index}/2\] done \S+ {name}: ([\d.]+)s, 1/1 compiled, 1 entry written \((\d+) bytes\)", log
        )
        assert done_line and int(done_line[2]) > 0, log
    assert log.index("[1/2] done") < log.index("[2/2] compiling")  # as it happens, not at the end
    totals = re.search(r"^compiled 2 targets in [\d.]+s: 2 entries \((\d+) bytes\) written$", log, re.MULTILINE)
    published = re.search(r"^published 2 entries \((\d+) bytes\)", log, re.MULTILINE)
    assert totals and published and totals[1] == published[1], log
    # Each compile here takes far longer than 0.05 s (a transformer step): the log says it still runs.
    assert re.search(r"\[2/2\] still compiling \S+ train_step: \d+ s", log), log


@pytest.mark.slow
@pytest.mark.jax
def test_exact_mode_logs_each_compile_as_jax_reports_it(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    argv = ["warm", "--cache-dir", str(cache), "--script", "examples/train.py", "--no-verify"]
    done = run_cli(argv, clean_env({PERIOD_ENV: "0.05"}), cwd=REPO)
    assert done.returncode == 0, done.stderr
    log = done.stdout
    assert re.search(r"^compiling jit\(_?train_step\) \(examples/train.py, #\d+\)$", log, re.MULTILINE), log
    ended = re.findall(
        r"^done (jit\(\w+\)) \(examples/train.py, #\d+\): [\d.]+s, compiled, 1 entry written \(\d+ bytes\)",
        log,
        re.MULTILINE,
    )
    assert any("train_step" in name for name in ended), log
    total = re.search(
        r"^examples/train.py: (\d+) compiles in [\d.]+s: (\d+) entries \(\d+ bytes\) written$", log, re.MULTILINE
    )
    assert total and int(total[1]) >= len(ended) >= 2, log
    assert "still compiling jit(" in log, log
