"""One run, from its log alone: time to train, staging, init, epochs, evaluation, residual.

Definitions follow the MLPerf HPC rules (v3.0, "Timing") and MLCommons' result_summarizer:
time to train is ``run_stop - run_start``; staging (``staging_start .. staging_stop``) happens
before ``run_start`` and is reported on its own; convergence is counted as the rcp_checker
counts it (``epoch_num`` of the last quality-metric record before a successful ``run_stop``).
`summarize_run` makes the run's frozen record, `mlhpc.log.facts.RunSummary`, once, part by part.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlhpc import rules
from mlhpc.errors import LogFormatError
from mlhpc.log.emulated import emulation_figures
from mlhpc.log.facts import Quality, RunSummary, Staging, Submission, Timing, Training
from mlhpc.log.mlperf_adapter import METRIC_KEYS, quality_target
from mlhpc.log.parse import Event, ParsedLog, cap_field, log_mentions, parse_log
from mlhpc.log.plausible import implausible

RESUME_KEY = "resume"


def is_resumed(parsed: ParsedLog) -> bool:
    """The log marks its run as resumed from a checkpoint: a ``resume`` record, or a record with
    ``"resumed": true`` in its metadata. Every reader of the marker asks here."""
    return any(event.key == RESUME_KEY or event.metadata.get("resumed") is True for event in parsed.events)


def earlier_attempts_s(parsed: ParsedLog) -> float | None:
    """Seconds of timed run spent by the attempts before this resumed one: the ``resume``
    record's ``earlier_attempts_s`` (None when the log is not resumed or does not say)."""
    for event in parsed.events:
        if event.key == RESUME_KEY and isinstance(event.value, dict):
            value = event.value.get("earlier_attempts_s")
            return None if implausible("duration_s", value) or value is None else float(value)
    return None


def superseded_logs(files: list[Path]) -> set[str]:
    """Names of the logs among ``files`` (one folder) that a resumed log among them continues
    (`resumed_from`): stopped attempts, kept apart with their resumed run."""
    names: set[str] = set()
    for path in files:
        try:  # a FIFO, a device or a link out of the folder is named by the caller's parse_log
            if not log_mentions(path, b'"resume"', Path(path).parent):  # streamed, never held whole
                continue
            name = resumed_from(parse_log(path, Path(path).parent))
        except LogFormatError:
            continue
        if name:
            names.add(name)
    return names


def resumed_from(parsed: ParsedLog) -> str | None:
    """The name of the log whose checkpoint this resumed run continues (``from_result_file`` of
    its ``resume`` record), else None. That log is superseded by this one: a stopped attempt,
    kept apart with the resumed run instead of counting as a failed run of its folder."""
    for event in parsed.events:
        if event.key == RESUME_KEY and isinstance(event.value, dict):
            name = event.value.get("from_result_file")
            return Path(name).name if isinstance(name, str) and name else None
    return None


@dataclass(frozen=True)
class Interval:
    """A ``*_start .. *_stop`` pair. Times in ms since the Unix epoch; ``epoch_num`` if logged."""

    start_ms: float
    stop_ms: float
    epoch_num: float | None = None

    @property
    def duration_s(self) -> float:
        return (self.stop_ms - self.start_ms) / 1000.0


def read_summary(path: Path | str, target: float | None = None) -> dict[str, Any]:
    """`summarize_run` of the log at ``path`` as a dict (`RunSummary.to_dict`): what a run's
    own summary is made of. Raises LogFormatError: the log cannot be read."""
    return summarize_run(parse_log(path), target=target).to_dict()


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _int(value: Any) -> int | None:
    number = _number(value)
    return None if number is None or not math.isfinite(number) else int(number)


def official_start_stop(events: list[Event]) -> tuple[float | None, float | None]:
    """``(run_start, run_stop)`` in ms exactly as result_summarizer's ``_query_run_start_stop``.

    Walks the records in order, remembering the latest of each key, and stops as soon as both
    have been seen (so a repeated ``run_start`` before the first ``run_stop`` wins).
    """
    return _first_pair(events, "run_start", "run_stop", lambda event: event.time_ms)


