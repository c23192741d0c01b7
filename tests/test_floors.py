"""The import layers (docs/architecture.md, "The layers"): a module imports only from its own
layer or below, and what a module loads when imported stays in its layer."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MLHPC = ROOT / "mlhpc"

GROUND, TRAINING, RESULTS, ROOF = 0, 1, 2, 3
FLOOR_NAMES = {GROUND: "ground", TRAINING: "training", RESULTS: "results", ROOF: "commands"}
#: Module-name prefixes and their layer; the longest prefix that matches decides. A prefix
#: ending in "." matches only modules below it (``mlhpc.data.`` is the data layer's modules, not
#: the package, whose __init__ holds nothing but its docstring).
FLOORS: dict[str, int] = {
    "mlhpc": GROUND, "mlhpc.errors": GROUND, "mlhpc.text": GROUND, "mlhpc.hints": GROUND,
    "mlhpc.rules": GROUND, "mlhpc.runtime": GROUND, "mlhpc.config": GROUND,
    "mlhpc.workload": GROUND, "mlhpc.knob": GROUND, "mlhpc.log": GROUND, "mlhpc.data": GROUND,
    "mlhpc.data.files": GROUND, "mlhpc.data.inputs": GROUND, "mlhpc.data.claims": GROUND,
    "mlhpc.data.checksums": GROUND, "mlhpc.data.locks": GROUND, "mlhpc.data.trees": GROUND,
    "mlhpc.data.statefiles": GROUND,
    "mlhpc.data.": TRAINING, "mlhpc.power": TRAINING, "mlhpc.run": TRAINING,
    "mlhpc.slurm": TRAINING, "mlhpc.slurm_job": TRAINING, "mlhpc.validate": TRAINING,
    "mlhpc.report": RESULTS, "mlhpc.store": RESULTS, "mlhpc.automl": RESULTS, "mlhpc.reframe": RESULTS,
    "mlhpc.slurm_automl": RESULTS,
    "mlhpc.cli": ROOF, "mlhpc.__main__": ROOF, "mlhpc.progress": ROOF,
}


def floor_of(module: str) -> int:
    """The layer of ``module``: a command module (``*.cli``) is in the commands layer; otherwise
    the layer of the longest matching prefix of `FLOORS`."""
    if module.endswith(".cli"):
        return ROOF
    best, floor = "", None
    for prefix, value in FLOORS.items():
        hit = module.startswith(prefix) if prefix.endswith(".") else (
            module == prefix or module.startswith(prefix + "."))
        if hit and len(prefix) > len(best):
            best, floor = prefix, value
    assert floor is not None, f"{module}: in no layer (add it to FLOORS)"
    return floor


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(source: str) -> list[tuple[int, str]]:
    """(line, module) of every mlhpc import in ``source``, at any depth (a function's lazy import
    counts as the module's), ``from mlhpc.x import y`` as both ``mlhpc.x`` and ``mlhpc.x.y``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("mlhpc"):
            found.append((node.lineno, node.module))
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names if a.name.startswith("mlhpc"))
    return found


def upward_imports(paths: list[Path]) -> list[str]:
    bad = []
    for path in paths:
        here = module_name(path)
        for line, target in imported(path.read_text()):
            if floor_of(target) > floor_of(here):
                bad.append(f"{path.relative_to(ROOT)}:{line}: {here} ({FLOOR_NAMES[floor_of(here)]}) "
                           f"imports {target} ({FLOOR_NAMES[floor_of(target)]})")
    return bad


def test_no_module_imports_one_on_a_higher_floor():
    bad = upward_imports(sorted(MLHPC.rglob("*.py")))
    assert not bad, "\n".join(bad)


def test_the_floor_check_sees_a_planted_arrow():
    source = "def f():\n    from mlhpc.report.score import build_report\n"
    here = floor_of("mlhpc.config.planted")
    assert [(line, t) for line, t in imported(source) if floor_of(t) > here] == [
        (2, "mlhpc.report.score"), (2, "mlhpc.report.score.build_report")]
    assert floor_of("mlhpc.data.inputs") == GROUND and floor_of("mlhpc.data.stage.copy") == TRAINING
    assert floor_of("mlhpc.store.cli") == ROOF and floor_of("mlhpc.log.parse") == GROUND


def test_the_results_tower_never_imports_the_run():
    bad = [f"{path.relative_to(ROOT)}:{line}: {target}"
           for tower in ("report", "store", "reframe") for path in sorted((MLHPC / tower).rglob("*.py"))
           for line, target in imported(path.read_text())
           if target == "mlhpc.run" or target.startswith(("mlhpc.run.", "mlhpc.power"))]
    assert not bad, "\n".join(bad)


def _loaded(*modules: str) -> dict[str, int]:
    """The mlhpc modules a fresh interpreter holds after importing ``modules``, with their lines."""
    code = ("import importlib, json, sys\n"
            f"for m in {list(modules)!r}: importlib.import_module(m)\n"
            "print(json.dumps({n: sum(1 for _ in open(m.__file__, encoding='utf-8'))\n"
            "    for n, m in sys.modules.items() if n.startswith('mlhpc') and getattr(m, '__file__', None)}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT).stdout
    return json.loads(out)


def _under(loaded: dict[str, int], *packages: str) -> list[str]:
    return sorted(n for n in loaded if any(n == p or n.startswith(p + ".") for p in packages))


def test_the_ground_floor_loads_nothing_above_it():
    loaded = _loaded("mlhpc.config", "mlhpc.workload", "mlhpc.log.parse", "mlhpc.log.summary",
                     "mlhpc.log.writer")
    assert not _under(loaded, "mlhpc.run", "mlhpc.power", "mlhpc.report", "mlhpc.store")
    contract = _loaded("mlhpc.config", "mlhpc.workload")
    assert not _under(contract, "mlhpc.run", "mlhpc.power", "mlhpc.data", "mlhpc.report", "mlhpc.store")


def test_power_loads_no_report():
    assert not _under(_loaded("mlhpc.power", "mlhpc.power.sampler", "mlhpc.power.sources"), "mlhpc.report")


#: What the run (`mlhpc.run.train`) may load, in lines of mlhpc: the issue's guard for a run not
#: outweighed by what is composed around it (7,994 on 2026-11-27).
RUN_LINES_MAX = 9000


def test_the_run_loads_no_report_or_store():
    loaded = _loaded("mlhpc.run.train")
    assert not _under(loaded, "mlhpc.report", "mlhpc.store")


def test_the_run_loads_only_the_run():
    """What the command composes around the run stays out of its stages: the log's reader (the
    summary, the resume's choice), the embedded data's synthesis, power sampling; and the run
    stays under its guard."""
    loaded = _loaded("mlhpc.run.train")
    composed = ["mlhpc.log.parse", "mlhpc.log.summary", "mlhpc.data.embedded", "mlhpc.data.synthwatch",
                "mlhpc.power.sampler", "mlhpc.run.command", "mlhpc.run.resume"]
    assert not [m for m in composed if m in loaded]
    assert sum(loaded.values()) <= RUN_LINES_MAX, sorted(loaded.items(), key=lambda kv: -kv[1])[:10]


@pytest.mark.parametrize("cli", sorted(MLHPC.rglob("cli.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_commands_import_as_python_does(cli):
    """The CLI adds every command group with an import statement, never ``__import__``."""
    tree = ast.parse(cli.read_text())
    calls = [n.lineno for n in ast.walk(tree)
             if isinstance(n, ast.Call) and getattr(n.func, "id", None) in ("__import__",)]
    assert not calls, f"{cli.relative_to(ROOT)}: __import__ at lines {calls}"
