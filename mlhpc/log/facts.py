"""What one ``result_N.txt`` says about its run, as frozen records: `RunSummary` and its parts.

The log's facts only (times, epochs, quality metric, sizes, staging, emulation), made once by
`mlhpc.log.summary.summarize_run` and never changed after. What the report computes from them
(energy, Valid FLOPS, compliance verdicts) is a record of the results side that holds a
`RunSummary` (`mlhpc.report.reported.ReportedRun`). Times in seconds unless named otherwise.
Definitions follow the MLPerf HPC rules (v3.0, "Timing") and MLCommons' result_summarizer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Submission:
    """What the log says the run is: each key's first value.

    Attributes:
        benchmark / org / division / platform / status_submission: the ``submission_*`` values.
        global_batch_size / number_of_nodes / accelerators_per_node / instance_id: as logged
            (``instance_id`` else the ``instance`` metadata of the first 50 records).
        train_samples / eval_samples: as logged.
    """

    benchmark: str | None = None
    org: str | None = None
    division: str | None = None
    platform: str | None = None
    status_submission: str | None = None
    global_batch_size: int | None = None
    number_of_nodes: int | None = None
    accelerators_per_node: int | None = None
    instance_id: Any = None
    train_samples: int | None = None
    eval_samples: int | None = None


@dataclass(frozen=True)
class Timing:
    """The timed run, ``run_start .. run_stop``.

    Attributes:
        status: ``"success"``, ``"aborted"`` (run_stop with another status), ``"incomplete"``
            (no run_stop, or no run_start) or ``"invalid"`` (an implausible time to train, e.g.
            run_stop before run_start: `mlhpc.log.plausible`; ``reason`` says why).
        run_start_ms / run_stop_ms: first ``run_start`` and first ``run_stop`` (ms since epoch).
        time_to_train_s: ``run_stop_ms - run_start_ms`` in seconds (``None`` if either is missing).
        reason / last_epoch: ``run_stop``'s ``reason`` and ``epoch_num`` metadata, when logged.
        resumed: a ``resume`` event or ``"resumed": true`` metadata appears in the log.
        earlier_attempts_s: a resumed run's timed seconds in the attempts before it
            (`mlhpc.log.summary.earlier_attempts_s`).
    """

    status: str = "incomplete"
    run_start_ms: float | None = None
    run_stop_ms: float | None = None
    time_to_train_s: float | None = None
    reason: str | None = None
    last_epoch: float | None = None
    resumed: bool = False
    earlier_attempts_s: float | None = None

    @property
    def time_to_train_min(self) -> float | None:
        return None if self.time_to_train_s is None else self.time_to_train_s / 60.0

    @property
    def time_to_train_total_s(self) -> float | None:
        """Timed seconds across every attempt of a resumed run: this log's time to train plus
        ``earlier_attempts_s`` (no score: the rules time a run as one unbroken period)."""
        if self.time_to_train_s is None:
            return None
        return self.time_to_train_s + (self.earlier_attempts_s or 0.0)


@dataclass(frozen=True)
class Staging:
    """Set-up around the timed run: staging and init.

    Attributes:
        staging_s / init_s: ``staging_start..staging_stop`` and ``init_start..init_stop``.
        staging_in_run: staging began after run_start, so it is inside time to train (rules
            before HPC v3.0) and part of the residual.
        staged_bytes: ``staging_stop``'s ``staged_bytes`` metadata.
        staging_nodes: ``staging_stop``'s per-node figures when mlhpc logged them (``nodes``,
            ``slowest_node_s``, ``mean_node_s``, ``node_gb_per_s``, ``aggregate_gb_per_s``,
            ``node_staged_bytes``, ``placement``; `mlhpc.data.stage.StagingResult.node_summary`).
    """

    staging_s: float | None = None
    staging_in_run: bool = False
    init_s: float | None = None
    staged_bytes: int | None = None
    staging_nodes: dict[str, Any] | None = None


@dataclass(frozen=True)
class Training:
    """Epochs and evaluations between run_start and the first run_stop.

    Attributes:
        train_epoch_s / eval_s: training time per epoch (evaluation nested in an epoch is
            subtracted) and evaluation time per evaluation.
        n_epochs: ``len(train_epoch_s)``.
        epoch_unit: ``"epochs"``, or ``"samples"`` where ``epoch_num`` counts samples (OpenFold).
        samples_per_s: samples trained / training time, where the samples trained are known.
        residual_s: time to train - sum(train_epoch_s) - (sum(eval_s) - eval_overlap_s): set-up
            inside the timed region, checkpoints, logging, anything not in an epoch or an
            evaluation.
        concurrent_eval / eval_overlap_s: evaluation ran while training went on (an evaluation
            overlapping an epoch of another ``epoch_num``), and for how many seconds it overlapped
            the epochs; such time is counted once, in the epochs.
    """

    train_epoch_s: list[float] = field(default_factory=list)
    eval_s: list[float] = field(default_factory=list)
    n_epochs: int = 0
    epoch_unit: str = "epochs"
    samples_per_s: float | None = None
    residual_s: float | None = None
    concurrent_eval: bool = False
    eval_overlap_s: float = 0.0

    @property
    def mean_epoch_s(self) -> float | None:
        return sum(self.train_epoch_s) / len(self.train_epoch_s) if self.train_epoch_s else None

    @property
    def total_eval_s(self) -> float:
        return sum(self.eval_s)

    @property
    def total_train_s(self) -> float:
        return sum(self.train_epoch_s)


@dataclass(frozen=True)
class Quality:
    """The quality metric and its target.

    Attributes:
        metric_key / metric_series: the quality metric and ``[(epoch_num, value)]``.
        target / target_direction: the target (from the run's ``summary_N.json``, else the
            closed-division target in mlperf_logging's rule file) and ``"max"`` or ``"min"``.
        epochs_to_target: ``epoch_num`` of the last metric record before a successful run_stop
            (as rcp_checker counts it), else ``None``; samples for OpenFold.
    """

    metric_key: str | None = None
    metric_series: list[tuple[float, float]] = field(default_factory=list)
    target: float | None = None
    target_direction: str | None = None
    epochs_to_target: float | None = None

    @property
    def start_metric(self) -> float | None:
        """The starting point's evaluation, before the first step (``epoch_num`` 0, as OpenFold's
        reference logs it), or None."""
        return self.metric_series[0][1] if self.metric_series and self.metric_series[0][0] == 0 else None


#: The keys the report's JSON adds to a run (`mlhpc.report.reported.ReportedRun.to_dict`), here
#: at their values before the report computes them, so a run's own summary has the same keys.
REPORT_KEYS: dict[str, Any] = {
    "compliant": None, "compliance_messages": [], "energy_to_train_j": None, "mean_power_w": None,
    "node_energy_j": {}, "mean_epoch_energy_j": None, "power_note": None, "valid_flops": None}

#: The order of `RunSummary.to_dict`'s keys (``summary_N.json``, ``mlhpc report --format json``).
JSON_ORDER = (
    "path", "benchmark", "org", "division", "platform", "status_submission", "status", "run_start_ms",
    "run_stop_ms", "time_to_train_s", "staging_s", "staging_in_run", "init_s", "train_epoch_s", "eval_s",
    "n_epochs", "epochs_to_target", "epoch_unit", "train_samples", "samples_per_s", "residual_s", "metric_key",
    "metric_series", "target", "target_direction", "global_batch_size", "number_of_nodes",
    "accelerators_per_node", "instance_id", "resumed", "earlier_attempts_s", "concurrent_eval", "eval_overlap_s",
    "reason", "last_epoch", "eval_samples", "staged_bytes", "staging_nodes", "malformed", *REPORT_KEYS,
    "accelerator_utilization", "emulation", "time_to_train_min", "mean_epoch_s", "total_train_s", "total_eval_s",
    "time_to_train_total_s", "start_metric")


@dataclass(frozen=True)
class RunSummary:
    """What one ``result_N.txt`` says about its run (`mlhpc.log.summary.summarize_run`).

    Attributes:
        path: the log file.
        submission / timing / staging / training / quality: the log's facts, by part.
        malformed: ``"file:line: reason"`` for every unreadable record line.
        emulation: a storage-mode run's figures, per node too
            (`mlhpc.log.emulated.emulation_figures`); None for any other run.
    """

    path: str
    submission: Submission = field(default_factory=Submission)
    timing: Timing = field(default_factory=Timing)
    staging: Staging = field(default_factory=Staging)
    training: Training = field(default_factory=Training)
    quality: Quality = field(default_factory=Quality)
    malformed: list[str] = field(default_factory=list)
    emulation: dict[str, Any] | None = None

    @property
    def accelerator_utilization(self) -> float | None:
        """A storage-mode run's AU (0..1), None for any other run."""
        return self.emulation["accelerator_utilization"] if self.emulation else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of every fact, flat, in `JSON_ORDER`: the parts' fields, the keys the
        report fills (`REPORT_KEYS`, not computed here), the derived ``*_min``/mean/total values."""
        timing, training = self.timing, self.training
        flat: dict[str, Any] = {"path": self.path}
        for part in (self.submission, timing, self.staging, training, self.quality):
            flat.update(asdict(part))
        flat.update(malformed=self.malformed, metric_series=[list(p) for p in self.quality.metric_series],
                    accelerator_utilization=self.accelerator_utilization, emulation=self.emulation,
                    time_to_train_min=timing.time_to_train_min, mean_epoch_s=training.mean_epoch_s,
                    total_train_s=training.total_train_s, total_eval_s=training.total_eval_s,
                    time_to_train_total_s=timing.time_to_train_total_s, start_metric=self.quality.start_metric)
        flat.update({key: (type(value)() if isinstance(value, (list, dict)) else value)
                     for key, value in REPORT_KEYS.items()})
        out = {key: flat.pop(key) for key in JSON_ORDER}
        out.update(flat)  # a field not in JSON_ORDER is kept, last
        return out
