"""`validate`: the levels of ``mlhpc validate`` asked for, on this rank's device, with the
process group of the launcher that started the job (if any) up for their duration; and the
checks of the command line's values (`parse_levels`, `parse_device`, `parse_precision`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from mlhpc import runtime
from mlhpc.config import Config
from mlhpc.errors import ConfigError
from mlhpc.run.step import precision as run_precision
from mlhpc.validate.checks import PRECISIONS, Check
from mlhpc.workload import get as get_workload

LEVELS = (0, 1, 2, 3)
LEVEL_NAMES = {0: "operators", 1: "network", 2: "training", 3: "distributed"}
MAX_STEPS = 100


@dataclass
class Validation:
    """What `validate` found: every check of every level asked for (all ranks' when the job
    has several), the device and precision, and the seconds each level took (rank 0's)."""

    workload: str
    device: str
    precision: str
    levels: list[int]
    checks: list[Check]
    seconds: dict[int, float] = field(default_factory=dict)
    reports: bool = True  # this rank prints (rank 0 of a launched job)

    @property
    def passed(self) -> bool:
        """No check failed (a skipped check or a row of information does not fail)."""
        return not any(c.passed is False for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"workload": self.workload, "device": self.device, "precision": self.precision,
                "levels": self.levels, "passed": self.passed,
                "seconds": {str(k): v for k, v in self.seconds.items()},
                "checks": [c.to_dict() for c in self.checks]}


def parse_levels(text: str) -> list[int]:
    """``"0,1,2,3"`` -> ``[0, 1, 2, 3]`` (sorted, once each).

    Raises:
        ConfigError: a level that is not one of `LEVELS`, or none."""
    levels = set()
    for part in text.split(","):
        part = part.strip()
        if part not in {str(n) for n in LEVELS}:
            raise ConfigError(f"--level {text!r}: unknown level {part!r}; the levels are "
                              f"{', '.join(f'{n} ({LEVEL_NAMES[n]})' for n in LEVELS)}")
        levels.add(int(part))
    return sorted(levels)


def parse_device(text: str | None, config: Config) -> str:
    """The device asked for (default the config's ``train.device``): ``auto``, ``cpu``, ``cuda``.

    Raises:
        ConfigError: another name, or CUDA on a machine without it."""
    device = text if text is not None else str(config.train.device)
    if device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"--device {device!r}: expected auto, cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible on this machine")
    return device


def parse_precision(text: str | None, config: Config, device: torch.device) -> str:
    """The precision asked for (default the run's: bf16 when ``train.amp`` is on a CUDA device,
    else fp32, `mlhpc.run.step.precision`).

    Raises:
        ConfigError: not one of `mlhpc.validate.checks.PRECISIONS`."""
    name = text if text is not None else run_precision(config.train.amp, device)
    if name not in PRECISIONS:
        raise ConfigError(f"--precision {name!r}: expected one of {', '.join(PRECISIONS)}")
    return name


def validate(config: Config, levels: list[int], device: str | None = None,
             precision: str | None = None, steps: int = 3) -> Validation:
    """Run the ``levels`` of ``config``'s workload (module docstring of `mlhpc.validate`).

    Raises:
        ConfigError: bad device, precision or steps (before anything is built), or the model
            cannot be built.
        DataError: the data cannot be read or synthesised.
    """
    from mlhpc.validate import distributed, material, network, operators

    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise ConfigError(f"--steps {steps}: must be an integer from 1 to {MAX_STEPS}")
    asked = parse_device(device, config)
    workload = get_workload(config.workload)
    with runtime.started(asked, threads=config.train.threads) as (rt, _):
        name = parse_precision(precision, config, rt.device)
        mat = material.material(config, workload, rt, name)
        found: list[Check] = []
        seconds: dict[int, float] = {}
        run = {0: lambda: operators.level0(mat), 1: lambda: network.level1(mat),
               2: lambda: network.level2(mat, steps), 3: lambda: distributed.level3(mat, rt)}
        for level in levels:
            t0 = time.perf_counter()
            rows = run[level]()
            seconds[level] = time.perf_counter() - t0
            for row in rows:
                row.rank = rt.rank
            found += rows
        if rt.distributed:  # every rank's rows, in rank order, on every rank
            found = [c for part in runtime.all_gather(found)
                     for c in part if c.level != 3 or c.rank == 0]
    return Validation(workload.name, str(mat.device), name, levels, found, seconds, rt.is_main)
