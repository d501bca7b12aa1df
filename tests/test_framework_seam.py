"""The framework seam, proven by a third framework: the toy (``tests/toyframework``) through the whole loop.

The toy is registered as an installed plug-in distribution registers one: a ``*.dist-info`` whose
``entry_points.txt`` names ``toy = toyframework:FRAMEWORK`` in the ``compilecache.frameworks`` group,
on ``sys.path`` here and on ``PYTHONPATH`` for the commands. Nothing in the package names it.

Each command is the one the operator writes for a ``framework: toy`` spec (the CRD's enum admits the
built-in ones only, so the parsed spec gets ``framework="toy"`` by ``dataclasses.replace``): the
warm-up Job's container command and environment, the expiry Job's command, a trainer's environment
as the webhook adds it. Each runs as a real process, with the container's paths mapped to local
folders as the local cluster's kubelet maps them (``compilecache.local.pods.map_value``), and what it
leaves (the cache's files, the termination messages) is read back by the operator's own readers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compilecache import frameworks
from compilecache.cache.cacheenv import DEFAULT_TERMINATION_LOG
from compilecache.controller import admission, expiryjob, jobs, reports, status
from compilecache.controller.api import CacheSpec, parse_cache
from compilecache.controller.pools import resolve_pools
from compilecache.local.pods import map_value
from specs import cache, cluster

TESTS = Path(__file__).resolve().parent
TOY = TESTS / "toyframework"  # the toy's folder: the training script's working directory (an image's WORKDIR)
TIMEOUT = 120  # seconds any one command may take on a busy machine
WARMUP = {
    "image": "registry.example/toy-trainer:1",
    # The warm-up runs the first 3 steps of a 5-step training (one program per step).
    "workloads": [{"name": "train", "script": "train.py", "steps": 3, "args": ["--steps", "5"]}],
    "discover": {"nodeSelector": {"nvidia.com/gpu.present": "true"}},
}
LIFECYCLE = {"maxAge": "1d", "verify": True}
DAY = 86400.0


def register(site: Path, target: str = "toyframework:FRAMEWORK") -> None:
    """The metadata a plug-in's wheel installs: the toy's entry point, found by importlib.metadata."""
    info = site / "compilecache_toy-0.0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: compilecache-toy\nVersion: 0.0.0\n")
    (info / "entry_points.txt").write_text(f"[{frameworks.ENTRY_POINTS}]\ntoy = {target}\n")


def installed(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``site`` and the toy's code importable here and in every command this test starts."""
    for path in (TESTS, site):
        monkeypatch.syspath_prepend(str(path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(TESTS), os.environ.get("PYTHONPATH", "")]))


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The toy, registered as an installed distribution."""
    site = tmp_path / "site"
    register(site)
    installed(site, monkeypatch)
    yield site


def run(argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: Path = TOY) -> subprocess.CompletedProcess[str]:
    """A command as a container runs it: this environment's ``bin`` first on ``PATH``, bounded in time."""
    base = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    return subprocess.run(
        list(argv), env={**base, **(env or {})}, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )


def toy_spec() -> tuple[dict[str, Any], CacheSpec]:
    """A CompileCache object and its parsed spec, with ``framework: toy``."""
    obj = cache("toy-cache", warmup=WARMUP, lifecycle=LIFECYCLE)
    return obj, dataclasses.replace(parse_cache(obj), framework="toy")


def finished_pod(container: str, message: str) -> dict[str, Any]:
    """A pod as the kubelet reports it once ``container`` exited 0 with ``message`` as its termination message."""
    terminated = {"exitCode": 0, "message": message, "finishedAt": "2026-01-01T00:00:00Z"}
    return {
        "status": {
            "phase": "Succeeded",
            "containerStatuses": [{"name": container, "state": {"terminated": terminated}}],
        }
    }


def published(cache_dir: Path) -> set[str]:
    return {path.name for path in (cache_dir / "toy").glob("*.toy")}


