"""The folders say which program a module belongs to; these tests keep the imports honest.

``compilecache.controller`` runs in the operator pod (no JAX there), ``compilecache.jobtools``
in warm-up and expiry pods (no kopf, no API client there), ``compilecache.cache`` is the format
both share (neither at import time). A module-level import is what would load in the wrong
process; imports inside functions are deliberate late loads and are allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "operator" / "compilecache"

# folder → top-level imports a module there must not make
FORBIDDEN = {
    "controller": ("jax", "jaxlib", "compilecache.jobtools", "compilecache.local"),
    "jobtools": ("kopf", "kubernetes", "compilecache.controller", "compilecache.local"),
    "cache": (
        "jax",
        "jaxlib",
        "kopf",
        "kubernetes",
        "compilecache.controller",
        "compilecache.jobtools",
        "compilecache.local",
    ),
    # The local cluster plays Kubernetes: it runs the product's commands as processes, never imports them.
    "local": ("jax", "jaxlib", "kopf", "compilecache.controller", "compilecache.jobtools"),
    # Training processes: the user's image has JAX and this package, never the operator's libraries.
    "training": ("kopf", "kubernetes", "compilecache.controller", "compilecache.jobtools", "compilecache.local"),
    # The entry point dispatches to every program and loads each one late, so `compilecache --help` stays light.
    "cli": (
        "jax",
        "jaxlib",
        "kopf",
        "kubernetes",
        "compilecache.controller",
        "compilecache.jobtools",
        "compilecache.local",
    ),
}


def module_level_imports(path: Path) -> list[str]:
    """The modules a file imports at its top level (not inside functions or classes)."""
    names: list[str] = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_every_module_lives_in_a_program_folder() -> None:
    """Every module sits in a folder named for the program it runs in; the top level only re-exports."""
    top = sorted(path.stem for path in PACKAGE.glob("*.py"))
    assert top == ["__init__"], top
    folders = sorted(path.parent.name for path in PACKAGE.glob("*/__init__.py"))
    assert folders == ["cache", "cli", "controller", "jobtools", "local", "training"], folders


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_folder_imports_stay_within_its_program(folder: str) -> None:
    offenders = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in sorted((PACKAGE / folder).rglob("*.py"))
        for name in module_level_imports(path)
        if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN[folder])
    ]
    assert not offenders, offenders


def test_the_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text("import jax.numpy as jnp\nfrom compilecache.jobtools import warm\n\ndef f():\n    import kopf\n")
    assert module_level_imports(sample) == ["jax.numpy", "compilecache.jobtools"]
