"""Shared fixtures. Paths, not state: every test works in its own tmp_path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO.parent / "shared" / "fixtures" / "mlperf-hpc-results"


def compliance_check(log: Path) -> subprocess.CompletedProcess:
    """Run MLCommons' own checker (hpc ruleset 3.0.0) on ``log``, in the log's folder (the checker
    writes compliance_checker.log into its working folder)."""
    return subprocess.run(
        [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "hpc",
         "--ruleset", "3.0.0", str(Path(log).resolve())], capture_output=True, text=True,
        timeout=300, cwd=Path(log).parent)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture
def mlhpc_cmd() -> list[str]:
    return [sys.executable, "-m", "mlhpc"]


@pytest.fixture(autouse=True)
def _few_threads(monkeypatch):
    # Two cores on CI: keep subprocesses from oversubscribing.
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "2"))