@pytest.mark.slow
def test_the_toy_goes_through_warm_expire_env_and_a_verdict(plugin: Path, tmp_path: Path) -> None:
    obj, spec = toy_spec()
    cache_dir, pod_tmp = tmp_path / "cache", tmp_path / "pod-tmp"
    pod_tmp.mkdir()
    logs = {name: tmp_path / f"{name}.termination-log" for name in ("warm", "expire", "train")}
    for log in logs.values():
        log.touch()  # the kubelet makes each container's empty file first

    def mapped(value: str, log: str) -> str:
        """A container's path as a local one: the cache's mount, the termination log, ``/tmp``."""
        table = [
            (spec.mount_path, str(cache_dir)),
            (DEFAULT_TERMINATION_LOG, str(logs[log])),
            (jobs.TMP_DIR, str(pod_tmp)),
        ]
        return map_value(value, table)

    def env_of(items: Sequence[Mapping[str, str]], log: str) -> dict[str, str]:
        return {item["name"]: mapped(item["value"], log) for item in items}

    # Warm: the warm-up Job's own container, command and environment.
    job = jobs.warmup_job(obj, spec, resolve_pools(spec, cluster())[0])
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["command"][:4] == ["compilecache", "warm", "--framework", "toy"]
    env = env_of(container["env"], "warm")
    assert jobs.warmup_env(spec).items() <= env.items() and env["TOY_FORMAT"] == "1"
    warmed = run([mapped(value, "warm") for value in container["command"]], env)
    assert warmed.returncode == 0, warmed.stderr
    steps = [f"step_{k}" for k in (1, 2, 3)]  # 3 of the script's 5 steps: the workload's steps
    assert sorted(name.split("-")[0] for name in published(cache_dir)) == steps
    pool = status.warm_report([finished_pod("warm", logs["warm"].read_text())])
    assert pool is not None
    assert (pool["entries"], pool["verifyHits"], pool["verifyRequests"]) == (3, 3, 3)
    assert (pool["steps"][0]["calls"], pool["steps"][0]["stoppedBy"]) == (3, "steps")

    # Expire: step_1 is older than maxAge, step_3's bytes no longer match its manifest; step_2 stays.
    entry = {name.split("-")[0]: cache_dir / "toy" / name for name in published(cache_dir)}
    now = time.time()
    os.utime(entry["step_1"], (now - 3 * DAY, now - 3 * DAY))
    entry["step_3"].write_text("not what was compiled\n")
    os.utime(entry["step_3"], (now - 3600, now - 3600))  # past expiry's grace period
    expired = run([mapped(value, "expire") for value in expiryjob.expire_command(spec)])
    assert expired.returncode == 0, expired.stderr
    assert published(cache_dir) == {entry["step_2"].name}
    summary = expiryjob.parse_summary(logs["expire"].read_text())
    assert summary is not None and summary["deleted"]["maxAge"] == summary["deleted"]["integrity"] == 1
    assert expiryjob.describe(summary).startswith("warmed and expired: deleted 1 by integrity, 1 by maxAge; 1 entries")

    # Env: `compilecache env` prints what the webhook gives a training container.
    printed = run(["compilecache", "env", "--framework", "toy", "--cache-dir", spec.mount_path, "--format", "json"])
    assert printed.returncode == 0, printed.stderr
    pod_env = admission.env_list(spec)
    assert json.loads(printed.stdout) == {item["name"]: item["value"] for item in pod_env}
    assert admission.read_only(spec)  # mounted read-only, and the toy runtime is told so

    # A trainer of 2 steps: step_2 hits, step_1 was expired; its verdict is counted by the operator.
    trained = run([sys.executable, "train.py", "--steps", "2"], env_of(pod_env, "train"))
    assert trained.returncode == 0, trained.stderr
    assert "compilecache: 1/2 programs hit; missed: step_1 (not warmed)" in trained.stderr
    assert published(cache_dir) == {entry["step_2"].name}  # the trainer wrote nothing
    counted, refused = reports.counted([finished_pod("train", logs["train"].read_text())])
    assert refused == []
    totals = reports.totals(counted)
    assert (totals["hits"], totals["requests"]) == (1, 2)
    assert totals["lastMissReason"].startswith("step_1: not warmed")


@pytest.mark.slow
def test_help_lists_the_toy_only_where_its_entry_point_is_installed(plugin: Path) -> None:
    def choices(pythonpath: str) -> list[str]:
        shown = run(["compilecache", "warm", "--help"], {"PYTHONPATH": pythonpath})
        assert shown.returncode == 0, shown.stderr
        found = re.search(r"--framework \{([a-z,]+)\}", shown.stdout)
        assert found, shown.stdout
        return found[1].split(",")

    assert choices(os.environ["PYTHONPATH"]) == ["jax", "pytorch", "toy"]
    assert choices(str(TESTS)) == ["jax", "pytorch"]  # the toy's code alone registers nothing


