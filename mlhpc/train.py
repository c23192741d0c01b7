"""The training loop: one model-agnostic harness for every `Workload`.

One straight line (DESIGN.md, "How a run flows"), one function per stage:

    run: config -> runtime + process group -> _run_instance:
      ensure_data (embedded data if missing) -> result_N.txt claimed
      -> _log_init (init_start, submission_*, cache_clear, seed, resume)
      -> _stage (staging_start/stop) -> _build (datasets, model, optimizer, loaders)
      -> _log_hyperparameters (... init_stop)
      -> train_loop (run_start, [epoch_start .. epoch_stop, eval_start .. eval_stop, metric]
         until target, run_stop)
      -> _finish: measured_N.json, then summary_N.json from the log (`mlhpc.results`),
         config_N.yaml, env_N.json

The pieces live in their own files: `mlhpc.step` (the one training step, shared with
``mlhpc profile`` and benchmarks/throughput.py), `mlhpc.evaluate` (metric all-reduced over ranks),
`mlhpc.checkpoint` (save, restore, resume), `mlhpc.results` (the result, read back from the log).

Rank 0 writes every log line; the timing events are bracketed by barriers so that a once-only key
appears once and measures the slowest rank. Data parallelism is DistributedDataParallel with a
seeded per-epoch shuffle shared by all ranks (so R ranks x local batch b see the same global
batches as 1 rank x R*b), and the metric is reduced as (sum, count) across ranks.
"""

from __future__ import annotations

import itertools
import math
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, default_collate

from mlhpc import checkpoint, loader, mllog, perf, results, runtime, staging
from mlhpc import env as envinfo
from mlhpc.checkpoint import Resume
from mlhpc.config import Config, save
from mlhpc.errors import ConfigError, DataError
from mlhpc.evaluate import ShardSampler, all_reduce, evaluate
from mlhpc.mllog import ComplianceLog, constants
from mlhpc.results import RunFiles, RunResult
from mlhpc.runtime import Runtime
from mlhpc.step import Step, autocast, compile_mode, precision, train_step, wrap_model
from mlhpc.workload import Workload
from mlhpc.workload import get as get_workload

ProgressFn = Callable[[dict[str, Any]], None]

__all__ = ["RunResult", "ShardSampler", "compile_mode", "ensure_data", "local_batch_size", "run",
           "stage_only"]


# ---- entry points ---------------------------------------------------------------------------------

def run(config: Config | None, *, on_progress: ProgressFn | None = None,
        resume_dir: Path | None = None) -> RunResult:
    """Train ``config``'s workload to its quality target; write the run's files on rank 0.

    With ``resume_dir``, continue the run stopped there (``config`` is then taken from its
    checkpoint and may be None). Returns this rank's instance's `RunResult`.

    Raises:
        ConfigError, DataError, StagingError: bad input, before any training starts.
    """
    resume = None
    if resume_dir is not None:
        config, resume = checkpoint.load_resume(Path(resume_dir))
    assert config is not None
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
        StagingError: as `mlhpc.staging.stage_dataset`.
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


def _run_instance(job: Job) -> RunResult:
    config, world = job.config, job.world
    job.rt = rt = runtime.split_instances(world, config.train.instances)
    lbs = local_batch_size(config, rt)
    synthesis_s = ensure_data(config, job.workload, world)
    job.log = ComplianceLog.create(Path(config.output.dir), rt.is_main, rt.instance)
    if rt.is_main:
        job.progress({"kind": "start", "result_file": str(job.log.path),
                      "workload": job.workload.name, "instance": rt.instance})
    try:
        _log_init(job)
        parts = _build(job, _stage(job), lbs)
        _log_hyperparameters(job, parts)
        outcome = train_loop(job, parts)
    finally:
        job.log.close()
    return _finish(job, parts, outcome, synthesis_s)


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
    if job.resume is not None:
        state = job.resume.state
        log.event(mllog.RESUME, {"checkpoint": str(job.resume.source),
                                 "from_result_file": state.result_file, "epoch": state.epoch,
                                 "step": state.step, "elapsed_before_s": state.elapsed_s},
                  metadata={"resumed": True})


def _stage(job: Job) -> staging.StagingResult | None:
    """staging_start .. staging_stop: every rank of the job stages (None: read in place)."""
    job.log.start(constants.STAGING_START)
    staged = staging.stage_dataset(job.config, job.world)
    runtime.barrier(job.rt)
    job.log.end(constants.STAGING_STOP, metadata={
        "staging_duration": staged.elapsed_s if staged else 0.0,
        "staged_bytes": staged.staged_bytes if staged else 0,
        "staged_files": staged.staged_files if staged else 0})
    return staged