def _first_pair(events: list[Event], key_a: str, key_b: str, get) -> tuple[Any, Any]:
    """The latest ``get(event)`` of ``key_a`` and of ``key_b``, walking in order and stopping as
    soon as both have been seen (the way result_summarizer's queries read a log)."""
    a = b = None
    for event in events:
        if event.key == key_a:
            a = get(event)
        elif event.key == key_b:
            b = get(event)
        if a is not None and b is not None:
            break
    return a, b


def official_instance_scale(events: list[Event]) -> int | None:
    """number_of_nodes x max(accelerators_per_node, 1), as result_summarizer's
    ``_query_instance_scale`` reads them; ``None`` if either key is missing or not a number."""
    nodes, accels = _first_pair(events, "number_of_nodes", "accelerators_per_node",
                                lambda event: event.value)
    try:
        return int(nodes) * max(int(accels), 1)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):  # OverflowError: Infinity
        return None


def pair_intervals(events: list[Event], start_key: str, stop_key: str) -> list[Interval]:
    """Match starts and stops in order (by epoch_num where both carry one)."""
    open_: list[Event] = []
    out: list[Interval] = []
    for event in events:
        if event.key == start_key:
            open_.append(event)
        elif event.key == stop_key and open_:
            num = event.metadata.get("epoch_num")
            match = 0
            if num is not None:
                for i, cand in enumerate(open_):
                    if cand.metadata.get("epoch_num") == num:
                        match = i
                        break
            start = open_.pop(match)
            out.append(Interval(start.time_ms, event.time_ms, _number(num)))
    return out


def _overlap_ms(a: Interval, b: Interval) -> float:
    return max(0.0, min(a.stop_ms, b.stop_ms) - max(a.start_ms, b.start_ms))


def _split_epochs(epochs: list[Interval], evals: list[Interval]) -> tuple[list[float], float]:
    """Training seconds per epoch, and seconds of evaluation concurrent with training.

    An evaluation that overlaps an epoch of the same ``epoch_num`` (or where either carries
    none) ran serially inside it: its overlap is subtracted from the epoch (overlap, not
    containment, so a few ms of clock skew do not matter). An evaluation that overlaps an epoch
    of another ``epoch_num`` ran concurrently with training (OpenFold evaluates the previous
    checkpoint while the next epoch trains): the epoch keeps its time, and the overlap is
    returned so the residual counts it once.
    """
    train_s: list[float] = []
    concurrent_ms = 0.0
    for ep in epochs:
        serial = 0.0
        for ev in evals:
            overlap = _overlap_ms(ep, ev)
            if overlap <= 0:
                continue
            if ev.epoch_num is None or ep.epoch_num is None or ev.epoch_num == ep.epoch_num:
                serial += overlap
            else:
                concurrent_ms += overlap
        train_s.append((ep.stop_ms - ep.start_ms - serial) / 1000.0)
    return train_s, concurrent_ms / 1000.0


def _span_s(first: Mapping[str, Event], start_key: str, stop_key: str) -> float | None:
    start, stop = first.get(start_key), first.get(stop_key)
    if start is None or stop is None:
        return None
    return (stop.time_ms - start.time_ms) / 1000.0


def _read_submission(events: list[Event], first: Mapping[str, Event]) -> Submission:
    """The ``submission_*`` names, sizes and instance id: each key's first value."""
    first_values = {key: event.value for key, event in first.items()}
    text = lambda key: cap_field(first_values[key]) if isinstance(first_values.get(key), str) else None  # noqa: E731
    instance_id = first_values.get("instance_id")
    if instance_id is None:
        instance_id = next((event.metadata["instance"] for event in events[:50] if "instance" in event.metadata), None)
    return Submission(
        benchmark=text("submission_benchmark"), org=text("submission_org"), division=text("submission_division"),
        platform=text("submission_platform"), status_submission=text("submission_status"),
        global_batch_size=_int(first_values.get("global_batch_size")),
        number_of_nodes=_int(first_values.get("number_of_nodes")),
        accelerators_per_node=_int(first_values.get("accelerators_per_node")), instance_id=instance_id,
        train_samples=_int(first_values.get("train_samples")), eval_samples=_int(first_values.get("eval_samples")))


