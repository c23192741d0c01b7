"""The material of one run: staging (staging_start .. staging_stop; `stage_only` for
`mlhpc stage`) and `build` (datasets, model, sampler, loaders, optimizer, the training step), with
the first read of a sample checked against the model (`check_sample`).

`build` is the only place a run's parts are assembled: `mlhpc.run.train`, `mlhpc.run.profile` and
benchmarks/throughput.py call it (through `tool_job` for the last two), so what is profiled and
benchmarked is what is trained.

`mlhpc.run.train` calls these in the order docs/architecture.md gives ("How a run flows").
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from mlhpc import runtime
from mlhpc.config import Config
from mlhpc.data import loader
from mlhpc.data import sampler as sampling
from mlhpc.data import stage as staging
from mlhpc.errors import DataError
from mlhpc.run import checkpoint
from mlhpc.run.job import Job
from mlhpc.log.writer import ComplianceLog, constants
from mlhpc.run.step import FlopCount, Step, count_flops_on_meta, precision, wrap_model
from mlhpc.runtime import Runtime
from mlhpc.workload import Workload, WorkloadDataset


@dataclass
class Parts:
    """What `build` makes for the loop."""

    model: torch.nn.Module  # the weights (evaluation, checkpoints)
    step: Step  # the training step (compiled / DDP model, loss, optimizer, scheduler)
    train_ds: WorkloadDataset
    eval_ds: WorkloadDataset
    train_sampler: Any
    train_loader: loader.DeviceLoader  # batches on the device, decoded
    eval_loader: loader.DeviceLoader
    local_batch_size: int
    staged: staging.StagingResult | None
    flops: FlopCount
    train_state: checkpoint.TrainState  # the counters a checkpoint carries (epoch, step, evaluations)
    train_samples: int = 0  # the job's training-set size (every node's share summed), as logged
    eval_samples: int = 0  # the job's validation-set size, as logged
    padded_samples: int = 0  # repeats per epoch that keep every rank's step count equal

    @property
    def optimizer(self) -> Any:
        return self.step.optimizer

    @property
    def scheduler(self) -> Any:
        return self.step.scheduler

    @property
    def history(self) -> list[tuple[int, float]]:
        """``[(epoch, metric value)]`` of the evaluations so far."""
        return self.train_state.history

    @property
    def states(self) -> dict[str, checkpoint.Stateful]:
        """The run's stateful parts by name: what a checkpoint saves (`mlhpc.run.checkpoint.save`)
        and a resumed run restores (`mlhpc.run.checkpoint.restore`)."""
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler,
                "train_state": self.train_state, "rng": checkpoint.TorchRandom()}


@dataclass(frozen=True)
class Seeded:
    """The run's model, built once per attempt right after seeding (`seeded_model`), and the
    random state its construction left (``random``, NumPy, torch), which `build` restores so that
    everything after it draws as though the model had been built there."""

    model: torch.nn.Module
    rng: tuple[Any, Any, torch.Tensor]


def seeded_model(job: Job) -> Seeded:
    """Seed (`seed_everything`, the instance's seed) and build the config's model once; with a
    run to resume, its saved weights are loaded into it here (`mlhpc.run.checkpoint.restore` of
    ``model``), before anything is written.

    Raises:
        ConfigError: the model cannot be built, or the checkpoint's weights do not fit it.
    """
    seed_everything(job.seed)
    model = job.workload.build_model(job.config.model)
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    if job.resume is not None:
        checkpoint.restore({"model": model}, job.resume.saved, source=f"--resume {job.resume.source}")
    return Seeded(model, rng)


def stage(job: Job, log: ComplianceLog) -> staging.StagingResult | None:
    """staging_start .. staging_stop: every rank of the job stages (None: read in place).

    ``staging_stop`` carries where staging sat (``placement``: ``init`` or ``run``), its
    duration, the bytes and files the nodes hold, and the per-node figures of
    `StagingResult.node_summary` (slowest node, mean, GB/s per node and aggregate, bytes per node).
    """
    placement = job.config.data.staging.placement
    log.barrier()  # every rank starts together: a node's time is its own staging
    log.start(constants.STAGING_START, metadata={"placement": placement})
    staged = staging.stage_dataset(job.config, job.world)
    log.barrier()
    meta: dict[str, Any] = {"placement": placement,
                            "staging_duration": staged.elapsed_s if staged else 0.0,
                            "staged_bytes": staged.staged_bytes if staged else 0,
                            "staged_files": staged.staged_files if staged else 0}
    if staged is not None:
        meta.update(staged.node_summary(), shard="node" if staged.shard else "none",
                    offline=staged.offline)
    log.end(constants.STAGING_STOP, metadata=meta)
    return staged


def sharded(staged: staging.StagingResult | None) -> bool:
    """The data were staged with ``shard: node``: each node holds only its share."""
    return staged is not None and staged.shard is not None


def recorded_counts(staged: staging.StagingResult | None, split: int) -> list[int] | None:
    """The nodes' sample counts of the shard's ``split``-th split folder (0: training, 1:
    validation) as the staged manifest records them (`StagingResult.node_samples`), or None."""
    if staged is None or staged.node_samples is None or staged.shard is None:
        return None
    names = staged.shard.get("splits") or []
    return staged.node_samples.get(names[split]) if split < len(names) else None


def build_train_sampler(dataset: WorkloadDataset, rt: Runtime, config: Config,
                        staged: staging.StagingResult | None) -> Sampler[int]:
    """The training sampler (`mlhpc.data.sampler.train_sampler`): after a sharded stage the node's
    samples over its local ranks, shuffled within the node; otherwise a seeded shuffle shared by
    every rank, each taking its stride. Its ``global_samples`` is the job's training-set size and
    ``padded_samples`` the repeats per epoch."""
    return sampling.train_sampler(len(dataset), rt, config.train.seed + (rt.instance or 0),
                                  sharded(staged), recorded_counts(staged, 0))


def tool_job(config: Config, workload: Workload, rt: Runtime) -> Job:
    """The `Job` of a tool that builds a run's parts without running it (``mlhpc profile``,
    benchmarks/throughput.py): no log, nothing to resume, progress dropped."""
    return Job(config, workload, rt, rt)


def build(job: Job, staged: staging.StagingResult | None, lbs: int, *,
          seeded: Seeded | None = None, precision_name: str | None = None) -> Parts:
    """Datasets, model, optimizer, loaders and the training step (compiled and wrapped once,
    `mlhpc.run.step.wrap_model`); restored from a checkpoint. The only assembly of a run's parts:
    `mlhpc.run.train`, `mlhpc.run.profile` and benchmarks/throughput.py all call it.

    Args:
        lbs: the local batch size (samples per rank per micro-step).
        seeded: the model `seeded_model` built for this attempt (a tool that runs no attempt
            passes none: it is built here).
        precision_name: ``"fp32"`` or ``"bf16"`` to override the precision ``train.amp`` gives
            (`mlhpc.run.step.precision`); the throughput benchmark measures bf16 on any device.

    Raises:
        DataError: no training or validation samples, or the first sample does not fit the
            model (`check_sample`).
    """
    config, workload, rt = job.config, job.workload, job.rt
    data_dir = Path(staged.dest) if staged is not None else Path(config.data.path)
    train_ds, eval_ds = workload.datasets(config, rt, data_dir)
    if len(train_ds) == 0 or len(eval_ds) == 0:
        raise DataError(f"{data_dir}: no training or validation samples found")
    seeded = seeded or seeded_model(job)
    random.setstate(seeded.rng[0])
    np.random.set_state(seeded.rng[1])
    torch.set_rng_state(seeded.rng[2])
    model = seeded.model
    sampler = build_train_sampler(train_ds, rt, config, staged)
    options = dict(num_workers=config.data.num_workers, device=rt.device)
    train_loader = loader.device_loader(train_ds, lbs, sampler=sampler, **options)
    eval_loader = loader.device_loader(
        eval_ds, lbs, sampler=sampling.eval_sampler(len(eval_ds), rt, sharded(staged)), **options)
    flops = check_sample(job, model, train_ds, data_dir)  # the first read of the data
    model = model.to(rt.device)
    optimizer, scheduler = workload.build_optimizer(model, config, steps_per_pass(train_loader, config))
    step = Step(wrap_model(model, rt, config.train.compile), workload.build_loss(config), optimizer,
                scheduler, precision_name or precision(config.train.amp, rt.device), rt.device,
                config.train.gradient_accumulation_steps)
    parts = Parts(model=model, step=step, train_ds=train_ds, eval_ds=eval_ds, train_sampler=sampler,
                  train_loader=train_loader, eval_loader=eval_loader, local_batch_size=lbs,
                  staged=staged, flops=flops, train_state=checkpoint.TrainState(config),
                  train_samples=sampler.global_samples,
                  eval_samples=sampling.global_count(len(eval_ds), rt, sharded(staged),
                                                     recorded_counts(staged, 1)),
                  padded_samples=sampler.padded_samples)
    if job.resume is not None:  # the weights are in since `seeded_model`; the rest now
        checkpoint.restore(parts.states, job.resume.saved, source=f"--resume {job.resume.source}",
                           exclude=("model",))
    return parts


def steps_per_pass(train_loader: loader.DeviceLoader, config: Config) -> int:
    """Optimizer steps in one pass over this rank's training batches: its micro-steps over
    ``train.gradient_accumulation_steps``, a short last group counted whole. The schedule's
    epoch (`Workload.build_optimizer`) and the loop's ``epoch_num`` both count with it."""
    return math.ceil(len(train_loader) / config.train.gradient_accumulation_steps)


