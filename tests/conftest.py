"""Shared fixtures. Paths, not state: every test works in its own tmp_path."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Published MLCommons result logs, shipped in the repository (see tests/data/mlperf-hpc-results/README.md).
FIXTURES = REPO / "tests" / "data" / "mlperf-hpc-results"
FIXTURES_ARCHIVE = FIXTURES / "mlperf-hpc-results.tar.xz"


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


@pytest.fixture(scope="session")
def mlperf_results(tmp_path_factory) -> Path:
    """The published trees (``hpc_results_v1.0``, ``hpc_results_v3.0``, ``expected_scores.csv``),
    unpacked once per session from the archive in tests/data into a temporary folder (about 1 s)."""
    root = tmp_path_factory.mktemp("mlperf-hpc-results")
    with tarfile.open(FIXTURES_ARCHIVE) as archive:
        archive.extractall(root, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return root


@pytest.fixture
def mlhpc_cmd() -> list[str]:
    return [sys.executable, "-m", "mlhpc"]


@pytest.fixture(autouse=True)
def _few_threads(monkeypatch):
    # Two cores on CI: keep subprocesses from oversubscribing.
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "2"))
    # Runs made by tests are not recorded in the user's results store (tests that test the
    # store set their own MLHPC_STORE).
    monkeypatch.setenv("MLHPC_STORE", "none")
