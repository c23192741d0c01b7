"""The `Job`: what every stage of one run reads, built once and never changed."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from mlhpc.config import Config
from mlhpc.run.checkpoint import Resume
from mlhpc.runtime import Runtime
from mlhpc.workload import Workload

if TYPE_CHECKING:
    from mlhpc.run.emulate import Emulation

ProgressFn = Callable[[dict[str, Any]], None]


def _quiet(event: dict[str, Any]) -> None:
    """The progress callback of a run nobody watches."""


@dataclass(frozen=True)
class Job:
    """One instance's run, as every stage reads it (frozen: a stage returns what it makes).

    Attributes:
        config: the resolved config.
        workload: the workload it trains.
        world: the whole job's `Runtime` (every rank of every instance).
        rt: this instance's share of it (`mlhpc.runtime.split_instances`; ``world`` itself when
            the job trains one model).
        resume: the checkpoint this run continues, or None.
        progress: called with the run's events on the ranks that report (library code never
            prints).
        synthesis_s: seconds spent making the embedded data before the run (0.0: they were there).
    """

    config: Config
    workload: Workload
    world: Runtime
    rt: Runtime
    resume: Resume | None = None
    progress: ProgressFn = _quiet
    synthesis_s: float = 0.0

    @property
    def seed(self) -> int:
        """The instance's seed: ``train.seed`` plus its instance number."""
        return self.config.train.seed + (self.rt.instance or 0)

    @functools.cached_property
    def emulation(self) -> "Emulation | None":
        """Storage mode's emulated accelerator (``train.emulate_accelerator``), or None: a normal
        run (`mlhpc.run.emulate`). Raises ConfigError: an unknown accelerator name."""
        from mlhpc.run.emulate import emulation  # loaded in storage mode only: a run loads what it uses

        return emulation(self.config, self.workload.name) if self.config.train.emulate_accelerator else None
