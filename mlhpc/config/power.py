"""The ``power`` section of a run config (`mlhpc.config`): whether, how often and from what a
node's power is sampled during the timed run (`mlhpc.power.sampler.sampling`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: The folder of a run's power logs, beside its result logs: ``<output.dir>/power/result_N/``.
POWER_DIR = "power"


class PowerConfig(BaseModel):
    """The ``power`` section of a run config.

    Attributes:
        enabled: ``true`` sample (say so when nothing can be read), ``false`` never, ``null``
            (default) sample where a counter is found.
        interval_s: seconds between readings, 0.05 .. 1 (at least 1 Hz, as the MLPerf power rules).
        node_meter_command: a command printing the node's power in watts as one number (run
            without a shell each reading); when given it is the node's only source.
        powercap_root: where the Linux powercap (RAPL) zones are.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    enabled: Optional[bool] = None
    interval_s: float = Field(1.0, ge=0.05, le=1.0)
    node_meter_command: str = ""
    powercap_root: Path = Field(Path("/sys/class/powercap"), strict=False)

    @field_validator("node_meter_command")
    @classmethod
    def _splits(cls, value: str) -> str:
        """The command is split as it will be run (no shell), at load: an unbalanced quote is a
        config error before the run starts, not a failure after run_start."""
        import shlex

        try:
            shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"cannot be split into a command and its arguments ({exc})") from None
        return value
