"""The injected runtime (``images/runtime``) on training images' own Pythons, which hold only jax.

The tree is what the Dockerfile installs (its own lines, run into a throwaway folder); the
Pythons are 3.10 and 3.13 environments (3.12 too under ``--long``) with jax alone (``tests/runtimeenv.py``). On each,
with the tree on ``PYTHONPATH`` as the webhook and the Job builder set it: ``python3 -m
compilecache.cli`` warms the example's training script in exact mode, expires, prints the
trainer's environment, and the unchanged training script then hits every entry and prints its
verdict, loaded by JAX from the tree's ``jax_plugins`` entry point.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from chartrender import ROOT
from runtimeenv import bare_env, image_python, shared_runtime_tree
from test_versions import locked

TRAIN = ROOT / "examples" / "train.py"
TINY = {"MODEL_LAYERS": "1", "MODEL_WIDTH": "32"}
# What the operator's own pod needs and the training side must never import.
OPERATOR_ONLY = ("kopf", "kubernetes", "pydantic", "pydantic_core", "croniter", "prometheus_client", "yaml")


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_runtime_tree(tmp_path_factory)


def test_the_dockerfile_copies_a_folder_as_a_non_root_user_with_no_shell() -> None:
    text = (ROOT / "images" / "runtime" / "Dockerfile").read_text()
    assert "--no-deps --no-compile --target /opt/runtime /src" in text
    final = text.rsplit("\nFROM ", 1)[1]
    assert final.startswith("${COPY_IMAGE}") and "RUN " not in final
    assert 'ENTRYPOINT ["cp", "-R", "/opt/runtime/.", "/compilecache-runtime/"]' in final
    assert "USER ${UID}:${UID}" in final


@pytest.mark.slow
@pytest.mark.jax
@pytest.mark.timeout(1200)
# Issue #33 names 3.10 and 3.13, the oldest and newest a training image runs; 3.12 between them
# only in `make test-long` (about 20 s of `make test`'s wall time).
@pytest.mark.parametrize("version", ["3.10", pytest.param("3.12", marks=pytest.mark.long), "3.13"])
def test_the_runtime_warms_expires_and_reports_on_a_python_with_only_jax(
    version: str, tree: Path, tmp_path: Path
) -> None:
    python = str(image_python(version, locked()["jax"]) / "python")
    # The tree is the package and its metadata only: no console script, no dependency.
    assert sorted(path.name for path in tree.iterdir()) == ["compilecache", "compilecache_operator-0.1.0.dist-info"]
    # No bytecode into the tree, as none goes into the pod's read-only mount of it: the tree is the
    # session's one (test_e2e_runtime.py's init containers copy it meanwhile).
    env = bare_env(PYTHONPATH=str(tree), HOME=str(tmp_path), PYTHONDONTWRITEBYTECODE="1", **TINY)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [python, "-m", "compilecache.cli", *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )

    absent = f"import importlib.util as u; print([n for n in {OPERATOR_ONLY!r} if u.find_spec(n)])"
    assert subprocess.run([python, "-c", absent], env=env, capture_output=True, text=True).stdout.strip() == "[]"
    version_line = cli("--version")
    assert version_line.returncode == 0 and f"python {version}." in version_line.stdout, version_line

    cache, report = tmp_path / "cache", tmp_path / "warm.json"
    warm = cli(
        "warm", "--cache-dir", str(cache), "--script", str(TRAIN), "--steps", "2", "--step-fn", "_train_step",
        "--report", str(report), "--", "--steps", "100000",
    )  # fmt: skip
    assert warm.returncode == 0, warm.stdout[-3000:] + warm.stderr[-3000:]
    result = json.loads(report.read_text())
    assert result["ok"] and result["verify"]["ok"] and result["entries"] == 2, result

    expire = cli("expire", "--cache-dir", str(cache), "--max-age", "7d")
    assert expire.returncode == 0, expire.stdout + expire.stderr
    assert "2 entries" in expire.stdout, expire.stdout

    printed = cli("env", "--cache-dir", str(cache), "--format", "json")
    assert printed.returncode == 0, printed.stderr
    termination_log = tmp_path / "termination-log"
    termination_log.touch()  # the kubelet creates it; the verdict writes only into an existing one
    trainer = json.loads(printed.stdout) | {"COMPILECACHE_TERMINATION_LOG": str(termination_log)}
    done = subprocess.run(
        [python, str(TRAIN), "--steps", "2"],
        env=env | trainer,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "compilecache: 2/2 compiles hit" in done.stdout + done.stderr, done.stdout + done.stderr
    document = json.loads(termination_log.read_text())
    assert document["schema"] == "compilecache.dev/trainer/v1", document
    assert (document["requests"], document["hits"]) == (2, 2), document
