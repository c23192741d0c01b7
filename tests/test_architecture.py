"""The shape of the harness, read from its source with `ast`: no import cycle among mlhpc
modules, nothing in mlhpc/ imports a workload, functions stay small, one step function."""

from __future__ import annotations

import ast
import re
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


def _typing_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes inside ``if TYPE_CHECKING:`` blocks."""
    return {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If)
            and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
            for stmt in node.body for inner in ast.walk(stmt)}


def _imports(name: str, tree: ast.Module, typing: bool = True) -> set[str]:
    """Every module ``name`` imports, at any depth (inside functions, and inside TYPE_CHECKING
    unless ``typing`` is false: such an import is never executed, so it makes no cycle)."""
    package = name if (PACKAGE / Path(*name.split(".")[1:]) / "__init__.py").exists() else name.rpartition(".")[0]
    found: set[str] = set()
    skipped = set() if typing else _typing_only(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
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


def _graph(typing: bool = True) -> dict[str, set[str]]:
    modules = _modules()
    return {name: {m for m in _imports(name, tree, typing) if m in modules and m != name}
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
    """No cycle among the imports that run (the contract's typing-only import of the real
    `mlhpc.config.Config` is not one: config reads the workload registry at run time)."""
    graph = _graph(typing=False)
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


#: Every function over the limits, with its reason: one list, not comments on the defs. Keys are
#: ``path::function``. mlhpc/data/ has none (its test below allows none there).
ALLOWED: dict[str, str] = {
    "benchmarks/baseline_deepcam.py::logistic_baseline": "the baseline's data and fit settings",
    "benchmarks/run.py::bench_data": "one benchmark's set-up, run and report in order",
}
SCANNED = ("mlhpc", "workloads", "benchmarks")
MAX_FILE_LINES = 500


def _click_groups(tree: ast.Module) -> set[str]:
    """Names of the module's functions decorated as click groups (``@click.group(...)``, or
    ``@<group>.group(...)`` of another such group), found to a fixed point."""
    groups: set[str] = set()
    while True:
        found = {n.name for n in _functions(tree)
                 if any(_decorator_is(d, groups | {"click"}, ("group",)) for d in n.decorator_list)}
        if found <= groups:
            return groups
        groups |= found


def _decorator_is(decorator: ast.expr, receivers: set[str], attrs: tuple[str, ...]) -> bool:
    """``decorator`` is ``@R.A`` or ``@R.A(...)`` with R in ``receivers`` and A in ``attrs``."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (isinstance(target, ast.Attribute) and target.attr in attrs
            and isinstance(target.value, ast.Name) and target.value.id in receivers)


def _click_command(node: ast.AST, groups: set[str]) -> bool:
    """The one exemption from the parameter limit: a click command or group, which takes one
    parameter per option, so its width is its interface. Only a function decorated
    ``@click.command``/``@click.group`` or ``@G.command``/``@G.group`` with G a click group of
    the same module counts; ``@click.option`` alone (or any other decorator) does not."""
    return any(_decorator_is(d, groups | {"click"}, ("command", "group"))
               for d in getattr(node, "decorator_list", []))


def _oversized(path: Path) -> list[tuple[str, str]]:
    """``(path::name, what)`` for each function of ``path`` over the limits."""
    return _oversized_in(path.read_text(), path.relative_to(ROOT).as_posix())


def _oversized_in(source: str, rel: str) -> list[tuple[str, str]]:
    found = []
    tree = ast.parse(source)
    groups = _click_groups(tree)
    for node in _functions(tree):
        args = node.args
        params = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs
                  if a.arg not in ("self", "cls")]
        length = node.end_lineno - node.lineno + 1
        wide = len(params) > MAX_PARAMS and not _click_command(node, groups)
        if length > MAX_LINES or wide:
            found.append((f"{rel}::{node.name}",
                          f"{length} lines, {len(params)} parameters"))
    return found


def _sources() -> list[Path]:
    return [p for base in SCANNED for p in sorted((ROOT / base).rglob("*.py"))]


def test_the_limits_cover_mlhpc_workloads_and_benchmarks():
    scanned = {p.relative_to(ROOT).parts[0] for p in _sources()}
    assert scanned == {"mlhpc", "workloads", "benchmarks"}
    assert {"mlhpc/cli.py", "workloads/cosmoflow/model.py", "benchmarks/throughput.py"} <= {
        p.relative_to(ROOT).as_posix() for p in _sources()}


