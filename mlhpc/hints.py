"""The closest valid name to a mistyped one, for one-line error messages ("did you mean ...?").

Uses `difflib.get_close_matches` (ratio >= 0.6, the standard library's default cut-off), so a
name that resembles none of the valid ones gets no guess.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel


def closest(name: str, choices: Iterable[str]) -> str | None:
    """The valid name in ``choices`` closest to ``name``, or None when none is close."""
    found = difflib.get_close_matches(str(name), sorted(set(choices)), n=1)
    return found[0] if found else None


def did_you_mean(name: str, choices: Iterable[str], prefix: str = "") -> str:
    """``"; did you mean PREFIX+closest?"`` for a message's tail, or ``""`` when none is close."""
    found = closest(name, choices)
    return f"; did you mean {prefix}{found}?" if found else ""


def existing_file(path: Path, suffixes: tuple[str, ...] = (".yaml", ".yml")) -> Path | None:
    """For a file that does not exist, the one that probably was meant: ``path`` with one of
    ``suffixes`` added, else the closest name among the files with those suffixes beside it."""
    path = Path(path)
    for suffix in suffixes:
        candidate = path.with_name(path.name + suffix)
        if candidate.is_file():
            return candidate
    folder = path.parent
    try:
        names = [p.name for p in folder.iterdir() if p.suffix in suffixes and p.is_file()]
    except OSError:
        return None
    found = closest(path.name, names)
    return folder / found if found else None


def section_model(schema: type[BaseModel], path: tuple[Any, ...]) -> type[BaseModel] | None:
    """The section model at ``path`` (key names) below ``schema``, or None where ``path`` leads
    to no section (an unknown key, a plain value)."""
    model: Any = schema
    for part in path:
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        ann = field.annotation
        model = next((a for a in (ann, *get_args(ann))
                      if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if model is None:
            return None
    return model
