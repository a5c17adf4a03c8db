"""The package's import graph (STYLE.md sections 1 and 9): no cycle, not even through an import
inside a function; layers import one way.

The graph is read from the source with `ast`: every `import cachepilot_sim...` and
`from cachepilot_sim... import ...` anywhere in a module (module level, functions, methods) is an
edge. Importing `a.b.c` also runs `a/__init__.py` and `a/b/__init__.py`, so those packages are edges
too, except the importer's own packages (already being imported). Imports under
`if TYPE_CHECKING:` are left out: they never run. A second check counts them too: a type-only
import that closes a circle (an index annotating the policy that builds it) still ties the two
modules together for a reader, so the package has none of those either (issue 32).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from functools import cache
from pathlib import Path

import pytest

PACKAGE = "cachepilot_sim"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE

# Edges a parallel branch removes; each names the branch. The lead deletes the entry at merge.
KNOWN_EDGES: set[tuple[str, str]] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_nodes(path: Path, type_only: bool = False) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: any depth, except the body of `if TYPE_CHECKING:`
    (kept with `type_only`)."""
    out: list[ast.Import | ast.ImportFrom] = []
    todo: list[ast.AST] = [ast.parse(path.read_text(), str(path))]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            out.append(node)
        elif isinstance(node, ast.If) and _is_type_checking(node) and not type_only:
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))
    return out


def _imported(node: ast.AST, importer: str, is_package: bool) -> Iterable[str]:
    """Full names an import statement may load: the module and, for `from m import x`, `m.x`."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        if node.level:  # relative: resolve against the importer's package
            base = importer.split(".")
            base = base[: len(base) - node.level + (1 if is_package else 0)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        yield module
        yield from (f"{module}.{alias.name}" for alias in node.names)


@cache
def import_graph(type_only: bool = False) -> dict[str, frozenset[str]]:
    """Module -> the package modules it imports (directly or through a package `__init__`);
    with `type_only`, through imports under `if TYPE_CHECKING:` too."""
    known = modules()
    graph: dict[str, frozenset[str]] = {}
    for name, path in known.items():
        is_package = path.name == "__init__.py"
        own = set(_ancestors(name)) | ({name} if is_package else set())
        targets: set[str] = set()
        for node in import_nodes(path, type_only):
            for target in _imported(node, name, is_package):
                if target in known:
                    targets.add(target)
                    targets |= {a for a in _ancestors(target) if a in known}
        graph[name] = frozenset(t for t in targets - own - {name} if (name, t) not in KNOWN_EDGES)
    return graph


def strongly_connected(graph: dict[str, frozenset[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components in a deterministic order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                out.append(sorted(component))
    return out


def a_cycle(graph: dict[str, frozenset[str]], component: list[str]) -> list[str]:
    """One concrete cycle inside a strongly connected component, for the failure message."""
    members = set(component)
    path = [component[0]]
    seen = {component[0]: 0}
    while True:
        step = min(t for t in graph[path[-1]] if t in members)
        if step in seen:
            return path[seen[step] :] + [step]
        seen[step] = len(path)
        path.append(step)


def imports_of(prefix: str) -> dict[str, set[str]]:
    """Module under `prefix` -> the package modules it imports."""
    return {
        m: set(t) for m, t in import_graph().items() if m == prefix or m.startswith(prefix + ".")
    }


def test_graph_sees_function_level_imports() -> None:
    # __main__ imports the sweep inside main(): the graph must hold that edge.
    assert "cachepilot_sim.experiment.sweep" in import_graph()["cachepilot_sim.__main__"]


def test_package_has_no_import_cycle() -> None:
    graph = import_graph()
    cycles = [a_cycle(graph, c) for c in strongly_connected(graph) if len(c) > 1]
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_package_has_no_import_cycle_even_through_type_only_imports() -> None:
    graph = import_graph(type_only=True)
    cycles = [a_cycle(graph, c) for c in strongly_connected(graph) if len(c) > 1]
    assert not cycles, "type-only import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_graph_sees_type_only_imports_when_asked(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import os\n")
    assert "os" in {a.name for n in import_nodes(source, type_only=True) for a in n.names}
    assert "os" not in {a.name for n in import_nodes(source) for a in n.names}


def test_the_cycle_finder_names_a_cycle() -> None:
    graph = {"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}), "d": frozenset()}
    components = [c for c in strongly_connected(graph) if len(c) > 1]
    assert components == [["a", "b", "c"]]
    assert a_cycle(graph, components[0]) == ["a", "b", "c", "a"]


@pytest.mark.parametrize("layer", ["cachepilot_sim.cost", "cachepilot_sim.policies"])
def test_pure_layers_do_not_import_simpy(layer: str) -> None:
    offenders = []
    for name in imports_of(layer):
        for node in import_nodes(modules()[name]):
            for target in _imported(node, name, modules()[name].name == "__init__.py"):
                if target == "simpy" or target.startswith("simpy."):
                    offenders.append(name)
    assert not offenders, f"{layer} must not import simpy: {sorted(set(offenders))}"


def test_components_do_not_import_workloads() -> None:
    offenders = {
        (m, t)
        for m, targets in imports_of("cachepilot_sim.components").items()
        for t in targets
        if t.startswith("cachepilot_sim.workloads.")
    }
    assert not offenders, sorted(offenders)  # a component takes what it needs from the Request


def test_only_the_entry_point_and_tools_import_the_experiment_layer() -> None:
    offenders = {
        (m, t)
        for m, targets in import_graph().items()
        if m != "cachepilot_sim.__main__"
        and not m.startswith(("cachepilot_sim.tools", "cachepilot_sim.experiment"))
        for t in targets
        if t.startswith("cachepilot_sim.experiment")
    }
    assert not offenders, sorted(offenders)


# `python -m cachepilot_sim.validate` is the command issue 12 documents; the module is a two-line
# entry that runs tools/validate.py, like __main__ runs the experiment layer.
TOOL_ENTRY_POINTS = ("cachepilot_sim.validate",)


def test_nothing_outside_tools_imports_a_tool() -> None:
    offenders = {
        (m, t)
        for m, targets in import_graph().items()
        if not m.startswith("cachepilot_sim.tools") and m not in TOOL_ENTRY_POINTS
        for t in targets
        if t.startswith("cachepilot_sim.tools")
    }
    assert not offenders, sorted(offenders)