def test_only_a_click_command_is_exempt_from_the_parameter_limit():
    source = ("import click\n"
              "@click.group()\ndef main(): pass\n"
              "@main.group('data')\ndef data(): pass\n"
              "@data.command('x')\n@click.option('--a')\ndef sub(a, b, c, d, e, f, g): pass\n"
              "@click.command('y')\ndef top(a, b, c, d, e, f, g): pass\n"
              "@click.option('--a')\ndef option_only(a, b, c, d, e, f, g): pass\n"
              "@other.command('z')\ndef not_a_group(a, b, c, d, e, f, g): pass\n"
              "def plain(a, b, c, d, e, f, g): pass\n")
    flagged = {key.split("::")[1] for key, _ in _oversized_in(source, "mod.py")}
    assert flagged == {"option_only", "not_a_group", "plain"}


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_functions_are_short_and_narrow(path):
    """At most 60 lines and 6 parameters (click commands aside), unless listed in ALLOWED."""
    bad = [f"{key}: {what}" for key, what in _oversized(path) if key not in ALLOWED]
    assert not bad, f"over the limits and not in ALLOWED (with a reason): {bad}"


def test_the_data_layer_has_no_exception():
    assert not [k for k in ALLOWED if k.startswith("mlhpc/data/")]
    assert not [k for p in sorted((PACKAGE / "data").rglob("*.py")) for k, _ in _oversized(p)]


def test_every_allowance_is_still_needed_and_has_a_reason():
    over = {key for path in _sources() for key, _ in _oversized(path)}
    stale = sorted(set(ALLOWED) - over)
    assert not stale, f"ALLOWED lists functions now within the limits: {stale}"
    assert all(len(reason) > 20 for reason in ALLOWED.values())


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_file_in_mlhpc_is_over_500_lines(path):
    assert len(path.read_text().splitlines()) <= MAX_FILE_LINES, path


def test_train_profile_and_throughput_share_one_step():
    for rel in ("mlhpc/run/train.py", "mlhpc/run/profile.py", "benchmarks/throughput.py"):
        tree = ast.parse((ROOT / rel).read_text())
        calls = {n.func.id for n in ast.walk(tree)
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        assert "train_step" in calls, rel
        backward = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "backward"]
        assert not backward, f"{rel} runs its own backward pass"


# ---- one assembly ---------------------------------------------------------------------------------

#: Calls that assemble a run's parts; outside mlhpc/run/assemble.py only train.py's preflight (which
#: builds a model and optimizer to check a checkpoint fits them, before any data are read) makes one.
ASSEMBLING = {"build_model", "build_optimizer", "build_loss", "build_datasets", "Step", "wrap_model",
              "make_loader"}
OPTIMIZERS = {"SGD", "Adam", "AdamW", "LAMB", "Lamb", "RMSprop", "Adagrad", "LBFGS"}