def scratch_copy(job: Job, model: torch.nn.Module) -> tuple[torch.nn.Module, Any]:
    """A throw-away deep copy of ``model`` and an optimizer of the config's for it (one step per
    epoch), for measurements that take a real optimizer step (`mlhpc.run.step.memory_breakdown`)
    without touching the run's weights or optimizer state."""
    scratch = copy.deepcopy(model)
    optimizer, _ = job.workload.build_optimizer(scratch, job.config, 1)
    return scratch, optimizer


def check_sample(job: Job, model: torch.nn.Module, train_ds: WorkloadDataset, data_dir: Path
                 ) -> FlopCount:
    """The first training sample, read and decoded on the CPU as the loader gives it
    (`mlhpc.data.loader.first_batch`), fits the model (shape, dtype: one forward and backward on
    the meta device); returns the FLOPs per sample of a training step counted on it
    (`count_flops`).

    This is the first read of a sample, so it runs after ``init_start`` and never before
    the clock may start. MLPerf's training rules (training_rules.adoc, "Run Results"): "The clock
    must start before any part of the system touches the dataset or when the maximum model
    initialization time is exceeded." MLPerf HPC v3.0 lets data staging, and so this read,
    sit inside the logged initialisation (``init_start`` .. ``init_stop``, within its limit):
    with ``data.staging.placement: init`` the check follows staging there, and a mismatch sets
    the attempt's log aside (`close_failed`). With ``placement: run`` the dataset is first
    touched after ``run_start``: the check follows staging inside the timed run (it is not done
    earlier, which would read the data before the clock starts), and a mismatch ends that run
    with ``run_stop`` (aborted, naming the file).

    Raises:
        DataError: the sample does not fit; names the sample's source file (not a staged copy),
            its shape and dtype, and the model settings.
    """
    try:
        first = loader.first_batch(train_ds)
        return count_flops(model, first, job.workload.build_loss(job.config), train_ds)
    except DataError:
        raise
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        said = " ".join(str(exc).split())[:200]
        raise DataError(f"{sample_name(train_ds, 0, data_dir, job.config)}: a training sample of "
                        f"{_shapes(train_ds[0][0])} does not fit the model of the config's model "
                        f"section ({model_settings(job)}): {said}") from None


