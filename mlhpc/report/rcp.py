"""Reference convergence points (RCPs) shipped with mlperf_logging, per benchmark and batch size.

The data and their statistics come from ``mlperf_logging.rcp_checker.rcp_checker.RCP_Checker``
(olympic mean of the reference runs' epochs to converge, the largest allowed speed-up from a
one-sided t-test, pruning of non-convex points). For a batch size with no reference run the
point is interpolated between its neighbours, as ``rcp_checker.check_directory`` does. The
comparison of a result folder with its RCP follows ``RCP_Checker._eval_submission_record``:
the olympic mean of the runs' epochs must be at least ``RCP mean / max speed-up``; when it is
faster than the RCP mean the score is normalised by ``RCP mean / mean epochs``.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass


@dataclass(frozen=True)
class ReferencePoint:
    """The reference convergence of one benchmark at one global batch size.

    Attributes:
        benchmark / global_batch_size: what it is for.
        mean_epochs: olympic mean of the reference runs' epochs to converge.
        min_epochs: the fewest mean epochs a submission may show (mean / max speed-up).
        kind: ``"exact"`` (a reference run at this batch size) or ``"interpolated"``.
    """

    benchmark: str
    global_batch_size: int
    mean_epochs: float
    min_epochs: float
    kind: str


@dataclass(frozen=True)
class ConvergenceCheck:
    """A result folder against its reference point.

    Attributes:
        reference: the point compared with.
        mean_epochs: olympic mean of the runs' epochs to converge (non-converged runs count as
            infinitely slow, as in rcp_checker).
        passed: ``mean_epochs >= reference.min_epochs``.
        normalization: ``max(1, reference.mean_epochs / mean_epochs)``, the factor a score is
            scaled by when the runs converge faster than the reference.
    """

    reference: ReferencePoint
    mean_epochs: float
    passed: bool
    normalization: float


@functools.lru_cache(maxsize=None)
def _checker(benchmark: str, ruleset: str):  # type: ignore[no-untyped-def]
    from mlperf_logging.rcp_checker import rcp_checker

    logging.getLogger().disabled, was = True, logging.getLogger().disabled
    try:
        return rcp_checker.RCP_Checker("hpc", ruleset, benchmark, verbose=False)
    finally:
        logging.getLogger().disabled = was


def reference_point(benchmark: str | None, global_batch_size: int | None,
                    ruleset: str = "3.0.0") -> ReferencePoint | None:
    """The RCP for ``benchmark`` at ``global_batch_size`` under the hpc ``ruleset``.

    Uses the pruned RCP set, as result_summarizer and package_checker do. Returns ``None`` when
    mlperf_logging has no RCP file for the benchmark/ruleset or the batch size lies outside the
    reference range (no neighbours to interpolate between); never raises for those.
    """
    if not benchmark or not global_batch_size:
        return None
    try:
        checker = _checker(benchmark, ruleset)
    except Exception:  # RCP_Checker raises bare Exception, KeyError or OSError for no RCP data
        return None
    record = checker._find_rcp(global_batch_size, "pruned_rcps")
    kind = "exact"
    if record is None:
        low = checker._find_top_min_rcp(global_batch_size, "pruned_rcps")
        high = checker._find_bottom_max_rcp(global_batch_size, "pruned_rcps")
        if low is None or high is None:
            return None
        _, record = checker._create_interp_rcp(global_batch_size, low, high)
        kind = "interpolated"
    mean = float(record["RCP Mean"])
    return ReferencePoint(benchmark, int(global_batch_size), mean,
                          mean / float(record["Max Speedup"]), kind)


def olympic_mean_epochs(epochs: list[float], rejected: int = 1) -> float | None:
    """Mean of ``epochs`` without the ``rejected`` smallest and largest (rcp_checker's mean)."""
    ordered = sorted(epochs)
    kept = ordered[rejected:len(ordered) - rejected]
    return sum(kept) / len(kept) if kept else None


def check_convergence(reference: ReferencePoint, epochs: list[float | None]) -> ConvergenceCheck | None:
    """Compare runs' epochs to converge (``None``: did not converge) with ``reference``.

    Returns ``None`` when fewer than three runs are given (no olympic mean).
    """
    values = [float("inf") if e is None else float(e) for e in epochs]
    mean = olympic_mean_epochs(values)
    if mean is None:
        return None
    norm = reference.mean_epochs / mean if mean > 0 else 1.0
    return ConvergenceCheck(reference, mean, mean >= reference.min_epochs, max(1.0, norm))
