"""The training loop: one model-agnostic harness for every `Workload`.

One straight line (docs/architecture.md, "How a run flows"), one function per stage:

    run: config -> runtime + process group -> _run_instance:
      _ensure_source (embedded data if missing; nothing when every node holds its staged copy
      and the source is gone) -> _preflight (config, model, checkpoint: nothing that reads the
      dataset) -> result_N.txt claimed
      -> _log_init (init_start, submission_*, cache_clear, seed, resume)
      -> _prepare: _log_hyperparameters, then by data.staging.placement
           init: _stage (staging_start/stop) -> _build (first read of the data: a sample checked
                 against the model) -> _log_samples -> _start_run (init_stop, run_start)
           run:  _start_run -> _stage -> _build -> _log_samples
      -> train_loop ([epoch_start .. epoch_stop, eval_start .. eval_stop, metric] until target,
         run_stop)
      -> _finish: measured_N.json, then summary_N.json from the log (`mlhpc.results`),
         config_N.yaml, env_N.json

The pieces live in their own files: `mlhpc.step` (the one training step, shared with
``mlhpc profile`` and benchmarks/throughput.py), `mlhpc.evaluate` (metric all-reduced over ranks),
`mlhpc.checkpoint` (save, restore, resume), `mlhpc.results` (the result, read back from the log).

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
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from mlhpc import checkpoint, mllog, outdir, perf, power, results, rules, runtime
from mlhpc.data import embedded, loader
from mlhpc.data import stage as staging
from mlhpc import env as envinfo
from mlhpc.data import sampler as sampling
from mlhpc.checkpoint import Resume
from mlhpc.config import Config
from mlhpc.errors import ConfigError, DataError, MlhpcError
from mlhpc.evaluate import all_reduce, evaluate
from mlhpc.mllog import ComplianceLog, constants
from mlhpc.results import RunFiles, RunResult
from mlhpc.runtime import Runtime
from mlhpc.data.sampler import ShardSampler
from mlhpc.step import Step, autocast, compile_mode, precision, train_step, wrap_model
from mlhpc.workload import Workload
from mlhpc.workload import get as get_workload

ProgressFn = Callable[[dict[str, Any]], None]

__all__ = ["RunResult", "ShardSampler", "compile_mode", "local_batch_size", "run",
           "stage_only"]


# ---- entry points ---------------------------------------------------------------------------------

def run(config: Config | None, *, on_progress: ProgressFn | None = None,
        resume_dir: Path | None = None) -> RunResult:
    """Train ``config``'s workload to its quality target; write the run's files on rank 0.

    With ``resume_dir`` (a run folder or a ``checkpoint_N.pt``), continue the run stopped there
    (``config`` is then taken from its checkpoint and may be None; `mlhpc.checkpoint` says what
    a resumed run is worth). Returns this rank's instance's `RunResult`.

    Everything that can be checked without reading the dataset is checked before
    ``result_N.txt`` is opened (`_preflight`); the data are read first after ``init_start``
    (`_build`, `_check_sample`). An attempt that fails (or is signalled) before ``run_start`` has
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
    if config.train.threads:
        torch.set_num_threads(config.train.threads)
    with runtime.process_group(world):
        return _run_instance(Job(config, workload, world, world, None, resume,
                                 on_progress or (lambda event: None)))


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

@dataclass
class Job:
    """What every stage of one instance's run reads: the config, the workload, the whole job
    (``world``) and this instance's share of it (``rt``), the log, the checkpoint to resume
    from and the progress callback."""

    config: Config
    workload: Workload
    world: Runtime
    rt: Runtime
    log: ComplianceLog | None
    resume: Resume | None
    progress: ProgressFn
    stop: "_Stop | None" = None

    @property
    def seed(self) -> int:
        return self.config.train.seed + (self.rt.instance or 0)

    @property
    def files(self) -> RunFiles | None:
        return RunFiles.of_log(self.log.path) if self.log and self.log.path else None


@dataclass
class Parts:
    """What `_build` makes for the loop."""

    model: torch.nn.Module  # the weights (evaluation, checkpoints)
    step: Step  # the training step (compiled / DDP model, loss, optimizer, scheduler)
    train_ds: Dataset
    eval_ds: Dataset
    train_sampler: Any
    train_loader: DataLoader
    eval_loader: DataLoader
    local_batch_size: int
    staged: staging.StagingResult | None
    flops: perf.FlopCount
    history: list[tuple[int, float]] = field(default_factory=list)
    train_samples: int = 0  # the job's training-set size (every node's share summed), as logged
    eval_samples: int = 0  # the job's validation-set size, as logged
    padded_samples: int = 0  # repeats per epoch that keep every rank's step count equal

    @property
    def optimizer(self) -> Any:
        return self.step.optimizer

    @property
    def scheduler(self) -> Any:
        return self.step.scheduler


