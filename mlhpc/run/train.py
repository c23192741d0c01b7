"""The run's stages, from its log to its files, each taking values and returning values; the
command (`mlhpc.run.command.run`) calls them in one straight line, with the resume chosen, the
ranks started and the data source made before, and the summary read back after:

    seeded_model (`mlhpc.run.assemble`): the model built once, a resumed run's weights loaded
       into it (nothing reads the dataset)
    -> `attempt`: result_N.txt claimed, the log synchronised over the instance's ranks
       (`ComplianceLog.barrier`), log_init: init_start, submission_*, cache_clear, seed, resume
       (`mlhpc.run.mllog`)
    -> `prepare`: hyperparameters; staging (staging_start/stop) and build (the parts: the first
       read of the data checked against the model) before or after init_stop .. run_start
       (`start_run`), by ``data.staging.placement``
    -> `Run` and `train_loop`: epochs and evaluations until the target, then run_stop (below)
    -> finish: measured_N.json, config_N.yaml, env_N.json (`mlhpc.run.outcome`)

Data parallelism is DistributedDataParallel; which samples a rank reads is
`mlhpc.data.sampler`'s choice: after a sharded stage (``data.staging.shard: node``) its node's
samples, shuffled within the node; otherwise a seeded per-epoch shuffle shared by all ranks (so R
ranks x local batch b see the same global batches as 1 rank x R*b).

The timed run (`train_loop`, below: the loop, one screen, over one `Run`) goes from ``run_start`` to
``run_stop``: each epoch trains (`_train_epoch`), evaluates (`_evaluate_epoch`), reports, and
stops at the quality target, a non-finite loss or metric, ``train.max_epochs``, or a signal (a
checkpoint is saved first: `mlhpc.run.checkpoint`). Rank 0 writes every log line; the timing
events are bracketed by barriers so that a once-only key appears once and measures the slowest
rank. The ranks agree on stopping every ``train.check_every_steps`` steps; the metric is reduced
as (sum, count) across ranks (`mlhpc.run.evaluate`).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mlhpc import rules, runtime
from mlhpc.config import Config, TrainConfig
from mlhpc.errors import ConfigError
from mlhpc.run import checkpoint
from mlhpc.run.assemble import Parts, Seeded, build, sources_named, stage, steps_per_pass
from mlhpc.run.evaluate import evaluate
from mlhpc.run.job import Job
from mlhpc.log.writer import EMULATED_ACCELERATOR, ComplianceLog, constants
from mlhpc.run.mllog import log_hyperparameters, log_init, log_samples
from mlhpc.run.outcome import Outcome, Stop, close_failed
from mlhpc.run.result import RunFiles
from mlhpc.run.step import autocast, train_step
from mlhpc.runtime import Runtime

__all__ = ["Clock", "Run", "attempt", "local_batch_size", "prepare", "train_loop"]


@contextmanager
def attempt(job: Job) -> Iterator[tuple[ComplianceLog, RunFiles | None]]:
    """This attempt's log (``result_N.txt`` claimed, with its set of files; None on ranks that
    write none) and, when resuming, its claim on the checkpoint; ``init_start`` and the records
    before the run are logged on entry. Whatever happens in the block the log is closed: with
    ``run_stop`` after ``run_start``, or set aside under ``failed/`` before it (`close_failed`)."""
    log = ComplianceLog.create(Path(job.config.output.dir), job.rt)
    files = RunFiles.of_log(log.path) if log.path else None
    claimed = None  # the checkpoint this attempt resumes, claimed by its log
    try:
        if job.resume is not None and files is not None:
            claimed = checkpoint.claim(job.resume, files.log)
        if job.rt.is_main:
            job.progress({"kind": "start", "result_file": str(log.path), "workload": job.workload.name,
                          "instance": job.rt.instance})
        log_init(job, log)
        yield log, files
    except BaseException as exc:
        close_failed(claimed, log, files, exc)
        raise
    finally:
        log.close()


def prepare(job: Job, log: ComplianceLog, stop: Stop, lbs: int, seeded: Seeded) -> Parts:
    """Hyperparameters, staging and building on either side of ``run_start``.

    ``data.staging.placement: init`` stages (and builds the datasets, model and loaders) before
    ``init_stop``/``run_start``, as MLPerf HPC v3.0 allows within its initialisation limit;
    ``run`` logs ``init_stop`` and ``run_start`` first, so staging and everything that reads the
    data count in the time to train (the rule before v3.0). Returns after ``run_start``.
    """
    log_hyperparameters(job, log)
    if job.emulation is not None:  # storage mode: what the steps emulate, before any data is read
        log.event(EMULATED_ACCELERATOR, job.emulation.record(lbs))
    in_run = job.config.data.staging.placement == "run"
    if in_run:
        start_run(job, log, stop)
    staged = stage(job, log)
    with sources_named(staged):  # an error naming the staged copy names the source file
        parts = build(job, staged, lbs, seeded=seeded)
    log_samples(log, parts.train_samples, parts.eval_samples, parts.padded_samples)
    if not in_run:
        start_run(job, log, stop)
    return parts


def start_run(job: Job, log: ComplianceLog, stop: Stop) -> None:
    """init_stop (with a warning when staging sat in an initialisation longer than the rules
    allow, `mlhpc.rules.init_limit_warning`), then run_start; from then on a signal stops the
    run with a checkpoint (`Stop.start_timed`)."""
    stop.check()  # a signal during initialisation: the attempt is set aside
    log.barrier()
    log.end(constants.INIT_STOP)
    began, ended = log.first(constants.INIT_START), log.first(constants.INIT_STOP)
    if began is not None and ended is not None and job.rt.is_main:
        warning = rules.init_limit_warning((ended.time_ms - began.time_ms) / 1e3,
                                             job.config.submission.division,
                                             job.config.data.staging.placement)
        if warning:
            job.progress({"kind": "warning", "message": warning})
    log.barrier()
    stop.start_timed()
    log.start(constants.RUN_START)


def local_batch_size(config: Config, rt: Runtime) -> int:
    """Per-rank micro-batch: global batch / (world size x gradient accumulation steps).

    Raises:
        ConfigError: the global batch does not divide evenly.
    """
    gbs, accum = config.train.global_batch_size, config.train.gradient_accumulation_steps
    if gbs % (rt.world_size * accum):
        raise ConfigError(f"{config.source}: train.global_batch_size: {gbs} is not divisible by "
                          f"world size {rt.world_size} x gradient_accumulation_steps {accum}")
    return gbs // (rt.world_size * accum)


# The timed run: run_start .. run_stop ----------------------------------------------------


class Clock:
    """Seconds of timed run: this attempt's since run_start plus ``before_s`` of earlier ones."""

    def __init__(self, before_s: float = 0.0) -> None:
        self.before_s, self.start = before_s, time.perf_counter()

    def elapsed_s(self) -> float:
        return self.before_s + time.perf_counter() - self.start


