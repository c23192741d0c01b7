"""`mlhpc profile`: a few training steps under `torch.profiler`.

The profiled step is `mlhpc.run.step.train_step`, the one `mlhpc run` trains with: the model compiled
as ``train.compile`` says, wrapped in DistributedDataParallel when the job has several ranks (or
a process group: ``torchrun --nproc-per-node 1`` gives a one-rank group), under bf16 autocast when
``train.amp`` is on a CUDA device. Reports time per operator type and per phase of a step (data,
forward, backward, optimizer; DDP's communication shows up in the operator table as
``gloo``/``nccl`` kernels), the memory breakdown (parameters, gradients, optimizer state,
activations saved for backward; `mlhpc.run.step`), and writes a Chrome trace that chrome://tracing
and Perfetto open (by default ``<output.dir>/profile/<workload>-trace.json``, `default_trace`).
With ``--roofline PNG`` it measures the machine's ceilings at the step's precision and draws the
step and its heaviest operators under them (`mlhpc.run.roofline`, HPC AI500's roofline).
The model, loaders, optimizer and step are those of a run: `mlhpc.run.assemble.build` makes them.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch
from torch.profiler import ProfilerActivity, record_function

from mlhpc import runtime
from mlhpc.run.result import check_output_dir

from mlhpc.run import assemble
from mlhpc.data.files import atomic_output
from mlhpc.data.outputs import output_file
from mlhpc.run.roofline_figure import Roofline, write_roofline
from mlhpc.config import Config
from mlhpc.errors import ConfigError, OutputError
from mlhpc.data.ready import ensure_data
from mlhpc.runtime import Runtime
from mlhpc.run import roofline as rooflines
from mlhpc.run.step import Step, compile_mode, memory_breakdown, train_step
from mlhpc.run.train import local_batch_size
from mlhpc.workload import get as get_workload

PHASES = ("data", "forward", "backward", "optimizer")
MAX_STEPS = 100_000  # profiled or warm-up steps: a profile, not a run


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
    distributed: bool = False  # the step ran under DistributedDataParallel
    precision: str = "fp32"  # "bf16": autocast, as train.amp on CUDA
    compile: str | None = None  # the torch.compile mode, None: eager
    notes: list[str] = field(default_factory=list)
    roofline: dict[str, Any] | None = None  # `mlhpc.run.roofline_figure.Roofline.to_dict`, with --roofline
    roofline_png: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


@dataclass(frozen=True)
class _Plan:
    """What `profile` was asked for: steps, warm-up steps, the trace file, operators listed, the
    roofline PNG (None: none)."""

    steps: int
    warmup: int
    trace: Path
    top: int
    roofline: Path | None


def profile(config: Config, steps: int = 5, warmup: int = 2, trace_path: Path | None = None,
            top: int = 15, roofline_path: Path | None = None) -> ProfileResult:
    """Profile ``steps`` training steps of ``config``'s workload after ``warmup`` untimed ones.

    Sets up (and tears down) the job's process group as `mlhpc.run.command.run` does, so DDP and its
    all-reduce are in the profile whenever they would be in a run.

    Raises:
        ConfigError: ``steps`` outside 1 .. `MAX_STEPS` or ``warmup`` outside 0 .. `MAX_STEPS`;
            otherwise as `mlhpc.run.command.run`.
        DataError: as `mlhpc.run.command.run`.
        OutputError: the trace file's folder cannot be written (checked before any step runs)
            or the trace cannot be written (no partial file is left).

    The Chrome trace goes to ``trace_path``, by default `default_trace` (under the config's
    ``output.dir``); `ProfileResult.trace` names the file written. With ``roofline_path`` the
    roofline PNG goes there (its folder checked first, like the trace's) and
    `ProfileResult.roofline` holds its figures.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise ConfigError(f"profile --steps {steps}: must be an integer from 1 to {MAX_STEPS}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or not 0 <= warmup <= MAX_STEPS:
        raise ConfigError(f"profile --warmup {warmup}: must be an integer from 0 to {MAX_STEPS}")
    trace = output_file(trace_path, "--trace") if trace_path is not None else default_trace(config)
    if trace.is_dir():
        raise OutputError(f"--trace {trace}: is a folder; give a file name")
    check_output_dir(trace.parent if str(trace.parent) else Path("."),
                            key="--trace folder" if trace_path is not None else "output.dir")
    if roofline_path is not None:
        roofline_path = output_file(roofline_path, "--roofline")  # used as given or refused
        check_output_dir(roofline_path.parent if str(roofline_path.parent) else Path("."), key="--roofline folder")
    with runtime.started(config.train.device, threads=config.train.threads) as (rt, _):
        return _profile(config, rt, _Plan(steps, warmup, trace, top, roofline_path))


def default_trace(config: Config) -> Path:
    """Where the trace goes without ``--trace``: ``<output.dir>/profile/<workload>-trace.json``,
    beside the config's runs, never the current folder."""
    return Path(config.output.dir) / "profile" / f"{config.workload}-trace.json"


def _profile(config: Config, rt: Runtime, plan: _Plan) -> ProfileResult:
    steps = plan.steps
    job = assemble.tool_job(config, get_workload(config.workload), rt)
    ensure_data(config, job.workload, rt)
    lbs = local_batch_size(config, rt)
    parts = assemble.build(job, None, lbs)  # the run's parts: model, loaders, optimizer, step
    step, loader = parts.step, parts.train_loader
    x0, y0 = next(iter(loader))  # on the device, decoded
    scratch, scratch_opt = assemble.scratch_copy(job, parts.model)
    memory = memory_breakdown(scratch, scratch_opt, x0, step.loss_fn, y0)

    timer = _PhaseTimer(rt.device)
    step.model.train()
    batches = _cycle(loader)
    for _ in range(plan.warmup):
        timer.step(step, batches, timed=False)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if rt.device.type == "cuda" else [])
    with torch.profiler.profile(activities=activities, record_shapes=False) as prof:
        wall0 = time.perf_counter()
        for _ in range(steps):
            timer.step(step, batches, timed=True)
        wall = time.perf_counter() - wall0
    trace = _write_trace(prof, plan.trace)
    result = ProfileResult(
        steps=steps, local_batch_size=lbs,
        phase_ms={k: v * 1e3 / steps for k, v in timer.seconds.items()},
        operators=_operators(prof, steps, rt.device, plan.top), memory=memory.to_dict(),
        flops=parts.flops.to_dict(), trace=str(trace), samples_per_s=steps * lbs / wall if wall else 0.0,
        distributed=rt.distributed, precision=step.precision,
        compile=compile_mode(config.train.compile),
        notes=["phase times include profiler overhead; the operator table is per step"])
    if plan.roofline is not None:
        roof = _roofline(job, parts, (x0, y0), steps)
        result.roofline = roof.to_dict()
        result.roofline_png = str(write_roofline(roof, plan.roofline))
    return result


def _roofline(job: Any, parts: Any, batch: tuple[Any, Any], steps: int) -> Roofline:
    """The step's roofline (`mlhpc.run.roofline`): ``steps`` of the run's own step on ``batch``
    timed (no profiler, no data loading), one eager step's operators tallied on a scratch copy,
    the machine's ceilings at the step's precision."""
    step, (x, y) = parts.step, batch
    step.model.train()
    train_step(step, x, y)  # settles a compiled step before it is timed
    if step.device.type == "cuda":
        torch.cuda.synchronize(step.device)
    t0 = time.perf_counter()
    for _ in range(steps):
        train_step(step, x, y)
    if step.device.type == "cuda":
        torch.cuda.synchronize(step.device)
    step_s = (time.perf_counter() - t0) / steps
    scratch, scratch_opt = assemble.scratch_copy(job, parts.model)
    tally = rooflines.tally_step(scratch, scratch_opt, step, x, y)
    ceilings = rooflines.measure_ceilings(step.device, step.precision)
    return rooflines.roofline(job.workload.name, ceilings, tally, step_s)


def _write_trace(prof: Any, trace: Path) -> Path:
    """Export the Chrome trace to ``trace`` through a temporary sibling renamed into place
    (`mlhpc.data.files.atomic_output`: created new, never through a link; the file is 0600).

    Raises:
        OutputError: it cannot be written (the temporary file is removed)."""
    try:
        with atomic_output(trace) as tmp:  # the project's temporary name; no link followed
            prof.export_chrome_trace(str(tmp))
    except OSError as exc:
        raise OutputError(f"--trace {trace}: cannot write the trace ({exc.strerror or exc})") from None
    return trace


class _PhaseTimer:
    """Runs `train_step` with each phase under `record_function` and timed (device synced)."""

    def __init__(self, device: torch.device) -> None:
        self.seconds = {name: 0.0 for name in PHASES}
        self.timed = False
        self._sync = ((lambda: torch.cuda.synchronize(device)) if device.type == "cuda"
                      else (lambda: None))

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        with record_function(name):
            yield
            self._sync()
        if self.timed:
            self.seconds[name] += time.perf_counter() - t0

    def step(self, step: Step, batches: Iterator, timed: bool) -> None:
        self.timed = timed
        with self.phase("data"):
            x, y = next(batches)  # drawn, moved and decoded
        train_step(step, x, y, last_micro=True, phase=self.phase)


def _operators(prof: Any, steps: int, device: torch.device, top: int) -> list[dict[str, Any]]:
    """The ``top`` operators by self CPU time per step (and self device time on a GPU)."""
    device_attr = "self_device_time_total" if device.type == "cuda" else None
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
    return rows[:top]


def _cycle(loader: Iterable) -> Iterator:
    while True:
        yield from loader
