"""A real one-node Slurm cluster for the tests marked ``slurm``.

``slurm_cluster`` (session scope) runs scripts/slurm/start-cluster.sh, which installs Slurm with
apt-get when missing, configures this host as controller and only node, starts munged, slurmctld
and slurmd, and waits for the node to be idle. The tests are skipped only where that cannot work:
not root, or Slurm missing with no apt-get to install it. Anywhere else (CI runs as root with apt)
a cluster that does not come up is a test failure.

Import the fixture into a test module with ``from slurm_cluster import slurm_cluster``.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
START_SCRIPT = REPO / "scripts" / "slurm" / "start-cluster.sh"
TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                   "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


@dataclass(frozen=True)
class SlurmCluster:
    """The running test cluster: its only node and how many CPUs it offers."""

    node: str
    cpus: int
    partition: str


@dataclass(frozen=True)
class JobEnd:
    """How a batch job ended, from ``scontrol show job``."""

    job_id: str
    state: str
    exit_code: str  # "<status>:<signal>", e.g. "0:0"
    details: str  # the whole `scontrol show job` record, for assertion messages


def _skip_reason() -> str | None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "the Slurm test cluster needs root (installs packages, starts daemons)"
    if shutil.which("slurmctld") is None and not os.path.exists("/usr/sbin/slurmctld") \
            and shutil.which("apt-get") is None:
        return "Slurm is not installed and apt-get is not available to install it"
    return None


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    """Start (or find running) the one-node cluster; skip only without root or apt."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    proc = subprocess.run(["bash", str(START_SCRIPT)], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.fail(f"{START_SCRIPT} failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    node = socket.gethostname().split(".")[0]
    info = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%c %P"], capture_output=True,
                          text=True, timeout=60, check=True).stdout.split()
    return SlurmCluster(node=node, cpus=int(info[0]), partition=info[1].rstrip("*"))


def wait_for_job(job_id: str, timeout_s: float = 600.0, poll_s: float = 1.0) -> JobEnd:
    """Poll ``scontrol show job`` until the job reaches a terminal state; cancel it on timeout."""
    deadline = time.monotonic() + timeout_s
    text = ""
    while time.monotonic() < deadline:
        text = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True,
                              timeout=60).stdout
        state = re.search(r"JobState=(\S+)", text)
        if state and state.group(1) in TERMINAL_STATES:
            code = re.search(r"\bExitCode=(\S+)", text)
            return JobEnd(job_id, state.group(1), code.group(1) if code else "?", text)
        time.sleep(poll_s)
    subprocess.run(["scancel", job_id], timeout=60)
    raise AssertionError(f"job {job_id} did not finish in {timeout_s:.0f} s:\n{text}")