def _read_start_stop(first: Mapping[str, Event], resumed: bool, earlier: float | None) -> Timing:
    """Time to train from the first ``run_start`` and ``run_stop``; status, reason, last epoch;
    whether the run was resumed, and the earlier attempts' seconds."""
    start, stop = first.get("run_start"), first.get("run_stop")
    if not (start and stop):
        return Timing(run_start_ms=start.time_ms if start else None, run_stop_ms=stop.time_ms if stop else None,
                      resumed=resumed, earlier_attempts_s=earlier)
    time_to_train_s: float | None = (stop.time_ms - start.time_ms) / 1000.0
    status = "success" if stop.metadata.get("status") == "success" else "aborted"
    reason = stop.metadata.get("reason")
    reason = reason if isinstance(reason, str) else None
    problem = implausible("time_to_train_s", time_to_train_s)
    if problem:  # never scored nor stored as a success (`mlhpc.log.plausible`)
        early = " (run_stop before run_start)" if time_to_train_s < 0 else ""  # type: ignore[operator]
        status, reason, time_to_train_s = "invalid", f"refused: {problem}{early}", None
    return Timing(status, start.time_ms, stop.time_ms, time_to_train_s, reason,
                  _number(stop.metadata.get("epoch_num")), resumed, earlier)


def _read_staging_and_init(first: Mapping[str, Event]) -> Staging:
    """Staging and init spans, staged bytes, mlhpc's per-node staging figures."""
    staging_stop = first.get("staging_stop")
    nodes = None
    if staging_stop and isinstance(staging_stop.metadata.get("nodes"), int):
        nodes = {k: staging_stop.metadata.get(k) for k in (
            "nodes", "slowest_node_s", "mean_node_s", "node_gb_per_s", "aggregate_gb_per_s",
            "node_staged_bytes", "placement")}
    start, staging_start = first.get("run_start"), first.get("staging_start")
    return Staging(staging_s=_span_s(first, "staging_start", "staging_stop"),
                   staging_in_run=bool(start and staging_start and staging_start.time_ms >= start.time_ms),
                   init_s=_span_s(first, "init_start", "init_stop"),
                   staged_bytes=_int(staging_stop.metadata.get("staged_bytes")) if staging_stop else None,
                   staging_nodes=nodes)


def _latencies_s(epoch_stops: list[Event], key: str) -> list[float]:
    """``epoch_stop``'s ``key`` metadata (ms) in seconds, where logs carry no start/stop pairs."""
    return [float(e.metadata[key]) / 1000.0 for e in epoch_stops if _number(e.metadata.get(key)) is not None]


def _read_epochs(events: list[Event], timing: Timing, train_samples: int | None, epoch_unit: str) -> Training:
    """Training time per epoch, evaluation time, residual and samples/s, from the records
    between run_start and the first run_stop (some logs go on training after run_stop)."""
    begin = next((i for i, e in enumerate(events) if e.key == "run_start"), -1)
    end = next((i for i, e in enumerate(events) if e.key == "run_stop"), len(events))
    timed = events[begin + 1:end] if begin < end else []
    epochs = pair_intervals(timed, "epoch_start", "epoch_stop")
    evals = pair_intervals(timed, "eval_start", "eval_stop")
    epoch_stops = [e for e in timed if e.key == "epoch_stop"]
    train_epoch_s: list[float] = []
    eval_s: list[float] = []
    overlap_s = 0.0
    if epochs:
        train_epoch_s, overlap_s = _split_epochs(epochs, evals)
    elif any("training_epoch_latency" in e.metadata for e in epoch_stops):
        train_epoch_s = _latencies_s(epoch_stops, "training_epoch_latency")
    if evals:
        eval_s = [ev.duration_s for ev in evals]
    elif any("eval_epoch_latency" in e.metadata for e in epoch_stops):
        eval_s = _latencies_s(epoch_stops, "eval_epoch_latency")
    total_train_s = sum(train_epoch_s)
    residual_s = None
    if timing.time_to_train_s is not None and (train_epoch_s or eval_s):
        residual_s = timing.time_to_train_s - total_train_s - (sum(eval_s) - overlap_s)
    trained = None if timing.resumed and epoch_unit == "samples" else _samples_trained(
        epoch_unit, train_samples, len(train_epoch_s), events)
    per_s = trained / total_train_s if trained and total_train_s > 0 else None  # a resumed run's count began before its log
    return Training(train_epoch_s, eval_s, len(train_epoch_s), epoch_unit, per_s, residual_s, overlap_s > 0, overlap_s)


