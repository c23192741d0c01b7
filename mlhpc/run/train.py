"""The training loop: one model-agnostic harness for every `Workload`.

One straight line (docs/architecture.md, "How a run flows"), one function per stage:

    run: config -> runtime + process group -> _run_instance:
      _ensure_source (embedded data if missing; nothing when every node holds its staged copy
      and the source is gone) -> _preflight (config, model, checkpoint: nothing that reads the
      dataset) -> result_N.txt claimed
      -> log_init (init_start, submission_*, cache_clear, seed, resume)
      -> _prepare: log_hyperparameters, then by data.staging.placement
           init: stage (staging_start/stop) -> build (first read of the data: a sample checked
                 against the model) -> log_samples -> start_run (init_stop, run_start)
           run:  start_run -> stage -> build -> log_samples
      -> train_loop ([epoch_start .. epoch_stop, eval_start .. eval_stop, metric] until target,
         run_stop)
      -> finish: measured_N.json, then summary_N.json from the log (`mlhpc.run.result`),
         config_N.yaml, env_N.json
      -> agree: every rank leaves with the job's exit status, after rank 0 has written its files

The pieces live in their own files: `mlhpc.run.assemble` (the `Job`, staging, `build`),
`mlhpc.run.log` (the log's records around the timed run), `mlhpc.run.finish` (the side files),
`mlhpc.run.outcome` (signals, a failed attempt set aside, the ranks' agreement), `mlhpc.run.step` (the
one training step, shared with ``mlhpc profile`` and benchmarks/throughput.py), `mlhpc.run.evaluate`
(metric all-reduced over ranks), `mlhpc.run.checkpoint` (save, restore, resume), `mlhpc.run.result` (the
result, read back from the log).

Rank 0 writes every log line; the timing events are bracketed by barriers so that a once-only key
appears once and measures the slowest rank. Data parallelism is DistributedDataParallel; which
samples a rank reads is `mlhpc.data.sampler`'s choice: after a sharded stage (``data.staging.shard:
node``) its node's samples, shuffled within the node; otherwise a seeded per-epoch shuffle shared
by all ranks (so R ranks x local batch b see the same global batches as 1 rank x R*b). The
metric is reduced as (sum, count) across ranks.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from pathlib import Path
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, Sampler

from mlhpc import outdir, power, runtime
from mlhpc.run import checkpoint
from mlhpc.run.assemble import Job, Parts, ProgressFn, build, stage
from mlhpc.config import Config
from mlhpc.data import embedded, loader
from mlhpc.data import stage as staging
from mlhpc.data.stage.copies import release
from mlhpc.data.sampler import ShardSampler
from mlhpc.errors import ConfigError
from mlhpc.run.evaluate import all_reduce, evaluate
from mlhpc.run.finish import finish
from mlhpc.mllog import ComplianceLog, constants
from mlhpc.run.outcome import Outcome, RunInterrupted, Stop, agree, close_failed
from mlhpc.run.result import RunResult
from mlhpc.run.log import log_hyperparameters, log_init, log_samples, start_run
from mlhpc.runtime import Runtime
from mlhpc.run.step import autocast, compile_mode, train_step
from mlhpc.workload import get as get_workload

__all__ = ["RunInterrupted", "RunResult", "ShardSampler", "compile_mode", "local_batch_size",
           "run", "stage_only"]


# ---- entry points ---------------------------------------------------------------------------------

def run(config: Config | None, *, on_progress: ProgressFn | None = None,
        resume_dir: Path | None = None) -> RunResult:
    """Train ``config``'s workload to its quality target; write the run's files on rank 0.

    With ``resume_dir`` (a run folder or a ``checkpoint_N.pt``), continue the run stopped there
    (``config`` is then taken from its checkpoint and may be None; `mlhpc.run.checkpoint` says what
    a resumed run is worth). Returns this rank's instance's `RunResult`.

    Everything that can be checked without reading the dataset is checked before
    ``result_N.txt`` is opened (`_preflight`); the data are read first after ``init_start``
    (`build`, `check_sample`). An attempt that fails (or is signalled) before ``run_start`` has
    its log moved to
    ``<output.dir>/failed/`` and named in the error, so it never counts as a run of the folder;
    one that fails after ``run_start`` logs ``run_stop`` (aborted, with the reason) first.

    Raises:
        ConfigError, DataError, StagingError, OutputError: bad input or environment.
        RunInterrupted: a signal before ``run_start`` (exit status 128 + its number).
    """
    resume = None
    if resume_dir is not None:
        config, resume = checkpoint.load_resume(Path(resume_dir))
    assert config is not None
    outdir.check_output_dir(config.output.dir)  # before anything is written (OutputError)
    workload = get_workload(config.workload)
    world = runtime.detect(device=config.train.device)
    if world.is_main and on_progress is not None:  # first thing: where data and results go
        on_progress(_where(config))
    if config.train.threads:
        torch.set_num_threads(config.train.threads)
    job = Job(config, workload, world, world, None, resume, on_progress or (lambda event: None))
    with runtime.process_group(world):
        try:
            return agree(_run_instance(job), world)  # rank 0 has written every file; no rank exits before
        finally:  # every rank of the node is done reading: the copy this run made goes (staging.keep)
            said = release(job.staged, config.data.staging.keep, world.local_rank, world.node_rank)
            if said and world.is_main:
                job.progress({"kind": "note", "message": said})


def _where(config: Config) -> dict[str, Any]:
    """The ``where`` event: ``data`` and ``output`` as absolute paths, each with the value the
    config gave (``*_given``), and ``cwd``, the folder a relative one was resolved against."""
    data, output = Path(config.data.path), Path(config.output.dir)
    return {"kind": "where", "data": str(data.absolute()), "data_given": str(data),
            "output": str(output.absolute()), "output_given": str(output),
            "cwd": str(Path.cwd())}


def stage_only(config: Config) -> tuple[staging.StagingResult | None, bool]:
    """`mlhpc stage`: the staging a run of ``config`` would do, on every rank of this job, with
    the process group set up and torn down here. Returns ``(result or None when staging is
    disabled, whether this rank is the one that reports)``.

    Raises:
        StagingError: as `mlhpc.data.stage.stage_dataset`.
    """
    rt = runtime.detect(device="cpu")
    with runtime.process_group(rt):
        return staging.stage_dataset(config, rt), rt.is_main


# ---- one instance's run ---------------------------------------------------------------------------


def _run_instance(job: Job) -> RunResult:
    config, world = job.config, job.world
    job.rt = rt = runtime.split_instances(world, config.train.instances)
    with Stop(job) as job.stop:  # SIGTERM: an error before run_start, a checkpoint after it
        lbs = local_batch_size(config, rt)
        # Synthesising the embedded dataset when it is missing creates the data a run then reads
        # (as a download would); it is not the benchmark touching the dataset, so it stays before
        # the log, untimed. Nothing here reads a sample: `_ensure_source` looks at the completion
        # marker and file sizes only.
        synthesis_s = _ensure_source(job)
        _preflight(job)
        job.log = ComplianceLog.create(Path(config.output.dir), rt.is_main, rt.instance)
        try:
            if job.resume is not None and job.files is not None:
                checkpoint.claim(job.resume, job.files.log)
            if rt.is_main:
                job.progress({"kind": "start", "result_file": str(job.log.path),
                              "workload": job.workload.name, "instance": rt.instance})
            log_init(job)
            parts = _prepare(job, lbs)
            with power.sampling(config.power, rt, job.log.path, Path(config.output.dir),  # run_start..run_stop
                                notify=lambda m: job.progress({"kind": "warning", "message": m})):
                outcome = train_loop(job, parts)
        except BaseException as exc:
            close_failed(job, exc)
            raise
        finally:
            job.log.close()
        # still under `Stop`: a SIGTERM now (a launcher stopping the job) waits for the files
        return finish(job, parts, outcome, synthesis_s)


def _preflight(job: Job) -> None:
    """What can be checked before the log is opened without touching the dataset: the model the
    config builds can be constructed, and a checkpoint being resumed fits that model and its
    optimizer (names, shapes). The config (ranges, seeds) and the output folder were checked
    before (`mlhpc.config`, `mlhpc.outdir`). Whether the data fit the model is checked after
    ``init_start`` (`check_sample`): MLPerf's training rules (training_rules.adoc, "Run Results")
    say "The clock must start before any part of the system touches the dataset", and the log is
    where that start is shown.

    Raises:
        ConfigError: the checkpoint does not fit (`mlhpc.run.checkpoint.restore`).
    """
    config, workload = job.config, job.workload
    model = workload.build_model(config.model)
    if job.resume is not None:
        # steps per epoch shape only the schedule's function, never the state restored here;
        # `build` restores again with the real count
        optimizer, scheduler = workload.build_optimizer(model, config, 1)
        checkpoint.restore(job.resume.state, model, optimizer, scheduler,
                           source=f"--resume {job.resume.source}")


def _ensure_source(job: Job) -> float:
    """`mlhpc.data.embedded.ensure_data` on ``data.path``, unless the source is gone and every node
    already holds its complete staged copy (`mlhpc.data.stage.staged_copy_present`): a run after a
    separate ``mlhpc stage`` step then needs no source (and synthesises none). Every rank of the
    job takes the same branch. Returns the seconds spent synthesising."""
    config, world = job.config, job.world
    present = (not Path(config.data.path).exists()
               and staging.staged_copy_present(config, world))
    if all_reduce([float(not present)], world, op="max")[0] == 0.0:
        return 0.0
    state = embedded.describe(Path(config.data.path))
    if world.is_main and config.data.synthesize_if_missing and state != "complete" and \
            state != "unmarked":  # what ensure_data is about to make, and how big
        synth = config.synth
        job.progress({"kind": "synthesis", "path": str(config.data.path), "state": state,
                      "workload": job.workload.name,
                      "samples": {k: v for k, v in (synth.model_dump() if synth is not None else {}).items()
                                  if k.endswith("_samples")}})
    seconds = embedded.ensure_data(config, job.workload, world, job.progress)
    if world.is_main and seconds > 0:
        job.progress({"kind": "synthesised", "path": str(config.data.path), "seconds": seconds})
    return seconds


def _prepare(job: Job, lbs: int) -> Parts:
    """Hyperparameters, staging and building on either side of ``run_start``.

    ``data.staging.placement: init`` stages (and builds the datasets, model and loaders) before
    ``init_stop``/``run_start``, as MLPerf HPC v3.0 allows within its initialisation limit;
    ``run`` logs ``init_stop`` and ``run_start`` first, so staging and everything that reads the
    data count in the time to train (the rule before v3.0). Returns after ``run_start``.
    """
    log_hyperparameters(job)
    in_run = job.config.data.staging.placement == "run"
    if in_run:
        start_run(job)
    parts = build(job, stage(job), lbs)
    log_samples(job, parts)
    if not in_run:
        start_run(job)
    return parts


# ---- the timed run -------------------------------------------------------------------------------

def train_loop(job: Job, parts: Parts) -> Outcome:
    """(after run_start) .. run_stop: epochs and evaluations until the target, max_epochs, a non-finite
    loss or metric, or SIGTERM (which saves a checkpoint)."""
    tcfg, metric, log = job.config.train, job.workload.metric, job.log
    target = metric.target if tcfg.target is None else tcfg.target
    first_epoch, skip = (job.resume.state.epoch, job.resume.state.step) if job.resume else (1, 0)
    outcome = Outcome(constants.ABORTED, f"max_epochs {tcfg.max_epochs} reached before the target",
                      first_epoch - 1)
    clock = _Clock(job.resume.earlier_attempts_s if job.resume else 0.0)
    with contextlib.nullcontext(job.stop) as stop:
        for epoch in range(first_epoch, tcfg.max_epochs + 1):
            outcome.epoch = epoch
            stopped, epoch_s, samples_per_s, train_loss = _train_epoch(
                job, parts, epoch, skip if epoch == first_epoch else 0, stop, clock)
            if stopped is not None:
                outcome.reason = stopped
                if stop.signal and stopped.startswith(stop.signal):
                    outcome.signal = stop.signal
                break
            value, eval_s = _evaluate_epoch(job, parts, epoch)
            if job.rt.is_main:
                job.progress({"kind": "epoch", "epoch": epoch, "max_epochs": tcfg.max_epochs,
                              "metric_key": metric.key, "metric": value, "target": target,
                              "reached": metric.reached(value, target), "train_loss": train_loss,
                              "epoch_s": epoch_s, "eval_s": eval_s, "instance": job.rt.instance,
                              "samples_per_s": samples_per_s})
            if not math.isfinite(value):
                outcome.reason = f"non-finite {metric.key} ({value}) at epoch {epoch}"
                break
            if metric.reached(value, target):
                outcome.status, outcome.reason = constants.SUCCESS, None
                break
            if tcfg.checkpoint_every_epochs and epoch % tcfg.checkpoint_every_epochs == 0:
                _save_checkpoint(job, parts, clock, epoch + 1, 0)
    runtime.barrier(job.rt)
    meta: dict[str, Any] = {"status": outcome.status, constants.EPOCH_NUM: outcome.epoch}
    if outcome.reason:
        meta["reason"] = outcome.reason
    if outcome.signal:  # stopped with a checkpoint: `mlhpc run --resume` may continue it
        meta["signal"] = outcome.signal
    log.end(constants.RUN_STOP, metadata=meta)
    return outcome


def _train_epoch(job: Job, parts: Parts, epoch: int, skip: int, stop: "Stop",
                 clock: "_Clock") -> tuple[str | None, float, float, float]:
    """One epoch_start .. epoch_stop from micro-step ``skip``. Returns (why the run stops or
    None, epoch seconds, samples/s, mean training loss). Every ``train.check_every_steps`` the
    ranks agree on stopping (SIGTERM: checkpoint and stop; non-finite loss: stop)."""
    rt, tcfg, log = job.rt, job.config.train, job.log
    batches = _epoch_batches(parts, epoch, skip, job.config)
    micro_steps = len(parts.train_loader)
    decode = parts.train_ds.device_transform
    runtime.barrier(rt)
    log.start(constants.EPOCH_START, metadata={constants.EPOCH_NUM: epoch})
    t0 = time.perf_counter()
    parts.step.model.train()
    loss_sum = torch.zeros((), dtype=torch.float64, device=rt.device)
    samples, stopped = 0, None
    for step, batch in enumerate(batches, start=skip):
        x, y = loader.to_device(batch, rt.device, decode)
        last_micro = (step + 1) % tcfg.gradient_accumulation_steps == 0 or step + 1 == micro_steps
        loss = train_step(parts.step, x, y, last_micro)
        n = parts.train_ds.batch_len(x)
        loss_sum += loss.double() * n
        samples += n
        if tcfg.log_every_steps and (step + 1) % tcfg.log_every_steps == 0 and rt.is_main:
            job.progress({"kind": "step", "epoch": epoch, "step": step + 1, "steps": micro_steps,
                          "loss": float(loss)})
        if (step + 1) % tcfg.check_every_steps == 0 and last_micro:
            flags = all_reduce([float(stop.signal is not None),
                                float(not math.isfinite(loss_sum.item()))], rt, op="max")
            if flags[1]:
                stopped = f"non-finite training loss in epoch {epoch} by step {step + 1}"
                break
            if flags[0]:
                stopped = f"{stop.signal or 'SIGTERM'} in epoch {epoch} after step {step + 1}"
                _save_checkpoint(job, parts, clock, epoch, step + 1)
                break
    signalled, loss_total, samples_total = all_reduce(
        [float(stop.signal is not None), loss_sum.item(), samples], rt)
    runtime.barrier(rt)
    epoch_s = time.perf_counter() - t0
    log.end(constants.EPOCH_STOP, metadata={constants.EPOCH_NUM: epoch})
    train_loss = loss_total / max(samples_total, 1)
    if stopped is None and not math.isfinite(train_loss):
        stopped = f"non-finite training loss ({train_loss}) in epoch {epoch}"
    if stopped is None and signalled > 0:  # the signal arrived after the last check
        stopped = f"{stop.signal or 'SIGTERM'} at the end of epoch {epoch}"
        _save_checkpoint(job, parts, clock, epoch, micro_steps)
    return stopped, epoch_s, samples_total / epoch_s if epoch_s > 0 else 0.0, train_loss


def _evaluate_epoch(job: Job, parts: Parts, epoch: int) -> tuple[float, float]:
    """eval_start .. eval_stop and the metric record; returns (value, seconds)."""
    log, metric = job.log, job.workload.metric
    log.start(constants.EVAL_START, metadata={constants.EPOCH_NUM: epoch})
    t0 = time.perf_counter()
    parts.step.model.eval()
    value = evaluate(parts.model, parts.eval_loader, parts.eval_ds.device_transform,
                     metric, job.rt, autocast(parts.step.precision, job.rt.device))
    runtime.barrier(job.rt)
    eval_s = time.perf_counter() - t0
    log.end(constants.EVAL_STOP, metadata={constants.EPOCH_NUM: epoch})
    log.event(metric.key, value, metadata={constants.EPOCH_NUM: epoch})
    parts.history.append((epoch, value))
    return value, eval_s


def _epoch_batches(parts: Parts, epoch: int, skip: int, config: Config) -> DataLoader:
    """This epoch's training batches, after the first ``skip`` micro-steps (resume)."""
    parts.train_sampler.set_epoch(epoch - 1)
    if skip == 0:
        return parts.train_loader
    return loader.make_loader(parts.train_ds, parts.local_batch_size,
                              sampler=_SkipSampler(parts.train_sampler, skip * parts.local_batch_size),
                              num_workers=config.data.num_workers, device=parts.step.device)