@dataclass(frozen=True)
class Run:
    """The timed run as one object: what every epoch of the loop reads. Its two halves keep the
    lifetimes they have: the `Job` (what is known before the log opens, frozen; the tools build
    their parts from one too) and the `Parts` (what was built from the data, after
    ``init_start``; their ``states`` are what a checkpoint carries), joined here with the
    attempt's log and files, the signal listener and the clock of the timed run."""

    job: Job
    log: ComplianceLog
    files: RunFiles | None
    parts: Parts
    stop: Stop
    clock: Clock

    @property
    def rt(self) -> Runtime:
        return self.job.rt

    @property
    def tcfg(self) -> TrainConfig:
        return self.job.config.train

    def tell(self, event: dict[str, Any]) -> None:
        """A progress event, from the rank that reports."""
        if self.job.rt.is_main:
            self.job.progress(event)


@dataclass(frozen=True)
class Stopped:
    """Why the ranks stopped training before the epoch's end: the reason logged in ``run_stop``
    and the signal that asked for it (None: a non-finite loss)."""

    reason: str
    signal: str | None = None


@dataclass(frozen=True)
class Epoch:
    """One epoch's training: why the run stops (None: it goes on), seconds, samples/s, mean
    training loss."""

    stopped: Stopped | None
    epoch_s: float
    samples_per_s: float
    train_loss: float


