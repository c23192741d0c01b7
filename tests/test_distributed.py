"""Data parallelism on CPUs (Gloo): torchrun and mpiexec launch 2 ranks; the result equals 1 rank."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from test_run_e2e import ONCE_ONLY, events, tiny_args, tiny_data  # noqa: F401 (fixture)

pytestmark = pytest.mark.cluster  # torchrun and mpiexec

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600, env=env)


def metric_series(log: Path) -> list[float]:
    return [e["value"] for e in events(log) if e["key"] == "eval_error"]


@pytest.fixture(scope="module")
def single_rank(tmp_path_factory, repo, tiny_data):
    out = tmp_path_factory.mktemp("single")
    proc = launch([str(BIN / "mlhpc"), *tiny_args(repo, tiny_data, out, "--set", "train.target=0.0")],
                  cwd=out)
    assert proc.returncode == 1, proc.stderr  # target 0 is never reached: 2 full epochs
    return metric_series(out / "result_0.txt")


@pytest.mark.parametrize("launcher", ["torchrun", "mpiexec"])
def test_two_ranks_match_one_rank(tmp_path, repo, tiny_data, single_rank, launcher):
    """2 ranks x local batch b give the same per-epoch eval_error as 1 rank x 2b (same seed)."""
    out = tmp_path / "out"
    args = tiny_args(repo, tiny_data, out, "--set", "train.target=0.0")
    if launcher == "torchrun":
        cmd = [str(BIN / "torchrun"), "--nproc-per-node", "2", "--no-python", str(BIN / "mlhpc"), *args]
    else:
        mpiexec = shutil.which("mpiexec", path=str(BIN)) or shutil.which("mpiexec")
        assert mpiexec, "mpiexec (PyPI mpich) not installed"
        cmd = [mpiexec, "-n", "2", str(BIN / "mlhpc"), *args]
    proc = launch(cmd, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    logs = sorted(out.glob("result_*.txt"))
    assert [p.name for p in logs] == ["result_0.txt"]  # rank 0 alone writes
    keys = [e["key"] for e in events(logs[0])]
    for key in ONCE_ONLY:
        assert keys.count(key) == 1, key
    nodes = [e["value"] for e in events(logs[0]) if e["key"] == "number_of_nodes"]
    assert nodes == [1]
    two = metric_series(logs[0])
    assert len(two) == len(single_rank) == 2
    for a, b in zip(two, single_rank):
        assert a == pytest.approx(b, abs=2e-4)