def _save_checkpoint(job: Job, parts: Parts, clock: "_Clock", next_epoch: int, steps_done: int) -> None:
    """Rank 0 saves where a resumed run re-enters: ``next_epoch`` after ``steps_done`` steps."""
    files = job.files
    if files is not None:
        state = checkpoint.capture(job.config, parts, next_epoch, steps_done, parts.history,
                                   files.log.name, clock.elapsed_s())
        checkpoint.save(files.checkpoint, state)


# ---- after run_stop -------------------------------------------------------------------------------


# ---- small helpers --------------------------------------------------------------------------------

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


class _Clock:
    """Seconds of timed run: this attempt's since run_start plus ``before_s`` of earlier ones."""

    def __init__(self, before_s: float = 0.0) -> None:
        self.before_s, self.start = before_s, time.perf_counter()

    def elapsed_s(self) -> float:
        return self.before_s + time.perf_counter() - self.start


class _SkipSampler(Sampler[int]):
    """The indices of ``base`` for this epoch after the first ``skip`` (resume inside an epoch)."""

    def __init__(self, base: Sampler[int], skip: int):
        self.base, self.skip = base, skip

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.base), self.skip, None)

    def __len__(self) -> int:
        return max(0, len(self.base) - self.skip)  # type: ignore[arg-type]