def build_train_sampler(dataset: Dataset, rt: Runtime, config: Config,
                        staged: staging.StagingResult | None) -> Sampler[int]:
    """The training sampler: a seeded shuffle shared by every rank, each taking its stride."""
    del staged  # a node-local sharded sampler will choose by the staging plan
    return DistributedSampler(dataset, num_replicas=rt.world_size, rank=rt.rank, shuffle=True,
                              seed=config.train.seed + (rt.instance or 0), drop_last=False)


def _build(job: Job, staged: staging.StagingResult | None, lbs: int) -> Parts:
    """Datasets, model, optimizer, loaders and the training step; restored from a checkpoint."""
    config, workload, rt = job.config, job.workload, job.rt
    data_dir = Path(staged.dest) if staged is not None else Path(config.data.path)
    train_ds, eval_ds = workload.build_datasets(config, rt, data_dir)
    if len(train_ds) == 0 or len(eval_ds) == 0:
        raise DataError(f"{data_dir}: no training or validation samples found")
    _seed_everything(job.seed)
    model = workload.build_model(config.model).to(rt.device)
    sampler = build_train_sampler(train_ds, rt, config, staged)
    options = dict(num_workers=config.data.num_workers, device=rt.device)
    train_loader = loader.make_loader(train_ds, lbs, sampler=sampler, **options)
    eval_loader = loader.make_loader(
        eval_ds, lbs, sampler=ShardSampler(len(eval_ds), rt.rank, rt.world_size), **options)
    steps_per_epoch = math.ceil(len(train_loader) / config.train.gradient_accumulation_steps)
    optimizer, scheduler = workload.build_optimizer(model, config, steps_per_epoch)
    step = Step(wrap_model(model, rt, config.train.compile), workload.build_loss(config), optimizer,
                scheduler, precision(config.train.amp, rt.device), rt.device,
                config.train.gradient_accumulation_steps)
    parts = Parts(model, step, train_ds, eval_ds, sampler, train_loader, eval_loader, lbs, staged,
                  _count_flops(model, train_ds, step.loss_fn))
    if job.resume is not None:
        checkpoint.restore(job.resume.state, model, optimizer, scheduler)
        parts.history = list(job.resume.state.history)
    return parts


def _log_hyperparameters(job: Job, parts: Parts) -> None:
    """The hyperparameters and dataset sizes, then init_stop."""
    log, tcfg = job.log, job.config.train
    log.event(constants.GLOBAL_BATCH_SIZE, tcfg.global_batch_size)
    log.event(mllog.GRADIENT_ACCUMULATION_FREQUENCY, tcfg.gradient_accumulation_steps)
    for key, value in job.workload.hyperparameters(job.config).items():
        log.event(key, value)
    log.event(constants.TRAIN_SAMPLES, len(parts.train_ds))
    log.event(constants.EVAL_SAMPLES, len(parts.eval_ds))
    runtime.barrier(job.rt)
    log.end(constants.INIT_STOP)


# ---- the timed run -------------------------------------------------------------------------------

def train_loop(job: Job, parts: Parts) -> Outcome:
    """run_start .. run_stop: epochs and evaluations until the target, max_epochs, a non-finite
    loss or metric, or SIGTERM (which saves a checkpoint)."""
    tcfg, metric, log = job.config.train, job.workload.metric, job.log
    target = metric.target if tcfg.target is None else tcfg.target
    first_epoch, skip = (job.resume.state.epoch, job.resume.state.step) if job.resume else (1, 0)
    outcome = Outcome(constants.ABORTED, f"max_epochs {tcfg.max_epochs} reached before the target",
                      first_epoch - 1)
    runtime.barrier(job.rt)
    log.start(constants.RUN_START)
    clock = _Clock(job.resume.state.elapsed_s if job.resume else 0.0)
    with _Stop() as stop:
        for epoch in range(first_epoch, tcfg.max_epochs + 1):
            outcome.epoch = epoch
            stopped, epoch_s, samples_per_s, train_loss = _train_epoch(
                job, parts, epoch, skip if epoch == first_epoch else 0, stop, clock)
            if stopped is not None:
                outcome.reason = stopped
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
        loss_sum += loss.double() * x.shape[0]
        samples += x.shape[0]
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
                stopped = f"SIGTERM in epoch {epoch} after step {step + 1}"
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
        stopped = f"SIGTERM at the end of epoch {epoch}"
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
    """Write the side file, then the summary read back from the log, the config and the env."""
    result = RunResult(outcome.status, outcome.reason)
    files = job.files
    if files is None:
        return result
    results.write_json(files.measured, _measured(job, parts, synthesis_s))
    result.result_file = str(files.log)
    result.summary = results.load(files.log)
    results.write_json(files.summary, result.summary)
    save(job.config, files.path("config", ".yaml"))
    world = job.world
    results.write_json(files.path("env", ".json"), {**envinfo.collect(), "runtime": {
        "launcher": world.launcher, "world_size": world.world_size, "num_nodes": world.num_nodes,
        "local_world_size": world.local_world_size, "device": str(job.rt.device),
        "instances": job.config.train.instances}})
    return result


