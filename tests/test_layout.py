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
    # The resource's definition: read by the operator pod and by `make generate`, never running JAX or kopf.
    "api": (
        "jax",
        "jaxlib",
        "kopf",
        "compilecache.controller",
        "compilecache.jobtools",
        "compilecache.local",
        "compilecache.training",
    ),
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
    assert folders == ["api", "cache", "cli", "controller", "jobtools", "local", "training"], folders


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


def controller_import_graph() -> dict[str, set[str]]:
    """The controller's modules → the controller modules each imports at its top level."""
    folder = PACKAGE / "controller"
    names = {path.stem for path in folder.glob("*.py")} - {"__init__"}
    prefix = "compilecache.controller"
    graph: dict[str, set[str]] = {name: set() for name in names}
    for name in names:
        for node in ast.parse((folder / f"{name}.py").read_text()).body:
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module == prefix:
                targets = [f"{prefix}.{alias.name}" for alias in node.names]  # from compilecache.controller import x
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module]
            for target in targets:
                parts = target.split(".")
                if parts[:2] == ["compilecache", "controller"] and len(parts) > 2 and parts[2] in names:
                    graph[name].add(parts[2])
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (its modules in order, the first repeated at the end), or ``None``."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for target in sorted(graph.get(node, ())):
            if (cycle := visit(target, [*path, node])) is not None:
                return cycle
        done.add(node)
        return None

    for start in sorted(graph):
        if (cycle := visit(start, [])) is not None:
            return cycle
    return None


def test_the_controller_has_no_import_circle() -> None:
    """Module-level imports inside ``controller/`` form no circle (metrics is a leaf everyone may import)."""
    graph = controller_import_graph()
    assert {"metrics", "api", "plan", "handlers"} <= set(graph)  # the graph sees the package
    assert graph["metrics"] == set(), graph["metrics"]
    assert find_cycle(graph) is None, " → ".join(find_cycle(graph) or [])


def test_the_cycle_finder_finds_a_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
