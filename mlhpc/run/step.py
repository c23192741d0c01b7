"""One training step, the same for `mlhpc run`, `mlhpc profile` and benchmarks/throughput.py.

`wrap_model` applies ``train.compile`` (torch.compile with the configured mode) and
DistributedDataParallel on a process group; `autocast` is the ``train.amp`` switch (bf16 autocast
on CUDA); `train_step` is forward, loss, backward (scaled for gradient accumulation, without the
all-reduce on the micro-steps before the last one) and, on the last micro-step, the optimizer and
scheduler steps. Whoever times or profiles a step calls this function, so what is measured is
what trains.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable

import torch

from mlhpc.runtime import Runtime

#: ``phase(name)`` -> a context wrapped around one phase of the step ("forward", "backward",
#: "optimizer"); `mlhpc.run.profile` passes one that records and times each phase.
PhaseFn = Callable[[str], AbstractContextManager]


def _no_phase(name: str) -> AbstractContextManager:
    return nullcontext()


def compile_mode(setting: bool | str) -> str | None:
    """The ``torch.compile`` mode for ``train.compile`` (None: do not compile)."""
    if setting is False:
        return None
    return "default" if setting is True else str(setting)


def precision(amp: bool, device: torch.device) -> str:
    """``"bf16"`` when ``train.amp`` is on and the device is CUDA, else ``"fp32"``."""
    return "bf16" if amp and device.type == "cuda" else "fp32"


def autocast(precision_name: str, device: torch.device) -> AbstractContextManager:
    """bf16 autocast on ``device`` for ``"bf16"``; no-op for ``"fp32"``."""
    if precision_name == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return nullcontext()


def wrap_model(model: torch.nn.Module, rt: Runtime, compile_setting: bool | str) -> torch.nn.Module:
    """The module a step calls: ``model`` compiled (``train.compile``) and, when ``rt`` is
    distributed, wrapped in DistributedDataParallel on ``rt.group``. ``model`` keeps the weights;
    evaluation and checkpoints use it directly."""
    mode = compile_mode(compile_setting)
    wrapped = torch.compile(model, mode=mode) if mode else model
    if rt.distributed:
        wrapped = torch.nn.parallel.DistributedDataParallel(
            wrapped, device_ids=[rt.device.index] if rt.device.type == "cuda" else None,
            process_group=rt.group)
    return wrapped


@dataclass
class Step:
    """What one training step needs.

    Attributes:
        model: the module called (from `wrap_model`: compiled and/or DDP).
        loss_fn: ``(output, target) -> 0-d loss``.
        optimizer / scheduler: stepped on the last micro-step; ``scheduler`` may be None.
        precision: ``"bf16"`` (autocast) or ``"fp32"``.
        device: the training device.
        accumulation_steps: micro-steps per optimizer step (``train.gradient_accumulation_steps``).
    """

    model: torch.nn.Module
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    optimizer: Any
    scheduler: Any
    precision: str
    device: torch.device
    accumulation_steps: int = 1


def train_step(step: Step, x: torch.Tensor, y: torch.Tensor, last_micro: bool = True,
               phase: PhaseFn = _no_phase) -> torch.Tensor:
    """One micro-step on the batch ``(x, y)`` (already on the device); returns the detached loss
    (0-d, the unscaled batch mean).

    On a micro-step that is not the last of an optimizer step, DDP's gradient all-reduce is
    skipped (``no_sync``) and the gradients accumulate; on the last one the optimizer, then the
    scheduler, step and the gradients are cleared.
    """
    ddp = isinstance(step.model, torch.nn.parallel.DistributedDataParallel)
    sync = step.model.no_sync() if (ddp and not last_micro) else nullcontext()
    with sync:
        with phase("forward"), autocast(step.precision, step.device):
            loss = step.loss_fn(step.model(x), y)
        with phase("backward"):
            (loss / step.accumulation_steps).backward()
    if last_micro:
        with phase("optimizer"):
            step.optimizer.step()
            step.optimizer.zero_grad(set_to_none=True)
            if step.scheduler is not None:
                step.scheduler.step()
    return loss.detach()
