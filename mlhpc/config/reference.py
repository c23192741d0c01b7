"""The config reference (docs/config-reference.md), generated from the config schema itself.

Every key of the common sections (`mlhpc.config.Config`) and of each shipped workload's
``model``, ``optimizer`` and ``synth`` sections, with its type, default, allowed range, unit and
meaning. The meaning is the field's ``description=``, else its entry under ``Attributes:`` in
its section's docstring; `missing_descriptions` lists the keys that have neither (a test keeps
it empty and keeps the file equal to `render`, so the reference cannot drift from the code).

Units follow the project's naming rule (units live in names): a key ending ``_s`` is in seconds,
``_km`` in kilometres, and so on (`UNITS`).
"""

from __future__ import annotations

import json
import re
import textwrap
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from mlhpc.config import Config

#: Name suffix -> unit, longest first (units live in names, docs/architecture.md).
UNITS = {
    "_km_per_s_per_mpc": "km/s/Mpc", "_kg_per_m_s": "kg/(m s)", "_kg_per_m2": "kg/m^2",
    "_eV_per_A": "eV/Å", "_m_per_s": "m/s", "_mpc_h": "Mpc/h", "_bytes": "bytes", "_epochs": "epochs",
    "_steps": "steps", "_ms": "ms", "_km": "km", "_pa": "Pa", "_A": "Å", "_k": "K", "_s": "s",
}
COMMON = ("submission", "data", "train", "output", "power", "automl")


@dataclass(frozen=True)
class Key:
    """One config key as the reference shows it."""

    path: str  # dotted, e.g. train.max_epochs
    type: str
    default: str
    allowed: str
    unit: str
    meaning: str  # "" when the schema gives none


def _section(ann: Any) -> type[BaseModel] | None:
    return next((a for a in (ann, *get_args(ann)) if isinstance(a, type) and issubclass(a, BaseModel)),
                None)


def _after_first_line(doc: str) -> str:
    """A docstring with its first line (never indented) set apart, so the rest dedents."""
    first, _, rest = doc.partition("\n")
    return first.strip() + "\n" + textwrap.dedent(rest)


def docstring_attributes(model: type) -> dict[str, str]:
    """``name -> text`` of the ``Attributes:`` block of ``model``'s own docstring (Google style)."""
    doc = _after_first_line(model.__doc__ or "").strip()  # a class docstring is its own
    found: dict[str, str] = {}
    block = doc.split("Attributes:", 1)[1] if "Attributes:" in doc else ""
    name = None
    for line in block.splitlines():
        entry = re.match(r"^    (\w+)(?: \([^)]*\))?: (.*)$", line)
        if entry:
            name = entry.group(1)
            found[name] = entry.group(2).strip()
        elif name and line.startswith("        "):
            found[name] += " " + line.strip()
        elif line.strip():
            break
    return found


def _type(ann: Any) -> str:
    """``ann`` as a reader would write it: ``dict[int, float]``, ``Optional[int]``, ``Literal[...]``
    (an ``Annotated`` type shown as the type it annotates)."""
    origin, args = get_origin(ann), get_args(ann)
    if origin is Annotated:
        return _type(args[0])
    if origin is Literal:
        return f"Literal[{', '.join(repr(a) for a in args)}]"
    if origin is Union:
        inner = [a for a in args if a is not type(None)]
        text = " | ".join(_type(a) for a in inner)
        return f"Optional[{text}]" if len(inner) < len(args) else text
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join('...' if a is Ellipsis else _type(a) for a in args)}]"
    if isinstance(ann, type):
        return "None" if ann is type(None) else ann.__name__
    return re.sub(r"\b(typing|pathlib|collections\.abc)\.", "", str(ann))


def _default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, tuple):
        value = list(value)
    return json.dumps(value, default=str)


def _allowed(field: Any) -> str:
    signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<", "min_length": "length >=",
             "pattern": "matches"}
    parts = [f"{sign} {getattr(m, name)}" for m in field.metadata for name, sign in signs.items()
             if getattr(m, name, None) is not None]
    return ", ".join(parts)


def _unit(name: str) -> str:
    return next((unit for suffix, unit in UNITS.items() if name.endswith(suffix)), "")


def section_keys(model: type[BaseModel], prefix: str) -> list[Key]:
    """Every key of ``model`` (nested sections flattened under ``prefix``), in declaration order."""
    out: list[Key] = []
    attributes = docstring_attributes(model)
    for name, field in model.model_fields.items():
        nested = _section(field.annotation)
        if nested is not None:  # a mapping of sections (automl.space) is keyed by name
            keyed = "<key>." if typing.get_origin(field.annotation) is dict else ""
            out += section_keys(nested, f"{prefix}{name}.{keyed}")
            continue
        meaning = field.description or attributes.get(name, "")
        out.append(Key(prefix + name, _type(field.annotation), _default(field), _allowed(field),
                       _unit(name), " ".join(meaning.split())))
    return out


def shipped_workloads() -> list[str]:
    """The workloads this distribution ships (the ``mlhpc.workloads`` entry points of the
    ``mlhpc`` distribution itself); a third party's workload, or one registered in a process,
    documents its own keys."""
    from importlib.metadata import entry_points

    return sorted(ep.name for ep in entry_points(group="mlhpc.workloads")
                  if ep.dist is not None and ep.dist.name == "mlhpc")


def sections() -> list[tuple[str, list[Key]]]:
    """(heading, keys) of the common sections, then of each shipped workload's own."""
    from mlhpc.workload import get

    found = [("top level", [Key("workload", "str", "required", "a registered workload", "",
                                "the workload to run (`mlhpc list` shows them)")])]
    for name in COMMON:
        found.append((f"`{name}`", section_keys(_section(Config.model_fields[name].annotation),
                                                  f"{name}.")))
    for workload in shipped_workloads():
        spec = get(workload)
        for section, model in spec.sections().items():
            found.append((f"`{section}` ({workload})", section_keys(model, f"{section}.")))
    return found


def missing_descriptions() -> list[str]:
    """``heading: key`` of every key the schema gives no meaning for."""
    return [f"{heading}: {key.path}" for heading, keys in sections() for key in keys if not key.meaning]


def _cell(text: str) -> str:
    return text.replace("|", "\\|") if text else "-"


def render() -> str:
    """docs/config-reference.md as Markdown."""
    lines = ["# Config reference", "",
             "Generated from the config schema by `mlhpc config reference --out "
             "docs/config-reference.md`; do not edit by hand (tests/test_config_reference.py "
             "fails when this file and the schema differ).", "",
             "A config is YAML: the file's values over these defaults, then `--set "
             "section.key=value` over both. Unknown keys are errors. Paths are taken relative "
             "to the folder `mlhpc` runs in. Units live in names (`_s`: seconds).", ""]
    for heading, keys in sections():
        lines += [f"## {heading}", "", "| key | type | default | allowed | unit | meaning |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| `{k.path}` | {_cell(k.type)} | {_cell(k.default)} | {_cell(k.allowed)} | "
                  f"{_cell(k.unit)} | {_cell(k.meaning)} |" for k in keys]
        lines.append("")
    return "\n".join(lines)

