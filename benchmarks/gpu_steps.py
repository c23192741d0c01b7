"""The training-step part of benchmarks/gpu.py: one step of each workload at a stated size, timed
in fp32 and in bf16 autocast (and compiled, where asked), with its FLOPs, MFU and peak memory.

The step is the harness's own (`mlhpc.run.step.Step` and `train_step`, the model wrapped by
`mlhpc.run.step.wrap_model`, the workload's model, loss, optimizer and scheduler built from its
config as `mlhpc.run.assemble.build` builds them), fed one batch that already lies on the device
in the decoded form the model reads. The batches are random, drawn in the shapes and dtypes of
the workload's decoded data (never zeros: METHOD.md), so no dataset has to be made first:

- CosmoFlow: float32 ``(B, 4, S, S, S)`` standardised log-counts ~ N(0, 1); targets U(-1, 1) (B, 4);
- DeepCAM: float32 ``(B, 16, H, W)`` ~ N(0, 1); labels int64 ``(B, H, W)`` in 0..2;
- OC20: B slab-like structures of ``atoms`` atoms (a jittered simple-cubic block, 2.6 A apart,
  under 15 A of vacuum; atomic numbers 1..83; OC20's structures hold 73 atoms on average),
  batched by the workload's own `collate`; the model builds its radius graph inside the step;
- OpenFold: `tests/openfold_model_batch.make_batch` (random features and an ideal-geometry chain).

FLOPs per sample are counted by `mlhpc.run.step.count_flops_on_meta` (torch's FlopCounterMode);
the peak comes from `mlhpc.run.step.device_peak` (the data-sheet table for known GPUs, a measured
matrix product elsewhere). Times are the median of per-step wall times, the device synchronised
after each step; peak memory is ``torch.cuda.max_memory_allocated`` over the timed steps.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # openfold_model_batch: the model tests' batches

from mlhpc import config as cfg  # noqa: E402
from mlhpc import runtime  # noqa: E402
from mlhpc import workload as workloads  # noqa: E402
from mlhpc.run.step import Step, count_flops_on_meta, device_peak, train_step, wrap_model  # noqa: E402

Batch = tuple[Any, Any]


@dataclass(frozen=True)
class Case:
    """One workload at one size: its config and overrides, the local batch, the batch maker's
    sizes, whether compile on/off is measured, and what the size is, in words."""

    workload: str
    config: str
    overrides: tuple[str, ...]
    batch: int
    sizes: dict[str, int]
    compile: bool
    size_words: str
    scaled_blocks: tuple[int, int] | None = None  # OpenFold: Evoformer blocks measured (a, b)


def _random_cosmoflow(case: Case, device: torch.device, gen: torch.Generator) -> Batch:
    s, b = case.sizes["side"], case.batch
    x = torch.randn(b, 4, s, s, s, generator=gen)
    return x.to(device), (torch.rand(b, 4, generator=gen) * 2 - 1).to(device)


def _random_deepcam(case: Case, device: torch.device, gen: torch.Generator) -> Batch:
    h, w, b = case.sizes["height"], case.sizes["width"], case.batch
    x = torch.randn(b, 16, h, w, generator=gen)
    return x.to(device), torch.randint(0, 3, (b, h, w), generator=gen).to(device)


def slab(atoms: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """One random slab-like OC20 structure of ``atoms`` atoms, as `Oc20Dataset` items are."""
    side = 4
    layers = -(-atoms // (side * side))
    grid = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), torch.arange(layers),
                                      indexing="ij"), -1).reshape(-1, 3)[:atoms].float()
    pos = grid * 2.6 + 0.2 * torch.randn(atoms, 3, generator=gen)
    cell = torch.diag(torch.tensor([side * 2.6, side * 2.6, layers * 2.6 + 15.0])).reshape(1, 3, 3)
    tags = torch.where(grid[:, 2] >= layers - 1, 1, 0)
    return {"atomic_numbers": torch.randint(1, 84, (atoms,), generator=gen), "pos": pos,
            "cell": cell, "natoms": torch.tensor(atoms), "tags": tags.long(),
            "fixed": grid[:, 2] < layers - 2, "forces": torch.randn(atoms, 3, generator=gen),
            "energy": torch.randn((), generator=gen)}


def _random_oc20(case: Case, device: torch.device, gen: torch.Generator) -> Batch:
    from mlhpc.data.loader import move
    from mlhpc_workloads.opencatalyst.data import collate

    x, y = collate([slab(case.sizes["atoms"], gen) for _ in range(case.batch)])
    return move(x, device), move(y, device)


def _random_openfold(case: Case, device: torch.device, gen: torch.Generator) -> Batch:
    from mlhpc.data.loader import move
    from mlhpc_workloads.openfold.data import INPUT_KEYS
    from openfold_model_batch import make_batch

    s = case.sizes
    batch = make_batch(n_res=s["crop"], n_seq=s["clusters"], n_extra=s["extra"],
                       n_templ=s["templates"], batch=case.batch,
                       seed=int(torch.randint(0, 2**31 - 1, (), generator=gen)))
    batch = move(batch, device)
    return {k: batch[k] for k in INPUT_KEYS}, batch


MAKERS: dict[str, Callable[[Case, torch.device, torch.Generator], Batch]] = {
    "cosmoflow": _random_cosmoflow, "deepcam": _random_deepcam, "oc20": _random_oc20,
    "openfold": _random_openfold}

#: The reference sizes (the workloads' closed configs); OpenFold's Evoformer is measured at two
#: depths and scaled to the reference's 48 blocks.
REFERENCE: tuple[Case, ...] = (
    Case("cosmoflow", "configs/cosmoflow.yaml", (), 8, {"side": 128}, True,
         "128^3 x 4 cubes, reference widths (configs/cosmoflow.yaml)"),
    Case("deepcam", "configs/deepcam.yaml", (), 2, {"height": 768, "width": 1152}, True,
         "768 x 1152 x 16 fields, reference widths (configs/deepcam.yaml)"),
    Case("oc20", "configs/opencatalyst.yaml", (), 8, {"atoms": 80}, False,
         "DimeNet++ at the reference widths (hidden 192, 3 blocks, cutoff 6 A), random slabs "
         "of 80 atoms"),
    Case("openfold", "configs/openfold.yaml", ("model.init_checkpoint=null",), 1,
         {"crop": 256, "clusters": 124, "extra": 1024, "templates": 4}, False,
         "crop 256, 124 MSA clusters, 1024 extra rows, 4 templates, reference widths",
         scaled_blocks=(2, 4)),
)

_TINY_DEEPCAM = ("model.entry_channels=[4,4,8,8,8]", "model.middle_blocks=1",
                 "model.exit_channels=[8,8,8,8]", "model.aspp_channels=8",
                 "model.low_level_channels=4", "model.decoder_channels=8")
#: Tiny sizes for ``--tiny`` (a CPU, seconds): the mini configs made smaller still.
TINY: tuple[Case, ...] = (
    Case("cosmoflow", "configs/cosmoflow-mini.yaml",
         ("model.input_size=16", "model.conv_channels=4", "model.n_conv_layers=3"), 2,
         {"side": 16}, True, "tiny: 16^3 x 4 cubes, 4 channels, 3 layers"),
    Case("deepcam", "configs/deepcam-mini.yaml", _TINY_DEEPCAM, 2,
         {"height": 32, "width": 48}, True, "tiny: 32 x 48 x 16 fields, narrow"),
    Case("oc20", "configs/opencatalyst-mini.yaml",
         ("model.hidden_channels=16", "model.out_emb_channels=16", "model.num_blocks=1"), 2,
         {"atoms": 12}, False, "tiny: DimeNet++ hidden 16, 1 block, slabs of 12 atoms"),
    Case("openfold", "configs/openfold-mini.yaml", ("model.structure_blocks=1", "model.init_checkpoint=null"), 1,
         {"crop": 16, "clusters": 4, "extra": 8, "templates": 1}, False,
         "tiny: mini widths, crop 16", scaled_blocks=(1, 2)),
)


@dataclass
class Timing:
    """Per-step wall times of one configuration (seconds), and its peak CUDA memory."""

    times_s: list[float] = field(default_factory=list)
    warmup_s: float = 0.0
    peak_memory_bytes: int | None = None

    @property
    def step_s(self) -> float:
        return statistics.median(self.times_s)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_step(config: cfg.Config, device: torch.device, precision: str,
               compile_setting: bool | str = False) -> tuple[Step, torch.nn.Module]:
    """The harness's step for ``config`` on ``device`` (as `mlhpc.run.assemble.build` makes it,
    without a dataset) and the bare model it trains."""
    workload = workloads.get(config.workload)
    torch.manual_seed(config.train.seed)
    model = workload.build_model(config.model).to(device).train()
    optimizer, scheduler = workload.build_optimizer(model, config, 100)
    rt = runtime.detect(env={}, device=device.type)
    wrapped = wrap_model(model, rt, compile_setting)
    return Step(wrapped, workload.build_loss(config), optimizer, scheduler, precision, device), model


def time_steps(step: Step, batch: Batch, warmup: int, steps: int, deadline: float) -> Timing:
    """``warmup`` untimed steps, then up to ``steps`` timed ones (at least one), stopping at
    ``deadline`` (``time.perf_counter`` seconds)."""
    x, y = batch
    out = Timing()
    start = time.perf_counter()
    for _ in range(warmup):
        train_step(step, x, y)
    _sync(step.device)
    out.warmup_s = time.perf_counter() - start
    cuda = step.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(step.device)
    while len(out.times_s) < steps and (not out.times_s or time.perf_counter() < deadline):
        t0 = time.perf_counter()
        train_step(step, x, y)
        _sync(step.device)
        out.times_s.append(time.perf_counter() - t0)
    if cuda:
        out.peak_memory_bytes = torch.cuda.max_memory_allocated(step.device)
    return out


def count_flops(case: Case, config: cfg.Config, batch: Batch) -> float:
    """Training FLOPs per sample (forward + backward) of ``config``'s model on ``batch``."""
    workload = workloads.get(config.workload)
    torch.manual_seed(0)
    model = workload.build_model(config.model).to(_device_of(batch)).train()
    x, y = batch
    count = count_flops_on_meta(model, x, workload.build_loss(config), y, n=case.batch)
    del model
    return count.train_flops


