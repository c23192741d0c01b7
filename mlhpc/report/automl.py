"""AIPerf's score of an AutoML search folder (``mlhpc automl``): FLOPs over time at each mark.

Source followed: Ren et al., "AIPerf: Automated machine learning as an AI-HPC benchmark"
(arXiv:2008.07141; code: AI-HPC-Research-Team/AIPerf). AIPerf runs a neural architecture and
hyperparameter search on the whole machine and scores it, "at discrete timestamps", by

    score           = FLOPs / time
    regulated score = FLOPs x log(1/Error) / time

where FLOPs are every floating-point operation the search's trainings and evaluations did up
to the timestamp, time is the time since the search started, and Error is the error of the
best model found so far (1 - accuracy). A result is valid when the search ran "at least 1
hour", trained "in FP16 or wider" precision, and its best accuracy is "above 70%".

How mlhpc departs from AIPerf:

- FLOPs are counted by torch's counter (``torch.utils.flop_counter.FlopCounterMode``) on each
  run's own model and written to the run's side file ``measured_N.json``
  (``perf.train_flops_per_sample``, ``perf.forward_flops_per_sample``), not AIPerf's
  per-layer analytical formulas; what the counter leaves out is said in
  `mlhpc.report.validflops`. Training FLOPs of an epoch = ``train_flops_per_sample`` x the
  samples it trained (``train.eval_every_steps`` x ``train.global_batch_size`` from the run's
  ``config_N.yaml`` when set, else the log's ``train_samples``), counted at its
  ``epoch_stop``; evaluation FLOPs = ``forward_flops_per_sample`` x the log's
  ``eval_samples``, counted at each ``eval_stop``. A run without a readable side file (a trial
  killed before ``run_stop``) counts 0 FLOPs, never a guess, and is counted in
  ``trials_without_flops``.
- The quality is the workload's own metric (``study.json`` ``metric_key``): Error is
  ``1 - value`` for a metric that rises (``direction`` ``"max"``: accuracy, IoU) and the value
  itself for an error metric (``"min"``: eval_error).
- The gates' values come from the study's config (``study.json`` ``gates``), not AIPerf's
  fixed hour and 70%; precision is the one each run measured (``perf.precision``).

The folder (written by the search, read here; nothing in it is written):
``study.json`` (`mlhpc.report.automl_folder.read_study`), and ``trial_<number>/`` folders each holding ``result_N.txt``
(the run's MLLOG log), ``measured_N.json``, ``config_N.yaml``, ``trial.yaml`` (the trial's
config, ready to run) and optionally ``trial.json``. Event times are seconds since
``started_unix_s``; events after the search's end (``ended_unix_s``) are not counted.

Links: a trial folder that is a symbolic link is skipped with a warning (one out of the folder
would read another tree; one inside it would count a trial twice); a log or side file that is
a link out of the folder is refused by the reader (`mlhpc.data.inputs`) and its log skipped
with a warning (`AutomlScore.warnings`; `mlhpc.report.automl_folder`). Unreadable log lines are passed over as
`mlhpc.log.parse.parse_log` passes them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mlhpc.data.inputs import read_json_object
from mlhpc.errors import ConfigError
from mlhpc.report.automl_folder import Search, Study, TrialLog, automl_folder, read_search

__all__ = ["AutomlScore", "BestTrial", "Gate", "Mark", "Study", "automl_folder", "score_folder", "score_search"]

#: The most time marks one report holds (a year at 316 s marks).
MAX_MARKS = 100_000
#: Precisions of 16 bits or wider (AIPerf: "FP16 or wider").
WIDE_PRECISIONS = ("fp64", "fp32", "tf32", "bf16", "fp16")


@dataclass(frozen=True)
class Mark:
    """The score at one time mark: ``elapsed_s`` since the start, ``trials`` finished (run_stop
    at or before it), ``best_quality`` and its ``error`` (None before any), ``total_flops``
    (FLOP), ``score_flop_per_s`` and ``regulated_score_flop_per_s`` (FLOP/s; the latter None
    without a quality or when Error <= 0, negative when Error > 1)."""

    elapsed_s: float
    trials: int
    best_quality: float | None
    error: float | None
    total_flops: float
    score_flop_per_s: float
    regulated_score_flop_per_s: float | None


@dataclass(frozen=True)
class Gate:
    """One validity rule: ``name`` (``duration``, ``quality``, ``precision``), whether it
    ``passed``, and a one-line ``reason`` with the numbers."""

    name: str
    passed: bool
    reason: str


@dataclass(frozen=True)
class BestTrial:
    """The trial that logged the best quality first: its ``number``, ``folder``, ``quality``,
    ``elapsed_s`` (when logged), ``log`` (the result file), ``config`` (its ``trial.yaml``,
    ready for ``mlhpc run``; None when absent), and ``state``/``params`` from ``trial.json``."""

    number: int
    folder: str
    quality: float
    elapsed_s: float
    log: str
    config: str | None
    state: str | None = None
    params: dict[str, Any] | None = None


@dataclass(frozen=True)
class AutomlScore:
    """An AutoML folder scored (`score_folder`): the study, ``duration_s``, the ``marks``, the
    ``gates`` (``valid`` when all passed), the best trial, trial counts, and one line per log
    or trial folder skipped or side file unusable (``warnings``)."""

    folder: Path
    study: Study
    duration_s: float
    marks: tuple[Mark, ...]
    gates: tuple[Gate, ...]
    best_trial: BestTrial | None
    trials_total: int
    trials_without_flops: int
    warnings: tuple[str, ...] = ()

    @property
    def valid(self) -> bool:
        return all(g.passed for g in self.gates)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``mlhpc report --format json`` (numbers in s, FLOP, FLOP/s)."""
        s = self.study
        return {
            "folder": str(self.folder), "study": s.study_name, "workload": s.workload,
            "metric_key": s.metric_key, "direction": s.direction, "target": s.target,
            "error_is": s.error_is, "started_unix_s": s.started_unix_s, "ended_unix_s": s.ended_unix_s,
            "budget_s": s.budget_s, "mark_every_s": s.mark_every_s, "duration_s": self.duration_s,
            "marks": [asdict(m) for m in self.marks], "gates": [asdict(g) for g in self.gates],
            "valid": self.valid, "best_trial": asdict(self.best_trial) if self.best_trial else None,
            "trials": {"total": self.trials_total, "without_flops": self.trials_without_flops},
            "storage": s.storage, "config": s.config, "warnings": list(self.warnings),
        }



