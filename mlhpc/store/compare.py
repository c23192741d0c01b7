"""Two selections of runs compared: olympic means, spread, and whether the difference is larger
than run-to-run noise.

The test is two-fold and both are named in the output: scipy's two-sided Mann-Whitney U test on
the times to train (no assumption of normal times), and a percentile bootstrap confidence
interval of the difference of means (B - A; 10,000 resamples, fixed seed, so the verdict is
reproducible). B is called slower (a regression) or faster only when the U test's p-value is
below ``alpha`` *and* the interval excludes 0; otherwise the difference is within noise. Below
`MIN_RUNS` successful runs on a side the answer is "not enough runs". The olympic mean is
MLCommons' (drop the fastest and the slowest, average the rest; `mlhpc.report.score`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np
from scipy import stats

from mlhpc.report.score import compute_olympic_average

MIN_RUNS = 3
TEST_NAME = "Mann-Whitney U (two-sided, scipy.stats.mannwhitneyu) + bootstrap 95% CI of mean(B) - mean(A)"


@dataclass(frozen=True)
class Side:
    """One selection's successful times to train (s) and their statistics."""

    label: str
    times_s: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.times_s)

    @property
    def olympic_s(self) -> float | None:
        return compute_olympic_average(list(self.times_s), 0) if self.n >= MIN_RUNS else None

    @property
    def mean_s(self) -> float | None:
        return statistics.fmean(self.times_s) if self.times_s else None

    @property
    def stdev_s(self) -> float | None:
        return statistics.stdev(self.times_s) if self.n >= 2 else None


@dataclass(frozen=True)
class Comparison:
    """The verdict: ``slower``, ``faster``, ``within noise`` or ``not enough runs``."""

    a: Side
    b: Side
    verdict: str
    p_value: float | None = None
    ci_low_s: float | None = None
    ci_high_s: float | None = None
    alpha: float = 0.05

    @property
    def regression(self) -> bool:
        return self.verdict == "slower"


def bootstrap_ci(a: np.ndarray, b: np.ndarray, resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap 95% interval of ``mean(b) - mean(a)`` (same unit as the inputs)."""
    rng = np.random.default_rng(seed)
    mean_a = rng.choice(a, size=(resamples, a.size), replace=True).mean(axis=1)
    mean_b = rng.choice(b, size=(resamples, b.size), replace=True).mean(axis=1)
    low, high = np.percentile(mean_b - mean_a, [2.5, 97.5])
    return float(low), float(high)


def compare_times(a: Side, b: Side, alpha: float = 0.05) -> Comparison:
    """Compare two sides (see the module docstring for the test and the verdict)."""
    if a.n < MIN_RUNS or b.n < MIN_RUNS:
        return Comparison(a, b, "not enough runs", alpha=alpha)
    xa, xb = np.asarray(a.times_s, float), np.asarray(b.times_s, float)
    p_value = float(stats.mannwhitneyu(xa, xb, alternative="two-sided").pvalue)
    low, high = bootstrap_ci(xa, xb)
    verdict = "within noise"
    if p_value < alpha and low > 0:
        verdict = "slower"
    elif p_value < alpha and high < 0:
        verdict = "faster"
    return Comparison(a, b, verdict, p_value, low, high, alpha)


def _fmt(value: float | None, unit: str = " s") -> str:
    return "-" if value is None else f"{value:.4g}{unit}"


def render(result: Comparison) -> str:
    """The comparison as text: per side n, olympic mean, mean, stdev, min..max; the test, the
    p-value, the interval, and the verdict in words."""
    lines = []
    for name, side in (("A", result.a), ("B", result.b)):
        span = f"{min(side.times_s):.4g}..{max(side.times_s):.4g} s" if side.times_s else "-"
        lines.append(f"{name} ({side.label}): {side.n} successful runs, olympic mean {_fmt(side.olympic_s)}, "
                     f"mean {_fmt(side.mean_s)}, stdev {_fmt(side.stdev_s)}, range {span}")
    if result.verdict == "not enough runs":
        lines.append(f"not enough runs: the test needs at least {MIN_RUNS} successful runs on each side")
        return "\n".join(lines)
    lines.append(f"test: {TEST_NAME}")
    lines.append(f"p = {result.p_value:.3g} (alpha {result.alpha}); mean(B) - mean(A) = "
                 f"{result.b.mean_s - result.a.mean_s:+.4g} s, 95% CI [{result.ci_low_s:+.4g}, {result.ci_high_s:+.4g}] s")
    words = {"slower": "B is slower than A beyond run-to-run noise (a regression)",
             "faster": "B is faster than A beyond run-to-run noise",
             "within noise": "the difference is within run-to-run noise"}
    lines.append(f"verdict: {words[result.verdict]}")
    return "\n".join(lines)
