"""Valid FLOPS and Valid FLOPS per watt, HPC AI500's figures of an HPC AI system, from a log.

Source followed: Jiang et al., "HPC AI500: The Methodology, Tools, Roofline Performance Models,
and Metrics for Benchmarking HPC AI Systems" (arXiv 2007.00279) and "HPC AI500: Representative,
Repeatable and Simple HPC AI Benchmarking" (arXiv 2102.12848), BenchCouncil. HPC AI500 ranks a
system by one number joining speed and quality: the FLOPS a training run sustained, times a
penalty for the quality it reached against the target,

    FLOPS       = training FLOPs performed / time to train
    Valid FLOPS = FLOPS x min(1, (achieved / target) ** n)   (a quality that rises: accuracy, IoU, lDDT-Ca)
    Valid FLOPS = FLOPS x min(1, (target / achieved) ** n)   (an error that falls: CosmoFlow's, OC20's eval_error)
    Valid FLOPS per watt = Valid FLOPS / mean power           (mean power = energy to train / time to train)

with n = 5 by default (`DEFAULT_EXPONENT`, as HPC AI500 sets it; ``mlhpc report
--valid-flops-exponent``). The factor is a penalty "on failing to achieve the target quality"
(2007.00279's abstract): a run that misses its target is penalised, never dropped, and a run
past its target gets its FLOPS, no bonus (the cap at 1 keeps a relaxed target from multiplying
the figure). It is a system figure, not an MLPerf score: MLPerf ranks by time to train to a
fixed target, with no credit for FLOPs.

From one log (`mlhpc.log.facts.RunSummary`): time to train (run_stop - run_start); the
quality reached (the last quality-metric record before run_stop) and its target; samples
trained, counted as the report counts samples/s: ``train_samples`` x the epochs in the timed
region, or for a benchmark whose ``epoch_num`` counts samples (OpenFold) the ``epoch_num`` of the
last ``epoch_stop``; energy to train where power was measured (`mlhpc.report.energy`). FLOPs per
sample are not in a log: an mlhpc run's side file ``measured_N.json`` holds the training
(forward + backward) FLOPs per sample counted on its own model (`perf.train_flops_per_sample`);
for a published log the reference model's count at the reference size, where mlhpc knows it
(`Workload.reference_train_flops_per_sample`: CosmoFlow's and DeepCAM's; OC20's work depends on each
graph and OpenFold's on each protein's crop and alignments, so neither has one; closed division
only: an open submission may change the model). `ValidFlops.flops_source` says which.

What the counted FLOPs miss: they are `torch.utils.flop_counter.FlopCounterMode`'s count
(matrix products, convolutions and attention; a multiply-add is 2 FLOPs). Element-wise work,
normalisation, activations, pooling, gathers and scatters (most of a graph network's message
passing), the loss, the optimizer step and evaluation are not counted; a grouped convolution is
counted with its own formula (`mlhpc.run.flops`; torch 2.13's counts its weight gradient as if
it were dense, which would make DeepCAM's reference count 2.24 times as high, 4.41e12 instead
of 1.96e12 FLOPs per sample); padded samples (a last batch filled up to the global batch) are
not counted as trained. Valid FLOPS is therefore a floor on the arithmetic of the counted kinds,
and a comparison only between systems running the same model.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlhpc.data.inputs import read_json_object
from mlhpc.errors import ConfigError
from mlhpc.log.parse import Event
from mlhpc.log.plausible import implausible, out_of_range
from mlhpc.log.summary import samples_trained

if TYPE_CHECKING:
    from mlhpc.log.facts import RunSummary
    from mlhpc.report.reported import ReportedRun

#: HPC AI500's exponent of the quality penalty.
DEFAULT_EXPONENT = 5.0
#: Where an mlhpc run's FLOPs per sample come from.
SIDE_FILE_SOURCE = "measured_N.json: counted on the run's own model"
@dataclass(frozen=True)
class ValidFlops:
    """HPC AI500's figures of one run (see the module docstring).

    Attributes:
        valid_flops_per_s: FLOPS x the quality penalty, FLOP/s (None: ``note`` says why).
        valid_flops_per_w: ``valid_flops_per_s`` / mean power, FLOP/s per W (FLOP per joule);
            None where energy to train was not measured.
        flops_per_s: training FLOPs / time to train, FLOP/s, before the penalty.
        penalty: ``min(1, (achieved / target) ** exponent)`` (the ratio inverted for an error).
        exponent: the penalty's n.
        train_flops_per_sample: forward + backward FLOPs per sample.
        samples_trained: samples the timed run trained on.
        achieved / target / direction: the quality reached, its target, ``"max"`` or ``"min"``.
        flops_source: where ``train_flops_per_sample`` came from.
        note: why a figure is missing (None when both are there or only power is missing).
    """

    valid_flops_per_s: float | None = None
    valid_flops_per_w: float | None = None
    flops_per_s: float | None = None
    penalty: float | None = None
    exponent: float = DEFAULT_EXPONENT
    train_flops_per_sample: float | None = None
    samples_trained: float | None = None
    achieved: float | None = None
    target: float | None = None
    direction: str | None = None
    flops_source: str | None = None
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def quality_penalty(achieved: float, target: float, direction: str, exponent: float = DEFAULT_EXPONENT) -> float:
    """HPC AI500's penalty: ``(achieved / target) ** exponent`` for a quality that rises
    (``direction`` ``"max"``), ``(target / achieved) ** exponent`` for an error that falls
    (``"min"``), capped at 1: below 1 short of the target, 1 at it and past it.

    Raises:
        ValueError: ``target`` is not positive, ``achieved`` is negative or not a number, or
            ``direction`` is neither ``"max"`` nor ``"min"``.
    """
    if not target > 0 or not achieved >= 0 or direction not in ("max", "min"):
        raise ValueError(f"no quality penalty for {achieved!r} against target {target!r} ({direction})")
    if direction == "min":
        return 1.0 if achieved <= target else (target / achieved) ** exponent
    return 1.0 if achieved >= target else (achieved / target) ** exponent


def side_file_flops(log: Path) -> float | None:
    """``perf.train_flops_per_sample`` of ``measured_N.json`` beside ``log`` (``result_N.txt`` of
    an mlhpc run), or None where there is none, it cannot be read, or holds no plausible number."""
    log = Path(log)
    if not (log.name.startswith("result_") and log.name.endswith(".txt")):
        return None
    path = log.parent / f"measured_{log.name[len('result_'):-len('.txt')]}.json"
    if not path.is_file():
        return None
    perf = read_json_object(path, "side file").get("perf")
    value = perf.get("train_flops_per_sample") if isinstance(perf, dict) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 \
            and not implausible("flops_per_sample", value):
        return float(value)
    return None


def reference_flops(benchmark: str) -> tuple[float, str] | None:
    """The registered workload's `Workload.reference_train_flops_per_sample` (counted on the
    reference model at the reference size, torch 2.13, meta device; recounted by
    tests/test_valid_flops.py), or None (no such workload, or none declared)."""
    from mlhpc.workload import get, names

    if benchmark not in names():
        return None
    try:
        return get(benchmark).reference_train_flops_per_sample
    except ConfigError:
        return None


def flops_per_sample(run: "RunSummary", log: Path) -> tuple[float | None, str]:
    """``(training FLOPs per sample, where it came from)``: the run's side file, else the
    reference count of a closed-division benchmark, else ``(None, why not)``."""
    counted = side_file_flops(log)
    if counted is not None:
        return counted, SIDE_FILE_SOURCE
    benchmark = run.submission.benchmark
    reference = reference_flops(benchmark or "")
    if reference is None:
        return None, f"no counted FLOPs per sample for {benchmark or 'an unnamed benchmark'}"
    if (run.submission.division or "closed") != "closed":
        return None, "open division: the model may differ from the reference, FLOPs not known"
    return reference[0], f"mlhpc's count of the {benchmark} reference model ({reference[1]})"


def valid_flops(run: "RunSummary", per_sample: float | None, source: str, samples: float | None,
                mean_power_w: float | None, exponent: float = DEFAULT_EXPONENT) -> ValidFlops:
    """`ValidFlops` of ``run`` with ``per_sample`` training FLOPs per sample from ``source``,
    ``samples`` trained (`samples_trained`) and the run's mean power in W (None: not measured).

    A run that stopped short of its target is penalised, not dropped; a run with no time to
    train (incomplete, invalid), no quality record, no target or no sample count gets none,
    and ``note`` says why; so does a run whose last quality value is not a finite number (NaN,
    Infinity: a malformed value, never credited) or whose FLOP/s overflow. Never raises.
    """
    quality = run.quality
    base = ValidFlops(exponent=exponent, train_flops_per_sample=per_sample, flops_source=source,
                      target=quality.target, direction=quality.target_direction,
                      achieved=quality.metric_series[-1][1] if quality.metric_series else None)
    why = _missing(run, per_sample, source, samples)
    if why:
        return _with(base, note=why, samples_trained=samples)
    flops = per_sample * samples / run.timing.time_to_train_s  # type: ignore[operator]
    if (problem := out_of_range(flops, 0.0)) is not None:  # a product of two in-range values can overflow
        return _with(base, note=f"refused: training FLOP/s {problem}", samples_trained=samples)
    try:
        penalty = quality_penalty(base.achieved, base.target, base.direction, exponent)  # type: ignore[arg-type]
        value = flops * penalty
    except (ValueError, OverflowError, ZeroDivisionError) as exc:
        return _with(base, note=str(exc), flops_per_s=flops, samples_trained=samples)
    if not math.isfinite(value):
        return _with(base, note="the penalty is not finite", flops_per_s=flops, samples_trained=samples)
    per_w = value / mean_power_w if mean_power_w else None
    return _with(base, valid_flops_per_s=value, valid_flops_per_w=per_w, flops_per_s=flops,
                 penalty=penalty, samples_trained=samples)


def _with(base: ValidFlops, **changes: Any) -> ValidFlops:
    return ValidFlops(**{**asdict(base), **changes})


def _missing(run: "RunSummary", per_sample: float | None, source: str, samples: float | None) -> str | None:
    """Why ``run`` has no Valid FLOPS, or None."""
    timing, quality = run.timing, run.quality
    if timing.resumed:
        return "a resumed run: its log times one attempt only"
    if timing.time_to_train_s is None or timing.time_to_train_s <= 0:
        return f"no time to train (run {timing.status})"
    if per_sample is None:
        return source
    if not samples:
        return "samples trained not in the log (train_samples, epoch records)"
    if not quality.metric_series or quality.target is None or quality.target_direction is None:
        return "no quality record or no target"
    problem = out_of_range(quality.metric_series[-1][1])  # Infinity would pass every target: a malformed value
    return f"refused: {quality.metric_key or 'the quality reached'} {problem}" if problem else None


def run_valid_flops(run: "RunSummary", mean_power_w: float | None, log: Path, events: list[Event],
                    exponent: float = DEFAULT_EXPONENT) -> ValidFlops:
    """The `ValidFlops` of ``run`` from the figures of its log (its ``events``), its mean power in
    W (`mlhpc.report.energy.run_power`; None: not measured) and the FLOPs per sample its side
    file or the reference table gives (`flops_per_sample`)."""
    per_sample, source = flops_per_sample(run, log)
    samples = samples_trained(run.training, run.submission.train_samples, events)
    return valid_flops(run, per_sample, source, samples, mean_power_w, exponent)


def folder_valid_flops(runs: list["ReportedRun"], kind: str,
                       ttta_min: float | None) -> tuple[float | None, float | None]:
    """A result folder's ``(Valid FLOPS, Valid FLOPS per watt)`` in FLOP/s and FLOP/s per W
    (None where there is none) from ``runs`` (its runs that count for the figure, resumed runs
    left out) that have one; a run that missed its target counts, penalised. ``kind``
    ``"strong"``/``"runs"`` (one model after another): the mean over those runs, per watt only
    when every one had power measured. ``"weak"`` (models trained at once): the system's figure,
    every model's valid FLOPs (Valid FLOPS x its time to train) over TTTa (``ttta_min``, first
    run_start to last run_stop); no per-watt figure (the models' node power files overlap)."""
    runs = [r for r in runs if r.valid_flops is not None and r.valid_flops.valid_flops_per_s is not None]
    if not runs:
        return None, None
    if kind == "weak":
        if not ttta_min:
            return None, None
        return sum(r.valid_flops.valid_flops_per_s * r.facts.timing.time_to_train_s  # type: ignore[union-attr, operator]
                   for r in runs) / (ttta_min * 60.0), None
    per_s = sum(r.valid_flops.valid_flops_per_s for r in runs) / len(runs)
    per_w = [r.valid_flops.valid_flops_per_w for r in runs]
    return per_s, (sum(per_w) / len(per_w) if all(w is not None for w in per_w) else None)


def exponent_of(runs: list["ReportedRun"]) -> float:
    """The penalty's exponent the runs' figures were made with (`DEFAULT_EXPONENT` without any)."""
    return next((r.valid_flops.exponent for r in runs if r.valid_flops is not None), DEFAULT_EXPONENT)


def check_exponent(exponent: float) -> float:
    """``exponent`` when it is a finite number >= 0.

    Raises:
        ValueError: otherwise (the caller names its option).
    """
    if isinstance(exponent, bool) or not isinstance(exponent, (int, float)) or not 0 <= exponent < math.inf:
        raise ValueError(f"{exponent!r}: expected a finite number >= 0")
    return float(exponent)
