"""The timed run: epochs and evaluations from ``run_start`` to ``run_stop``, top to bottom.

`train_loop` is the loop, one screen: each epoch trains (`_train_epoch`), evaluates
(`_evaluate_epoch`), reports, and stops at the quality target, a non-finite loss or metric,
``train.max_epochs``, or a signal (a checkpoint is saved first: `mlhpc.run.checkpoint`). Rank 0
writes every log line; the timing events are bracketed by barriers so that a once-only key
appears once and measures the slowest rank. The ranks agree on stopping every
``train.check_every_steps`` steps; the metric is reduced as (sum, count) across ranks
(`mlhpc.run.evaluate`).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from mlhpc import rules, runtime
from mlhpc.config import Config
from mlhpc.run import checkpoint
from mlhpc.run.assemble import Parts
from mlhpc.run.evaluate import evaluate
from mlhpc.run.job import Job
from mlhpc.run.mllog import ComplianceLog, constants
from mlhpc.run.outcome import Outcome, Stop
from mlhpc.run.result import RunFiles
from mlhpc.run.step import autocast, train_step


class Clock:
    """Seconds of timed run: this attempt's since run_start plus ``before_s`` of earlier ones."""

    def __init__(self, before_s: float = 0.0) -> None:
        self.before_s, self.start = before_s, time.perf_counter()

    def elapsed_s(self) -> float:
        return self.before_s + time.perf_counter() - self.start


@dataclass(frozen=True)
class Loop:
    """What every epoch of the loop reads: the job, its log and files, the parts, the signal
    listener and the clock of the timed run."""

    job: Job
    log: ComplianceLog
    files: RunFiles | None
    parts: Parts
    stop: Stop
    clock: Clock


@dataclass(frozen=True)
class Epoch:
    """One epoch's training: why the run stops (None: it goes on), seconds, samples/s, mean
    training loss."""

    stopped: str | None
    epoch_s: float
    samples_per_s: float
    train_loss: float


def train_loop(job: Job, log: ComplianceLog, parts: Parts, stop: Stop,
               files: RunFiles | None) -> Outcome:
    """(after run_start) .. run_stop: epochs and evaluations until the target, max_epochs, a
    non-finite loss or metric, or a signal (which saves a checkpoint). Returns the outcome
    logged in ``run_stop``."""
    tcfg, metric = job.config.train, job.workload.metric
    target = metric.target if tcfg.target is None else tcfg.target
    first, skip = (job.resume.state.epoch, job.resume.state.step) if job.resume else (1, 0)
    loop = Loop(job, log, files, parts, stop, Clock(job.resume.earlier_attempts_s if job.resume else 0.0))
    outcome = Outcome(constants.ABORTED, f"max_epochs {tcfg.max_epochs} reached before the target",
                      first - 1)
    for epoch in range(first, tcfg.max_epochs + 1):
        outcome.epoch = epoch
        trained = _train_epoch(loop, epoch, skip if epoch == first else 0)
        if trained.stopped is not None:
            outcome.reason = trained.stopped
            outcome.signal = stop.signal if stop.signal and trained.stopped.startswith(stop.signal) else None
            break
        value, eval_s = _evaluate_epoch(loop, epoch)
        _report(loop, epoch, trained, value, eval_s, target)
        if not math.isfinite(value):
            outcome.reason = f"non-finite {metric.key} ({value}) at epoch {epoch}"
            break
        if metric.reached(value, target):
            outcome.status, outcome.reason = constants.SUCCESS, None
            break
        if tcfg.checkpoint_every_epochs and epoch % tcfg.checkpoint_every_epochs == 0:
            _save_checkpoint(loop, epoch + 1, 0)
    log.barrier()
    log.end(constants.RUN_STOP, metadata=outcome.run_stop_metadata())
    return outcome


