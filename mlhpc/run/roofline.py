"""The roofline of a run's training step, measured: the machine's ceilings and the step's operators.

Source followed: Williams, Waterman and Patterson's roofline model (CACM 52(4), 2009) as HPC
AI500 applies it to AI systems (Jiang et al., arXiv 2007.00279): the compute ceilings are
measured with a large GEMM and a large convolution, the two kernels that dominate AI training,
at the run's precision; the memory ceiling with the bandwidth of a large copy. On a GPU the same
code measures that GPU's ceilings.

Under them (`mlhpc.run.roofline_figure.Roofline`, drawn by `mlhpc.run.roofline_figure.write_roofline`):

- the training step: its FLOPs and bytes summed over its operators, over the seconds of the
  step as `mlhpc run` runs it (`mlhpc.run.step.train_step`: compiled, DDP, autocast);
- its heaviest operators (most FLOPs): each distinct operator and input shapes, its FLOPs from
  torch's counter (`torch.utils.flop_counter`'s formulas as mlhpc's `FlopCounterMode` applies
  them, `mlhpc.run.flops.FLOP_FORMULAS`: matrix products, convolutions, attention; a
  multiply-add is 2 FLOPs), its bytes from its input and output tensor sizes (a lower bound on
  its memory traffic: each read or written once, caches and fusion not modelled), its seconds
  timed call by call (the device synchronised).

Operators are tallied on an eager copy of the model (`OperatorTally`, a `TorchDispatchMode`) for
one step after a warm-up step, on one batch of the run's loader; views (no data moved) are left
out. Operators without a FLOP formula (element-wise, normalisation, pooling, copies) have no
FLOPs in torch's counter and are not drawn, though their bytes count in the step's.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from mlhpc.run.flops import FLOP_FORMULAS
from mlhpc.run.roofline_figure import Ceilings, Roofline, RooflinePoint
from mlhpc.run.step import Step, autocast, measure_matmul_peak

#: Operators drawn under the step.
TOP_OPERATORS = 8


@dataclass(frozen=True)
class KernelSizes:
    """The shapes the ceilings are measured with: GEMM side, convolution (N, C=K, H=W, kernel
    3x3), bytes copied. `sizes_for` gives them per device."""

    gemm: int
    conv_batch: int
    conv_filters: int
    conv_side: int
    copy_bytes: int


#: On a GPU: a 8192 GEMM, a ResNet-stage convolution of 128 x 256 x 56 x 56, a 1 GiB copy.
GPU_SIZES = KernelSizes(gemm=8192, conv_batch=128, conv_filters=256, conv_side=56, copy_bytes=1 << 30)
#: On a CPU: a 1024 GEMM (170 FLOP/byte), 8 x 128 x 28 x 28, 64 MiB copied (128 MiB moved,
#: beyond a last-level cache): tens of milliseconds each, so the best of many repeats is seen
#: even on a shared machine.
CPU_SIZES = KernelSizes(gemm=1024, conv_batch=8, conv_filters=128, conv_side=28, copy_bytes=64 << 20)


def sizes_for(device: torch.device) -> KernelSizes:
    return GPU_SIZES if device.type == "cuda" else CPU_SIZES


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best_rate(fn: Callable[[], Any], work: float, device: torch.device, seconds: float) -> float:
    """``work`` / the fastest of ``fn``'s calls within ``seconds`` (after one untimed call)."""
    fn()
    best, deadline = 0.0, time.perf_counter() + seconds
    while True:
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = max(best, work / max(time.perf_counter() - t0, 1e-9))
        if time.perf_counter() >= deadline:
            return best


def measure_ceilings(device: torch.device, precision: str, seconds: float = 1.0,
                     sizes: KernelSizes | None = None) -> Ceilings:
    """The machine's ceilings on ``device`` at ``precision`` (``"bf16"`` or ``"fp32"``): a GEMM
    (`mlhpc.run.step.measure_matmul_peak`, 2 x side^3 FLOPs), a 3x3 convolution (2 x N x K x C x
    9 x H x W FLOPs, stride 1, padding 1) and a copy (2 x the bytes: read and written), each the
    best of its repeats within ``seconds``.

    Raises:
        RuntimeError: the device cannot allocate the kernels' tensors (a full GPU).
    """
    sizes = sizes or sizes_for(device)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    gemm = measure_matmul_peak(device, dtype, sizes.gemm, seconds)
    n, c, side = sizes.conv_batch, sizes.conv_filters, sizes.conv_side
    x = torch.randn(n, c, side, side, device=device, dtype=dtype)
    w = torch.randn(c, c, 3, 3, device=device, dtype=dtype)
    with torch.no_grad():
        conv = _best_rate(lambda: torch.nn.functional.conv2d(x, w, padding=1),
                          2.0 * n * c * c * 9 * side * side, device, seconds)
    del x, w
    src = torch.empty(sizes.copy_bytes // 4, device=device, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    copy = _best_rate(lambda: dst.copy_(src), 2.0 * src.numel() * 4, device, seconds)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    kernels = (f"GEMM {sizes.gemm}^3 {dtype}", f"convolution {n}x{c}x{side}x{side}, {c} 3x3 filters, {dtype}",
               f"copy of {sizes.copy_bytes / 2**20:.0f} MiB (bytes read + written)")
    return Ceilings(gemm, conv, copy, precision, name, kernels)


