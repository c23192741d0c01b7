"""The training loop: one model-agnostic harness for every `Workload`.

One straight line (DESIGN.md, "How a run flows"):

    config -> runtime -> (embedded data if missing) -> init_start, submission_*, cache_clear,
    hyperparameters -> staging (staging_start/stop) -> datasets, model, optimizer -> init_stop
    -> run_start -> [epoch_start .. epoch_stop, eval_start .. eval_stop, metric] until target
    -> run_stop(status) -> RunResult -> result_N.txt, summary_N.json, config_N.yaml, env_N.json

Rank 0 writes every log line; the timing events are bracketed by barriers so that a once-only key
appears once and measures the slowest rank. Data parallelism is DistributedDataParallel with a
seeded per-epoch shuffle shared by all ranks (so R ranks x local batch b see the same global batches
as 1 rank x R*b), and the metric is reduced as (sum, count) across ranks.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import signal
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.utils.data import Dataset, DistributedSampler, Sampler, default_collate

from mlhpc import env as envinfo
from mlhpc import loader, mllog, perf, runtime, staging
from mlhpc.config import Config, save
from mlhpc.errors import ConfigError, DataError
from mlhpc.mllog import ComplianceLog, constants
from mlhpc.runtime import Runtime
from mlhpc.workload import Workload

ProgressFn = Callable[[dict[str, Any]], None]


@dataclass
class RunResult:
    """What one run measured. Times in seconds; the split follows DESIGN.md "What a result means".

    time_to_train_s = run_stop - run_start (the official score of one run); residual_s = time to
    train - sum(epoch times) - sum(eval times), shown, never hidden.
    """

    status: str
    reason: str | None
    workload: str
    result_file: str | None
    metric_key: str
    target: float
    metric_value: float | None
    epochs: int
    time_to_train_s: float
    staging_s: float
    init_s: float
    synthesis_s: float
    epoch_times_s: list[float]
    eval_times_s: list[float]
    residual_s: float
    train_samples: int
    eval_samples: int
    global_batch_size: int
    world_size: int
    num_nodes: int
    samples_per_s: float
    metric_history: list[tuple[int, float]] = field(default_factory=list)
    staging: dict[str, Any] = field(default_factory=dict)
    departs_from_reference: list[str] = field(default_factory=list)
    perf: dict[str, Any] = field(default_factory=dict)
    instance: int | None = None
    resumed_from: str | None = None
    checkpoint: str | None = None

    @property
    def mean_epoch_s(self) -> float:
        return sum(self.epoch_times_s) / len(self.epoch_times_s) if self.epoch_times_s else 0.0

    @property
    def eval_s(self) -> float:
        return sum(self.eval_times_s)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["mean_epoch_s"] = self.mean_epoch_s
        out["eval_s"] = self.eval_s
        return out


class ShardSampler(Sampler[int]):
    """Evaluation sharding without padding: rank r of R takes indices r, r+R, r+2R, ...

    Unlike `DistributedSampler`, no sample is repeated, so sums over ranks are exact.
    """

    def __init__(self, length: int, rank: int, world_size: int):
        self.indices = list(range(rank, length, world_size))

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class _Stop:
    """Set by SIGTERM (what Slurm sends before a time limit); checked between steps."""

    def __init__(self) -> None:
        self.signal: str | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        self.signal = signal.Signals(signum).name


def compile_mode(setting: bool | str) -> str | None:
    """The ``torch.compile`` mode for ``train.compile`` (None: do not compile)."""
    if setting is False:
        return None
    return "default" if setting is True else str(setting)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _all_reduce(values: list[float], rt: Runtime, op: str = "sum") -> list[float]:
    if not rt.distributed:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=rt.device)
    red = torch.distributed.ReduceOp.SUM if op == "sum" else torch.distributed.ReduceOp.MAX
    torch.distributed.all_reduce(tensor, op=red, group=rt.group)
    return tensor.tolist()


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


def _departures(config: Config, workload: Workload, train_n: int, eval_n: int) -> list[str]:
    notes = []
    ref_model = workload.model_config()
    for key, value in config.model.model_dump().items():
        if getattr(ref_model, key) != value:
            notes.append(f"model.{key}={value} (reference {getattr(ref_model, key)})")
    ref_train, ref_eval = workload.reference_samples
    if ref_train and (train_n, eval_n) != (ref_train, ref_eval):
        notes.append(f"samples {train_n}/{eval_n} (reference {ref_train}/{ref_eval})")
    if config.train.target is not None and config.train.target != workload.metric.target:
        notes.append(f"target {config.train.target} (reference {workload.metric.target})")
    return notes


def _count_flops(model: torch.nn.Module, dataset: Dataset, loss_fn: Any) -> "perf.FlopCount":
    """FLOPs per sample of one training step, counted on a meta-device copy (no compute)."""
    x, y = loader.to_device(default_collate([dataset[0]]), torch.device("cpu"),
                            loader.device_transform(dataset))
    return perf.count_flops_on_meta(model, x, loss_fn, y)


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


CHECKPOINT_PATTERN = "checkpoint_{}.pt"


@dataclass
class _Resume:
    """Where a resumed run starts: the state saved by a stopped run."""

    state: dict[str, Any]
    source: Path  # the checkpoint file

    @property
    def epoch(self) -> int:  # the epoch to (re)enter, 1-based
        return int(self.state["epoch"])

    @property
    def step(self) -> int:  # micro-steps of that epoch already done
        return int(self.state["step"])


def find_checkpoint(run_dir: Path) -> Path:
    """The newest ``checkpoint_N.pt`` in ``run_dir``.

    Raises:
        ConfigError: the folder or a checkpoint in it does not exist.
    """
    if not run_dir.is_dir():
        raise ConfigError(f"--resume {run_dir}: not a run folder")
    found = sorted(run_dir.glob("checkpoint_*.pt"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise ConfigError(f"--resume {run_dir}: no checkpoint_N.pt in this folder (a run writes one "
                          "when stopped by SIGTERM or every train.checkpoint_every_epochs)")
    return found[-1]


def load_resume(run_dir: Path) -> tuple[Config, _Resume]:
    """The config and saved state to continue the run stopped in ``run_dir``.

    The checkpoint is loaded with ``weights_only=True`` (tensors and plain containers only).

    Raises:
        ConfigError: no checkpoint, or one that cannot be read.
    """
    from mlhpc import config as cfg

    path = find_checkpoint(run_dir)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for a damaged or foreign file
        raise ConfigError(f"--resume {path}: cannot read checkpoint ({type(exc).__name__})") from None
    config = cfg.from_dict(state["config"], source=f"{path} (config)")
    return config, _Resume(state, path)


def run(config: Config, *, on_progress: ProgressFn | None = None,
        resume_dir: Path | None = None) -> RunResult:
    """Train ``config``'s workload to its quality target; write the result files on rank 0.

    With ``resume_dir``, continue the run stopped there (``config`` is then taken from its
    checkpoint and may be None). Returns this rank's instance's `RunResult`.

    Raises:
        ConfigError, DataError, StagingError: bad input, before any training starts.
    """
    from mlhpc.workload import get as get_workload

    resume = None
    if resume_dir is not None:
        config, resume = load_resume(Path(resume_dir))
    workload = get_workload(config.workload)
    rt = runtime.detect(device=config.train.device)
    if config.train.threads:
        torch.set_num_threads(config.train.threads)
    runtime.init_process_group(rt)
    try:
        return _run(config, workload, rt, on_progress or (lambda event: None), resume)
    finally:
        runtime.destroy_process_group()


def _run(config: Config, workload: Workload, world: Runtime, progress: ProgressFn,
         resume: _Resume | None) -> RunResult:
    rt = runtime.split_instances(world, config.train.instances)
    lbs = local_batch_size(config, rt)
    out_dir = Path(config.output.dir)
    synthesis_s = ensure_data(config, workload, world)

    log = ComplianceLog.create(out_dir, rt.is_main, rt.instance)
    index = log.path.name[len("result_"):-len(".txt")] if log.path else None
    if rt.is_main:
        progress({"kind": "start", "result_file": str(log.path), "workload": workload.name,
                  "instance": rt.instance})
    try:
        return _train(config, workload, world, rt, log, lbs, synthesis_s, index, progress, resume)
    finally:
        log.close()


def _save_checkpoint(path: Path, model: torch.nn.Module, optimizer: Any, scheduler: Any,
                     config: Config, epoch: int, step: int, history: list[tuple[int, float]],
                     result_file: str | None, elapsed_s: float) -> None:
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(), "config": config.to_dict(), "epoch": epoch,
             "step": step, "history": [list(h) for h in history], "result_file": result_file,
             "elapsed_s": elapsed_s, "torch_rng": torch.get_rng_state()}
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save(state, tmp)
    os.replace(tmp, path)


class _SkipSampler(Sampler[int]):
    """The indices of ``base`` for this epoch after the first ``skip`` (resume inside an epoch)."""

    def __init__(self, base: Sampler[int], skip: int):
        self.base, self.skip = base, skip

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.base), self.skip, None)

    def __len__(self) -> int:
        return max(0, len(self.base) - self.skip)  # type: ignore[arg-type]


def _train(config: Config, workload: Workload, world: Runtime, rt: Runtime, log: ComplianceLog,
           lbs: int, synthesis_s: float, index: str | None, progress: ProgressFn,
           resume: _Resume | None) -> RunResult:
    tcfg = config.train
    out_dir = Path(config.output.dir)
    sub = config.submission
    seed = tcfg.seed + (rt.instance or 0)

    # ---- init: everything before run_start ------------------------------------------------
    runtime.barrier(rt)
    log.start(constants.INIT_START)
    log.event(constants.SUBMISSION_BENCHMARK, workload.name)
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
    log.event(constants.SEED, seed)
    if resume is not None:
        log.event(mllog.RESUME, {"checkpoint": str(resume.source),
                                 "from_result_file": resume.state.get("result_file"),
                                 "epoch": resume.epoch, "step": resume.step,
                                 "elapsed_before_s": resume.state.get("elapsed_s", 0.0)},
                  metadata={"resumed": True})

    log.start(constants.STAGING_START)
    staged = staging.stage_dataset(config, world)  # every rank of the job; None: read in place
    runtime.barrier(rt)
    staged_info = staged.to_dict() if staged is not None else {}
    staging_s = staged.seconds if staged is not None else 0.0
    log.end(constants.STAGING_STOP, metadata={
        "staging_duration": staging_s, "staged_bytes": staged_info.get("bytes", 0),
        "staged_files": staged_info.get("files", 0)})
    data_dir = Path(staged.dest) if staged is not None else Path(config.data.path)

    train_ds, eval_ds = workload.build_datasets(config, rt, data_dir)
    train_n, eval_n = len(train_ds), len(eval_ds)
    if train_n == 0 or eval_n == 0:
        raise DataError(f"{data_dir}: no training or validation samples found")

    _seed_everything(seed)
    model = workload.build_model(config.model).to(rt.device)
    ddp_model = torch.compile(model, mode=compile_mode(tcfg.compile)) if tcfg.compile else model
    if rt.distributed:
        ddp_model = torch.nn.parallel.DistributedDataParallel(
            ddp_model, device_ids=[rt.device.index] if rt.device.type == "cuda" else None,
            process_group=rt.group)

    train_sampler = DistributedSampler(train_ds, num_replicas=rt.world_size, rank=rt.rank,
                                       shuffle=True, seed=seed, drop_last=False)
    loader_args = dict(num_workers=config.data.num_workers, device=rt.device)
    train_loader = loader.make_loader(train_ds, lbs, sampler=train_sampler, **loader_args)
    eval_loader = loader.make_loader(eval_ds, lbs, sampler=ShardSampler(eval_n, rt.rank,
                                                                        rt.world_size),
                                     **loader_args)
    train_decode = loader.device_transform(train_ds)
    eval_decode = loader.device_transform(eval_ds)
    micro_steps = len(train_loader)
    steps_per_epoch = math.ceil(micro_steps / tcfg.gradient_accumulation_steps)
    optimizer, scheduler = workload.build_optimizer(model, config, steps_per_epoch)
    loss_fn = workload.build_loss(config)
    metric = workload.metric
    target = metric.target if tcfg.target is None else tcfg.target
    first_epoch, skip_steps, history = 1, 0, []
    if resume is not None:
        model.load_state_dict(resume.state["model"])
        optimizer.load_state_dict(resume.state["optimizer"])
        scheduler.load_state_dict(resume.state["scheduler"])
        torch.set_rng_state(resume.state["torch_rng"])
        first_epoch, skip_steps = resume.epoch, resume.step
        history = [(int(e), float(v)) for e, v in resume.state.get("history", [])]

    flops = _count_flops(model, train_ds, loss_fn)
    log.event(constants.GLOBAL_BATCH_SIZE, tcfg.global_batch_size)
    log.event(mllog.GRADIENT_ACCUMULATION_FREQUENCY, tcfg.gradient_accumulation_steps)
    for key, value in workload.hyperparameters(config).items():
        log.event(key, value)
    log.event(constants.TRAIN_SAMPLES, train_n)
    log.event(constants.EVAL_SAMPLES, eval_n)
    runtime.barrier(rt)
    log.end(constants.INIT_STOP)

    stop = _Stop()
    previous = signal.signal(signal.SIGTERM, stop) if _in_main_thread() else None
    amp = (torch.autocast(device_type="cuda", dtype=torch.bfloat16)
           if tcfg.amp and rt.device.type == "cuda" else nullcontext())
    checkpoint = out_dir / CHECKPOINT_PATTERN.format(index if index is not None else "x")

    def save_checkpoint(next_epoch: int, steps_done: int) -> None:
        """Rank 0 saves where a resumed run re-enters: ``next_epoch`` after ``steps_done`` steps."""
        if rt.is_main:
            _save_checkpoint(checkpoint, model, optimizer, scheduler, config, next_epoch, steps_done,
                             history, log.path and log.path.name, time.perf_counter() - run_start)

    # ---- the timed run ----------------------------------------------------------------------
    runtime.barrier(rt)
    log.start(constants.RUN_START)
    run_start = time.perf_counter()
    status, reason = constants.ABORTED, f"max_epochs {tcfg.max_epochs} reached before the target"
    epoch_times: list[float] = []
    eval_times: list[float] = []
    value: float | None = history[-1][1] if history else None
    epoch = first_epoch - 1
    samples_seen = 0
    try:
        for epoch in range(first_epoch, tcfg.max_epochs + 1):
            train_sampler.set_epoch(epoch - 1)
            skip = skip_steps if epoch == first_epoch else 0
            batches = train_loader if skip == 0 else loader.make_loader(
                train_ds, lbs, sampler=_SkipSampler(train_sampler, skip * lbs), **loader_args)
            runtime.barrier(rt)
            log.start(constants.EPOCH_START, metadata={constants.EPOCH_NUM: epoch})
            t0 = time.perf_counter()
            ddp_model.train()
            loss_sum = torch.zeros((), dtype=torch.float64, device=rt.device)
            epoch_samples, stopped = 0, None
            for step, batch in enumerate(batches, start=skip):
                x, y = loader.to_device(batch, rt.device, train_decode)
                last_micro = (step + 1) % tcfg.gradient_accumulation_steps == 0 or step + 1 == micro_steps
                sync = nullcontext() if (last_micro or not rt.distributed) else ddp_model.no_sync()
                with sync:
                    with amp:
                        loss = loss_fn(ddp_model(x), y)
                    (loss / tcfg.gradient_accumulation_steps).backward()
                if last_micro:
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    scheduler.step()
                loss_sum += loss.detach().double() * x.shape[0]
                epoch_samples += x.shape[0]
                if tcfg.log_every_steps and (step + 1) % tcfg.log_every_steps == 0 and rt.is_main:
                    progress({"kind": "step", "epoch": epoch, "step": step + 1, "steps": micro_steps,
                              "loss": float(loss)})
                if (step + 1) % tcfg.check_every_steps == 0 and last_micro:
                    flags = _all_reduce([float(stop.signal is not None),
                                         float(not math.isfinite(loss_sum.item()))], rt, op="max")
                    if flags[1]:
                        stopped = f"non-finite training loss in epoch {epoch} by step {step + 1}"
                        break
                    if flags[0]:
                        stopped = f"SIGTERM in epoch {epoch} after step {step + 1}"
                        save_checkpoint(epoch, step + 1)
                        break
            totals = _all_reduce([float(stop.signal is not None), loss_sum.item(), epoch_samples], rt)
            runtime.barrier(rt)
            epoch_s = time.perf_counter() - t0
            log.end(constants.EPOCH_STOP, metadata={constants.EPOCH_NUM: epoch})
            epoch_times.append(epoch_s)
            samples_seen += int(totals[2])
            train_loss = totals[1] / max(totals[2], 1)
            if stopped is None and not math.isfinite(train_loss):
                stopped = f"non-finite training loss ({train_loss}) in epoch {epoch}"
            if stopped is None and totals[0] > 0:  # signal arrived after the last check
                stopped = f"SIGTERM at the end of epoch {epoch}"
                save_checkpoint(epoch, micro_steps)
            if stopped is not None:
                reason = stopped
                break

            log.start(constants.EVAL_START, metadata={constants.EPOCH_NUM: epoch})
            t1 = time.perf_counter()
            ddp_model.eval()
            total = torch.zeros((), dtype=torch.float64, device=rt.device)
            count = torch.zeros((), dtype=torch.float64, device=rt.device)
            with torch.no_grad(), amp:
                for batch in eval_loader:
                    x, y = loader.to_device(batch, rt.device, eval_decode)
                    s, n = metric.batch_stats(model(x), y)
                    total += s
                    count += n
            total_sum, count_sum = _all_reduce([total.item(), count.item()], rt)
            value = total_sum / max(count_sum, 1.0)
            runtime.barrier(rt)
            eval_s = time.perf_counter() - t1
            log.end(constants.EVAL_STOP, metadata={constants.EPOCH_NUM: epoch})
            log.event(metric.key, value, metadata={constants.EPOCH_NUM: epoch})
            eval_times.append(eval_s)
            history.append((epoch, value))
            if rt.is_main:
                progress({"kind": "epoch", "epoch": epoch, "max_epochs": tcfg.max_epochs,
                          "metric_key": metric.key, "metric": value, "target": target,
                          "reached": metric.reached(value, target), "train_loss": train_loss,
                          "epoch_s": epoch_s, "eval_s": eval_s, "instance": rt.instance,
                          "samples_per_s": totals[2] / epoch_s if epoch_s > 0 else 0.0})
            if not math.isfinite(value):
                reason = f"non-finite {metric.key} ({value}) at epoch {epoch}"
                break
            if metric.reached(value, target):
                status, reason = constants.SUCCESS, None
                break
            if tcfg.checkpoint_every_epochs and epoch % tcfg.checkpoint_every_epochs == 0:
                save_checkpoint(epoch + 1, 0)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    runtime.barrier(rt)
    stop_meta: dict[str, Any] = {"status": status, constants.EPOCH_NUM: epoch}
    if reason:
        stop_meta["reason"] = reason
    log.end(constants.RUN_STOP, metadata=stop_meta)
    time_to_train_s = time.perf_counter() - run_start

    def interval(start_key: str, stop_key: str) -> float:
        a, b = log.first(start_key), log.first(stop_key)
        return (b.time_ms - a.time_ms) / 1e3 if a and b else 0.0

    train_time = sum(epoch_times)
    samples_per_s = samples_seen / train_time if train_time else 0.0
    precision = "bf16" if tcfg.amp and rt.device.type == "cuda" else "fp32"
    peak, peak_source = perf.device_peak(rt.device, precision)
    achieved = flops.train_flops * samples_per_s
    total_samples = train_n + eval_n
    perf_info = {
        "forward_flops_per_sample": flops.forward_flops, "train_flops_per_sample": flops.train_flops,
        "achieved_flop_per_s": achieved, "achieved_flop_per_s_per_rank": achieved / rt.world_size,
        "peak_flop_per_s_per_rank": peak, "peak_source": peak_source, "precision": precision,
        "mfu": achieved / (peak * rt.world_size) if peak else None,
        "allreduce_bytes_per_step": perf.allreduce_bytes_per_step(model) if rt.distributed else 0,
        "dataset_bytes_per_sample": staged_info.get("bytes", 0) / total_samples if staged_info else None,
        "read_bytes_per_s": (staged_info.get("bytes", 0) / total_samples * samples_per_s
                             if staged_info else None),
        "parameters": sum(p.numel() for p in model.parameters()),
        "data_path": {"num_workers": train_loader.num_workers,
                      "pin_memory": train_loader.pin_memory,
                      "memory_mapped": getattr(train_ds, "memory_mapped", False),
                      "decode_on_device": hasattr(train_ds, "device_transform"),
                      "channels_last": bool(getattr(config.model, "channels_last", False)),
                      "compile": compile_mode(tcfg.compile)},
    }
    result = RunResult(
        status=status, reason=reason, workload=workload.name,
        result_file=str(log.path) if log.path else None, metric_key=metric.key, target=target,
        metric_value=value, epochs=epoch, time_to_train_s=time_to_train_s,
        staging_s=staging_s, init_s=interval(constants.INIT_START, constants.INIT_STOP),
        synthesis_s=synthesis_s, epoch_times_s=epoch_times, eval_times_s=eval_times,
        residual_s=time_to_train_s - train_time - sum(eval_times), train_samples=train_n,
        eval_samples=eval_n, global_batch_size=tcfg.global_batch_size, world_size=rt.world_size,
        num_nodes=rt.num_nodes, samples_per_s=samples_per_s, perf=perf_info,
        metric_history=history, staging=staged_info, instance=rt.instance,
        resumed_from=str(resume.source) if resume else None,
        checkpoint=str(checkpoint) if checkpoint.exists() else None,
        departs_from_reference=_departures(config, workload, train_n, eval_n))
    if rt.is_main and index is not None:
        _write_json(out_dir / f"summary_{index}.json", result.to_dict())
        save(config, out_dir / f"config_{index}.yaml")
        _write_json(out_dir / f"env_{index}.json", {**envinfo.collect(), "runtime": {
            "launcher": world.launcher, "world_size": world.world_size, "num_nodes": world.num_nodes,
            "local_world_size": world.local_world_size, "device": str(rt.device),
            "instances": tcfg.instances}})
    return result


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