@dataclass
class Outcome:
    """How the timed run ended (the values logged in ``run_stop``)."""

    status: str
    reason: str | None
    epoch: int
    signal: str | None = None


def _run_instance(job: Job) -> RunResult:
    config, world = job.config, job.world
    job.rt = rt = runtime.split_instances(world, config.train.instances)
    with _Stop(job) as job.stop:  # SIGTERM: an error before run_start, a checkpoint after it
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
            _log_init(job)
            parts = _prepare(job, lbs)
            with power.sampling(config.power, rt, job.log.path, Path(config.output.dir),  # run_start..run_stop
                                notify=lambda m: job.progress({"kind": "warning", "message": m})):
                outcome = train_loop(job, parts)
        except BaseException as exc:
            _close_failed(job, exc)
            raise
        finally:
            job.log.close()
    return _finish(job, parts, outcome, synthesis_s)


class RunInterrupted(MlhpcError):
    """A signal (SIGTERM, SIGINT) stopped the run before ``run_start``; the CLI exits with
    ``exit_status`` = 128 + the signal's number."""

    def __init__(self, message: str, signum: int = signal.SIGTERM) -> None:
        super().__init__(message)
        self.signum = int(signum)
        self.exit_status = 128 + self.signum


def _close_failed(job: Job, exc: BaseException) -> None:
    """An attempt failed with ``exc`` after its log was opened. Before ``run_start``: its log
    moves to ``<out>/failed/result_N.log`` (a resume claim is released) and a user error names
    it; after: ``run_stop`` (aborted, the reason) ends the log. Errors of the library's own
    (`MlhpcError`) get the new path in their one-line message; anything else keeps its type."""
    log, files = job.log, job.files
    if log.first(constants.RUN_START) is not None:
        if log.first(constants.RUN_STOP) is None:
            reason = " ".join(str(exc).split())[:300] or type(exc).__name__
            log.end(constants.RUN_STOP, metadata={"status": constants.ABORTED,
                                                  "reason": f"{type(exc).__name__}: {reason}"})
        return
    if job.resume is not None and files is not None and job.resume.claim.is_file() and \
            checkpoint._read_claim(job.resume.claim).get("resumed_by") == files.log.name:
        checkpoint.release(job.resume)
    if files is None:
        return
    log.close()
    moved = _set_aside(files)
    if moved is not None and isinstance(exc, MlhpcError) and exc.args:
        exc.args = (f"{exc.args[0]} (this attempt's log moved to {moved})", *exc.args[1:])


def _set_aside(files: RunFiles) -> Path | None:
    """Move ``files.log`` to the first free ``failed/result_N[.K].log`` beside it (exclusive;
    an empty log, claimed but never written, is removed). Returns the new path or None."""
    src = files.log
    if not src.exists() or src.stat().st_size == 0:
        src.unlink(missing_ok=True)
        return None
    folder = files.out_dir / "failed"
    folder.mkdir(exist_ok=True)
    for k in itertools.count():
        dest = folder / (f"result_{files.index}.log" if k == 0 else f"result_{files.index}.{k}.log")
        try:
            os.link(src, dest)
        except FileExistsError:
            continue
        src.unlink()
        return dest
    return None


def _preflight(job: Job) -> None:
    """What can be checked before the log is opened without touching the dataset: the model the
    config builds can be constructed, and a checkpoint being resumed fits that model and its
    optimizer (names, shapes). The config (ranges, seeds) and the output folder were checked
    before (`mlhpc.config`, `mlhpc.outdir`). Whether the data fit the model is checked after
    ``init_start`` (`_check_sample`): MLPerf's training rules (training_rules.adoc, "Run Results")
    say "The clock must start before any part of the system touches the dataset", and the log is
    where that start is shown.

    Raises:
        ConfigError: the checkpoint does not fit (`mlhpc.checkpoint.restore`).
    """
    config, workload = job.config, job.workload
    model = workload.build_model(config.model)
    if job.resume is not None:
        # steps per epoch shape only the schedule's function, never the state restored here;
        # `_build` restores again with the real count
        optimizer, scheduler = workload.build_optimizer(model, config, 1)
        checkpoint.restore(job.resume.state, model, optimizer, scheduler,
                           source=f"--resume {job.resume.source}")