def _tensor_bytes(tree: Any) -> int:
    leaves, _ = tree_flatten(tree)
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


def _first_shape(args: Any) -> str:
    leaves, _ = tree_flatten(args)
    first = next((t for t in leaves if isinstance(t, torch.Tensor)), None)
    return "x".join(str(d) for d in first.shape) if first is not None else "-"


class OperatorTally(TorchDispatchMode):
    """Every ATen operator call in its block: FLOPs (`mlhpc.run.flops.FLOP_FORMULAS`, as
    `mlhpc.run.flops.flop_counter` counts them), bytes of its tensor inputs and outputs, and its seconds
    (``device`` synchronised before and after), summed per (operator, first input's shape).
    Views move no data and are not tallied; an operator without a formula that torch can
    decompose is tallied as its parts, as `FlopCounterMode` does."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.groups: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0])

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        packet = func._overloadpacket
        if packet not in FLOP_FORMULAS:
            with self:
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        _sync(self.device)
        t0 = time.perf_counter()
        out = func(*args, **kwargs)
        _sync(self.device)
        seconds = time.perf_counter() - t0
        if func.is_view:
            return out
        flops = FLOP_FORMULAS[packet](*args, **kwargs, out_val=out) if packet in FLOP_FORMULAS else 0
        group = self.groups[(packet.__name__, _first_shape(args))]
        group[0] += flops
        group[1] += _tensor_bytes((args, kwargs)) + _tensor_bytes(out)
        group[2] += seconds
        group[3] += 1
        return out

    def points(self) -> list[RooflinePoint]:
        """One `RooflinePoint` per (operator, shape), most FLOPs first."""
        rows = [RooflinePoint(f"{name} [{shape}]", flops, traffic, seconds, int(calls))
                for (name, shape), (flops, traffic, seconds, calls) in self.groups.items()]
        return sorted(rows, key=lambda p: p.flops, reverse=True)


def _eager_step(model: torch.nn.Module, optimizer: Any, step: Step, x: Any, y: Any) -> None:
    with autocast(step.precision, step.device):
        loss = step.loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def tally_step(model: torch.nn.Module, optimizer: Any, step: Step, x: Any, y: Any,
               repeats: int = 3) -> OperatorTally:
    """`OperatorTally` of one eager training step (forward, loss, backward, optimizer step) of
    ``model`` (a throw-away copy: it is trained) on the batch ``(x, y)``, after one warm-up step:
    the step is tallied ``repeats`` times and each operator keeps its fastest seconds (a step
    interrupted by another process on a shared machine does not count against it)."""
    _eager_step(model, optimizer, step, x, y)
    tallies = []
    for _ in range(repeats):
        tally = OperatorTally(step.device)
        with tally:
            _eager_step(model, optimizer, step, x, y)
        tallies.append(tally)
    best = tallies[-1]
    for key, group in best.groups.items():
        group[2] = min(t.groups[key][2] for t in tallies if key in t.groups)
    return best


def roofline(workload: str, ceilings: Ceilings, tally: OperatorTally, step_s: float,
             top: int = TOP_OPERATORS) -> Roofline:
    """The `Roofline` of a step: its FLOPs and bytes from ``tally``, its seconds ``step_s`` (the
    run's own step, timed), and ``tally``'s ``top`` operators with the most FLOPs."""
    points = tally.points()
    step = RooflinePoint("training step", sum(p.flops for p in points), sum(p.traffic_bytes for p in points),
                         step_s, 1)
    notes = [f"ceilings: {'; '.join(ceilings.kernels)}, each the best of its repeats",
             "step: FLOPs and bytes of every operator of one eager step, over the step's time as "
             "mlhpc run runs it; operators: timed call by call (device synchronised), eager, the "
             "fastest of 3 steps"]
    return Roofline(workload, ceilings, step, [p for p in points if p.flops > 0][:top], notes)
