"""One training step: how it runs, the same for `mlhpc run`, `mlhpc profile` and
benchmarks/throughput.py, and what it costs.

How it runs. `wrap_model` applies ``train.compile`` (torch.compile with the configured mode) and
DistributedDataParallel on a process group; `autocast` is the ``train.amp`` switch (bf16 autocast
on CUDA); `train_step` is forward, loss, backward (scaled for gradient accumulation, without the
all-reduce on the micro-steps before the last one) and, on the last micro-step, the optimizer and
scheduler steps. Whoever times or profiles a step calls this function, so what is measured is
what trains.

What it costs, counted and measured:

- FLOPs per sample, forward and forward+backward, counted by PyTorch itself with
  `torch.utils.flop_counter.FlopCounterMode` on the workload's model (a multiply-add counts as 2
  FLOPs, as in the MLPerf / AIPerf convention), with torch's formulas except a grouped
  convolution's backward, counted by its own formula (`mlhpc.run.flops`).
- Achieved FLOP/s = training FLOPs per sample x samples/s, and model FLOP utilisation (MFU)
  against the device's peak at the step's precision: a small table of published dense peaks for
  known GPUs, or, on a CPU or an unknown device, a peak measured here with a large matrix
  product (``peak_source`` says which).
- Memory: parameters, gradients, optimizer state (bytes) and activations saved for backward
  (bytes, counted with `torch.autograd.graph.saved_tensors_hooks`), plus the CUDA peak.
- Communication: bytes all-reduced per optimizer step by DistributedDataParallel (every gradient).
"""

from __future__ import annotations

import copy
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch

from mlhpc.run.flops import flop_counter
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


# Dense peak FLOP/s per device, from the vendors' data sheets (no sparsity).
KNOWN_PEAKS_FLOP_PER_S: dict[tuple[str, str], float] = {
    ("H100", "bf16"): 989.4e12, ("H100", "fp32"): 66.9e12,
    ("H200", "bf16"): 989.4e12, ("H200", "fp32"): 66.9e12,
    ("A100", "bf16"): 312e12, ("A100", "fp32"): 19.5e12,
}


@dataclass
class FlopCount:
    """FLOPs for one sample (float), counted on a batch and divided by its size."""

    forward_flops: float
    train_flops: float  # forward + backward

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def count_flops(model: torch.nn.Module, sample: Any, loss_fn: Any, target: Any,
                n: int | None = None) -> FlopCount:
    """FLOPs per sample of ``model`` on ``sample`` (N, ...) with targets ``target`` (N, ...), as
    torch's FlopCounterMode counts them (matrix products and convolutions, a grouped convolution
    by `mlhpc.run.flops.conv_backward_flops`; gathers, scatters and element-wise work are not
    counted). ``n``: samples in ``sample`` when it is not a tensor (a graph batch; default
    ``sample.shape[0]``).

    The model is left unchanged (gradients are cleared afterwards).
    """
    n = sample.shape[0] if n is None else n
    was_training = model.training
    model.train()
    with flop_counter() as forward_counter:
        with torch.no_grad():
            model(sample)
    with flop_counter() as train_counter:
        loss_fn(model(sample), target).backward()
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    return FlopCount(forward_counter.get_total_flops() / n, train_counter.get_total_flops() / n)


def count_flops_on_meta(model: torch.nn.Module, batch: Any, loss_fn: Any,
                        target: Any, n: int = 1) -> FlopCount:
    """`count_flops` for the first sample of ``batch`` / ``target`` on a meta-device copy of
    ``model``: shapes only, no compute, ``model`` and its device untouched. A batch that is not
    a tensor (a dict of graph tensors of ``n`` samples, whose work depends on its edges and
    triplets) is counted on a real copy of the model instead: the meta device cannot follow
    data-dependent graph construction."""
    if not isinstance(batch, torch.Tensor):  # a structured batch (graphs): counted for real,
        return count_flops(copy.deepcopy(model), batch, loss_fn, target, n)  # on a copy
    meta = copy.deepcopy(model).to("meta")
    return count_flops(meta, batch[:1].to("meta"), loss_fn, target[:1].to("meta"))


def measure_matmul_peak(device: torch.device, dtype: torch.dtype = torch.float32, size: int = 2048,
                        seconds: float = 0.5) -> float:
    """Achieved FLOP/s of a ``size`` x ``size`` matrix product on ``device`` (best of a
    ``seconds``-long loop): the practical peak for a device with no table entry."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    torch.matmul(a, b)
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        torch.matmul(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = max(best, 2 * size ** 3 / (time.perf_counter() - t0))
    return best


def device_peak(device: torch.device, precision: str) -> tuple[float, str]:
    """(peak FLOP/s, source) for ``device`` at ``precision`` (``"bf16"`` or ``"fp32"``)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for (key, prec), peak in KNOWN_PEAKS_FLOP_PER_S.items():
            if key in name and prec == precision:
                return peak, f"data sheet: {key} {prec} dense"
    dtype = torch.bfloat16 if precision == "bf16" and device.type == "cuda" else torch.float32
    return measure_matmul_peak(device, dtype), f"measured: {dtype} matmul on {device.type}"


@dataclass
class MemoryBreakdown:
    parameters_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    saved_activations_bytes: int  # per training step at the given batch
    cuda_peak_bytes: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def memory_breakdown(model: torch.nn.Module, optimizer: torch.optim.Optimizer, sample: Any,
                     loss_fn: Any, target: Any) -> MemoryBreakdown:
    """Bytes of parameters, gradients, optimizer state and saved activations for one step on
    ``sample`` (a tensor or a dict of tensors). Takes one real optimizer step, so call it on a
    throw-away copy of the model."""
    saved = 0
    device = next(model.parameters()).device

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += _tensor_bytes(t)
        return t

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(model(sample), target)
    loss.backward()
    optimizer.step()
    params = sum(_tensor_bytes(p) for p in model.parameters())
    grads = sum(_tensor_bytes(p.grad) for p in model.parameters() if p.grad is not None)
    state = sum(_tensor_bytes(v) for s in optimizer.state.values() for v in s.values()
                if isinstance(v, torch.Tensor))
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    optimizer.zero_grad(set_to_none=True)
    return MemoryBreakdown(params, grads, state, saved, peak)


def allreduce_bytes_per_step(model: torch.nn.Module) -> int:
    """Bytes of gradients DistributedDataParallel all-reduces per optimizer step (every trainable
    parameter's gradient, in its dtype)."""
    return sum(_tensor_bytes(p) for p in model.parameters() if p.requires_grad)
