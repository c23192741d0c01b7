"""One run, from its log alone: time to train, staging, init, epochs, evaluation, residual.

Definitions follow the MLPerf HPC rules (v3.0, "Timing") and MLCommons' result_summarizer:
time to train is ``run_stop - run_start``; staging (``staging_start .. staging_stop``) happens
before ``run_start`` and is reported on its own; convergence is counted as the rcp_checker
counts it (``epoch_num`` of the last quality-metric record before a successful ``run_stop``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlhpc import rules
from mlhpc.errors import LogFormatError
from mlhpc.log.emulated import emulation_figures
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


@dataclass
class RunSummary:
    """What one ``result_N.txt`` says about its run. Times in seconds unless named otherwise.

    Attributes:
        path: the log file.
        benchmark / org / division / platform / status_submission: the ``submission_*`` values.
        status: ``"success"``, ``"aborted"`` (run_stop with another status), ``"incomplete"``
            (no run_stop, or no run_start) or ``"invalid"`` (an implausible time to train, e.g.
            run_stop before run_start: `mlhpc.log.plausible`; ``reason`` says why).
        run_start_ms / run_stop_ms: first ``run_start`` and first ``run_stop`` (ms since epoch).
        time_to_train_s: ``run_stop_ms - run_start_ms`` in seconds (``None`` if either is missing).
        staging_s / init_s: ``staging_start..staging_stop`` and ``init_start..init_stop``.
        staging_in_run: staging began after run_start, so it is inside time to train (rules
            before HPC v3.0) and part of the residual.
        train_epochs: per-epoch training intervals (evaluation nested in an epoch is subtracted
            from ``train_epoch_s``).
        train_epoch_s / eval_s: training time per epoch and evaluation time per evaluation.
        epochs_to_target: ``epoch_num`` of the last metric record before a successful run_stop
            (as rcp_checker counts it), else ``None``; samples for OpenFold (``epoch_unit``).
        samples_per_s: ``train_samples`` x epochs / training time, where train_samples is known.
        residual_s: time to train - sum(train_epoch_s) - (sum(eval_s) - eval_overlap_s): set-up
            inside the timed region, checkpoints, logging, anything not in an epoch or an
            evaluation.
        concurrent_eval / eval_overlap_s: evaluation ran while training went on (an evaluation
            overlapping an epoch of another ``epoch_num``), and for how many seconds it overlapped
            the epochs; such time is counted once, in the epochs.
        metric_key / metric_series / target: the quality metric, ``[(epoch_num, value)]`` and
            the target (from the run's ``summary_N.json``, else the closed-division target in
            mlperf_logging's rule file, `quality_target`).
        global_batch_size / number_of_nodes / accelerators_per_node / instance_id: as logged.
        resumed: a ``resume`` event or ``"resumed": true`` metadata appears in the log.
        earlier_attempts_s: a resumed run's timed seconds in the attempts before it
            (`earlier_attempts_s`); ``time_to_train_total_s`` in `to_dict` adds them.
        reason / last_epoch: ``run_stop``'s ``reason`` and ``epoch_num`` metadata, when logged.
        eval_samples: as logged. staged_bytes: ``staging_stop``'s ``staged_bytes`` metadata.
        staging_nodes: ``staging_stop``'s per-node figures when mlhpc logged them (``nodes``,
            ``slowest_node_s``, ``mean_node_s``, ``node_gb_per_s``, ``aggregate_gb_per_s``,
            ``node_staged_bytes``, ``placement``; `mlhpc.data.stage.StagingResult.node_summary`).
        malformed: ``"file:line: reason"`` for every unreadable record line.
        energy_to_train_j / mean_power_w: from ``power/result_N/node_K.txt`` beside the log, as
            result_summarizer integrates them (`mlhpc.report.energy`); None where unmeasured.
        node_energy_j: joules per node (and switch) file. mean_epoch_energy_j: the readings'
            energy over each ``epoch_start .. epoch_stop``, averaged. power_note: why no energy.
        valid_flops: HPC AI500's Valid FLOPS (per watt) of the run (`mlhpc.report.validflops`).
        accelerator_utilization / emulation: a storage-mode run's AU (0..1) and its figures, per
            node too (`mlhpc.log.emulated.emulation_figures`); None for any other run.
    """

    path: str
    benchmark: str | None = None
    org: str | None = None
    division: str | None = None
    platform: str | None = None
    status_submission: str | None = None
    status: str = "incomplete"
    run_start_ms: float | None = None
    run_stop_ms: float | None = None
    time_to_train_s: float | None = None
    staging_s: float | None = None
    staging_in_run: bool = False
    init_s: float | None = None
    train_epoch_s: list[float] = field(default_factory=list)
    eval_s: list[float] = field(default_factory=list)
    n_epochs: int = 0
    epochs_to_target: float | None = None
    epoch_unit: str = "epochs"
    train_samples: int | None = None
    samples_per_s: float | None = None
    residual_s: float | None = None
    metric_key: str | None = None
    metric_series: list[tuple[float, float]] = field(default_factory=list)
    target: float | None = None
    target_direction: str | None = None
    global_batch_size: int | None = None
    number_of_nodes: int | None = None
    accelerators_per_node: int | None = None
    instance_id: Any = None
    resumed: bool = False
    earlier_attempts_s: float | None = None
    concurrent_eval: bool = False
    eval_overlap_s: float = 0.0
    reason: str | None = None
    last_epoch: float | None = None
    eval_samples: int | None = None
    staged_bytes: int | None = None
    staging_nodes: dict[str, Any] | None = None
    malformed: list[str] = field(default_factory=list)
    compliant: bool | None = None
    compliance_messages: list[str] = field(default_factory=list)
    energy_to_train_j: float | None = None
    mean_power_w: float | None = None
    node_energy_j: dict[str, float] = field(default_factory=dict)
    mean_epoch_energy_j: float | None = None
    power_note: str | None = None
    valid_flops: Any = None  # a ValidFlops (mlhpc.report.validflops imports this module)
    accelerator_utilization: float | None = None
    emulation: dict[str, Any] | None = None

    @property
    def time_to_train_min(self) -> float | None:
        return None if self.time_to_train_s is None else self.time_to_train_s / 60.0

    @property
    def mean_epoch_s(self) -> float | None:
        return sum(self.train_epoch_s) / len(self.train_epoch_s) if self.train_epoch_s else None

    @property
    def start_metric(self) -> float | None:
        """The starting point's evaluation, before the first step (``epoch_num`` 0, as OpenFold's
        reference logs it), or None."""
        return self.metric_series[0][1] if self.metric_series and self.metric_series[0][0] == 0 else None

    @property
    def total_eval_s(self) -> float:
        return sum(self.eval_s)

    @property
    def total_train_s(self) -> float:
        return sum(self.train_epoch_s)

    @property
    def time_to_train_total_s(self) -> float | None:
        """Timed seconds across every attempt of a resumed run: this log's time to train plus
        ``earlier_attempts_s`` (no score: the rules time a run as one unbroken period)."""
        if self.time_to_train_s is None:
            return None
        return self.time_to_train_s + (self.earlier_attempts_s or 0.0)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of every field plus the derived ``*_min``/mean/total values."""
        out = {k: v for k, v in self.__dict__.items()}
        out["metric_series"] = [list(p) for p in self.metric_series]
        out["valid_flops"] = self.valid_flops.to_dict() if self.valid_flops is not None else None
        out.update(time_to_train_min=self.time_to_train_min, mean_epoch_s=self.mean_epoch_s,
                   total_train_s=self.total_train_s, total_eval_s=self.total_eval_s,
                   time_to_train_total_s=self.time_to_train_total_s, start_metric=self.start_metric)
        return out


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