def _check_sample(job: Job, model: torch.nn.Module, train_ds: Dataset, loss_fn: Any,
                  data_dir: Path) -> perf.FlopCount:
    """The first training sample fits the model (shape, dtype: one forward and backward on the
    meta device); returns the FLOPs per sample of a training step counted on it
    (`_count_flops`).

    This is the first read of a sample, so it runs after ``init_start`` and never before the
    clock may start. MLPerf's training rules (training_rules.adoc, "Run Results"): "The clock
    must start before any part of the system touches the dataset or when the maximum model
    initialization time is exceeded." MLPerf HPC v3.0 lets data staging, and so this read,
    sit inside the logged initialisation (``init_start`` .. ``init_stop``, within its limit):
    with ``data.staging.placement: init`` the check follows staging there, and a mismatch sets
    the attempt's log aside (`_close_failed`). With ``placement: run`` the dataset is first
    touched after ``run_start``: the check follows staging inside the timed run (it is not done
    earlier, which would read the data before the clock starts), and a mismatch ends that run
    with ``run_stop`` (aborted, naming the file).

    Raises:
        DataError: the sample does not fit; names the sample's source file (not a staged copy),
            its shape and dtype, and the model settings.
    """
    try:
        return _count_flops(model, train_ds, loss_fn)
    except DataError:
        raise
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        x, _ = train_ds[0]
        first = " ".join(str(exc).split())[:200]
        raise DataError(f"{_sample_name(train_ds, 0, data_dir, job.config)}: a training sample of "
                        f"shape {tuple(getattr(x, 'shape', ()))} ({getattr(x, 'dtype', '?')}) "
                        f"does not fit the model of the config's model section "
                        f"({_model_settings(job.config)}): {first}") from None


def _sample_name(dataset: Dataset, index: int, data_dir: Path, config: Config) -> str:
    """``<file> sample <k>`` of sample ``index``, the file named in ``data.path`` when
    ``data_dir`` is a staged copy (the copy named after it in brackets)."""
    if hasattr(dataset, "locate"):
        path, local = dataset.locate(index)
        name = f"{path} sample {local}"
    elif getattr(dataset, "files", None):
        path, name = Path(dataset.files[index]), str(dataset.files[index])
    else:
        return f"{config.data.path} sample {index}"
    source = Path(config.data.path)
    try:
        rel = Path(path).relative_to(data_dir)
    except ValueError:
        return name
    if Path(data_dir).resolve() == source.resolve():
        return name
    return name.replace(str(path), str(source / rel), 1) + f" [read from the staged copy {path}]"


def _model_settings(config: Config) -> str:
    fields = config.model.model_dump()
    keys = [k for k in ("input_size", "in_channels", "n_channels", "conv_channels") if k in fields]
    return ", ".join(f"model.{k}={fields[k]}" for k in keys) or "model.*"


def _log_init(job: Job) -> None:
    """init_start and the keys logged before staging."""
    log, rt, sub = job.log, job.rt, job.config.submission
    runtime.barrier(rt)
    log.start(constants.INIT_START)
    log.event(constants.SUBMISSION_BENCHMARK, job.workload.name)
    log.event(constants.SUBMISSION_ORG, sub.org)
    log.event(constants.SUBMISSION_DIVISION, sub.division)
    log.event(constants.SUBMISSION_STATUS, sub.status)
    log.event(constants.SUBMISSION_PLATFORM, sub.platform)
    if sub.poc_name:
        log.event(constants.SUBMISSION_POC_NAME, sub.poc_name)
    if sub.poc_email:
        log.event(constants.SUBMISSION_POC_EMAIL, sub.poc_email)
    log.event(constants.CACHE_CLEAR, True)
    log.event(mllog.NUMBER_OF_NODES, rt.num_nodes)
    log.event(mllog.ACCELERATORS_PER_NODE, rt.accelerators_per_node)
    log.event(constants.SEED, job.seed)
    if job.resume is not None:  # the marker `mlhpc.report.runs.is_resumed` reads
        resume, state = job.resume, job.resume.state
        log.event(mllog.RESUME, {"checkpoint": resume.source.name,
                                 "from_result_file": state.result_file, "epoch": state.epoch,
                                 "step": state.step,
                                 "earlier_attempts_s": round(resume.earlier_attempts_s, 3)},
                  metadata={"resumed": True})


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
    return embedded.ensure_data(config, job.workload, world)


