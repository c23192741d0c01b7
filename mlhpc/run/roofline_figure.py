"""The roofline of a training step: the machine's measured ceilings and, under them, the step and
its heaviest operators by arithmetic intensity (one PNG, `write_roofline`).

Source followed: Williams, Waterman and Patterson, "Roofline: an insightful visual performance
model for multicore architectures" (CACM 52(4), 2009), as HPC AI500 applies it to AI systems
(Jiang et al., arXiv 2007.00279, "HPC AI roofline models"): the ceilings are measured, not taken
from a data sheet, with the two kernels that dominate AI training, a large GEMM and a large
convolution, at the run's precision, and the memory bandwidth of a large copy. A point at
arithmetic intensity I (FLOP per byte) can reach at most min(peak, I x bandwidth).

The figures are measured on the run side (`mlhpc.run.roofline`, `mlhpc profile --roofline`);
this module only holds them (`Roofline`) and draws them, so the report stays a reader.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, FuncFormatter

from mlhpc.data.files import atomic_output, reason
from mlhpc.errors import OutputError
from mlhpc.text import plot_text

#: Said on every roofline: how its bytes were counted.
TRAFFIC_NOTE = ("bytes: each operator's input and output tensor sizes, a lower bound on its memory "
                "traffic (each read or written once; caches and fusion not modelled)")


@dataclass(frozen=True)
class Ceilings:
    """The machine's measured ceilings at one precision.

    Attributes:
        gemm_flop_per_s: a large matrix product's FLOP/s (best of the measured repeats).
        conv_flop_per_s: a large 2-D convolution's FLOP/s.
        copy_bytes_per_s: a large tensor copy's bytes read + written per second.
        precision: ``"fp32"`` or ``"bf16"`` (the dtype of the GEMM and the convolution).
        device: the device, in words (``cpu``, ``NVIDIA H100 80GB HBM3``).
        kernels: how each ceiling was measured (shapes, bytes), one line each.
    """

    gemm_flop_per_s: float
    conv_flop_per_s: float
    copy_bytes_per_s: float
    precision: str
    device: str
    kernels: tuple[str, ...] = ()

    @property
    def peak_flop_per_s(self) -> float:
        """The higher of the two compute ceilings."""
        return max(self.gemm_flop_per_s, self.conv_flop_per_s)

    def attainable(self, intensity: float) -> float:
        """min(peak, intensity x bandwidth): the most FLOP/s a kernel of ``intensity`` FLOP/byte
        can reach under these ceilings."""
        return min(self.peak_flop_per_s, intensity * self.copy_bytes_per_s)

    @property
    def ridge_flop_per_byte(self) -> float:
        """The intensity where the bandwidth roof meets the compute roof."""
        return self.peak_flop_per_s / self.copy_bytes_per_s


@dataclass(frozen=True)
class RooflinePoint:
    """One kernel under the roof: its FLOPs (torch's counter), bytes (inputs + outputs) and
    seconds, per training step.

    Attributes:
        label: the training step, or an operator with its first input's shape.
        flops / traffic_bytes / seconds: per step.
        calls: how many calls the point sums (1 for the step).
    """

    label: str
    flops: float
    traffic_bytes: float
    seconds: float
    calls: int = 1

    @property
    def intensity_flop_per_byte(self) -> float:
        return self.flops / self.traffic_bytes if self.traffic_bytes else math.inf

    @property
    def flop_per_s(self) -> float:
        return self.flops / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Roofline:
    """A workload's training step against the machine's ceilings.

    Attributes:
        workload: the benchmark name. ceilings: `Ceilings`.
        step: the whole training step (FLOPs and bytes summed over its operators, seconds of the
            step as `mlhpc run` runs it). operators: the heaviest operators (most FLOPs).
        notes: how the figures were made, drawn under the plot.
    """

    workload: str
    ceilings: Ceilings
    step: RooflinePoint
    operators: list[RooflinePoint] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for point, raw in zip([self.step, *self.operators], [out["step"], *out["operators"]]):
            raw.update(intensity_flop_per_byte=point.intensity_flop_per_byte, flop_per_s=point.flop_per_s)
        return out


def roofline_figure(roof: Roofline) -> Figure:
    """Log-log FLOP/s against FLOP/byte: the bandwidth roof (``copy``), the GEMM and convolution
    ceilings as horizontal roofs, the step (a star) and each operator (a dot), every one named
    in the legend; the bytes' caveat (`TRAFFIC_NOTE`) and ``roof.notes`` under the axes."""
    c = roof.ceilings
    points = [roof.step, *roof.operators]
    xs = [p.intensity_flop_per_byte for p in points if p.flops > 0 and math.isfinite(p.intensity_flop_per_byte)]
    low = min(xs + [c.ridge_flop_per_byte]) / 10
    high = max(xs + [c.ridge_flop_per_byte]) * 10
    fig, ax = plt.subplots(figsize=(9, 6.5), layout="constrained")
    grid = [low * (high / low) ** (i / 200) for i in range(201)]
    ax.plot(grid, [min(x * c.copy_bytes_per_s, c.peak_flop_per_s) for x in grid], color="black", lw=1.5,
            label=f"copy bandwidth {c.copy_bytes_per_s / 1e9:.3g} GB/s", gid="roof-copy")
    for name, value, style, gid in (("GEMM", c.gemm_flop_per_s, "--", "roof-gemm"),
                                    ("convolution", c.conv_flop_per_s, ":", "roof-conv")):
        ax.axhline(value, color="black", ls=style, lw=1.2, gid=gid,
                   label=f"{name} {c.precision} {value / 1e9:.4g} GFLOP/s")
    cmap = plt.get_cmap("tab10")
    for i, point in enumerate(points):
        if point.flops <= 0 or point.seconds <= 0:
            continue
        is_step = i == 0
        ax.plot([point.intensity_flop_per_byte], [point.flop_per_s], "*" if is_step else "o",
                ms=16 if is_step else 7, color="crimson" if is_step else cmap((i - 1) % 10), ls="none",
                gid="point-step" if is_step else f"point-op-{i - 1}",
                label=(f"training step ({point.flop_per_s / 1e9:.3g} GFLOP/s)" if is_step
                       else f"{point.label} x{point.calls}"))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(low, high)
    ys = [p.flop_per_s for p in points if p.flops > 0 and p.seconds > 0] + [low * c.copy_bytes_per_s]
    ax.set_ylim(min(ys) / 2, c.peak_flop_per_s * 3)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # plain text, no mathtext
    ax.yaxis.set_major_formatter(EngFormatter(unit="FLOP/s", places=0))
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("FLOP/s (SI prefixes)")
    ax.set_title(f"{roof.workload}: training step and heaviest operators on {c.device} ({c.precision})")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower right")
    fig.text(0.01, 0.005, "\n".join([TRAFFIC_NOTE, *roof.notes]), fontsize=6.5, va="bottom", wrap=True)
    fig.get_layout_engine().set(rect=(0, 0.04 + 0.018 * len(roof.notes), 1, 0.96 - 0.018 * len(roof.notes)))
    return fig


def write_roofline(roof: Roofline, path: Path | str) -> Path:
    """Draw `roofline_figure` into ``path`` (PNG, 150 dpi) through `mlhpc.data.files` (atomic).

    Raises:
        OutputError: the PNG cannot be written (nothing half-written is left).
    """
    path = Path(path)
    with plot_text():  # names drawn as written, never read as mathtext
        fig = roofline_figure(roof)
        try:
            with atomic_output(path, 0o644) as tmp:  # the name asked for, never rewritten
                fig.savefig(tmp, dpi=150, format="png")
        except OSError as exc:
            raise OutputError(f"--roofline {path}: cannot write ({reason(exc)})") from None
        finally:
            plt.close(fig)
    return path
