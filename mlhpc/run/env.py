"""What a run ran on: versions, CPU, GPUs, host and git commit, written as ``env_N.json``."""

from __future__ import annotations

import os
import platform
import re
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import torch


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    here = Path(__file__).resolve().parents[1]
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


_REQUIREMENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


def _requirements(dist: str) -> list[str]:
    """The distributions ``dist`` requires to run (its optional extras left out), as its
    installed metadata names them; [] when it is not installed."""
    try:
        requires = metadata.requires(dist) or []
    except metadata.PackageNotFoundError:
        return []
    return [m.group(0) for req in requires if "extra ==" not in req.partition(";")[2]
            and (m := _REQUIREMENT_NAME.match(req.strip()))]


def versions() -> dict[str, str | None]:
    """Installed versions of mlhpc and everything it requires, then of each distribution that
    provides a workload (an ``mlhpc.workloads`` entry point) and everything that requires: read
    from the installed distributions' metadata, so the harness lists no workload's packages by
    name. ``{distribution: version}``, mlhpc first; None for one that is not installed."""
    names = ["mlhpc", *_requirements("mlhpc")]
    for entry in metadata.entry_points(group="mlhpc.workloads"):
        dist = entry.dist.name if entry.dist is not None else None
        if dist:
            names += [dist, *_requirements(dist)]
    return {name: _version(name) for name in dict.fromkeys(names)}


def collect() -> dict[str, Any]:
    """A JSON-able description of this process's machine and software."""
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {
        "hostname": socket.gethostname(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_num_threads": torch.get_num_threads(),
        "memory_bytes": _memory_bytes(),
        "gpu_count": len(gpus),
        "gpu_names": gpus,
        "cuda": torch.version.cuda,
        "versions": versions(),
        "git_commit": _git_commit(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
    }


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