def _measured(job: Job, parts: Parts, synthesis_s: float) -> dict[str, Any]:
    """What the log cannot hold: the contents of ``measured_N.json``."""
    config, rt, model, files = job.config, job.rt, parts.model, job.files
    staged = parts.staged.to_dict() if parts.staged is not None else {}
    samples = len(parts.train_ds) + len(parts.eval_ds)
    peak, peak_source = perf.device_peak(rt.device, parts.step.precision)
    return {
        "workload": job.workload.name, "target": _target(job), "synthesis_s": synthesis_s,
        "world_size": rt.world_size, "num_nodes": rt.num_nodes, "instance": rt.instance,
        "staging": staged, "departs_from_reference": _departures(job, parts),
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
    train_n, eval_n = len(parts.train_ds), len(parts.eval_ds)
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


def ensure_data(config: Config, workload: Workload, rt: Runtime) -> float:
    """Synthesize the embedded dataset at ``config.data.path`` if it is missing and allowed.

    Returns the seconds spent (0 when the data was there). Rank 0 writes; the others wait.

    Raises:
        DataError: the folder is missing and ``data.synthesize_if_missing`` is false, or its
            train/ or validation/ folder is empty.
    """
    path = Path(config.data.path)
    runtime.barrier(rt)  # every rank looks before rank 0 may start writing ...
    missing = not ((path / "train").is_dir() and (path / "validation").is_dir())
    runtime.barrier(rt)  # ... so all ranks agree on `missing`
    start = time.perf_counter()
    if missing:
        if not config.data.synthesize_if_missing:
            raise DataError(f"{path}: dataset folder not found (expected train/ and validation/); "
                            "set data.path or data.synthesize_if_missing: true")
        if rt.is_main:
            workload.synthesize(path, config.synth, config.train.seed)
        runtime.barrier(rt)
    for split in ("train", "validation"):
        if not any(p.is_file() for p in (path / split).iterdir()):
            raise DataError(f"{path / split}: dataset folder is empty")
    return time.perf_counter() - start if missing else 0.0


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _count_flops(model: torch.nn.Module, dataset: Dataset, loss_fn: Any) -> perf.FlopCount:
    """FLOPs per sample of one training step, counted on a meta-device copy (no compute)."""
    x, y = loader.to_device(default_collate([dataset[0]]), torch.device("cpu"),
                            loader.device_transform(dataset))
    return perf.count_flops_on_meta(model, x, loss_fn, y)


class _Clock:
    """Seconds of timed run: this attempt's since run_start plus ``before_s`` of earlier ones."""

    def __init__(self, before_s: float = 0.0) -> None:
        self.before_s, self.start = before_s, time.perf_counter()

    def elapsed_s(self) -> float:
        return self.before_s + time.perf_counter() - self.start


class _Stop:
    """SIGTERM (what Slurm sends before a time limit) sets ``signal``; checked between steps.
    Installed for the ``with`` block when this is the main thread."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self._previous: Any = None

    def __call__(self, signum: int, frame: Any) -> None:
        self.signal = signal.Signals(signum).name

    def __enter__(self) -> "_Stop":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


class _SkipSampler(Sampler[int]):
    """The indices of ``base`` for this epoch after the first ``skip`` (resume inside an epoch)."""

    def __init__(self, base: Sampler[int], skip: int):
        self.base, self.skip = base, skip

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.base), self.skip, None)

    def __len__(self) -> int:
        return max(0, len(self.base) - self.skip)  # type: ignore[arg-type]
