"""Stored runs checked against performance references kept as data, the way ReFrame keeps them.

The references file (YAML) maps system -> benchmark -> figure -> ``[value, lower, upper, unit]``
(or a mapping with those keys). As in ReFrame, ``lower`` and ``upper`` are fractions of
``value`` (``-0.05`` and ``0.10``: 5% below to 10% above), ``null`` for no bound::

    daint-gpu:
      cosmoflow:
        time_to_train_s: [1200.0, null, 0.10, s]
        samples_per_s: {value: 950.0, lower: -0.10, upper: null, unit: samples/s}

Figures: ``time_to_train_s`` (unit ``s`` or ``min``), ``energy_to_train_j`` (``J``, ``kJ``,
``kWh``): lower is better; ``samples_per_s`` (``samples/s``): higher is better. Each number passes
the range check `mlhpc.log.plausible.out_of_range` where it is read: ``value`` finite, above
0 and within the figure's `mlhpc.log.plausible.BOUNDS`, ``lower`` from -1 to 0, ``upper`` from 0
to `MAX_UPPER` (NaN or Infinity would make the gate never fire, a bound on the wrong side of the
value make it always fire); a stored figure outside its bounds is left out of the runs judged. The measured
figure is the olympic mean of the system's last ``window`` successful runs of the benchmark
(their mean with fewer than 3). Outside the bounds on the worse side is a regression; outside
on the better side is "improved" (the reference may be updated), not a failure.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mlhpc.data.inputs import read_text_input
from mlhpc.errors import ConfigError
from mlhpc.log.plausible import BOUNDS, checked_number, out_of_range
from mlhpc.text import clip
from mlhpc.report.score import compute_olympic_average

#: figure -> (unit -> factor to the stored unit, "lower" or "higher" is better)
FIGURES: dict[str, tuple[dict[str, float], str]] = {
    "time_to_train_s": ({"s": 1.0, "min": 60.0, "h": 3600.0}, "lower"),
    "energy_to_train_j": ({"J": 1.0, "kJ": 1e3, "kWh": 3.6e6}, "lower"),
    "samples_per_s": ({"samples/s": 1.0}, "higher"),
}
#: figure -> its name in `mlhpc.log.plausible.BOUNDS` (the stored unit's bounds).
_BOUNDS_OF = {"time_to_train_s": "time_to_train_s", "energy_to_train_j": "energy_j", "samples_per_s": "samples_per_s"}
#: The largest ``upper`` fraction: a million times the value.
MAX_UPPER = 1e6


@dataclass(frozen=True)
class Reference:
    """One reference, its value and bounds converted to the stored unit."""

    system: str
    benchmark: str
    figure: str
    value: float
    lower: float | None
    upper: float | None
    unit: str

    @property
    def low_bound(self) -> float | None:
        return None if self.lower is None else self.value * (1 + self.lower)

    @property
    def high_bound(self) -> float | None:
        return None if self.upper is None else self.value * (1 + self.upper)


@dataclass(frozen=True)
class Verdict:
    """``ok``, ``regression``, ``improved`` or ``no runs``, with the measured figure."""

    reference: Reference
    verdict: str
    measured: float | None = None
    runs: int = 0


def _number(where: str, value: Any, optional: bool, bounds: tuple[float, float], unit: str = "",
            above_low: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: expected a number{' or null' if optional else ''}, got {clip(value, 80)}")
    return checked_number(value, where, ConfigError, bounds, unit, above_low)


def in_bounds(figure: str, value: Any) -> bool:
    """Whether a stored ``figure`` (stored unit) is a finite number within its bounds."""
    low, high, _ = BOUNDS[_BOUNDS_OF[figure]]
    return out_of_range(value, low, high, above_low=True) is None


def _reference(where: str, system: str, benchmark: str, figure: str, spec: Any) -> Reference:
    if figure not in FIGURES:
        raise ConfigError(f"{where}: unknown figure {clip(repr(figure), 80)} (one of {', '.join(FIGURES)})")
    if isinstance(spec, dict):
        spec = [spec.get("value"), spec.get("lower"), spec.get("upper"), spec.get("unit")]
    if not isinstance(spec, list) or len(spec) != 4:
        raise ConfigError(f"{where}: expected [value, lower, upper, unit]")
    units, _ = FIGURES[figure]
    unit = spec[3] if isinstance(spec[3], str) else clip(spec[3], 80)  # never a huge value's str
    if unit not in units:
        raise ConfigError(f"{where}: unit {clip(repr(unit), 80)} for {figure} (one of {', '.join(units)})")
    factor = units[unit]
    high = BOUNDS[_BOUNDS_OF[figure]][1] / factor
    value = _number(where + " value", spec[0], False, (0.0, high), unit, above_low=True)
    return Reference(system, benchmark, figure, value * factor,  # type: ignore[operator]
                     _number(where + " lower", spec[1], True, (-1.0, 0.0)),
                     _number(where + " upper", spec[2], True, (0.0, MAX_UPPER)), unit)


def load_references(path: Path) -> list[Reference]:
    """Read a references file (see the module docstring).

    Raises:
        ConfigError: unreadable, not YAML, or a malformed entry (naming the file and its place).
    """
    try:
        data = yaml.safe_load(read_text_input(path, what="references file", error=ConfigError))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not YAML ({' '.join(str(exc).split())[:200]})") from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{path}: expected system -> benchmark -> figure: [value, lower, upper, unit]")
    found = []
    for system, benchmarks in data.items():
        if not isinstance(benchmarks, dict):
            raise ConfigError(f"{path}: {system}: expected benchmark -> figure mappings")
        for benchmark, figures in benchmarks.items():
            if not isinstance(figures, dict):
                raise ConfigError(f"{path}: {system}.{benchmark}: expected figure -> [value, lower, upper, unit]")
            for figure, spec in figures.items():
                found.append(_reference(f"{path}: {system}.{benchmark}.{figure}", str(system), str(benchmark),
                                        str(figure), spec))
    return found


def judge(reference: Reference, values: list[float]) -> Verdict:
    """The verdict for one reference given the figure of the runs chosen (stored unit)."""
    if not values:
        return Verdict(reference, "no runs")
    measured = compute_olympic_average(values, 0) if len(values) >= 3 else statistics.fmean(values)
    below = reference.low_bound is not None and measured < reference.low_bound
    above = reference.high_bound is not None and measured > reference.high_bound
    lower_better = FIGURES[reference.figure][1] == "lower"
    if (above and lower_better) or (below and not lower_better):
        verdict = "regression"
    elif above or below:
        verdict = "improved"
    else:
        verdict = "ok"
    return Verdict(reference, verdict, measured, len(values))


def render(verdicts: list[Verdict]) -> str:
    """One line per reference: system, benchmark, figure, measured, bounds, verdict."""
    lines = []
    for v in verdicts:
        r = v.reference
        factor = FIGURES[r.figure][0][r.unit]

        def shown(x: float | None, factor: float = factor) -> str:
            return "-" if x is None else f"{x / factor:.4g}"
        lines.append(f"{r.system} {r.benchmark} {r.figure}: measured {shown(v.measured)} {r.unit} over {v.runs} "
                     f"run(s), reference {shown(r.value)} [{shown(r.low_bound)}, {shown(r.high_bound)}] "
                     f"{r.unit}: {v.verdict}")
    return "\n".join(lines)