def sample_name(dataset: WorkloadDataset, index: int, data_dir: Path, config: Config) -> str:
    """``<file> sample <k>`` of sample ``index``, the file named in ``data.path`` when
    ``data_dir`` is a staged copy (the copy named after it in brackets)."""
    where = dataset.locate(index)
    if where is None:
        return f"{config.data.path} sample {index}"
    path, name = where.file, f"{where.file} sample {where.index}"
    original = staged_source(path, data_dir, config.data.path)
    if original is None:
        return name
    return name.replace(str(path), str(original), 1) + f" [read from the staged copy {path}]"


def model_settings(job: Job) -> str:
    """``model.K=V, ...``: the model settings the workload reports (`Workload.model_settings`)."""
    settings = job.workload.model_settings(job.config.model)
    return ", ".join(f"model.{k}={v}" for k, v in settings.items()) or "model.*"


def _shapes(x: Any) -> str:
    """``shape (..) (dtype)`` of a sample's input: a tensor, or a mapping of tensors."""
    if isinstance(x, torch.Tensor):
        return f"shape {tuple(x.shape)} ({x.dtype})"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k}: {_shapes(v)}" for k, v in x.items()) + "}"
    return type(x).__name__


@contextmanager
def sources_named(staged: staging.StagingResult | None) -> Iterator[None]:
    """Within the block, a `DataError` naming a file of this node's staged copy names the
    source file instead (`name_source`)."""
    try:
        yield
    except DataError as exc:
        name_source(staged, exc)
        raise


