"""Two selections of runs compared like with like: one scaling mode, MLCommons' score, and
whether the difference is larger than run-to-run noise.

Strong and weak scaling are never mixed in one verdict (`mlhpc.store.api.compare_selections`
picks the mode). The score is the one `mlhpc report` computes (`mlhpc.report.score`, after
MLCommons' result_summarizer): for a strong-scaling set (an own run folder counts as one) the
olympic mean of the times to train (drop the fastest and the slowest, average the rest; a run that
did not succeed counts as the slowest, at most one), for a weak-scaling set the throughput in
models per minute. A ``scaling.json`` factor is not stored, so strong scores are the raw olympic
means.

Strong scaling, the noise test is two-fold and both are named in the output: scipy's two-sided
Mann-Whitney U test on the times to train (no assumption of normal times), and a percentile
bootstrap confidence interval of the difference of means (B - A; 10,000 resamples, fixed seed, so
the verdict is reproducible). B is called slower (a regression) or faster only when the U test's
p-value is below ``alpha`` *and* the interval excludes 0; otherwise the difference is within
noise. Below `MIN_RUNS` successful runs on a side the answer is "not enough runs". Weak scaling
gives one throughput per side, so there is no noise to test: the verdict is the throughputs'
order, and the output says so.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np
from scipy import stats

from mlhpc import rules
from mlhpc.report.score import compute_olympic_average, weak_throughput

MIN_RUNS = 3
TEST_NAME = "Mann-Whitney U (two-sided, scipy.stats.mannwhitneyu) + bootstrap 95% CI of mean(B) - mean(A)"


#: What each scaling mode's score is, said in the output.
SCORES = {"strong": "olympic mean of the times to train (min), as MLCommons' result_summarizer scores "
                    "a strong-scaling set",
          "weak": "throughput (models/min = models / (last run_stop - first run_start)), as MLCommons' "
                  "result_summarizer scores a weak-scaling set"}


@dataclass(frozen=True)
class Side:
    """One selection's successful runs in one scaling mode.

    Attributes:
        label: the selection as given.
        times_s: the successful runs' times to train (s).
        scaling: ``"strong"`` or ``"weak"``.
        spans_ms: per successful run ``(run_start_ms, run_stop_ms)`` (the weak score's input).
        failed: runs selected in this mode that did not succeed.
        folders: result folders the runs come from (MLCommons scores one folder at a time).
        left_out: runs of the selection in the other scaling mode, not compared.
    """

    label: str
    times_s: tuple[float, ...]
    scaling: str = "strong"
    spans_ms: tuple[tuple[float, float], ...] = ()
    failed: int = 0
    folders: int = 1
    left_out: int = 0

    @property
    def n(self) -> int:
        return len(self.times_s)

    @property
    def olympic_s(self) -> float | None:
        if self.n < MIN_RUNS or self.failed > rules.ruleset().max_dropped:
            return None
        return compute_olympic_average(list(self.times_s), self.failed)

    @property
    def models_per_min(self) -> float | None:
        return weak_throughput(list(self.spans_ms))[1] if self.spans_ms else None

    @property
    def score(self) -> float | None:
        """The MLCommons score: olympic mean in minutes (strong) or models/min (weak)."""
        if self.scaling == "weak":
            return self.models_per_min
        return None if self.olympic_s is None else self.olympic_s / 60.0

    @property
    def mean_s(self) -> float | None:
        return statistics.fmean(self.times_s) if self.times_s else None

    @property
    def stdev_s(self) -> float | None:
        return statistics.stdev(self.times_s) if self.n >= 2 else None


@dataclass(frozen=True)
class Comparison:
    """The verdict: ``slower``, ``faster``, ``within noise`` (strong), ``same`` (weak) or
    ``not enough runs``."""

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
    """Compare two sides of one scaling mode (see the module docstring for the test and the
    verdict).

    Raises:
        ValueError: the sides are of different scaling modes.
    """
    if a.scaling != b.scaling:
        raise ValueError(f"{a.scaling} and {b.scaling} scaling are not compared")
    if a.scaling == "weak":
        if a.models_per_min is None or b.models_per_min is None:
            return Comparison(a, b, "not enough runs", alpha=alpha)
        order = "faster" if b.models_per_min > a.models_per_min else "slower"
        return Comparison(a, b, "same" if b.models_per_min == a.models_per_min else order, alpha=alpha)
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


def _side_line(name: str, side: Side) -> str:
    span = f"{min(side.times_s):.4g}..{max(side.times_s):.4g} s" if side.times_s else "-"
    score = (f"throughput {_fmt(side.models_per_min, ' models/min')}" if side.scaling == "weak"
             else f"olympic mean {_fmt(side.score, ' min')}")
    line = (f"{name} ({side.label}): {side.n} successful runs, {score}; times to train: mean "
            f"{_fmt(side.mean_s)}, stdev {_fmt(side.stdev_s)}, range {span}")
    notes = []
    if side.failed:
        notes.append(f"{side.failed} run(s) did not succeed" + (
            f" (more than {rules.ruleset().max_dropped}: no olympic mean)"
            if side.scaling == "strong" and side.failed > rules.ruleset().max_dropped
            else ""))
    if side.folders > 1:
        notes.append(f"pools {side.folders} result folders (MLCommons scores each folder on its own)")
    if side.left_out:
        other = "strong" if side.scaling == "weak" else "weak"
        notes.append(f"{side.left_out} {other}-scaling run(s) left out (add scaling={other} to compare them)")
    return line + "".join(f"\n  note: {n}" for n in notes)


def render(result: Comparison) -> str:
    """The comparison as text: the scaling mode and score compared; per side n, the score, mean,
    stdev, min..max of the times to train and what was left out; the test, the p-value, the
    interval, and the verdict in words."""
    mode = result.a.scaling
    lines = [f"compared: {mode} scaling; score: {SCORES[mode]}"]
    lines += [_side_line(name, side) for name, side in (("A", result.a), ("B", result.b))]
    if result.verdict == "not enough runs":
        need = f"at least {MIN_RUNS} successful runs" if mode == "strong" else "a successful run"
        lines.append(f"not enough runs: the comparison needs {need} on each side")
        return "\n".join(lines)
    if mode == "weak":
        words = {"faster": "B has the higher throughput", "slower": "B has the lower throughput",
                 "same": "A and B have the same throughput"}[result.verdict]
        lines.append(f"verdict: {words} (one throughput per side: no run-to-run noise to test)")
        return "\n".join(lines)
    lines.append(f"test: {TEST_NAME}")
    lines.append(f"p = {result.p_value:.3g} (alpha {result.alpha}); mean(B) - mean(A) = "
                 f"{result.b.mean_s - result.a.mean_s:+.4g} s, 95% CI [{result.ci_low_s:+.4g}, {result.ci_high_s:+.4g}] s")
    words = {"slower": "B is slower than A beyond run-to-run noise (a regression)",
             "faster": "B is faster than A beyond run-to-run noise",
             "within noise": "the difference is within run-to-run noise"}
    lines.append(f"verdict: {words[result.verdict]}")
    return "\n".join(lines)
