"""Typed options (issue 54): no dataclass in mlhpc/ wider than 25 fields, no public function of
mlhpc/ taking ``**kwargs`` unless it forwards them to a third-party API, no config section typed
``Any``. Read from the source with `ast`, so they stay true as the code changes."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MLHPC = ROOT / "mlhpc"
MAX_FIELDS = 25

#: Dataclasses allowed more than `MAX_FIELDS` fields, with the reason.
WIDE_ALLOWED: dict[str, str] = {}
#: Public functions that take ``**kwargs`` to hand them to a third-party API, with that API.
FORWARDS = {
    "mlhpc/data/loader.py::make_loader": "torch.utils.data.DataLoader's sampler, shuffle, drop_last, num_workers",
    "mlhpc/data/loader.py::device_loader": "make_loader's DataLoader options, passed on as they are",
    "mlhpc/run/flops.py::conv_backward_flops": "torch's register_flop_formula calls it with aten's arguments",
    "mlhpc/text.py::console": "rich.console.Console's options",
}


def _sources() -> list[Path]:
    return sorted(MLHPC.rglob("*.py"))


def _is_dataclass(node: ast.ClassDef) -> bool:
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "dataclass":
            return True
    return False


def _fields(node: ast.ClassDef) -> list[str]:
    """The class's annotated fields: not a ``ClassVar``, not the ``KW_ONLY`` marker."""
    out = []
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            annotation = ast.unparse(stmt.annotation)
            if "ClassVar" not in annotation and "KW_ONLY" not in annotation:
                out.append(stmt.target.id)
    return out


def wide_dataclasses(source: str) -> list[tuple[str, int]]:
    """``(class, fields)`` of every dataclass in ``source`` with more than `MAX_FIELDS` fields."""
    return [(node.name, len(_fields(node))) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ClassDef) and _is_dataclass(node) and len(_fields(node)) > MAX_FIELDS]


def _public(name: str) -> bool:
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def keyword_bags(source: str) -> list[str]:
    """Public functions of ``source`` (module level, or methods of a public class) taking
    ``**kwargs``, as ``name`` or ``Class.name``. A nested function is no one's interface."""
    found = []

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.args.kwarg is not None and _public(node.name):
                    found.append(prefix + node.name)
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                walk(node.body, f"{prefix}{node.name}.")

    walk(ast.parse(source).body, "")
    return found


def _names_any(annotation: ast.expr) -> bool:
    return any((isinstance(n, ast.Name) and n.id == "Any") or (isinstance(n, ast.Attribute) and n.attr == "Any")
               for n in ast.walk(annotation))


def any_fields(source: str) -> list[str]:
    """``Class.field`` of every class-level field of ``source`` whose annotation names ``Any``."""
    return [f"{node.name}.{stmt.target.id}" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ClassDef) for stmt in node.body
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
            and _names_any(stmt.annotation)]


def _key(path: Path, name: str) -> str:
    return f"{path.relative_to(ROOT).as_posix()}::{name}"


def test_no_dataclass_in_mlhpc_has_more_than_25_fields() -> None:
    wide = [f"{_key(p, name)} ({count} fields)" for p in _sources()
            for name, count in wide_dataclasses(p.read_text()) if _key(p, name) not in WIDE_ALLOWED]
    assert not wide, f"split into typed sub-records: {wide}"


def test_no_public_function_in_mlhpc_takes_a_keyword_bag() -> None:
    bags = [_key(p, name) for p in _sources() for name in keyword_bags(p.read_text())
            if _key(p, name) not in FORWARDS]
    assert not bags, f"take a typed record (or list the third-party API it forwards to in FORWARDS): {bags}"


def test_no_config_section_is_typed_any() -> None:
    loose = [_key(p, name) for p in sorted((MLHPC / "config").rglob("*.py")) for name in any_fields(p.read_text())]
    assert not loose, f"config fields typed Any: {loose}"
    from mlhpc.config import Config

    assert all(field.annotation is not Any for field in Config.model_fields.values())


def test_every_allowance_is_still_needed() -> None:
    wide = {_key(p, name) for p in _sources() for name, _ in wide_dataclasses(p.read_text())}
    bags = {_key(p, name) for p in _sources() for name in keyword_bags(p.read_text())}
    assert not set(WIDE_ALLOWED) - wide, f"no longer wide: drop from WIDE_ALLOWED: {set(WIDE_ALLOWED) - wide}"
    assert not set(FORWARDS) - bags, f"no longer a keyword bag: drop from FORWARDS: {set(FORWARDS) - bags}"


def test_the_checks_see_planted_cases() -> None:
    fields = "\n".join(f"    f{i}: int = 0" for i in range(MAX_FIELDS + 1))
    planted = (f"from dataclasses import dataclass, KW_ONLY\n@dataclass(frozen=True)\nclass Wide:\n{fields}\n"
               f"@dataclass\nclass Narrow:\n    _: KW_ONLY\n{fields.split(chr(10), 1)[1]}\n")
    assert wide_dataclasses(planted) == [("Wide", MAX_FIELDS + 1)]
    bags = ("def render(path, **options): pass\ndef _inner(**kw): pass\n"
            "class Job:\n    def __init__(self, **kw): pass\n    def _private(self, **kw): pass\n"
            "def outer():\n    def nested(**kw): pass\nclass _Hidden:\n    def go(self, **kw): pass\n")
    assert keyword_bags(bags) == ["render", "Job.__init__"]
    sections = "class Config:\n    model: Any = None\n    train: TrainConfig\n    extra: typing.Any\n"
    assert any_fields(sections) == ["Config.model", "Config.extra"]