def _prepare(job: Job, lbs: int) -> Parts:
    """Hyperparameters, staging and building on either side of ``run_start``.

    ``data.staging.placement: init`` stages (and builds the datasets, model and loaders) before
    ``init_stop``/``run_start``, as MLPerf HPC v3.0 allows within its initialisation limit;
    ``run`` logs ``init_stop`` and ``run_start`` first, so staging and everything that reads the
    data count in the time to train (the rule before v3.0). Returns after ``run_start``.
    """
    _log_hyperparameters(job)
    in_run = job.config.data.staging.placement == "run"
    if in_run:
        _start_run(job)
    parts = _build(job, _stage(job), lbs)
    _log_samples(job, parts)
    if not in_run:
        _start_run(job)
    return parts


def _stage(job: Job) -> staging.StagingResult | None:
    """staging_start .. staging_stop: every rank of the job stages (None: read in place).

    ``staging_stop`` carries where staging sat (``placement``: ``init`` or ``run``), its
    duration, the bytes and files the nodes hold, and the per-node figures of
    `StagingResult.node_summary` (slowest node, mean, GB/s per node and aggregate, bytes per node).
    """
    placement = job.config.data.staging.placement
    runtime.barrier(job.rt)  # every rank starts together: a node's time is its own staging
    job.log.start(constants.STAGING_START, metadata={"placement": placement})
    staged = staging.stage_dataset(job.config, job.world)
    runtime.barrier(job.rt)
    meta: dict[str, Any] = {"placement": placement,
                            "staging_duration": staged.elapsed_s if staged else 0.0,
                            "staged_bytes": staged.staged_bytes if staged else 0,
                            "staged_files": staged.staged_files if staged else 0}
    if staged is not None:
        meta.update(staged.node_summary(), shard="node" if staged.shard else "none",
                    offline=staged.offline)
    job.log.end(constants.STAGING_STOP, metadata=meta)
    return staged


def _sharded(staged: staging.StagingResult | None) -> bool:
    """The data were staged with ``shard: node``: each node holds only its share."""
    return staged is not None and staged.shard is not None


def build_train_sampler(dataset: Dataset, rt: Runtime, config: Config,
                        staged: staging.StagingResult | None) -> Sampler[int]:
    """The training sampler (`mlhpc.data.sampler.train_sampler`): after a sharded stage the node's
    samples over its local ranks, shuffled within the node; otherwise a seeded shuffle shared by
    every rank, each taking its stride. Its ``global_samples`` is the job's training-set size and
    ``padded_samples`` the repeats per epoch."""
    return sampling.train_sampler(len(dataset), rt, config.train.seed + (rt.instance or 0),
                                  _sharded(staged))


def _build(job: Job, staged: staging.StagingResult | None, lbs: int) -> Parts:
    """Datasets, model, optimizer, loaders and the training step; restored from a checkpoint."""
    config, workload, rt = job.config, job.workload, job.rt
    data_dir = Path(staged.dest) if staged is not None else Path(config.data.path)
    train_ds, eval_ds = workload.build_datasets(config, rt, data_dir)
    if len(train_ds) == 0 or len(eval_ds) == 0:
        raise DataError(f"{data_dir}: no training or validation samples found")
    _seed_everything(job.seed)
    model = workload.build_model(config.model)
    flops = _check_sample(job, model, train_ds, workload.build_loss(config), data_dir)
    model = model.to(rt.device)
    sampler = build_train_sampler(train_ds, rt, config, staged)
    options = dict(num_workers=config.data.num_workers, device=rt.device)
    train_loader = loader.make_loader(train_ds, lbs, sampler=sampler, **options)
    eval_loader = loader.make_loader(
        eval_ds, lbs, sampler=sampling.eval_sampler(len(eval_ds), rt, _sharded(staged)), **options)
    steps_per_epoch = math.ceil(len(train_loader) / config.train.gradient_accumulation_steps)
    optimizer, scheduler = workload.build_optimizer(model, config, steps_per_epoch)
    step = Step(wrap_model(model, rt, config.train.compile), workload.build_loss(config), optimizer,
                scheduler, precision(config.train.amp, rt.device), rt.device,
                config.train.gradient_accumulation_steps)
    parts = Parts(model, step, train_ds, eval_ds, sampler, train_loader, eval_loader, lbs, staged,
                  flops, train_samples=sampler.global_samples,
                  eval_samples=sampling.global_count(len(eval_ds), rt, _sharded(staged)),
                  padded_samples=sampler.padded_samples)
    if job.resume is not None:
        checkpoint.restore(job.resume.state, model, optimizer, scheduler)
        parts.history = list(job.resume.state.history)
    return parts


