"""No Python file of the project imports another that imports it back (issue 41).

The graph is built from the source with :mod:`ast`, not by importing anything: every ``import``
and ``from ... import`` statement of a module counts, wherever it stands (a function body, an
``if TYPE_CHECKING:`` block), because each one says the two files cannot be read, changed or
moved alone. ``from pkg import name`` is an edge to ``pkg.name`` when that is a module of the
project, else to ``pkg``'s ``__init__``. Importing ``a.b.c`` runs ``a/__init__`` and
``a/b/__init__`` too, but that alone is not an edge: a package that re-exports its modules
would otherwise be in a cycle with each of them.

A cycle is a strongly connected group of modules; the failure names each group and one loop
through it. The extender's own packages are also kept acyclic by import-linter
(``acyclic_siblings`` in pyproject.toml), which runs in the lint step.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("fastgshare", "fastgshare_cli", "fastgshare_cluster", "fastgshare_kube", "device_plugin",
            "scheduler_extender", "fastpod_crd_controller", "fastgshare_gateway", "fastfunc_controller", "simgpu",
            "bench")
Graph = Mapping[str, frozenset[str]]


def module_files(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Every module of ``packages`` under ``root`` by dotted name (a package by its own name)."""
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def imported_modules(name: str, path: Path, known: Iterable[str]) -> frozenset[str]:
    """The project modules that module ``name`` (its source at ``path``) imports."""
    known_set = set(known)
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(name, is_package, node.module, node.level)
            for alias in node.names:
                member = f"{base}.{alias.name}" if base else alias.name
                targets.add(member if member in known_set else base)
    return frozenset(target for target in targets if target in known_set and target != name)


def _absolute(name: str, is_package: bool, module: str | None, level: int) -> str:
    if level == 0:
        return module or ""
    parts = name.split(".") if is_package else name.split(".")[:-1]
    parts = parts[:len(parts) - (level - 1)]
    return ".".join([*parts, *([module] if module else [])])


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, frozenset[str]]:
    files = module_files(root, packages)
    return {name: imported_modules(name, path, files) for name, path in files.items()}


def cycles(graph: Graph) -> list[frozenset[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[frozenset[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph.get(step, ())))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(frozenset(group))
    return sorted(groups, key=sorted)


def loop_through(group: frozenset[str], graph: Graph) -> list[str]:
    """One import loop inside ``group``, from its first module back to it (breadth-first: shortest)."""
    start = min(group)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for step in sorted(graph[node] & group):
                if step == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if step not in came_from:
                    came_from[step] = node
                    following.append(step)
        frontier = following
    raise AssertionError(f"{sorted(group)} is not a cycle")  # pragma: no cover - groups come from cycles()


def describe(groups: Iterable[frozenset[str]], graph: Graph) -> str:
    return "\n".join(f"{' -> '.join(loop_through(group, graph))} (the group: {', '.join(sorted(group))})"
                     for group in groups)


# --- the checker on small graphs ------------------------------------------------------------
def write(root: Path, files: Mapping[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_a_cycle_through_a_type_checking_import_is_found(tmp_path: Path) -> None:
    write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/app.py": "from pkg import routes\n",
        "pkg/routes.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.app import Services\n",
        "pkg/alone.py": "import pkg.app\n",
    })
    graph = import_graph(tmp_path, ["pkg"])
    assert cycles(graph) == [frozenset({"pkg.app", "pkg.routes"})]
    assert describe(cycles(graph), graph) == "pkg.app -> pkg.routes -> pkg.app (the group: pkg.app, pkg.routes)"


def test_relative_imports_and_function_level_imports_count(tmp_path: Path) -> None:
    write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/sub/__init__.py": "",
        "pkg/sub/a.py": "from . import b\n",
        "pkg/sub/b.py": "def f():\n    from ..c import thing\n",
        "pkg/c.py": "from .sub.a import x\n",
    })
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg.sub.a"] == {"pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.c"}
    assert describe(cycles(graph), graph).startswith("pkg.c -> pkg.sub.a -> pkg.sub.b -> pkg.c ")


def test_a_package_reexporting_its_modules_is_no_cycle(tmp_path: Path) -> None:
    write(tmp_path, {
        "pkg/__init__.py": "from pkg.a import A\n",
        "pkg/a.py": "import pkg.b\nclass A: ...\n",
        "pkg/b.py": "X = 1\n",
    })
    assert cycles(import_graph(tmp_path, ["pkg"])) == []


def test_an_import_of_a_name_from_a_package_is_an_edge_to_its_init(tmp_path: Path) -> None:
    write(tmp_path, {
        "pkg/__init__.py": "from pkg.a import A\nVALUE = 1\n",
        "pkg/a.py": "from pkg import VALUE\nclass A: ...\n",
    })
    graph = import_graph(tmp_path, ["pkg"])
    assert cycles(graph) == [frozenset({"pkg", "pkg.a"})]


# --- the project ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def project_graph() -> dict[str, frozenset[str]]:
    return import_graph(ROOT, PACKAGES)


def test_the_project_has_no_import_cycle(project_graph: Graph) -> None:
    found = cycles(project_graph)
    assert not found, "modules that import each other (break the loop):\n" + describe(found, project_graph)