@pytest.mark.slow
def test_a_framework_without_a_demo_says_so_in_one_line(plugin: Path) -> None:
    """``demo`` is optional in the seam: the toy has none, and ``compilecache demo`` says so."""
    refused = run(["compilecache", "demo", "--framework", "toy"])
    assert refused.returncode == 2
    assert refused.stderr == "compilecache demo: error: --framework toy has no demo\n", refused.stderr


@pytest.mark.slow
@pytest.mark.parametrize("command", ["warm", "expire", "env"])
def test_an_unknown_framework_is_refused_in_one_line(plugin: Path, tmp_path: Path, command: str) -> None:
    refused = run(["compilecache", command, "--framework", "tyo", "--cache-dir", str(tmp_path)])
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert "invalid choice: 'tyo' (choose from 'jax', 'pytorch', 'toy')" in refused.stderr


def test_the_registry_finds_the_toy_by_its_entry_point(plugin: Path) -> None:
    import toyframework

    assert frameworks.names() == ("jax", "pytorch", "toy")
    assert frameworks.get("toy") is toyframework.FRAMEWORK


def test_without_its_entry_point_the_toy_is_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    installed(tmp_path / "empty", monkeypatch)  # the toy's code importable, its registration absent
    assert "toy" not in frameworks.names()
    with pytest.raises(
        frameworks.UnknownFramework, match="unknown framework 'toy': this installation has jax, pytorch"
    ):
        frameworks.get("toy")


def test_an_entry_point_to_no_framework_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    register(site, "toyframework:NAME")  # a string, not a Framework
    installed(site, monkeypatch)
    with pytest.raises(frameworks.UnknownFramework, match="its FRAMEWORK is no Framework named 'toy'"):
        frameworks.get("toy")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("toybroken:FRAMEWORK", "cannot be loaded (ImportError: the toy needs a library this image lacks)"),
        ("toyframework:NAME", "its FRAMEWORK is no Framework named 'toy'"),
    ],
)
@pytest.mark.parametrize("command", ["warm", "expire", "env", "demo"])
def test_a_broken_registration_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, target: str, why: str
) -> None:
    """A plug-in that fails to load (its import raises, or it names no Framework) is bad input: one
    line naming the framework and why, exit 2; not a traceback, which the CLI keeps for its own bugs."""
    site = tmp_path / "site"
    register(site, target)
    (site / "toybroken.py").write_text('raise ImportError("the toy needs a library this image lacks")\n')
    installed(site, monkeypatch)
    refused = run(["compilecache", command, "--framework", "toy", "--cache-dir", str(tmp_path / "cache")])
    assert (refused.returncode, refused.stderr.count("\n")) == (2, 1), refused.stderr
    assert refused.stderr.startswith(f"compilecache {command}: error: framework 'toy' "), refused.stderr
    assert why in refused.stderr, refused.stderr


@given(st.text(min_size=1, max_size=40).filter(lambda name: name not in frameworks.names()))
def test_any_unregistered_name_is_refused_in_one_line(name: str) -> None:
    with pytest.raises(frameworks.UnknownFramework) as refused:
        frameworks.get(name)
    assert "\n" not in str(refused.value)
    assert str(refused.value).endswith(f"this installation has {', '.join(frameworks.names())}")


def test_the_toy_refuses_what_only_jax_reads(plugin: Path) -> None:
    """The toy's own spec check, through the seam, names each JAX-only option it would otherwise ignore."""
    warmup = {
        **WARMUP,
        "workloads": [{"name": "aot", "entrypoint": "m:f"}, {"name": "t", "script": "t.py", "stepFn": "s"}],
        "jax": {"minCompileTimeSecs": 0, "xlaFlags": "--xla_x=1"},
    }
    assert frameworks.get("toy").spec_problems(warmup) == [
        ("spec.warmup.workloads[0].entrypoint", "is not a toy setting; spec.framework is toy"),
        ("spec.warmup.workloads[1].stepFn", "is not a toy setting; spec.framework is toy"),
        ("spec.warmup.jax.xlaFlags", "is a JAX setting; spec.framework is toy"),
    ]
    assert frameworks.get("toy").spec_problems(WARMUP) == []
