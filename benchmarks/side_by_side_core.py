"""The machinery benchmarks/side_by_side.py measures with: calibrated timing of one side, A B A B
interleaving of two sides, the median of each, the printed line and the raw figures.

A comparison pits an mlhpc side against a reference side (what a user would pick instead). Each
side is a function ``work() -> int`` that does one unit of work (a training step, a pass over the
data) and returns the samples it handled. `calibrate` runs it once (the warm-up, never counted)
and fixes how many calls one measurement makes, so that a measurement lasts at least
``min_s``; `interleave` then measures the two sides in turn, A B A B, ``repeats`` times each,
sampling the load average before every measurement (the machine is shared).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Work = Callable[[], int]


@dataclass
class Measured:
    """The raw figures of one comparison.

    Attributes:
        name: the comparison (``harness``, ``model``, ``data``, ...).
        unit: the unit of both figures (``samples/s``).
        mlhpc_all / reference_all: every measurement of each side, in order.
        higher_is_better: False for time-like figures; the ratio is then inverted so that a ratio
            above 1 still means mlhpc is better.
        goal: the ratio the project aims at (None: context only).
        sides: what each side is, in words (for the JSON).
        extra: anything else measured on the way (compile seconds, profile, ...).
    """

    name: str
    unit: str
    mlhpc_all: list[float]
    reference_all: list[float]
    higher_is_better: bool = True
    goal: float | None = None
    sides: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def mlhpc(self) -> float:
        return statistics.median(self.mlhpc_all)

    @property
    def reference(self) -> float:
        return statistics.median(self.reference_all)

    @property
    def ratio(self) -> float:
        """mlhpc / reference of the medians (reference / mlhpc for time-like figures)."""
        ratio = self.mlhpc / self.reference
        return ratio if self.higher_is_better else 1.0 / ratio

    @property
    def met(self) -> bool | None:
        return None if self.goal is None else self.ratio >= self.goal

    def line(self) -> str:
        """``name  mlhpc=<figure> <unit>  reference=<figure> <unit>  ratio=<ratio>``."""
        return (f"{self.name}  mlhpc={figure(self.mlhpc)} {self.unit}  "
                f"reference={figure(self.reference)} {self.unit}  ratio={self.ratio:.3f}")

    def to_json(self) -> dict[str, Any]:
        return {"unit": self.unit, "mlhpc": self.mlhpc, "reference": self.reference,
                "ratio": self.ratio, "goal": self.goal, "met": self.met,
                "higher_is_better": self.higher_is_better, "statistic": "median",
                "mlhpc_all": self.mlhpc_all, "reference_all": self.reference_all,
                "paired_ratios": self.paired_ratios(), "sides": self.sides, **self.extra}

    def paired_ratios(self) -> list[float]:
        """The ratio of each measurement to the other side's measurement of the same round (its
        spread shows what the shared machine does to one figure)."""
        pairs = zip(self.mlhpc_all, self.reference_all)
        return [(a / b if self.higher_is_better else b / a) for a, b in pairs]


def figure(value: float) -> str:
    """A figure for the printed line: one decimal from 100 up, else four significant digits."""
    return f"{value:.1f}" if abs(value) >= 100 else f"{value:.4g}"


class LoadWatch:
    """The 1-minute load average, sampled at start, before each measurement and at the end."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.sample()

    def sample(self) -> None:
        self.samples.append(os.getloadavg()[0])

    def to_json(self) -> dict[str, Any]:
        return {"start": self.samples[0], "end": self.samples[-1], "min": min(self.samples),
                "max": max(self.samples), "mean": statistics.fmean(self.samples),
                "samples": len(self.samples)}


@dataclass
class Timed:
    """One side, calibrated: ``calls`` calls of ``work`` make one measurement."""

    work: Work
    calls: int
    warmup_s: float

    def measure(self) -> float:
        """Samples/s over one measurement (``calls`` calls)."""
        start = time.perf_counter()
        samples = sum(self.work() for _ in range(self.calls))
        return samples / (time.perf_counter() - start)


def calibrate(work: Work, min_s: float) -> Timed:
    """Call ``work`` once (the warm-up, not counted) and size a measurement to last ``min_s``
    at that pace (at least one call)."""
    start = time.perf_counter()
    work()
    warmup_s = time.perf_counter() - start
    return Timed(work, max(1, math.ceil(min_s / max(warmup_s, 1e-9))), warmup_s)


def interleave(name: str, unit: str, sides: tuple[Timed, Timed], repeats: int,
               load: LoadWatch) -> Measured:
    """``repeats`` measurements of each side, alternating mlhpc, reference, mlhpc, ... (samples/s,
    higher is better); the load average is sampled before each."""
    mlhpc, reference = sides
    mlhpc_all, reference_all = [], []
    for _ in range(repeats):
        load.sample()
        mlhpc_all.append(mlhpc.measure())
        load.sample()
        reference_all.append(reference.measure())
    return Measured(name, unit, mlhpc_all, reference_all,
                    extra={"calls_per_measurement": {"mlhpc": mlhpc.calls,
                                                     "reference": reference.calls},
                           "warmup_s": {"mlhpc": mlhpc.warmup_s, "reference": reference.warmup_s}})


class Skipped(Exception):
    """A comparison that does not apply to this workload (or could not run); the message says
    why, in one line."""