def samples_trained(training: Training, train_samples: int | None, events: list[Event]) -> float | None:
    """Samples the timed run trained on: ``train_samples`` x epochs (the epochs counted between
    run_start and run_stop), or for a benchmark whose ``epoch_num`` counts samples (OpenFold, as
    the reference logs it: the samples trained by the epoch's end) the largest ``epoch_num`` of
    an ``epoch_stop`` there; None where the log does not say. samples/s and Valid FLOPS
    (`mlhpc.report.validflops`) both count with it. ``training`` and ``train_samples``: the run's
    (`RunSummary.training`, ``RunSummary.submission.train_samples``)."""
    return _samples_trained(training.epoch_unit, train_samples, training.n_epochs, events)


def _samples_trained(epoch_unit: str, train_samples: int | None, n_epochs: int, events: list[Event]) -> float | None:
    if epoch_unit != "samples":
        return float(train_samples * n_epochs) if train_samples and n_epochs else None
    begin = next((i for i, e in enumerate(events) if e.key == "run_start"), None)
    end = next((i for i, e in enumerate(events) if e.key == "run_stop"), len(events))
    counts = [e.metadata.get("epoch_num") for e in events[(begin or 0) + 1:end]
              if begin is not None and e.key == "epoch_stop"]
    counts = [float(c) for c in counts if isinstance(c, (int, float)) and not isinstance(c, bool)
              and math.isfinite(c) and c > 0]
    return max(counts) if counts else None


def _read_metric(events: list[Event]) -> tuple[str | None, list[tuple[float, float]], float | None]:
    """The quality metric's key and series, and epochs to target as rcp_checker counts them."""
    key, series, to_target, last_metric_epoch = None, [], None, None
    for event in events:
        if event.key in METRIC_KEYS:
            value = _number(event.value)
            epoch = _number(event.metadata.get("epoch_num"))
            if key is None:
                key = event.key
            if value is not None and event.key == key:
                series.append((epoch if epoch is not None else float(len(series) + 1), value))
            if epoch is not None:
                last_metric_epoch = round(epoch, 3)
        elif event.key == "run_stop":
            if event.metadata.get("status") == "success" and last_metric_epoch is not None:
                to_target = last_metric_epoch
            break
    return key, series, to_target


def _read_quality(events: list[Event], benchmark: str | None, target: float | None) -> Quality:
    """The quality metric, and the target shown (``target``, else the rules' closed-division
    one) with its direction."""
    metric_key, series, to_target = _read_metric(events)
    reference = quality_target(benchmark)
    shown = target
    if target is None and reference and (metric_key in (None, reference[0])):
        shown = reference[1]
    direction = None
    if reference and metric_key in (None, reference[0]):
        direction = reference[2]
    elif metric_key:
        direction = "min" if metric_key == "eval_error" else "max"
    return Quality(metric_key, series, shown, direction, to_target)


def summarize_run(parsed: ParsedLog, target: float | None = None) -> RunSummary:
    """Summarize one parsed log.

    Args:
        parsed: from `mlhpc.log.parse.parse_log`.
        target: the quality target to show (default: the closed-division target of the logged
            benchmark in mlperf_logging's rules, `quality_target`).

    Returns:
        a `RunSummary`; a log missing keys yields ``None`` fields and status ``"incomplete"``,
        never an exception.
    """
    first: dict[str, Event] = {}  # each key's first record, found in one pass
    for event in parsed.events:
        first.setdefault(event.key, event)
    submission = _read_submission(parsed.events, first)
    timing = _read_start_stop(first, is_resumed(parsed), earlier_attempts_s(parsed))
    epoch_unit = "samples" if submission.benchmark in rules.ruleset().sample_counted_epochs else "epochs"
    training = _read_epochs(parsed.events, timing, submission.train_samples, epoch_unit)
    return RunSummary(path=parsed.path, submission=submission, timing=timing,
                      staging=_read_staging_and_init(first), training=training,
                      quality=_read_quality(parsed.events, submission.benchmark, target),
                      malformed=[m.message for m in parsed.malformed],
                      emulation=emulation_figures(parsed.events, training.train_epoch_s))