def _pair(events: list[Event], start_key: str, stop_key: str) -> list[Interval]:
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


def _span_s(parsed: ParsedLog, start_key: str, stop_key: str) -> float | None:
    start, stop = parsed.first(start_key), parsed.first(stop_key)
    if start is None or stop is None:
        return None
    return (stop.time_ms - start.time_ms) / 1000.0


def _read_submission(run: RunSummary, parsed: ParsedLog) -> None:
    """The ``submission_*`` names, sizes and instance id: each key's first value."""
    events = parsed.events
    first_values: dict[str, Any] = {}
    for event in events:
        first_values.setdefault(event.key, event.value)
    text = lambda key: cap_field(first_values[key]) if isinstance(first_values.get(key), str) else None  # noqa: E731
    run.benchmark = text("submission_benchmark")
    run.org, run.division = text("submission_org"), text("submission_division")
    run.platform, run.status_submission = text("submission_platform"), text("submission_status")
    run.global_batch_size = _int(first_values.get("global_batch_size"))
    run.number_of_nodes = _int(first_values.get("number_of_nodes"))
    run.accelerators_per_node = _int(first_values.get("accelerators_per_node"))
    run.train_samples = _int(first_values.get("train_samples"))
    run.eval_samples = _int(first_values.get("eval_samples"))
    run.instance_id = first_values.get("instance_id")
    if run.instance_id is None:
        for event in events[:50]:
            if "instance" in event.metadata:
                run.instance_id = event.metadata["instance"]
                break
    if run.benchmark in rules.ruleset().sample_counted_epochs:
        run.epoch_unit = "samples"


