"""compilecache.training.runtime.enable: the same settings as the env, through jax.config."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from compilecache.frameworks.jax.env import jax_cache_env
from compilecache.training.runtime import config_updates, enable
from jaxhelpers import clean_env, entry_files


def test_config_names_are_the_lowercased_variables() -> None:
    updates = config_updates(jax_cache_env("/c", xla_flags="--x=1"))
    assert updates == {
        "jax_compilation_cache_dir": "/c",
        "jax_persistent_cache_min_compile_time_secs": "0",
        "jax_persistent_cache_min_entry_size_bytes": "0",
        "jax_persistent_cache_enable_xla_caches": "none",
    }


def test_enable_without_a_dir_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    with pytest.raises(ValueError, match="JAX_COMPILATION_CACHE_DIR"):
        enable()


ENABLE_AND_COMPILE = """
import json, sys, jax, jax.numpy as jnp
from compilecache.training import runtime
hits = []
jax.monitoring.register_event_listener(lambda e, **_: hits.append(e) if e.endswith("cache_hits") else None)
runtime.enable(sys.argv[1] if sys.argv[1] != "-" else None)
jax.jit(lambda x: jnp.sin(x) + 1).lower(jax.ShapeDtypeStruct((8, 8), jnp.float32)).compile()
print(json.dumps({"hits": len(hits), "xla_caches": jax.config.jax_persistent_cache_enable_xla_caches}))
"""


@pytest.mark.slow
@pytest.mark.jax
def test_enable_writes_then_a_process_configured_by_env_hits(tmp_path: Path) -> None:
    cache = tmp_path / "cache"

    def run(arg: str, env: dict[str, str]) -> dict[str, object]:
        out = subprocess.run(
            [sys.executable, "-c", ENABLE_AND_COMPILE, arg],
            env=clean_env(env),
            capture_output=True,
            text=True,
            check=True,
        )
        result: dict[str, object] = json.loads(out.stdout)
        return result

    assert run(str(cache), {}) == {"hits": 0, "xla_caches": "none"}
    assert len(entry_files(cache)) == 1
    # enable(None) takes the directory from the environment; the key is the same.
    assert run("-", {"JAX_COMPILATION_CACHE_DIR": str(cache)}) == {"hits": 1, "xla_caches": "none"}