def _train_epoch(loop: Loop, epoch: int, skip: int) -> Epoch:
    """One epoch_start .. epoch_stop from micro-step ``skip``. Every ``train.check_every_steps``
    the ranks agree on stopping (a signal: checkpoint and stop; a non-finite loss: stop)."""
    job, parts, rt, tcfg = loop.job, loop.parts, loop.job.rt, loop.job.config.train
    batches, micro_steps = _epoch_batches(parts, epoch, skip, job.config)
    loop.log.barrier()
    loop.log.start(constants.EPOCH_START, metadata={constants.EPOCH_NUM: _epoch_num(loop, epoch)})
    t0 = time.perf_counter()
    parts.step.model.train()
    loss_sum = torch.zeros((), dtype=torch.float64, device=rt.device)
    samples, stopped = 0, None
    for step, (x, y) in enumerate(batches, start=skip):  # on the device, decoded
        last_micro = (step + 1) % tcfg.gradient_accumulation_steps == 0 or step + 1 == micro_steps
        loss = train_step(parts.step, x, y, last_micro)
        n = parts.train_ds.batch_len(x)
        loss_sum += loss.double() * n
        samples += n
        if tcfg.log_every_steps and (step + 1) % tcfg.log_every_steps == 0 and rt.is_main:
            job.progress({"kind": "step", "epoch": epoch, "step": step + 1, "steps": micro_steps,
                          "loss": float(loss)})
        if (step + 1) % tcfg.check_every_steps == 0 and last_micro:
            stopped = _agreed_stop(loop, loss_sum, epoch, step + 1)
            if stopped is not None:
                break
    signalled, loss_total, samples_total = runtime.all_reduce(
        [float(loop.stop.signal is not None), loss_sum.item(), samples], rt)
    loop.log.barrier()
    epoch_s = time.perf_counter() - t0
    loop.log.end(constants.EPOCH_STOP, metadata={constants.EPOCH_NUM: _epoch_num(loop, epoch)})
    train_loss = loss_total / max(samples_total, 1)
    if stopped is None and not math.isfinite(train_loss):
        stopped = f"non-finite training loss ({train_loss}) in epoch {epoch}"
    if stopped is None and signalled > 0:  # the signal arrived after the last check
        stopped = f"{loop.stop.signal or 'SIGTERM'} at the end of epoch {epoch}"
        _save_checkpoint(loop, epoch, micro_steps)
    return Epoch(stopped, epoch_s, samples_total / epoch_s if epoch_s > 0 else 0.0, train_loss)


def _agreed_stop(loop: Loop, loss_sum: torch.Tensor, epoch: int, steps_done: int) -> str | None:
    """Why every rank stops after ``steps_done`` steps (a checkpoint is saved on a signal), or
    None: the ranks agree on a signal or a non-finite loss seen by any of them."""
    signalled, non_finite = runtime.all_reduce(
        [float(loop.stop.signal is not None), float(not math.isfinite(loss_sum.item()))],
        loop.job.rt, op="max")
    if non_finite:
        return f"non-finite training loss in epoch {epoch} by step {steps_done}"
    if signalled:
        _save_checkpoint(loop, epoch, steps_done)
        return f"{loop.stop.signal or 'SIGTERM'} in epoch {epoch} after step {steps_done}"
    return None


def _evaluate_epoch(loop: Loop, epoch: int) -> tuple[float, float]:
    """eval_start .. eval_stop and the metric record; returns (value, seconds)."""
    job, parts, log, metric = loop.job, loop.parts, loop.log, loop.job.workload.metric
    logged = {constants.EPOCH_NUM: _epoch_num(loop, epoch)}
    log.start(constants.EVAL_START, metadata=logged)
    t0 = time.perf_counter()
    parts.step.model.eval()
    value = evaluate(parts.model, parts.eval_loader, metric, job.rt, autocast(parts.step.precision, job.rt.device))
    log.barrier()
    eval_s = time.perf_counter() - t0
    log.end(constants.EVAL_STOP, metadata=logged)
    log.event(metric.key, value, metadata=logged)
    parts.history.append((epoch, value))
    return value, eval_s


def _epoch_num(loop: Loop, epoch: int) -> int:
    """``epoch_num`` as the ruleset counts it: the epoch (1-based) or, for a benchmark whose
    epochs count training samples (`mlhpc.rules.Ruleset.sample_counted_epochs`: OpenFold), the
    samples trained by the epoch's end, its optimizer steps x ``train.global_batch_size`` (a
    pass's short last batch counted whole)."""
    if loop.job.workload.name not in rules.ruleset().sample_counted_epochs:
        return epoch
    tcfg = loop.job.config.train
    steps = tcfg.eval_every_steps or math.ceil(len(loop.parts.train_loader) / tcfg.gradient_accumulation_steps)
    return epoch * steps * tcfg.global_batch_size


def _report(loop: Loop, epoch: int, trained: Epoch, value: float, eval_s: float,
            target: float) -> None:
    """The ``epoch`` progress event (rank 0)."""
    job, metric = loop.job, loop.job.workload.metric
    if job.rt.is_main:
        job.progress({"kind": "epoch", "epoch": epoch, "max_epochs": job.config.train.max_epochs,
                      "metric_key": metric.key, "metric": value, "target": target,
                      "reached": metric.reached(value, target), "train_loss": trained.train_loss,
                      "epoch_s": trained.epoch_s, "eval_s": eval_s, "instance": job.rt.instance,
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


def _save_checkpoint(loop: Loop, next_epoch: int, steps_done: int) -> None:
    """Rank 0 saves where a resumed run re-enters: ``next_epoch`` after ``steps_done`` steps."""
    if loop.files is not None:
        state = checkpoint.capture(loop.job.config, loop.parts, next_epoch, steps_done,
                                   loop.files.log.name, loop.clock.elapsed_s())
        checkpoint.save(loop.files.checkpoint, state)

