"""What every level of ``mlhpc validate`` works on, obtained through the workload contract alone
(`mlhpc.workload.Workload`), as a run obtains it (`mlhpc.run.assemble`): the config's model built
once after seeding (float32, on the CPU), its loss, its optimizer, and batches of real training
samples, collated as the loader collates them and decoded on the CPU (so that the device and the
float64 reference see the same input values).
"""

from __future__ import annotations

import copy
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from mlhpc.config import Config
from mlhpc.data import loader
from mlhpc.errors import DataError
from mlhpc.run import assemble
from mlhpc.runtime import Runtime
from mlhpc.validate.checks import SameDraws, autocast, cast
from mlhpc.workload import Workload, WorkloadDataset


@dataclass
class Material:
    """The model and data of one validation.

    Attributes:
        config / workload: the validated config and its workload.
        model: the config's model, float32 on the CPU, as built after seeding (never trained here).
        loss_fn: ``(output, target) -> 0-d loss``.
        dataset: the training split.
        device / precision: where and how the device side computes (``fp32``, ``bf16``, ``fp16``).
        seed: the draws' seed (`SameDraws`), the config's ``train.seed``.
    """

    config: Config
    workload: Workload
    model: torch.nn.Module
    loss_fn: Callable[[Any, Any], torch.Tensor]
    dataset: WorkloadDataset
    device: torch.device
    precision: str
    seed: int
    read: dict[tuple[int, ...], Any] = field(default_factory=dict)

    def batch(self, indices: list[int]) -> tuple[Any, Any]:
        """Samples ``indices`` (taken modulo the split's size) collated as the loader collates
        them and decoded on the CPU (``device_transform``); read once and then the same copy
        every time (a reader that crops or samples at random would give each side another batch).

        Raises:
            DataError: as the dataset's reader.
        """
        picked = tuple(i % len(self.dataset) for i in indices)
        if picked not in self.read:
            samples = self.dataset.__getitems__(list(picked))
            cpu = torch.device("cpu")
            self.read[picked] = loader.to_device(self.dataset.collate_fn(samples), cpu,
                                                 self.dataset.device_transform)
        return cast(self.read[picked], "cpu")

    def device_copy(self, module: torch.nn.Module | None = None) -> torch.nn.Module:
        """A copy of ``module`` (default the model) on the device, its weights as built (float32)."""
        return copy.deepcopy(self.model if module is None else module).to(self.device)

    def steps_per_epoch(self) -> int:
        """Optimizer steps in an epoch of one rank at the config's global batch (the schedule's
        epoch, `Workload.build_optimizer`)."""
        return max(1, math.ceil(len(self.dataset) / self.config.train.global_batch_size))


def reference_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy of ``module`` on the CPU (every floating-point parameter and buffer)."""
    return copy.deepcopy(module).to("cpu").double()


@contextmanager
def float64_default() -> Iterator[None]:
    """torch's default dtype float64 within the block, so that tensors a model makes without a
    dtype (``torch.zeros(n)``) are float64 in the reference too."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def reference_forward(fn: Callable[..., Any], args: Any, kwargs: Any, seed: int) -> Any:
    """``fn(*args, **kwargs)`` in float64 on the CPU: the inputs cast, the default dtype
    float64, the draws of `SameDraws` with ``seed``."""
    args, kwargs = cast((args, kwargs), "cpu", torch.float64)
    with float64_default(), SameDraws(seed):
        return fn(*args, **kwargs)


def device_forward(fn: Callable[..., Any], args: Any, kwargs: Any, seed: int, device: torch.device,
                   precision: str) -> Any:
    """``fn(*args, **kwargs)`` on ``device`` at ``precision`` (autocast for bf16 / fp16): the
    inputs moved as they are (float32), the draws of `SameDraws` with ``seed``."""
    args, kwargs = cast((args, kwargs), device)
    with autocast(precision, device), SameDraws(seed):
        return fn(*args, **kwargs)


def material(config: Config, workload: Workload, rt: Runtime, precision: str) -> Material:
    """The material of ``config``: the training split read from ``data.path`` (embedded data
    synthesised first when missing, `mlhpc.data.ready.ensure_data`, as a run does) and the
    model built after seeding with ``train.seed`` (`mlhpc.run.assemble.seeded_model`).

    Raises:
        DataError: no training samples, or as the workload's reader and synthesis.
        ConfigError: the model cannot be built.
    """
    from mlhpc.data.ready import ensure_data

    ensure_data(config, workload, rt)
    train_ds, _ = workload.datasets(config, rt, Path(config.data.path))
    if len(train_ds) == 0:
        raise DataError(f"{config.data.path}: no training samples found")
    seeded = assemble.seeded_model(assemble.tool_job(config, workload, rt))
    model = seeded.model.float().train()
    return Material(config, workload, model, workload.build_loss(config), train_ds, rt.device,
                    precision, config.train.seed)
