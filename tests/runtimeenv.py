"""The injected runtime as the pods get it, and training images' Pythons that do not contain the product.

:func:`runtime_tree` runs the install lines of ``images/runtime/Dockerfile`` into a throwaway
folder: the tree its init container copies into a pod. :func:`image_python` is a Python
environment such as a training image has: one interpreter (3.10 to 3.13, from pyenv or ``PATH``)
with only jax (the lock's version; on 3.10 the newest JAX for it) and what jax itself requires.
:func:`torch_python` is a PyTorch training image's (torch alone). The environments are kept in
``.venv-runtime-py3.X/`` (and ``-torch``) at the repository root (git-ignored), so a
second run reuses them; a missing interpreter or an unreachable registry skips with the reason.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from chartrender import ROOT

DOCKERFILE = ROOT / "images" / "runtime" / "Dockerfile"
# Where the Dockerfile's build stage puts the folder, and where its venv is.
TREE_IN_IMAGE = "/opt/runtime"
VENV_IN_IMAGE = "/opt/compilecache"
# JAX 0.7 needs Python 3.11 (its wheels' Requires-Python); a training image on 3.10 has at most 0.6.2.
NEWEST_JAX_FOR = {"3.10": "0.6.2"}
# Comma-separated Python versions whose absence fails the runtime's tests rather than skipping them.
REQUIRED_ENV = "TEST_REQUIRE_PYTHONS"


def install_lines() -> list[str]:
    """The build stage's RUN commands, one per ``&&`` (the Dockerfile's own order)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    lines = [line[4:] for line in text.splitlines() if line.startswith("RUN ")]
    return [" ".join(part.split()) for line in lines for part in line.split("&&")]


def runtime_tree(scratch: Path) -> Path:
    """The Dockerfile's install lines run into ``scratch``: its ``/opt/runtime``, returned."""
    context = scratch / "src"
    context.mkdir(parents=True)
    for name in ("pyproject.toml", "constraints.txt", "README.md"):
        shutil.copy2(ROOT / name, context / name)
    shutil.copytree(ROOT / "operator", context / "operator", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    tree = scratch / "runtime"
    for command in install_lines():
        command = command.replace(VENV_IN_IMAGE, str(scratch / "venv")).replace(TREE_IN_IMAGE, str(tree))
        command = command.replace("/src", str(context)).replace(" --no-cache-dir", "")
        command = re.sub(r"^python -m venv ", f"{sys.executable} -m venv ", command)
        run_or_fail(command, cwd=scratch, shell=True)
    return tree


def shared_runtime_tree(factory: pytest.TempPathFactory) -> Path:
    """:func:`runtime_tree`, built once per pytest session: its modules (on any xdist worker) only read it.

    The folder is the session's base temporary directory, which xdist's workers share as the
    parent of their own (``pytest-N/popen-gwK``); the tree is built from this checkout's source
    as it is when the session runs, so it is never reused by a later session.
    """
    base = factory.getbasetemp()
    session = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    scratch, done = session / "runtime-image", session / "runtime-image.built"
    with _locked(session / "runtime-image.lock"):
        if not done.exists():
            shutil.rmtree(scratch, ignore_errors=True)  # a build that failed part-way
            runtime_tree(scratch)
            done.touch()
    return scratch / "runtime"


def run_or_fail(command: list[str] | str, cwd: Path, shell: bool = False, timeout: int = 600) -> str:
    done = subprocess.run(
        command, shell=shell, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False, env=bare_env()
    )
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def bare_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything that would change what a child Python imports or caches."""
    drop = ("JAX_", "XLA_", "MODEL_", "COMPILECACHE_", "PYTHON", "VIRTUAL_ENV", "TORCHINDUCTOR_")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)} | extra


def interpreter(version: str) -> str:
    """The path of a Python ``version`` (``3.10``) on this machine, or skip naming where it was looked for."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = sorted(glob.glob(str(pyenv / f"{version}.*" / "bin" / f"python{version}")))
    found = shutil.which(f"python{version}")
    # pyenv's shims answer "command not found" for a version that is not the selected one.
    if not candidates and found and "/shims/" not in found:
        candidates = [found]
    if not candidates:
        missing = f"no Python {version} here (looked for python{version} on PATH and in {pyenv})"
        # CI names the versions it must run (.ci/run): there a missing one fails instead of skipping.
        if version in os.environ.get(REQUIRED_ENV, "").split(","):
            pytest.fail(f"{missing}; ${REQUIRED_ENV} requires it")
        pytest.skip(missing)
    return str(candidates[-1])


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    # Two pytest-xdist workers may want the same environment: one builds, the other waits.
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def image_python(version: str, jax_version: str) -> Path:
    """The bin folder of ``.venv-runtime-pyVERSION`` with only jax (``NEWEST_JAX_FOR`` where the lock's has none)."""
    jax_version = NEWEST_JAX_FOR.get(version, jax_version)
    return _environment(version, f".venv-runtime-py{version}", [f"jax=={jax_version}", f"jaxlib=={jax_version}"])


def torch_python(version: str, torch_version: str) -> Path:
    """The bin folder of ``.venv-runtime-pyVERSION-torch`` with only torch (and what torch requires).

    A PyTorch training image's Python: the CPU build, where pip finds one for ``version`` (3.11 here).
    """
    return _environment(version, f".venv-runtime-py{version}-torch", [f"torch=={torch_version}"])


def _environment(version: str, name: str, requirements: list[str]) -> Path:
    """The bin folder of the virtual environment ``ROOT/name`` of Python ``version`` with ``requirements``."""
    python = interpreter(version)
    venv = ROOT / name
    marker = venv / (".installed-" + requirements[0].replace("==", "-"))  # jax's: as named before torch's
    with _locked(ROOT / f"{name}.lock"):
        if not marker.exists():
            shutil.rmtree(venv, ignore_errors=True)
            run_or_fail([python, "-m", "venv", str(venv)], cwd=ROOT)
            pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
            done = subprocess.run(
                [*pip, *requirements], capture_output=True, text=True, timeout=900, check=False, env=bare_env()
            )
            if done.returncode != 0:
                lines = (done.stderr or done.stdout).strip().splitlines()
                pytest.skip(f"pip could not install {' '.join(requirements)} for Python {version}: {lines[-1:]}")
            marker.touch()
    return venv / "bin"


def has_module(bin_dir: Path, module: str) -> bool:
    """Whether the environment's own Python (run with nothing of ours on its path) finds ``module``."""
    probe = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 3)"
    done = subprocess.run([str(bin_dir / "python3"), "-c", probe], env=bare_env(), cwd="/", timeout=120, check=False)
    assert done.returncode in (0, 3), f"{bin_dir / 'python3'} could not look for {module}"
    return done.returncode == 0
