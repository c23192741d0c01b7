"""`mlhpc profile`: a few training steps under `torch.profiler`.

Reports time per operator type and per phase of a step (data, forward, backward, optimizer; DDP's
communication shows up in the operator table as ``gloo``/``nccl`` kernels), the memory breakdown
(parameters, gradients, optimizer state, activations saved for backward; `mlhpc.perf`), and
writes a Chrome trace that chrome://tracing and Perfetto open.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, record_function
from torch.utils.data import DataLoader

from mlhpc import perf, runtime
from mlhpc.loader import device_transform, make_loader, to_device
from mlhpc.config import Config
from mlhpc.train import ensure_data, local_batch_size

PHASES = ("data", "forward", "backward", "optimizer")


@dataclass
class ProfileResult:
    """What `profile` measured. Times in milliseconds per step, memory in bytes."""

    steps: int
    local_batch_size: int
    phase_ms: dict[str, float]
    operators: list[dict[str, Any]]  # name, calls, self_cpu_ms (and self_cuda_ms on GPUs), share
    memory: dict[str, Any]
    flops: dict[str, float]
    trace: str
    samples_per_s: float
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def profile(config: Config, steps: int = 5, warmup: int = 2, trace_path: Path | None = None,
            top: int = 15) -> ProfileResult:
    """Profile ``steps`` training steps of ``config``'s workload after ``warmup`` untimed ones.

    Raises:
        ConfigError, DataError: as `mlhpc.train.run`.
    """
    from mlhpc.workload import get as get_workload

    workload = get_workload(config.workload)
    rt = runtime.detect(device=config.train.device)
    if config.train.threads:
        torch.set_num_threads(config.train.threads)
    ensure_data(config, workload, rt)
    lbs = local_batch_size(config, rt)
    train_ds, _ = workload.build_datasets(config, rt, Path(config.data.path))
    torch.manual_seed(config.train.seed)
    model = workload.build_model(config.model).to(rt.device)
    loader = make_loader(train_ds, lbs, shuffle=True, drop_last=True,
                         num_workers=config.data.num_workers, device=rt.device)
    decode = device_transform(train_ds)
    optimizer, scheduler = workload.build_optimizer(model, config, max(1, len(loader)))
    loss_fn = workload.build_loss(config)

    x0, y0 = to_device(next(iter(loader)), rt.device, decode)
    flops = perf.count_flops_on_meta(model, x0, loss_fn, y0)
    scratch = copy.deepcopy(model)
    scratch_opt, _ = workload.build_optimizer(scratch, config, 1)
    memory = perf.memory_breakdown(scratch, scratch_opt, x0, loss_fn, y0)
    del scratch, scratch_opt

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if rt.device.type == "cuda" else [])
    sync = (lambda: torch.cuda.synchronize(rt.device)) if rt.device.type == "cuda" else (lambda: None)
    phase_s = {name: 0.0 for name in PHASES}
    model.train()
    iterator = iter(_cycle(loader))
    def one_step(timed: bool) -> None:
        t = time.perf_counter()
        with record_function("data"):
            x, y = to_device(next(iterator), rt.device, decode)
            sync()
        t = _lap(phase_s, "data", t, timed)
        with record_function("forward"):
            loss = loss_fn(model(x), y)
            sync()
        t = _lap(phase_s, "forward", t, timed)
        with record_function("backward"):
            loss.backward()
            sync()
        t = _lap(phase_s, "backward", t, timed)
        with record_function("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            sync()
        _lap(phase_s, "optimizer", t, timed)

    for _ in range(warmup):
        one_step(False)
    with torch.profiler.profile(activities=activities, record_shapes=False) as prof:
        wall0 = time.perf_counter()
        for _ in range(steps):
            one_step(True)
        wall = time.perf_counter() - wall0

    device_attr = "self_device_time_total" if rt.device.type == "cuda" else None
    averages = prof.key_averages()
    total_cpu = sum(e.self_cpu_time_total for e in averages) or 1.0
    rows = []
    for e in sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True):
        if e.key in PHASES or e.key.startswith("ProfilerStep"):
            continue
        row = {"name": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3 / steps,
               "share": e.self_cpu_time_total / total_cpu}
        if device_attr:
            row["self_device_ms"] = getattr(e, device_attr, 0) / 1e3 / steps
        rows.append(row)
    trace = Path(trace_path or f"profile-{workload.name}.json")
    trace.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(trace))
    return ProfileResult(
        steps=steps, local_batch_size=lbs,
        phase_ms={k: v * 1e3 / steps for k, v in phase_s.items()}, operators=rows[:top],
        memory=memory.to_dict(), flops=flops.to_dict(), trace=str(trace),
        samples_per_s=steps * lbs / wall if wall else 0.0,
        notes=["phase times include profiler overhead; the operator table is per step"])


def _lap(acc: dict[str, float], name: str, since: float, timed: bool) -> float:
    now = time.perf_counter()
    if timed:
        acc[name] += now - since
    return now


def _cycle(loader: DataLoader):
    while True:
        yield from loader