def _read_start_stop(run: RunSummary, parsed: ParsedLog) -> None:
    """Time to train from the first ``run_start`` and ``run_stop``; status, reason, last epoch."""
    start, stop = parsed.first("run_start"), parsed.first("run_stop")
    run.run_start_ms = start.time_ms if start else None
    run.run_stop_ms = stop.time_ms if stop else None
    if start and stop:
        run.time_to_train_s = (stop.time_ms - start.time_ms) / 1000.0
        status = stop.metadata.get("status")
        run.status = "success" if status == "success" else "aborted"
        reason = stop.metadata.get("reason")
        run.reason = reason if isinstance(reason, str) else None
        problem = implausible("time_to_train_s", run.time_to_train_s)
        if problem:  # never scored nor stored as a success (`mlhpc.log.plausible`)
            early = " (run_stop before run_start)" if run.time_to_train_s < 0 else ""
            run.status, run.reason, run.time_to_train_s = "invalid", f"refused: {problem}{early}", None
        run.last_epoch = _number(stop.metadata.get("epoch_num"))


def _read_staging_and_init(run: RunSummary, parsed: ParsedLog) -> None:
    """Staging and init spans, staged bytes, mlhpc's per-node staging figures."""
    run.staging_s = _span_s(parsed, "staging_start", "staging_stop")
    staging_stop = parsed.first("staging_stop")
    run.staged_bytes = _int(staging_stop.metadata.get("staged_bytes")) if staging_stop else None
    if staging_stop and isinstance(staging_stop.metadata.get("nodes"), int):
        run.staging_nodes = {k: staging_stop.metadata.get(k) for k in (
            "nodes", "slowest_node_s", "mean_node_s", "node_gb_per_s", "aggregate_gb_per_s",
            "node_staged_bytes", "placement")}
    start, staging_start = parsed.first("run_start"), parsed.first("staging_start")
    run.staging_in_run = bool(start and staging_start and staging_start.time_ms >= start.time_ms)
    run.init_s = _span_s(parsed, "init_start", "init_stop")


def _latencies_s(epoch_stops: list[Event], key: str) -> list[float]:
    """``epoch_stop``'s ``key`` metadata (ms) in seconds, where logs carry no start/stop pairs."""
    return [float(e.metadata[key]) / 1000.0 for e in epoch_stops if _number(e.metadata.get(key)) is not None]