def train_loop(run: Run) -> Outcome:
    """(after run_start) .. run_stop: epochs and evaluations until the target, max_epochs, a
    non-finite loss or metric, or a signal (which saves a checkpoint). Returns the outcome
    logged in ``run_stop``.

    Sync points: every epoch's start and stop and every evaluation's stop are barriers over
    the instance's ranks (`ComplianceLog.barrier`: a once-only key appears once and times the
    slowest rank); inside an epoch the ranks all-reduce two flags every
    ``train.check_every_steps`` steps (`_agreed_stop`) and the loss sum once at its end; an
    evaluation all-reduces (sum, count) once (`mlhpc.run.evaluate`).
    """
    job, tcfg, metric = run.job, run.tcfg, run.job.workload.metric
    target = metric.target if tcfg.target is None else tcfg.target
    first, skip = (job.resume.state.epoch, job.resume.state.step) if job.resume else (1, 0)
    storage = job.emulation is not None  # storage mode: no model trained, nothing evaluated
    if job.workload.evaluate_at_start and job.resume is None and not storage:
        _evaluate_epoch(run, 0, target)  # the starting point, epoch_num 0; training follows, as the reference's
    outcome = Outcome(constants.ABORTED, f"max_epochs {tcfg.max_epochs} reached before the target",
                      max(first - 1, tcfg.max_epochs))
    if storage:
        outcome = Outcome(constants.ABORTED, f"storage mode: {tcfg.max_epochs} epochs on emulated "
                          f"{job.emulation.accelerator} accelerators, no quality claimed",
                          max(first - 1, tcfg.max_epochs), complete=True)
    for epoch in range(first, tcfg.max_epochs + 1):
        trained = _train_epoch(run, epoch, skip if epoch == first else 0)
        if trained.stopped is not None:
            outcome = Outcome(constants.ABORTED, trained.stopped.reason, epoch, trained.stopped.signal)
            break
        if storage:
            continue
        evaluated = _evaluate_epoch(run, epoch, target)
        _report(run, epoch, trained, evaluated)
        if not math.isfinite(evaluated.value):
            outcome = Outcome(constants.ABORTED, f"non-finite {metric.key} ({evaluated.value}) at epoch {epoch}",
                              epoch)
            break
        if evaluated.reached:
            outcome = Outcome(constants.SUCCESS, None, epoch)
            break
        if should_checkpoint(tcfg, epoch):
            _save_checkpoint(run, epoch + 1, 0)
    run.log.barrier()
    run.log.end(constants.RUN_STOP, metadata=outcome.run_stop_metadata())
    return outcome


# Cadences: when the loop does what it does every so often (torchtitan's ``should_validate``). An
# evaluation closes every epoch: a pass, or ``train.eval_every_steps`` optimizer steps.

def should_checkpoint(tcfg: TrainConfig, epoch: int) -> bool:
    """A checkpoint after ``epoch`` (``train.checkpoint_every_epochs``; 0: only on a signal)."""
    return bool(tcfg.checkpoint_every_epochs) and epoch % tcfg.checkpoint_every_epochs == 0


def should_log_step(tcfg: TrainConfig, steps_done: int) -> bool:
    """A ``step`` progress event after ``steps_done`` micro-steps (``train.log_every_steps``)."""
    return bool(tcfg.log_every_steps) and steps_done % tcfg.log_every_steps == 0


def should_check(tcfg: TrainConfig, steps_done: int) -> bool:
    """The ranks agree on stopping after ``steps_done`` micro-steps (``train.check_every_steps``;
    one all-reduce of two flags, `_agreed_stop`), at the end of an optimizer step."""
    return steps_done % tcfg.check_every_steps == 0


