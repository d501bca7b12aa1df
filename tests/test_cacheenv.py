"""jax_cache_env is the one source of truth: check its output, and that JAX really reads each variable."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
import yaml

from compilecache.cache.cacheenv import REPORT, TERMINATION_LOG, format_env
from compilecache.cli.main import main
from compilecache.frameworks.jax.env import jax_cache_env, trainer_env
from jaxhelpers import clean_env
from specs import cache_spec


def test_env_has_jax_own_variables_with_xla_caches_off() -> None:
    env = jax_cache_env("/var/cache/compilecache")
    assert env == {
        "JAX_COMPILATION_CACHE_DIR": "/var/cache/compilecache",
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
        "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES": "none",
    }


def test_env_options_and_format() -> None:
    env = jax_cache_env("gs://b/p", min_compile_time_secs=1.5, min_entry_size_bytes=4096, xla_flags="--xla_x=1")
    assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "1.5"
    assert env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] == "4096"
    assert env["XLA_FLAGS"] == "--xla_x=1"
    lines = format_env(env).splitlines()
    assert lines == sorted(lines) and "export JAX_COMPILATION_CACHE_DIR=gs://b/p" in lines


def test_trainer_env_adds_the_report_and_on_read_only_caches_stops_writes() -> None:
    env = jax_cache_env("/c", min_compile_time_secs=1.5, xla_flags="--a")
    writer = trainer_env(env, read_only=False)
    report = {REPORT: "1", TERMINATION_LOG: "/dev/termination-log"}  # the kubelet's default file
    assert writer == env | report
    reader = trainer_env(env, read_only=True)
    assert reader == env | report | {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "1000000000"}


ODD_FLAGS = "--xla_a=1 --xla_b='two words' \"quoted\" $HOME `id` ;x"


@pytest.mark.parametrize("fmt", ["shell", "dotenv", "json", "yaml"])
def test_every_format_carries_the_exact_values(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["env", "--cache-dir", "/c d", "--read-only", f"--xla-flags={ODD_FLAGS}", "--format", fmt]) == 0
    out = capsys.readouterr().out
    expected = trainer_env(jax_cache_env("/c d", xla_flags=ODD_FLAGS), read_only=True)
    if fmt == "json":
        assert json.loads(out) == expected
    elif fmt == "yaml":
        assert {item["name"]: item["value"] for item in yaml.safe_load(out)["env"]} == expected
    elif fmt == "dotenv":
        assert dict(line.split("=", 1) for line in out.splitlines()) == expected
    else:
        assert all(line.startswith("export ") for line in out.splitlines())


def test_dotenv_refuses_a_value_it_cannot_carry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["env", "--cache-dir", "/c", "--xla-flags=--a\n--b", "--format", "dotenv"]) == 2
    assert "newline" in capsys.readouterr().err


def test_xla_flags_need_the_equals_form(capsys: pytest.CaptureFixture[str]) -> None:
    # argparse reads a separate word starting with "--" as an option: the help says to use "=".
    with pytest.raises(SystemExit):
        main(["env", "--cache-dir", "/c", "--xla-flags", "--xla_foo"])
    assert "expected one argument" in capsys.readouterr().err
    assert main(["env", "--cache-dir", "/c", "--xla-flags=--xla_foo", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["XLA_FLAGS"] == "--xla_foo"


@pytest.mark.slow
def test_eval_in_bash_exports_exactly_the_values() -> None:
    script = 'eval "$("$0" -m compilecache.cli env "$@")" && printenv XLA_FLAGS JAX_COMPILATION_CACHE_DIR ' + REPORT
    args = ["--cache-dir", "/mnt/a b", f"--xla-flags={ODD_FLAGS}"]
    done = subprocess.run(
        ["bash", "-c", script, sys.executable, *args], env=clean_env(), capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [ODD_FLAGS, "/mnt/a b", "1"]


@pytest.mark.slow
@pytest.mark.emulator
def test_env_command_with_a_name_prints_the_pod_snippet(kube_env: Any, capsys: pytest.CaptureFixture[str]) -> None:
    body = {"metadata": {"name": "llama"}, "spec": cache_spec()}
    kube_env.create("compilecache.dev/v1alpha1/compilecaches", body, "team")
    assert main(["env", "llama", "-n", "team"]) == 0
    snippet = yaml.safe_load(capsys.readouterr().out)
    text = json.dumps(snippet)
    assert "/var/cache/compilecache" in text and "jax-cache" in text
    for key, value in trainer_env(jax_cache_env("/var/cache/compilecache"), read_only=True).items():
        assert json.dumps({"name": key, "value": value})[1:-1] in text

    assert main(["env", "typo", "-n", "team"]) == 1
    assert "not found" in capsys.readouterr().err


PRINT_CONFIG = """
import json, jax
print(json.dumps({
    "dir": jax.config.jax_compilation_cache_dir,
    "min_time": jax.config.jax_persistent_cache_min_compile_time_secs,
    "min_size": jax.config.jax_persistent_cache_min_entry_size_bytes,
    "xla_caches": jax.config.jax_persistent_cache_enable_xla_caches,
    "devices": jax.device_count(),
}))
"""


@pytest.mark.slow
@pytest.mark.jax
def test_jax_reads_every_variable_from_the_environment() -> None:
    env = jax_cache_env(
        "/tmp/somewhere",
        min_compile_time_secs=2.5,
        min_entry_size_bytes=77,
        xla_flags="--xla_force_host_platform_device_count=3",
    )
    out = subprocess.run(
        [sys.executable, "-c", PRINT_CONFIG], env=clean_env(env), capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == {
        "dir": "/tmp/somewhere",
        "min_time": 2.5,
        "min_size": 77,
        "xla_caches": "none",
        "devices": 3,
    }