def _read_epochs(run: RunSummary, events: list[Event]) -> None:
    """Training time per epoch, evaluation time, residual and samples/s, from the records
    between run_start and the first run_stop (some logs go on training after run_stop)."""
    begin = next((i for i, e in enumerate(events) if e.key == "run_start"), -1)
    end = next((i for i, e in enumerate(events) if e.key == "run_stop"), len(events))
    timed = events[begin + 1:end] if begin < end else []
    epochs = _pair(timed, "epoch_start", "epoch_stop")
    evals = _pair(timed, "eval_start", "eval_stop")
    epoch_stops = [e for e in timed if e.key == "epoch_stop"]
    if epochs:
        run.train_epoch_s, run.eval_overlap_s = _split_epochs(epochs, evals)
        run.concurrent_eval = run.eval_overlap_s > 0
    elif any("training_epoch_latency" in e.metadata for e in epoch_stops):
        run.train_epoch_s = _latencies_s(epoch_stops, "training_epoch_latency")
    if evals:
        run.eval_s = [ev.duration_s for ev in evals]
    elif any("eval_epoch_latency" in e.metadata for e in epoch_stops):
        run.eval_s = _latencies_s(epoch_stops, "eval_epoch_latency")
    run.n_epochs = len(run.train_epoch_s)
    if run.time_to_train_s is not None and (run.train_epoch_s or run.eval_s):
        run.residual_s = run.time_to_train_s - run.total_train_s - (run.total_eval_s - run.eval_overlap_s)
    trained = None if run.resumed and run.epoch_unit == "samples" else samples_trained(run, events)
    if trained and run.total_train_s > 0:  # a resumed run's sample count began before its log
        run.samples_per_s = trained / run.total_train_s


def samples_trained(run: RunSummary, events: list[Event]) -> float | None:
    """Samples the timed run trained on: ``train_samples`` x epochs (the epochs counted between
    run_start and run_stop), or for a benchmark whose ``epoch_num`` counts samples (OpenFold, as
    the reference logs it: the samples trained by the epoch's end) the largest ``epoch_num`` of
    an ``epoch_stop`` there; None where the log does not say. samples/s and Valid FLOPS
    (`mlhpc.report.validflops`) both count with it."""
    if run.epoch_unit != "samples":
        return float(run.train_samples * run.n_epochs) if run.train_samples and run.n_epochs else None
    begin = next((i for i, e in enumerate(events) if e.key == "run_start"), None)
    end = next((i for i, e in enumerate(events) if e.key == "run_stop"), len(events))
    counts = [e.metadata.get("epoch_num") for e in events[(begin or 0) + 1:end]
              if begin is not None and e.key == "epoch_stop"]
    counts = [float(c) for c in counts if isinstance(c, (int, float)) and not isinstance(c, bool)
              and math.isfinite(c) and c > 0]
    return max(counts) if counts else None


def _read_metric(run: RunSummary, events: list[Event]) -> None:
    """The quality metric's series, and epochs to target as rcp_checker counts them."""
    last_metric_epoch = None
    for event in events:
        if event.key in METRIC_KEYS:
            value = _number(event.value)
            epoch = _number(event.metadata.get("epoch_num"))
            if run.metric_key is None:
                run.metric_key = event.key
            if value is not None and event.key == run.metric_key:
                run.metric_series.append((epoch if epoch is not None else float(len(run.metric_series) + 1), value))
            if epoch is not None:
                last_metric_epoch = round(epoch, 3)
        elif event.key == "run_stop":
            if event.metadata.get("status") == "success" and last_metric_epoch is not None:
                run.epochs_to_target = last_metric_epoch
            break


def _read_target(run: RunSummary, target: float | None) -> None:
    """The target shown (``target``, else the rules' closed-division one) and its direction."""
    reference = quality_target(run.benchmark)
    if target is not None:
        run.target = target
    elif reference and (run.metric_key in (None, reference[0])):
        run.target = reference[1]
    if reference and run.metric_key in (None, reference[0]):
        run.target_direction = reference[2]
    elif run.metric_key:
        run.target_direction = "min" if run.metric_key == "eval_error" else "max"


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
    run = RunSummary(path=parsed.path, malformed=[m.message for m in parsed.malformed])
    run.resumed, run.earlier_attempts_s = is_resumed(parsed), earlier_attempts_s(parsed)
    _read_submission(run, parsed)
    _read_start_stop(run, parsed)
    _read_staging_and_init(run, parsed)
    _read_epochs(run, parsed.events)
    run.emulation = emulation_figures(parsed.events, run.train_epoch_s)
    run.accelerator_utilization = run.emulation["accelerator_utilization"] if run.emulation else None
    _read_metric(run, parsed.events)
    _read_target(run, target)
    return run