def _train_epoch(run: Run, epoch: int, skip: int) -> Epoch:
    """One epoch_start .. epoch_stop from micro-step ``skip``. Every ``train.check_every_steps``
    the ranks agree on stopping (a signal: checkpoint and stop; a non-finite loss: stop)."""
    parts, rt, tcfg = run.parts, run.rt, run.tcfg
    batches, micro_steps = _epoch_batches(parts, epoch, skip, run.job.config)
    run.log.barrier()
    run.log.start(constants.EPOCH_START, metadata={constants.EPOCH_NUM: _epoch_num(run, epoch)})
    t0 = time.perf_counter()
    emulated = run.job.emulation.compute(rt.device) if run.job.emulation else None  # storage mode
    parts.step.model.train()
    loss_sum = torch.zeros((), dtype=torch.float64, device=rt.device)
    samples, stopped = 0, None
    for step, (x, y) in enumerate(batches, start=skip):  # on the device, decoded
        last_micro = (step + 1) % tcfg.gradient_accumulation_steps == 0 or step + 1 == micro_steps
        n = parts.train_ds.batch_len(x)
        loss = emulated.step(n) if emulated else train_step(parts.step, x, y, last_micro)
        loss_sum += loss.double() * n
        samples += n
        if should_log_step(tcfg, step + 1):
            run.tell({"kind": "step", "epoch": epoch, "step": step + 1, "steps": micro_steps,
                      "loss": float(loss)})
        if last_micro and should_check(tcfg, step + 1):
            stopped = _agreed_stop(run, loss_sum, epoch, step + 1)
            if stopped is not None:
                break
    signalled, loss_total, samples_total = runtime.all_reduce(
        [float(run.stop.signal is not None), loss_sum.item(), samples], rt)
    run.log.barrier()
    epoch_s = time.perf_counter() - t0
    run.log.end(constants.EPOCH_STOP, metadata={constants.EPOCH_NUM: _epoch_num(run, epoch)})
    if emulated is not None:  # storage mode: every rank's emulated compute, for AU
        emulated.log_epoch(run.log, rt, _epoch_num(run, epoch))
    train_loss = loss_total / max(samples_total, 1)
    if stopped is None and not math.isfinite(train_loss):
        stopped = Stopped(f"non-finite training loss ({train_loss}) in epoch {epoch}")
    if stopped is None and signalled > 0:  # the signal arrived after the last check
        stopped = Stopped(f"{run.stop.signal or 'SIGTERM'} at the end of epoch {epoch}", run.stop.signal)
        _save_checkpoint(run, epoch, micro_steps)
    return Epoch(stopped, epoch_s, samples_total / epoch_s if epoch_s > 0 else 0.0, train_loss)


def _agreed_stop(run: Run, loss_sum: torch.Tensor, epoch: int, steps_done: int) -> Stopped | None:
    """Why every rank stops after ``steps_done`` steps (a checkpoint is saved on a signal), or
    None: the ranks agree on a signal or a non-finite loss seen by any of them."""
    signalled, non_finite = runtime.all_reduce(
        [float(run.stop.signal is not None), float(not math.isfinite(loss_sum.item()))],
        run.rt, op="max")
    if non_finite:
        return Stopped(f"non-finite training loss in epoch {epoch} by step {steps_done}")
    if signalled:
        _save_checkpoint(run, epoch, steps_done)
        return Stopped(f"{run.stop.signal or 'SIGTERM'} in epoch {epoch} after step {steps_done}",
                       run.stop.signal)
    return None


@dataclass(frozen=True)
class Evaluated:
    """One evaluation: the metric's value, its seconds, the target and whether the value reached
    it (decided once, so the progress line and ``run_stop`` agree)."""

    value: float
    eval_s: float
    target: float
    reached: bool