# ---- the score ----------------------------------------------------------------------------------


def score_folder(folder: Path | str) -> AutomlScore:
    """AIPerf's score of the AutoML folder ``folder`` (`score_search` of `read_search`).

    Raises:
        ConfigError: ``study.json`` is refused (`mlhpc.report.automl_folder.read_study`), the
            folder cannot be listed, or the marks would be more than `MAX_MARKS`.
    """
    return score_search(read_search(folder))


def score_search(search: Search) -> AutomlScore:
    """AIPerf's score of a search read from its folder (`read_search`) at each time mark, its
    gates and its best trial, from the folder's files alone (see the module docstring).

    Raises:
        ConfigError: the marks would be more than `MAX_MARKS`.
    """
    study, logs = search.study, list(search.logs)
    duration_s = search_duration(study, logs)
    best = _best_event(study, logs, duration_s)
    gates = (duration_gate(study, duration_s), quality_gate(study, best and best[3]),
             precision_gate(logs))
    return AutomlScore(folder=search.folder, study=study, duration_s=duration_s,
                       marks=score_marks(study, logs, duration_s), gates=gates,
                       best_trial=_best_trial(best), trials_total=search.trials_total,
                       trials_without_flops=search.trials_without_flops, warnings=search.warnings)


def search_duration(study: Study, logs: list[TrialLog]) -> float:
    """Seconds the search ran: ``ended_unix_s - started_unix_s`` when the search's end was
    written, else to the latest event of any trial log (0 without any; never negative)."""
    if study.ended_unix_s is not None:
        return study.ended_unix_s - study.started_unix_s
    return max([0.0] + [log.last_s for log in logs if log.last_s is not None])


