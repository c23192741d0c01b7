"""mlperf_logging's internals that mlhpc relies on, checked in one place: a new release that
changes one of them fails here, naming it (mlhpc/log/mlperf_adapter.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mlhpc.log import mlperf_adapter


def test_everything_relied_on_is_there():
    assert mlperf_adapter.self_check() == []


def test_a_change_is_named(monkeypatch: pytest.MonkeyPatch):
    from mlperf_logging.rcp_checker import rcp_checker

    monkeypatch.delattr(rcp_checker, "get_submission_epochs")
    problems = mlperf_adapter.self_check()
    assert problems == ["mlperf_logging.rcp_checker.rcp_checker.get_submission_epochs: missing (AttributeError)"]


def test_the_version_is_bounded_in_pyproject():
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    line = next(line for line in text.splitlines() if '"mlperf-logging' in line)
    assert "<" in line, line


def test_only_the_adapter_imports_mlperf_logging_internals():
    """Outside the adapter, mlhpc imports only mlperf_logging.mllog (its public logging API)."""
    root = Path(__file__).resolve().parents[1] / "mlhpc"
    offenders = []
    for path in root.rglob("*.py"):
        if path.name == "mlperf_adapter.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.relative_to(root)}: {n}" for n in names
                          if n.startswith("mlperf_logging") and not n.startswith("mlperf_logging.mllog")]
    assert not offenders, offenders