def name_source(staged: staging.StagingResult | None, exc: BaseException) -> None:
    """Make a `DataError` whose subject (its ``path`` field, `mlhpc.errors.MlhpcError.repoint`)
    is a file of this node's staged copy (``staged.dest``) name the file it was copied from
    instead, the copy in brackets, as `sample_name` does:
    ``SOURCE/train/f.lmdb: key '3': ... [read from the staged copy DEST/train/f.lmdb]``. The
    file is mapped by its path relative to the copy (`staged_source`); an error with no path
    field, one re-pointed already, or a path with no such file in the source (a converted copy)
    is left as it is. Nothing is searched in the message's text."""
    if not isinstance(exc, DataError) or staged is None or exc.path is None or exc.copy is not None:
        return
    copy = exc.path
    original = staged_source(copy, staged.dest, staged.source)
    if original is not None and original.is_file():
        exc.repoint(original, copy)


def staged_source(path: str | Path, dest: str | Path, source: str | Path) -> Path | None:
    """The path in ``source`` that ``path``, under ``source``'s staged copy ``dest``, was copied
    from (``source / path.relative_to(dest)``); None when ``path`` is not under ``dest`` or
    ``dest`` is ``source`` itself (the data were read in place). Nothing is read but the two
    folders' resolved names."""
    try:
        rel = Path(path).relative_to(dest)
    except ValueError:
        return None
    if Path(dest).resolve() == Path(source).resolve():
        return None
    return Path(source) / rel


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def count_flops(model: torch.nn.Module, first: tuple[Any, Any], loss_fn: Any,
                dataset: WorkloadDataset) -> FlopCount:
    """FLOPs per sample of one training step on the batch ``first`` (on the CPU, decoded),
    counted on a meta-device copy (no compute)."""
    x, y = first
    return count_flops_on_meta(model, x, loss_fn, y, dataset.batch_len(x))


def stage_only(config: Config) -> tuple[staging.StagingResult | None, bool]:
    """`mlhpc stage`: the staging a run of ``config`` would do, on every rank of this job, with
    the process group set up and torn down here. Returns ``(result or None when staging is
    disabled, whether this rank is the one that reports)``.

    Raises:
        StagingError: as `mlhpc.data.stage.stage_dataset`.
    """
    with runtime.started("cpu") as (world, _):
        return staging.stage_dataset(config, world), world.is_main
