"""The folders say which program a module belongs to; these tests keep the imports honest.

``compilecache.controller`` runs in the operator pod (no JAX there), ``compilecache.jobtools``
in warm-up and expiry pods (no kopf, no API client there), ``compilecache.cache`` is the format
both share (neither at import time). A module-level import is what would load in the wrong
process; imports inside functions are deliberate late loads and are allowed.
"""

from __future__ import annotations

import ast
import subprocess
import sys
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
    # The seam and each framework's implementation: run by every program but the operator's libraries.
    "frameworks": ("kopf", "kubernetes", "compilecache.controller"),
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
    assert folders == ["api", "cache", "cli", "controller", "frameworks", "jobtools", "local", "training"], folders


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


# --- The whole package: no circle, and each framework reached only through the registry (issue 29).


def module_name(path: Path) -> str:
    """``compilecache.frameworks.jax.warm`` for ``.../compilecache/frameworks/jax/warm.py``."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_names(path: Path, *, type_checking: bool) -> list[str]:
    """Every module a file imports, at its top level and inside functions (the late loads run too);
    ``type_checking`` says whether the ``if TYPE_CHECKING:`` blocks count (they never run)."""
    names: list[str] = []

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child) and not type_checking:
                for other in child.orelse:
                    walk(other)
                continue
            if isinstance(child, ast.Import):
                names.extend(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                names.append(child.module)
                names.extend(f"{child.module}.{alias.name}" for alias in child.names)
            walk(child)

    walk(ast.parse(path.read_text()))
    return names


def package_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def package_import_graph(*, type_checking: bool = False) -> dict[str, set[str]]:
    """Each module of the package → the package's modules it imports (``from a import b``: ``a.b`` if
    ``b`` is a module, else ``a``), and the packages above them whose ``__init__`` Python runs first
    (all but the root, which every import runs, and the module's own, which ran before it)."""
    modules = package_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for imported in imported_names(path, type_checking=type_checking):
            if imported not in modules:
                continue
            parts = imported.split(".")
            targets |= {".".join(parts[:end]) for end in range(2, len(parts) + 1)}
        # A module's own packages are initialised before it, whatever it imports: no circle through them.
        own = {".".join(name.split(".")[:end]) for end in range(1, name.count(".") + 2)}
        graph[name] = {target for target in targets if target in modules and target not in own}
    return graph


def framework_of(name: str) -> str | None:
    """``jax`` for ``compilecache.frameworks.jax.warm``; ``None`` outside a framework's folder."""
    parts = name.split(".")
    return (
        parts[2]
        if len(parts) > 3
        or (
            len(parts) == 3
            and parts[:2] == ["compilecache", "frameworks"]
            and (PACKAGE / "frameworks" / parts[2]).is_dir()
        )
        else None
    )


def test_the_package_has_no_import_circle() -> None:
    """No module of the package imports, through any chain of imports that run, a module that imports it.

    ``if TYPE_CHECKING:`` imports are left out: they never run (an annotation names a type, as the
    seam's interface names the operator's parsed spec).
    """
    graph = package_import_graph()
    assert {"compilecache.frameworks.jax.warm", "compilecache.jobtools.warm"} <= set(graph)
    assert "compilecache.frameworks" in graph["compilecache.jobtools.warm"]  # the graph sees the registry
    assert find_cycle(graph) is None, " → ".join(find_cycle(graph) or [])


# Modules outside a framework's folder that are its public face for user code, kept at the paths users
# import them from (docs/training.md, docs/warmer.md, every workload's `from compilecache import Target`):
# each re-exports the framework's own names and holds no code of its own.
PUBLIC_FACES = {"compilecache": "jax", "compilecache.training.runtime": "jax"}


def test_frameworks_are_reached_only_through_the_registry() -> None:
    """No module outside a framework's folder imports that framework's code, and no framework another's:
    the rest finds one by name (``compilecache.frameworks.get``), never by an import. Type-only imports count."""
    assert {"jax", "pytorch"} <= {path.name for path in (PACKAGE / "frameworks").iterdir() if path.is_dir()}
    offenders = [
        f"{name} imports {target}"
        for name, targets in package_import_graph(type_checking=True).items()
        for target in targets
        if framework_of(target) is not None
        and framework_of(target) != framework_of(name)
        and PUBLIC_FACES.get(name) != framework_of(target)
    ]
    assert not offenders, offenders


def test_a_public_face_only_re_exports() -> None:
    """A public face (:data:`PUBLIC_FACES`) is a docstring and imports: no function, class or value of its own."""
    for name in PUBLIC_FACES:
        path = package_modules()[name]
        own = [
            type(node).__name__
            for node in ast.parse(path.read_text()).body
            if not isinstance(node, ast.Import | ast.ImportFrom)
            and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
            and not (
                isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["__all__"]
            )
        ]
        assert not own, (name, own)


def test_the_layout_checks_find_a_circle_and_a_reach_into_a_framework(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a.typed\n"
        "def f():\n    from compilecache.frameworks.jax import warm\n"
    )
    assert imported_names(sample, type_checking=False) == [
        "typing",
        "typing.TYPE_CHECKING",
        "compilecache.frameworks.jax",
        "compilecache.frameworks.jax.warm",
    ]
    assert "a.typed" in imported_names(sample, type_checking=True)
    assert framework_of("compilecache.frameworks.jax.warm") == "jax"
    assert framework_of("compilecache.frameworks.jax") == "jax"
    assert framework_of("compilecache.frameworks.interface") is None
    assert framework_of("compilecache.jobtools.warm") is None


def test_the_operator_loads_every_framework_without_its_libraries() -> None:
    """The operator pod has no JAX and no torch: the registry and each framework's operator half
    (what the controller calls) load none of them."""
    code = (
        "import sys, compilecache.controller.handlers\n"
        "from compilecache import frameworks\n"
        "loaded = [frameworks.get(name).name for name in frameworks.names()]\n"
        "print(loaded, sorted(m for m in ('jax', 'jaxlib', 'torch') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split("] ")[-1].strip() == "[]", done.stdout
    assert "'jax', 'pytorch'" in done.stdout, done.stdout