def _device_of(batch: Batch) -> torch.device:
    x = batch[0]
    return (x if isinstance(x, torch.Tensor) else next(iter(x.values()))).device


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


def measure_precision(config: cfg.Config, batch: Batch, precision: str, plan: dict[str, Any],
                      compile_setting: bool | str = False) -> dict[str, Any]:
    """One configuration's figures: step seconds (median), samples/s, steps timed, warm-up
    seconds (compile included), peak memory; ``{"skipped": why}`` when it fails."""
    device = _device_of(batch)
    deadline = min(plan["part_deadline"], time.perf_counter() + plan["slice_s"])
    try:
        step, model = build_step(config, device, precision, compile_setting)
        torch.manual_seed(1234)  # the same random draws (OpenFold's recycling) in every measurement
        timing = time_steps(step, batch, plan["warmup"], plan["steps"], deadline)
    except Exception as exc:  # noqa: BLE001 - a failure is this figure's result, said in one line
        return {"skipped": _one_line(exc)}
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    del step, model
    return {"step_s": timing.step_s, "samples_per_s": plan["batch"] / timing.step_s,
            "mean_step_s": statistics.fmean(timing.times_s),
            "steps_timed": len(timing.times_s), "times_s": timing.times_s,
            "warmup_s": timing.warmup_s, "peak_memory_bytes": timing.peak_memory_bytes}