def _log_hyperparameters(job: Job) -> None:
    """The hyperparameters (nothing that reads the data)."""
    log, tcfg = job.log, job.config.train
    log.event(constants.GLOBAL_BATCH_SIZE, tcfg.global_batch_size)
    log.event(mllog.GRADIENT_ACCUMULATION_FREQUENCY, tcfg.gradient_accumulation_steps)
    for key, value in job.workload.hyperparameters(job.config).items():
        log.event(key, value)


def _log_samples(job: Job, parts: Parts) -> None:
    """``train_samples`` and ``eval_samples``: the job's counts (after a sharded stage every
    node's share summed, never one node's); the padding, if any, as metadata."""
    meta = {"padded_samples_per_epoch": parts.padded_samples} if parts.padded_samples else None
    job.log.event(constants.TRAIN_SAMPLES, parts.train_samples, metadata=meta)
    job.log.event(constants.EVAL_SAMPLES, parts.eval_samples)


def _start_run(job: Job) -> None:
    """init_stop (with a warning when staging sat in an initialisation longer than the rules
    allow, `mlhpc.data.stage.init_limit_warning`), then run_start."""
    log = job.log
    if job.stop is not None:
        job.stop.check()  # a signal during initialisation: the attempt is set aside
    runtime.barrier(job.rt)
    log.end(constants.INIT_STOP)
    start, stop = log.first(constants.INIT_START), log.first(constants.INIT_STOP)
    if start is not None and stop is not None and job.rt.is_main:
        warning = rules.init_limit_warning((stop.time_ms - start.time_ms) / 1e3,
                                             job.config.submission.division,
                                             job.config.data.staging.placement)
        if warning:
            job.progress({"kind": "warning", "message": warning})
    runtime.barrier(job.rt)
    log.start(constants.RUN_START)


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


