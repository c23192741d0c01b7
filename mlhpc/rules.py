"""MLPerf HPC rules that the harness applies, kept as data in one place.

From mlcommons/training_policies ``hpc_training_rules.adoc`` (and, for the v3.0 order of
staging, mlcommons/logging issue 318; see docs/staging-at-scale.md):

- "the clock starts before any part of the system touches the dataset": nothing reads the dataset
  before ``init_start``;
- from v3.0 data may start on any durable storage, node-local disks included, never RAM, and
  staging sits in initialisation, untimed; before v3.0 the data started on a parallel file system
  and staging was timed (`STAGING_TIMED`);
- at most 30 minutes of initialisation before the clock for the closed division, 4 hours for the
  open division (`INIT_LIMIT_S`);
- "arbitrary sharding is allowed if the data stay randomly ordered overall and each datum appears
  exactly once per epoch" (`mlhpc.data.stage.assign_shards`, `mlhpc.data.sampler`).
"""

from __future__ import annotations

from typing import Optional

#: Initialisation allowed before ``run_start``, seconds, by division.
INIT_LIMIT_S = {"closed": 30 * 60.0, "open": 4 * 3600.0}

#: Whether staging counts inside the timed run, by the first ruleset of each regime.
STAGING_TIMED = {"0.7.0": True, "1.0.0": True, "2.0.0": True, "3.0.0": False}


def staging_timed(ruleset: str) -> bool:
    """Whether ``ruleset`` (``"X.Y.Z"``) times staging inside the run (before v3.0)."""
    major = int(str(ruleset).split(".")[0])
    return major < 3


def init_limit_s(division: str) -> float:
    """The time allowed between ``init_start`` and ``run_start`` under the MLPerf HPC v3.0 rules:
    30 minutes in the closed division, 4 hours in the open one."""
    return INIT_LIMIT_S["closed" if division == "closed" else "open"]


def init_limit_warning(init_s: float, division: str, placement: str) -> Optional[str]:
    """A one-line warning when staging sits in init and init took longer than the rules allow
    (`init_limit_s`); ``None`` otherwise."""
    limit = init_limit_s(division)
    if placement != "init" or init_s <= limit:
        return None
    return (f"initialisation took {init_s / 60:.1f} min with staging before run_start; the "
            f"{division} division allows {limit / 60:.0f} min (set data.staging.placement: run "
            "to time staging inside the run, as before v3.0)")