def error_of(study: Study, quality: float) -> float:
    """AIPerf's Error of a quality value: ``1 - value`` for a metric that rises (``"max"``), the
    value itself for an error metric (``"min"``)."""
    return 1.0 - quality if study.direction == "max" else quality


def mark_at(study: Study, elapsed_s: float, trials: int, best: float | None, total_flops: float) -> Mark:
    """The `Mark` at ``elapsed_s``: score = FLOPs / time; regulated score = FLOPs x ln(1/Error) /
    time (None without a quality, or with Error <= 0, where the logarithm has no value)."""
    error = None if best is None else error_of(study, best)
    regulated = None
    if error is not None and error > 0:
        regulated = total_flops * math.log(1.0 / error) / elapsed_s
    return Mark(elapsed_s=elapsed_s, trials=trials, best_quality=best, error=error,
                total_flops=total_flops, score_flop_per_s=total_flops / elapsed_s,
                regulated_score_flop_per_s=regulated)


def _mark_count(study: Study, duration_s: float) -> int:
    """How many marks k x mark_every_s fit in ``duration_s`` (k >= 1, mark <= duration).

    Raises:
        ConfigError: more than `MAX_MARKS`."""
    count = int(duration_s // study.mark_every_s) if duration_s > 0 else 0
    if count > MAX_MARKS:
        raise ConfigError(f"{study.mark_every_s:g} s over a search of {duration_s:,.0f} s makes {count} marks, "
                          f"more than {MAX_MARKS}; check mark_every_s and started_unix_s",
                          path=study.path, key="mark_every_s")
    while count > 0 and count * study.mark_every_s > duration_s:
        count -= 1
    while (count + 1) * study.mark_every_s <= duration_s:
        count += 1
    return count


def _better(study: Study, value: float, than: float | None) -> bool:
    if than is None:
        return True
    return value < than if study.direction == "min" else value > than


def _quality_events(logs: list[TrialLog]) -> list[tuple[float, int, int, float, TrialLog]]:
    """Every quality value as ``(seconds, trial, order read, value, log)``, earliest first (ties:
    the lower trial number, then the order in the log)."""
    events = [(t, log.trial, i, value, log) for log in logs for i, (t, value) in enumerate(log.qualities)]
    return sorted(events, key=lambda e: e[:3])


def score_marks(study: Study, logs: list[TrialLog], duration_s: float) -> tuple[Mark, ...]:
    """The `Mark` at each k x ``mark_every_s`` <= ``duration_s`` (k = 1, 2, ...): trials finished,
    best quality and FLOPs counted at or before it.

    Raises:
        ConfigError: more than `MAX_MARKS` marks."""
    flops = sorted(item for log in logs for item in log.flops)
    stops = sorted((log.stop_s, log.trial) for log in logs if log.stop_s is not None)
    qualities = _quality_events(logs)
    marks, finished = [], set()
    total, best, at_flop, at_stop, at_quality = 0.0, None, 0, 0, 0
    for k in range(1, _mark_count(study, duration_s) + 1):
        elapsed_s = k * study.mark_every_s
        while at_flop < len(flops) and flops[at_flop][0] <= elapsed_s:
            total += flops[at_flop][1]
            at_flop += 1
        while at_stop < len(stops) and stops[at_stop][0] <= elapsed_s:
            finished.add(stops[at_stop][1])
            at_stop += 1
        while at_quality < len(qualities) and qualities[at_quality][0] <= elapsed_s:
            if _better(study, qualities[at_quality][3], best):
                best = qualities[at_quality][3]
            at_quality += 1
        marks.append(mark_at(study, elapsed_s, len(finished), best, total))
    return tuple(marks)


def _best_event(study: Study, logs: list[TrialLog], duration_s: float
                ) -> tuple[float, int, int, float, TrialLog] | None:
    """The first quality event with the best value at or before the search's end."""
    best = None
    for event in _quality_events(logs):
        if event[0] <= duration_s and _better(study, event[3], best and best[3]):
            best = event
    return best


def _best_trial(best: tuple[float, int, int, float, TrialLog] | None) -> BestTrial | None:
    """The `BestTrial` of the best quality event, with ``trial.yaml`` and ``trial.json`` beside."""
    if best is None:
        return None
    elapsed_s, number, _, quality, log = best
    config = log.folder / "trial.yaml"
    record = read_json_object(log.folder / "trial.json", "trial record")
    state, params = record.get("state"), record.get("params")
    return BestTrial(number=number, folder=str(log.folder), quality=quality, elapsed_s=elapsed_s,
                     log=str(log.log), config=str(config) if config.is_file() and not config.is_symlink() else None,
                     state=state[:40] if isinstance(state, str) else None,
                     params=_scalars(params) if isinstance(params, dict) else None)


def _scalars(params: dict[str, Any]) -> dict[str, Any]:
    """A trial's parameters as Optuna gives them (names to numbers, strings, booleans); anything
    else in the record is left out."""
    return {str(k)[:80]: (v[:200] if isinstance(v, str) else v) for k, v in list(params.items())[:200]
            if v is None or isinstance(v, (str, int, float, bool))}


# ---- the gates ----------------------------------------------------------------------------------


def duration_gate(study: Study, duration_s: float) -> Gate:
    """AIPerf: the search runs "at least 1 hour"; mlhpc: at least ``gates.min_duration_s``."""
    how = "to ended_unix_s" if study.ended_unix_s is not None else "to its last logged event"
    passed = duration_s >= study.min_duration_s
    return Gate("duration", passed, f"the search ran {_seconds(duration_s)} s ({how}); "
                                    f"{'at least' if passed else 'short of'} the {_seconds(study.min_duration_s)} s required")


def _seconds(value: float) -> str:
    """``3,600`` for a long time, ``0.0351`` for a short one (three figures)."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def quality_gate(study: Study, best: float | None) -> Gate:
    """AIPerf: the best accuracy is "above 70%"; mlhpc: the best quality reaches
    ``gates.min_quality`` (<= it for an error metric, >= it for one that rises)."""
    sign = "<=" if study.direction == "min" else ">="
    if best is None:
        return Gate("quality", False, f"no {study.metric_key} logged; {sign} {study.min_quality:g} required")
    passed = best <= study.min_quality if study.direction == "min" else best >= study.min_quality
    return Gate("quality", passed, f"best {study.metric_key} {best:.6g} {'reaches' if passed else 'misses'} "
                                   f"the required {sign} {study.min_quality:g}")


def precision_gate(logs: list[TrialLog]) -> Gate:
    """AIPerf: training "in FP16 or wider" precision; mlhpc: every trial that measured its
    precision (``perf.precision``) trained in one of `WIDE_PRECISIONS`."""
    measured = [log for log in logs if log.precision is not None]
    if not measured:
        return Gate("precision", True, "no trial measured its precision (no measured_N.json); nothing to check")
    for log in measured:
        if log.precision.lower() not in WIDE_PRECISIONS:
            return Gate("precision", False, f"trial {log.trial} ({log.log.name}) trained in {log.precision!r}, "
                                            f"narrower than 16 bits or unknown ({', '.join(WIDE_PRECISIONS)} required)")
    seen = sorted({log.precision for log in measured})
    return Gate("precision", True, f"{len({log.trial for log in measured})} trial(s) trained in "
                                   f"{', '.join(seen)}: 16 bits or wider")