def peaks(device: torch.device) -> dict[str, Any]:
    """``{precision: {"flop_per_s", "source"}}`` from `mlhpc.run.step.device_peak`."""
    out = {}
    for precision in ("fp32", "bf16"):
        value, source = device_peak(device, precision)
        out[precision] = {"flop_per_s": value, "source": source}
    return out


def load_config(case: Case, extra: tuple[str, ...] = ()) -> cfg.Config:
    return cfg.load(REPO / case.config, (*case.overrides, *extra))


def with_mfu(row: dict[str, Any], flops_per_sample: float, peak: float) -> dict[str, Any]:
    if "samples_per_s" in row:
        row["achieved_flop_per_s"] = flops_per_sample * row["samples_per_s"]
        row["mfu"] = row["achieved_flop_per_s"] / peak
    return row


def sample_bytes(case: Case, device: torch.device) -> int:
    """Bytes of one sample of ``case``'s batch as the step reads it (input and target)."""
    x, y = random_batch(case, device)

    def size(value: Any) -> int:
        if isinstance(value, torch.Tensor):
            return value.numel() * value.element_size()
        return sum(size(v) for v in value.values()) if isinstance(value, dict) else 0
    return int((size(x) + size({k: v for k, v in (y.items() if isinstance(y, dict) else ())
                                if not isinstance(x, dict) or k not in x}) +
                (size(y) if isinstance(y, torch.Tensor) else 0)) / case.batch)


def random_batch(case: Case, device: torch.device, seed: int = 0) -> Batch:
    return MAKERS[case.workload](case, device, torch.Generator().manual_seed(seed))


def _with_blocks(case: Case, blocks: int) -> Case:
    return dataclasses.replace(case, overrides=(*case.overrides, f"model.evoformer_blocks={blocks}"))


