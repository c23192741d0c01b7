"""What a wheel of mlhpc holds: every package of the tree and every data file a module reads
(an editable install finds them in the checkout; a built wheel only what pyproject.toml lists)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_of_the_tree_is_listed():
    found = set()
    for top, name in (("mlhpc", "mlhpc"), ("workloads", "mlhpc_workloads")):
        for init in (ROOT / top).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / top).parts
            found.add(".".join((name, *parts)))
    assert sorted(found - set(_setuptools()["packages"])) == []


def test_every_data_file_in_the_package_is_listed():
    patterns = _setuptools()["package-data"]["mlhpc"]
    data = [p.relative_to(ROOT / "mlhpc") for p in (ROOT / "mlhpc").rglob("*")
            if p.is_file() and p.suffix in {".json", ".yaml", ".in", ".csv"}]
    assert data, "no data file found: the pattern above is out of date"
    assert [str(p) for p in data if not any(p.match(pattern) for pattern in patterns)] == []