def _train_epoch(job: Job, parts: Parts, epoch: int, skip: int, stop: "_Stop",
                 clock: "_Clock") -> tuple[str | None, float, float, float]:
    """One epoch_start .. epoch_stop from micro-step ``skip``. Returns (why the run stops or
    None, epoch seconds, samples/s, mean training loss). Every ``train.check_every_steps`` the
    ranks agree on stopping (SIGTERM: checkpoint and stop; non-finite loss: stop)."""
    rt, tcfg, log = job.rt, job.config.train, job.log
    batches = _epoch_batches(parts, epoch, skip, job.config)
    micro_steps = len(parts.train_loader)
    decode = loader.device_transform(parts.train_ds)
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
        n = loader.batch_len(parts.train_ds, x)
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
    value = evaluate(parts.model, parts.eval_loader, loader.device_transform(parts.eval_ds),
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

def _finish(job: Job, parts: Parts, outcome: Outcome, synthesis_s: float) -> RunResult:
    """Write the side file, then the summary read back from the log, the config and the env
    (each once, exclusively: the set was claimed with the log)."""
    result = RunResult(outcome.status, outcome.reason, signal=outcome.signal)
    files = job.files
    if files is None:
        return result
    results.write_json(files.measured, _measured(job, parts, synthesis_s))
    result.result_file = str(files.log)
    result.summary = results.load(files.log)
    results.write_json(files.summary, result.summary)
    results.write_yaml(files.config, job.config.to_dict())
    world = job.world
    results.write_json(files.env, {**envinfo.collect(), "runtime": {
        "launcher": world.launcher, "world_size": world.world_size, "num_nodes": world.num_nodes,
        "local_world_size": world.local_world_size, "device": str(job.rt.device),
        "instances": job.config.train.instances}})
    return result


def _measured(job: Job, parts: Parts, synthesis_s: float) -> dict[str, Any]:
    """What the log cannot hold: the contents of ``measured_N.json``."""
    config, rt, model, files = job.config, job.rt, parts.model, job.files
    staged = parts.staged.to_dict() if parts.staged is not None else {}
    samples = parts.train_samples + parts.eval_samples  # the job's, as staged_bytes
    peak, peak_source = perf.device_peak(rt.device, parts.step.precision)
    return {
        "workload": job.workload.name, "target": _target(job), "synthesis_s": synthesis_s,
        "world_size": rt.world_size, "num_nodes": rt.num_nodes, "instance": rt.instance,
        "staging": staged, "padded_samples_per_epoch": parts.padded_samples,
        "departs_from_reference": _departures(job, parts),
        "resumed_from": str(job.resume.source) if job.resume else None,
        "checkpoint": str(files.checkpoint) if files.checkpoint.exists() else None,
        "perf": {
            "forward_flops_per_sample": parts.flops.forward_flops,
            "train_flops_per_sample": parts.flops.train_flops,
            "peak_flop_per_s_per_rank": peak, "peak_source": peak_source,
            "precision": parts.step.precision, "parameters": sum(p.numel() for p in model.parameters()),
            "allreduce_bytes_per_step": perf.allreduce_bytes_per_step(model) if rt.distributed else 0,
            "dataset_bytes_per_sample": staged["staged_bytes"] / samples if staged else None,
            "data_path": {"num_workers": parts.train_loader.num_workers,
                          "pin_memory": parts.train_loader.pin_memory,
                          "memory_mapped": getattr(parts.train_ds, "memory_mapped", False),
                          "decode_on_device": hasattr(parts.train_ds, "device_transform"),
                          "channels_last": bool(getattr(config.model, "channels_last", False)),
                          "compile": compile_mode(config.train.compile)}},
    }


def _target(job: Job) -> float:
    target = job.config.train.target
    return job.workload.metric.target if target is None else target


def _departures(job: Job, parts: Parts) -> list[str]:
    """How this run departs from the reference: the workload's own list when it declares one,
    else the model fields that differ from their defaults, sample counts and target."""
    config, workload = job.config, job.workload
    if workload.departures is not None:
        return workload.departures(config)
    ref_model = workload.model_config()
    notes = [f"model.{key}={value} (reference {getattr(ref_model, key)})"
             for key, value in config.model.model_dump().items() if getattr(ref_model, key) != value]
    train_n, eval_n = parts.train_samples, parts.eval_samples
    ref_train, ref_eval = workload.reference_samples
    if ref_train and (train_n, eval_n) != (ref_train, ref_eval):
        notes.append(f"samples {train_n}/{eval_n} (reference {ref_train}/{ref_eval})")
    if config.train.target is not None and config.train.target != workload.metric.target:
        notes.append(f"target {config.train.target} (reference {workload.metric.target})")
    return notes


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


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _count_flops(model: torch.nn.Module, dataset: Dataset, loss_fn: Any) -> perf.FlopCount:
    """FLOPs per sample of one training step, counted on a meta-device copy (no compute)."""
    x, y = loader.to_device(loader.first_batch(dataset), torch.device("cpu"),
                            loader.device_transform(dataset))
    return perf.count_flops_on_meta(model, x, loss_fn, y, loader.batch_len(dataset, x))


class _Clock:
    """Seconds of timed run: this attempt's since run_start plus ``before_s`` of earlier ones."""

    def __init__(self, before_s: float = 0.0) -> None:
        self.before_s, self.start = before_s, time.perf_counter()

    def elapsed_s(self) -> float:
        return self.before_s + time.perf_counter() - self.start


class _Stop:
    """SIGTERM (what Slurm sends before a time limit) or SIGINT (Ctrl-C): before ``run_start`` it raises
    `RunInterrupted` (the attempt's log is set aside); from ``run_start`` on it sets ``signal``,
    checked between steps (a checkpoint is saved, run_stop logged). Installed for the ``with``
    block when this is the main thread."""

    def __init__(self, job: Job | None = None) -> None:
        self.signal: str | None = None
        self._previous: Any = None
        self._job = job

    def __call__(self, signum: int, frame: Any) -> None:
        self.signal = signal.Signals(signum).name
        self.check()

    def check(self) -> None:
        """Raise `RunInterrupted` when a signal came and run_start is not logged yet (also called
        just before run_start, in case library code caught the handler's exception)."""
        log = self._job.log if self._job is not None else None
        if self.signal and self._job is not None and (log is None or log.first(constants.RUN_START) is None):
            raise RunInterrupted(f"{self.signal} before run_start: nothing trained, no checkpoint",
                                 signal.Signals[self.signal])

    def __enter__(self) -> "_Stop":
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self) for sig in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, previous in (self._previous or {}).items():
            signal.signal(sig, previous)


class _SkipSampler(Sampler[int]):
    """The indices of ``base`` for this epoch after the first ``skip`` (resume inside an epoch)."""

    def __init__(self, base: Sampler[int], skip: int):
        self.base, self.skip = base, skip

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.base), self.skip, None)

    def __len__(self) -> int:
        return max(0, len(self.base) - self.skip)  # type: ignore[arg-type]
