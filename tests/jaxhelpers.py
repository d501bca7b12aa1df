"""Helpers for the real-JAX warmer tests: run the CLI and fresh JAX processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# A tiny model keeps every compile well under a second on 2 cores.
TINY_MODEL = {
    "MODEL_LAYERS": "1",
    "MODEL_WIDTH": "32",
    "MODEL_SEQ": "8",
    "MODEL_BATCH": "4",
    "MODEL_VOCAB": "64",
}

TINY_WORKLOAD = """
import jax, jax.numpy as jnp
from compilecache import Target

def targets():
    spec = jax.ShapeDtypeStruct((16, 16), jnp.float32)
    return [
        Target("matmul", jax.jit(lambda x, y: jnp.tanh(x @ y).sum()), (spec, spec)),
        Target("cosine", jax.jit(lambda x: jnp.cos(x) * 2.0), (spec,)),
        Target("scaled", jax.jit(lambda x, s: x * s, static_argnums=1), (spec, 3.0)),
    ]
"""


def inherited_pythonpath(first: Sequence[Path | str], environ: Mapping[str, str] = os.environ) -> str:
    """A child's ``PYTHONPATH``: ``first``, then the entries of the caller's own ``PYTHONPATH``.

    Kept, not replaced: where a machine's packages come from ``PYTHONPATH`` (wheels unpacked into
    a folder, as on the GPU machine), a child without them cannot import the product's
    dependencies. Empty entries are dropped: CPython reads one as the working directory
    (measured: ``PYTHONPATH=/x:`` puts the current folder on ``sys.path``).
    """
    ours = [str(path) for path in first]
    theirs = [entry for entry in environ.get("PYTHONPATH", "").split(os.pathsep) if entry and entry not in ours]
    return os.pathsep.join(ours + theirs)


def clean_env(extra: Mapping[str, str] | None = None, pythonpath: Sequence[Path] = ()) -> dict[str, str]:
    """The test process's environment without JAX/XLA settings, plus ``extra``."""
    # COMPILECACHE_*: an in-process `warm` (CLI tests) sets COMPILECACHE_REPORT=0 in this process.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_", "MODEL_", "COMPILECACHE_"))}
    # This tree's package first (operator/ is the source root), then the repository for
    # examples.*: never the copy a virtual environment has installed from another tree.
    env["PYTHONPATH"] = inherited_pythonpath([*pythonpath, REPO / "operator", REPO])
    env.update(extra or {})
    return env


def write_module(folder: Path, name: str, source: str) -> Path:
    """Write ``name.py`` (dedented) into ``folder`` and return the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    return folder


def run_cli(args: Sequence[str], env: Mapping[str, str], cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """``python -m compilecache.cli ARGS`` in a fresh process."""
    return subprocess.run(
        [sys.executable, "-m", "compilecache.cli", *args],
        env=dict(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def run_trainer(script: Path, env: Mapping[str, str], termination: Path) -> tuple[dict[str, Any], str]:
    """Run a training ``script`` (in its folder) as a training pod would; its trainer's report and stderr.

    ``termination`` is the pod's termination-message file, emptied first: the trainer writes only
    into an empty one.
    """
    termination.write_text("")
    done = subprocess.run(
        [sys.executable, str(script)],
        env=dict(env),
        cwd=script.parent,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(termination.read_text())
    return report, done.stderr


def declare_trainer_plugin(folder: Path) -> Path:
    """A throwaway ``*.dist-info`` in ``folder`` declaring the package's ``jax_plugins`` entry point
    (as pyproject.toml does): with ``folder`` on ``PYTHONPATH`` JAX loads the trainer's report even
    where this tree is not installed. Returns ``folder``."""
    import tomllib

    info = folder / "compilecache_report_test-0.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: compilecache-report-test\nVersion: 0.0\n")
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["jax_plugins"]
    (info / "entry_points.txt").write_text(
        "[jax_plugins]\n" + "".join(f"{name} = {value}\n" for name, value in declared.items())
    )
    return folder


def run_train(env: Mapping[str, str], *extra: str) -> dict[str, Any]:
    """``examples/train.py --json --steps 1`` in a fresh process; its JSON result."""
    return run_json_script("train.py", env, "--steps", "1", *extra)


PROBE = """
import json, sys
import jax
counts = {"req": 0, "hit": 0}
def on(event, **_):
    if event == "/jax/compilation_cache/compile_requests_use_cache": counts["req"] += 1
    if event == "/jax/compilation_cache/cache_hits": counts["hit"] += 1
jax.monitoring.register_event_listener(on)
import importlib
module, func = sys.argv[1].split(":")
for target in getattr(importlib.import_module(module), func)():
    target.fn.lower(*target.args, **dict(target.kwargs)).compile()
print(json.dumps(counts))
"""


def probe_hits(spec: str, env: Mapping[str, str]) -> dict[str, int]:
    """In a fresh process with plain JAX settings from ``env``, compile a workload's targets;
    return cache requests and hits (no code of the warmer involved)."""
    return run_json([sys.executable, "-c", PROBE, spec], env)


def entry_files(cache: Path) -> list[str]:
    """Published entry file names at the top of a cache dir."""
    return sorted(p.name for p in cache.iterdir() if p.name.endswith("-cache"))


# The Flax example over 4 CPU devices (examples/workloads/flax_mlp.py, examples/train_flax.py).
FOUR_CPUS = "--xla_force_host_platform_device_count=4"


def run_flax_train(env: Mapping[str, str], *extra: str) -> dict[str, Any]:
    """``examples/train_flax.py --json`` in a fresh process; its JSON result."""
    return run_json_script("train_flax.py", env, *extra)


def run_json_script(script: str, env: Mapping[str, str], *args: str) -> dict[str, Any]:
    """``examples/SCRIPT --json ARGS`` in a fresh process: the JSON object its last line prints."""
    return run_json([sys.executable, str(REPO / "examples" / script), "--json", *args], env)


def run_json(argv: Sequence[str], env: Mapping[str, str]) -> dict[str, Any]:
    """``argv`` in a fresh process (from the repository root) that must exit 0: the JSON its last line prints."""
    completed = subprocess.run(
        list(argv), env=dict(env), cwd=REPO, capture_output=True, text=True, timeout=240, check=False
    )
    assert completed.returncode == 0, completed.stderr
    result: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return result