def _called(tree: ast.AST) -> set[str]:
    """The names called in ``tree``: ``f(...)`` -> f, ``a.b.f(...)`` -> f and ``a.b.f``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name):
                names.add(node.func.id)
            elif isinstance(node.func, ast.Attribute):
                names |= {node.func.attr, ast.unparse(node.func)}
    return names


@pytest.mark.parametrize("rel", ["mlhpc/run/profile.py", "benchmarks/throughput.py"])
def test_profile_and_throughput_assemble_through_the_one_build(rel):
    """`mlhpc.run.assemble.build` is the one assembly of model, data, optimizer, compiled step: the
    profiler and the throughput benchmark call it and construct none of those themselves."""
    called = _called(ast.parse((ROOT / rel).read_text()))
    assert "assemble.build" in called, f"{rel} does not call assemble.build"
    assert not called & ASSEMBLING, f"{rel} assembles parts itself: {sorted(called & ASSEMBLING)}"
    optim = {c for c in called if c.split(".")[-1] in OPTIMIZERS or c.startswith("torch.optim.")}
    assert not optim, f"{rel} constructs an optimizer: {sorted(optim)}"


def test_train_assembles_through_the_one_build():
    called = _called(ast.parse((ROOT / "mlhpc/run/train.py").read_text()))
    assert "build" in called and not called & {"Step", "wrap_model"}  # (a resumed epoch's
    # loader skips its first batches: `_epoch_batches` makes that one loader itself)


def test_the_assembly_check_sees_a_planted_optimizer():
    planted = ast.parse("import torch\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                        "step = Step(m, l, opt, None, 'fp32', d)\n")
    called = _called(planted)
    assert "torch.optim.SGD" in called and "Step" in called & ASSEMBLING


# ---- docs/architecture.md is cited by its sections -------------------------------------------------

ARCH = ROOT / "docs" / "architecture.md"
#: ``docs/architecture.md`` then, within a few words, a quoted section name.
_CITATION = re.compile(r'docs/architecture\.md[^"\n]{0,20}(?:"(?P<section>[^"\n]{1,60}'
                       r'(?:\n[ \t#]*[^"\n]{1,60})?)")?')


def _headings() -> list[str]:
    return [line.lstrip("#").strip() for line in ARCH.read_text().splitlines()
            if line.startswith("## ")]


def _citations() -> list[tuple[str, str | None]]:
    """``(where, section or None)`` for every mention of docs/architecture.md in code and tests."""
    found = []
    for path in [p for base in (*SCANNED, "tests", "scripts") for p in sorted((ROOT / base).rglob("*.py"))
                 if p != Path(__file__).resolve()]:  # this file's citations are examples
        text = path.read_text()
        for match in _CITATION.finditer(text):
            section = match["section"]
            if section is not None:
                section = " ".join(section.replace("#", " ").split())  # a name broken over lines
            where = f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, match.start()) + 1}"
            found.append((where, section))
    return found


def _names_a_section(section: str, headings: list[str]) -> bool:
    """The cited name is a heading or a heading's start (``The data layer`` for ``The data layer
    (`mlhpc/data/`)``)."""
    return any(re.sub(r"\s*\(.*\)$", "", h) == section or h == section for h in headings)


def test_docs_architecture_exists_and_every_cited_section_is_there():
    assert ARCH.is_file()
    citations = _citations()
    assert citations, "nothing cites docs/architecture.md"
    headings = _headings()
    bad = [f"{where}: \"{section}\"" for where, section in citations
           if section is not None and not _names_a_section(section, headings)]
    assert not bad, f"cited sections missing from docs/architecture.md {headings}: {bad}"
    assert sum(section is not None for _, section in citations) >= 3


def test_the_citation_check_sees_a_missing_section():
    headings = ["The layers", "The data layer (`mlhpc/data/`)"]
    assert _names_a_section("The data layer", headings) and _names_a_section("The layers", headings)
    assert not _names_a_section("The data", headings) and not _names_a_section("Staging", headings)
    match = _CITATION.search('see docs/architecture.md, "The data\n    # layer" for why')
    assert match and " ".join(match["section"].replace("#", " ").split()) == "The data layer"


# ---- the layout (docs/layout.md) names what is there, and all of it -------------------------------

_NAME = re.compile(r"^[\w.*<>/-]+$")


def _layout_entries(readme: str) -> list[tuple[str, int]]:
    """``(path, line)`` for every path docs/layout.md's Layout block names. A line indented less than
    12 spaces starts with comma-separated names, each relative to the nearest folder above it
    with a smaller indent, then (after two spaces) what they hold; deeper lines continue the text.

    Raises:
        AssertionError: a line that does not parse so (naming it)."""
    section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```\n", 1)[1].split("```", 1)[0]
    folders: list[tuple[int, str]] = []  # (indent, path), innermost last
    entries = []
    for number, line in enumerate(block.splitlines(), 1):
        indent = len(line) - len(line.lstrip(" "))
        if not line.strip() or indent >= 12:
            continue
        names = [n.strip() for n in re.split(r"\s{2,}", line.strip(), maxsplit=1)[0].split(",")]
        assert all(_NAME.match(n) for n in names), f"docs/layout.md layout line {number}: {line.strip()!r}"
        folders = [(i, f) for i, f in folders if i < indent]
        parent = folders[-1][1] if folders else ""
        for name in names:
            entries.append((parent + name, number))
        if len(names) == 1 and names[0].endswith("/"):
            folders.append((indent, parent + names[0]))
    return entries


def _exists(path: str) -> bool:
    pattern = re.sub(r"<[^>]+>", "*", path.rstrip("/"))
    matches = list(ROOT.glob(pattern)) if "*" in pattern else [ROOT / pattern]
    return any(m.is_dir() if path.endswith("/") else m.is_file() for m in matches)


def test_every_path_in_the_readme_layout_exists_and_every_module_is_named():
    entries = _layout_entries((ROOT / "docs" / "layout.md").read_text())
    missing = [f"{path} (line {n})" for path, n in entries if not _exists(path)]
    assert not missing, f"docs/layout.md names paths that are not there: {missing}"
    named = {path for path, _ in entries}
    modules = [p.relative_to(ROOT).as_posix() for base in ("mlhpc", "workloads")
               for p in sorted((ROOT / base).rglob("*.py")) if p.name != "__init__.py"]
    docs = [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "docs").glob("*.md"))]
    unnamed = [m for m in modules + docs if m not in named]
    assert not unnamed, f"docs/layout.md leaves out: {unnamed}"


def test_the_layout_check_sees_a_stale_line():
    readme = ("x\n## Layout\n\n```\nmlhpc/   the harness\n  cli.py   the commands\n"
              "  spec.py   gone\n    data/   wrong depth, still under mlhpc/\n"
              "                 a continuation, not a name\n```\n## Next\n")
    entries = [p for p, _ in _layout_entries(readme)]
    assert entries == ["mlhpc/", "mlhpc/cli.py", "mlhpc/spec.py", "mlhpc/data/"]
    assert _exists("mlhpc/cli.py") and not _exists("mlhpc/spec.py")
    assert _exists("configs/<workload>-mini.yaml") and not _exists("configs/<w>-huge.yaml")
    with pytest.raises(AssertionError, match="line 2"):
        _layout_entries("\n## Layout\n```\nmlhpc/  the harness\nthe harness: names no workload\n```\n")
