"""The shape of the harness, read from its source with `ast`: no import cycle among mlhpc
modules, nothing in mlhpc/ imports a workload, functions stay small, one step function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mlhpc"
MAX_LINES = 60
MAX_PARAMS = 6


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, ast.Module]:
    return {_module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, tree: ast.Module) -> set[str]:
    """Every module ``name`` imports, at any depth (inside functions and TYPE_CHECKING too)."""
    package = name if (PACKAGE / Path(*name.split(".")[1:]) / "__init__.py").exists() else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: {m for m in _imports(name, tree) if m in modules and m != name}
            for name, tree in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        stack.pop()
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_no_import_cycle_among_mlhpc_modules():
    graph = _graph()
    # A package imports its own submodules in __init__ to re-export them; an edge from a
    # submodule back to its package is then not a cycle between two units of code.
    for name in graph:
        graph[name] = {m for m in graph[name] if not name.startswith(m + ".")}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_detects_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_mlhpc_never_imports_a_workload():
    for name, tree in _modules().items():
        bad = {m for m in _imports(name, tree)
               if m.split(".")[0] in ("workloads", "mlhpc_workloads")}
        assert not bad, f"{name} imports {sorted(bad)}"


def _functions(tree: ast.Module):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _has_reason(lines: list[str], node: ast.AST) -> bool:
    """A comment on the ``def`` line(s) explains why the function is long or wide."""
    header = lines[node.lineno - 1: node.body[0].lineno - 1]
    return any("#" in line for line in header)


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_functions_are_short_and_narrow(path):
    lines = path.read_text().splitlines()
    for node in _functions(ast.parse(path.read_text())):
        args = node.args
        params = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs
                  if a.arg not in ("self", "cls")]
        length = node.end_lineno - node.lineno + 1
        where = f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"
        if length > MAX_LINES or len(params) > MAX_PARAMS:
            assert _has_reason(lines, node), (
                f"{where}: {length} lines, {len(params)} parameters and no reason written beside it")


def test_train_profile_and_throughput_share_one_step():
    for rel in ("mlhpc/train.py", "mlhpc/profile.py", "benchmarks/throughput.py"):
        tree = ast.parse((ROOT / rel).read_text())
        calls = {n.func.id for n in ast.walk(tree)
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        assert "train_step" in calls, rel
        backward = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "backward"]
        assert not backward, f"{rel} runs its own backward pass"
