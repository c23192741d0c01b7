"""MLPerf HPC rules that the harness and the report apply, kept as data in one place: one
`Ruleset` table per version (`RULESETS`), and the initialisation limits.

From mlcommons/training_policies ``hpc_training_rules.adoc`` (and, for the v3.0 order of
staging, mlcommons/logging issue 318; see docs/staging-at-scale.md):

- "the clock starts before any part of the system touches the dataset": nothing reads the dataset
  before ``init_start``;
- from v3.0 data may start on any durable storage, node-local disks included, never RAM, and
  staging sits in initialisation, untimed; before v3.0 the data started on a parallel file system
  and staging was timed (`Ruleset.staging_timed`);
- at most 30 minutes of initialisation before the clock for the closed division, 4 hours for the
  open division (`INIT_LIMIT_S`);
- "arbitrary sharding is allowed if the data stay randomly ordered overall and each datum appears
  exactly once per epoch" (`mlhpc.data.stage.assign_shards`, `mlhpc.data.sampler`).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Optional

#: Initialisation allowed before ``run_start``, seconds, by division.
INIT_LIMIT_S = {"closed": 30 * 60.0, "open": 4 * 3600.0}


@dataclass(frozen=True)
class Ruleset:
    """The rules of one MLPerf HPC ruleset version that the harness and the report apply.

    Attributes:
        version: ``"X.Y.Z"``, as mlperf_logging names its ``hpc_X.Y.Z`` rule folders.
        staging_timed: data staging counts inside the timed run (before v3.0 the data started
            on the parallel file system; from v3.0 staging sits in the untimed initialisation).
        runs: the result files a strong-scaling score needs, per benchmark of the round
            (mlperf_logging's ``benchmark_meta``: the benchmarks the round allows and their
            counts).
        max_dropped: runs a strong-scaling score may drop (a failed run counts as the slowest):
            result_summarizer's olympic mean drops this many at each end.
        sample_counted_epochs: benchmarks whose ``epoch_num`` counts training samples rather
            than passes over the data.
    """

    version: str
    staging_timed: bool
    runs: Mapping[str, int]
    max_dropped: int = 1
    sample_counted_epochs: frozenset[str] = frozenset()


def _ruleset(version: str, staging_timed: bool, runs: dict[str, int],
             sample_counted: frozenset[str] = frozenset()) -> Ruleset:
    return Ruleset(version, staging_timed, MappingProxyType(runs), 1, sample_counted)


_V07 = {"cosmoflow": 10, "deepcam": 5}
_V10 = {**_V07, "oc20": 5}
#: One table per ruleset version, the rounds' own rules (mlcommons/training_policies
#: hpc_training_rules.adoc of each round; mlperf_logging's benchmark_meta for the runs).
RULESETS: Mapping[str, Ruleset] = MappingProxyType({
    "0.7.0": _ruleset("0.7.0", True, _V07),
    "1.0.0": _ruleset("1.0.0", True, _V10),
    "2.0.0": _ruleset("2.0.0", True, _V10),
    "3.0.0": _ruleset("3.0.0", False, {**_V10, "openfold": 10}, frozenset({"openfold"})),
})
#: The ruleset mlhpc's own runs follow.
CURRENT = "3.0.0"


def ruleset(version: str | None = None) -> Ruleset:
    """The rules of ``version`` (``"X.Y.Z"``; None: `CURRENT`); an unknown version gets the
    rules of the latest one before it (a patch release keeps its round's rules).

    Raises:
        ValueError: ``version`` is not ``X.Y.Z`` or precedes every known ruleset.
    """
    version = version or CURRENT
    key = tuple(int(p) for p in version.split("."))
    known = [v for v in RULESETS if tuple(int(p) for p in v.split(".")) <= key]
    if not known:
        raise ValueError(f"ruleset {version}: no MLPerf HPC ruleset before it")
    return RULESETS[max(known, key=lambda v: tuple(int(p) for p in v.split(".")))]


def of_round(version: str | None, round_: str | None) -> Ruleset:
    """The rules a result is scored by: those of ruleset ``version`` when given, else of its
    round (``"v0.7"`` -> ``0.7.0``), else the current ones."""
    try:
        return ruleset(version or (f"{round_.lstrip('v')}.0" if round_ else None))
    except ValueError:
        return ruleset()


def staging_timed(version: str) -> bool:
    """Whether ruleset ``version`` (``"X.Y.Z"``) times staging inside the run (before v3.0)."""
    return ruleset(version).staging_timed


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