def _evaluate_epoch(run: Run, epoch: int, target: float) -> Evaluated:
    """eval_start .. eval_stop and the metric record (``epoch_num`` as `_epoch_num` counts)."""
    parts, log, rt, metric = run.parts, run.log, run.rt, run.job.workload.metric
    logged = {constants.EPOCH_NUM: _epoch_num(run, epoch)}
    log.start(constants.EVAL_START, metadata=logged)
    t0 = time.perf_counter()
    parts.step.model.eval()
    value = evaluate(parts.model, parts.eval_loader, metric, rt, autocast(parts.step.precision, rt.device))
    log.barrier()
    eval_s = time.perf_counter() - t0
    log.end(constants.EVAL_STOP, metadata=logged)
    log.event(metric.key, value, metadata=logged)
    parts.history.append((epoch, value))
    return Evaluated(value, eval_s, target, metric.reached(value, target))


def _epoch_num(run: Run, epoch: int) -> int:
    """``epoch_num`` as the ruleset counts it: the epoch (1-based) or, for a benchmark whose
    epochs count training samples (`mlhpc.rules.Ruleset.sample_counted_epochs`: OpenFold), the
    samples trained by the epoch's end, its optimizer steps x ``train.global_batch_size`` (a
    pass's short last batch counted whole)."""
    if run.job.workload.name not in rules.ruleset().sample_counted_epochs:
        return epoch
    tcfg = run.job.config.train
    steps = tcfg.eval_every_steps or steps_per_pass(run.parts.train_loader, run.job.config)
    return epoch * steps * tcfg.global_batch_size


def _report(run: Run, epoch: int, trained: Epoch, evaluated: Evaluated) -> None:
    """The ``epoch`` progress event (rank 0)."""
    run.tell({"kind": "epoch", "epoch": epoch, "max_epochs": run.tcfg.max_epochs,
              "metric_key": run.job.workload.metric.key, "metric": evaluated.value,
              "target": evaluated.target, "reached": evaluated.reached,
              "train_loss": trained.train_loss, "epoch_s": trained.epoch_s,
              "eval_s": evaluated.eval_s, "instance": run.rt.instance,
              "samples_per_s": trained.samples_per_s})


def _epoch_batches(parts: Parts, epoch: int, skip: int, config: Config) -> tuple[Iterable, int]:
    """This epoch's training batches after its first ``skip`` micro-steps (resume), and the
    epoch's micro-steps.

    An epoch is one pass over the data (``train.eval_every_steps`` unset) or, set, a block of
    that many optimizer steps read on from where the last block stopped, passes following each
    other with each pass's own shuffle (the reference's OpenFold: an evaluation every 40 steps,
    ``val_every_iters``). Either way every pass reads each datum once: "each training sample
    must be used once per epoch" (hpc_training_rules.adoc, where an epoch is a pass).
    """
    every = config.train.eval_every_steps
    if every is None:
        parts.train_sampler.set_epoch(epoch - 1)
        if skip == 0:
            return parts.train_loader, len(parts.train_loader)
        return parts.train_loader.resumed(skip), len(parts.train_loader)
    micro_steps = every * config.train.gradient_accumulation_steps
    start = (epoch - 1) * micro_steps + skip
    return itertools.islice(_passes(parts, start), micro_steps - skip), micro_steps


def _passes(parts: Parts, start: int) -> Iterator[Any]:
    """Endless training batches from micro-step ``start`` of the run: pass after pass, pass p
    shuffled as epoch p of the sampler."""
    per_pass = len(parts.train_loader)
    if per_pass == 0:
        return
    for number in itertools.count(start // per_pass):
        parts.train_sampler.set_epoch(number)
        offset = start % per_pass if number == start // per_pass else 0
        yield from (parts.train_loader.resumed(offset) if offset else parts.train_loader)


def _save_checkpoint(run: Run, next_epoch: int, steps_done: int) -> None:
    """Rank 0 saves the run's parts (`Parts.states`) and where a resumed run re-enters:
    ``next_epoch`` after ``steps_done`` steps."""
    if run.files is not None:
        state = run.parts.train_state
        state.epoch, state.step, state.result_file = next_epoch, steps_done, run.files.log.name
        state.elapsed_s = run.clock.elapsed_s()
        checkpoint.save(run.files.checkpoint, run.parts.states)