def _precisions(config: cfg.Config, batch: Batch, plan: dict[str, Any], flops: float,
                peak: dict[str, Any], into: dict[str, Any]) -> dict[str, Any]:
    """fp32 then bf16 figures into ``into`` (returned), ``plan["save"]()`` after each, so that
    a part stopped at its budget keeps what it measured."""
    for p in ("fp32", "bf16"):
        into[p] = with_mfu(measure_precision(config, batch, p, plan), flops, peak[p]["flop_per_s"])
        plan.get("save", lambda: None)()
    return into


def measure_case(case: Case, device: torch.device, plan: dict[str, Any], peak: dict[str, Any],
                 compile_note: str | None) -> dict[str, Any]:
    """Every figure of one workload: FLOPs per sample, fp32 and bf16 steps (MFU, memory), and
    compiled against eager in bf16 where ``case.compile`` and ``compile_note`` is None (else the
    note says why not). OpenFold's Evoformer is measured at two depths and scaled linearly to
    the reference's depth (`_scaled`)."""
    if case.scaled_blocks is not None:
        return _scaled(case, device, plan, peak)
    config = load_config(case)
    batch = random_batch(case, device)
    flops = count_flops(case, config, batch)
    out: dict[str, Any] = plan.get("out", {})
    out.update({"size": case.size_words, "batch": case.batch, "train_flops_per_sample": flops,
                "precisions": {}})
    _precisions(config, batch, plan, flops, peak, out["precisions"])
    if not case.compile:
        return out
    if compile_note is not None:
        out["compile"] = {"skipped": compile_note}
        return out
    compiled = measure_precision(config, batch, "bf16", {**plan, "warmup": 2}, True)
    eager = out["precisions"]["bf16"]
    if "step_s" in compiled and "step_s" in eager:
        compiled["compile_s"] = max(0.0, compiled["warmup_s"] - 2 * compiled["step_s"])
        compiled["speedup_over_eager"] = eager["step_s"] / compiled["step_s"]
    out["compile"] = compiled
    plan.get("save", lambda: None)()
    return out


def _scaled(case: Case, device: torch.device, plan: dict[str, Any], peak: dict[str, Any]
            ) -> dict[str, Any]:
    """OpenFold at ``case.scaled_blocks`` Evoformer depths (a, b), and each precision's step
    time and FLOPs carried linearly to the reference depth N: ``t_b + (N - b) (t_b - t_a) / (b - a)``.
    The step times are means, not medians: each step draws its recycling iterations (0 to
    ``num_recycling_iters``, as the reference), the same draws at both depths (one seed)."""
    depth = load_config(case).model.evoformer_blocks
    batch = random_batch(case, device)
    measured = {}
    for blocks in case.scaled_blocks or ():
        config = load_config(_with_blocks(case, blocks))
        flops = count_flops(case, config, batch)
        measured[blocks] = {"train_flops_per_sample": flops, "precisions": {}}
        plan.get("out", {})["measured"] = measured
        _precisions(config, batch, plan, flops, peak, measured[blocks]["precisions"])
    a, b = case.scaled_blocks or (0, 0)
    per = (depth - b) / (b - a)
    flops = measured[b]["train_flops_per_sample"] + per * (
        measured[b]["train_flops_per_sample"] - measured[a]["train_flops_per_sample"])
    scaled = {}
    for precision in ("fp32", "bf16"):
        ra, rb = measured[a]["precisions"][precision], measured[b]["precisions"][precision]
        if "step_s" not in ra or "step_s" not in rb:
            scaled[precision] = {"skipped": rb.get("skipped") or ra.get("skipped")}
            continue
        step_s = rb["mean_step_s"] + per * (rb["mean_step_s"] - ra["mean_step_s"])
        scaled[precision] = with_mfu({"step_s": step_s, "samples_per_s": case.batch / step_s,
                                      "peak_memory_bytes_at_measured_depth": rb["peak_memory_bytes"]},
                                     flops, peak[precision]["flop_per_s"])
    out: dict[str, Any] = plan.get("out", {})
    out.update({"size": case.size_words, "batch": case.batch, "reference_evoformer_blocks": depth,
                "measured_evoformer_blocks": [a, b], "measured": measured,
                "train_flops_per_sample": flops, "precisions": scaled,
                "scaled": f"Evoformer measured at {a} and {b} blocks, step time and FLOPs "
                          f"carried linearly to the reference's {depth}"})
    return out
