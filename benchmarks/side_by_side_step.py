"""The training-step comparisons of benchmarks/side_by_side.py: the harness against a bare PyTorch
loop, and ``train.compile`` on against off.

Both sides train on the same few batches of the workload's own data, read once through the
training loader, decoded on the device and kept there, so that neither side reads or decodes
anything while it is timed. One call of a side's work is one pass over those batches (one
training step each) and returns the samples stepped on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from side_by_side_core import LoadWatch, Measured, Skipped, calibrate, interleave
from throughput import one_batch

from mlhpc import config as cfg
from mlhpc.run.step import train_step


@dataclass
class Prepared:
    """The parts `mlhpc run` builds for ``config`` (``job``, ``parts``: throughput.py's
    `one_batch`, i.e. `mlhpc.run.assemble.build`) and ``batches``: ``(x, y, samples)`` on the
    device, the first batches of the training loader."""

    config: cfg.Config
    job: Any
    parts: Any
    batches: list[tuple[Any, Any, int]]

    def sync(self) -> None:
        if self.job.rt.device.type == "cuda":
            torch.cuda.synchronize(self.job.rt.device)


def prepare(config: cfg.Config, device: str, max_batches: int) -> Prepared:
    """The run's parts at the config's global batch size (one process, so it is the local
    batch) and up to ``max_batches`` training batches on the device.

    Raises:
        ConfigError, DataError: as `mlhpc run` (the data are synthesised when missing and the
            config allows it).
    """
    job, parts, _, _ = one_batch(config, config.train.global_batch_size, "fp32", device)
    dataset = parts.train_ds
    batches = []
    for x, y in parts.train_loader:  # on the device, decoded
        batches.append((x, y, dataset.batch_len(x)))
        if len(batches) == max_batches:
            break
    return Prepared(config, job, parts, batches)


def mlhpc_work(prep: Prepared, step: Any) -> Callable[[], int]:
    """One pass of `mlhpc.run.step.train_step` (the step `mlhpc run` trains with) over the batches."""
    def work() -> int:
        for x, y, _ in prep.batches:
            train_step(step, x, y)
        prep.sync()
        return sum(n for _, _, n in prep.batches)
    return work


def bare_work(prep: Prepared) -> Callable[[], int]:
    """One pass of a bare PyTorch loop over the batches: the workload's model, loss, optimizer
    and scheduler built directly (same seed), forward, loss, backward, optimizer step, zero_grad,
    scheduler step."""
    workload, config, device = prep.job.workload, prep.config, prep.job.rt.device
    torch.manual_seed(config.train.seed)
    model = workload.build_model(config.model).to(device).train()
    optimizer, scheduler = workload.build_optimizer(model, config, len(prep.parts.train_loader))
    loss_fn = workload.build_loss(config)

    def work() -> int:
        for x, y, _ in prep.batches:
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if scheduler is not None:
                scheduler.step()
        prep.sync()
        return sum(n for _, _, n in prep.batches)
    return work


def harness(prep: Prepared, repeats: int, min_s: float, load: LoadWatch) -> Measured:
    """`mlhpc run`'s training step on its parts vs the bare loop, samples/s."""
    prep.parts.model.train()
    sides = (calibrate(mlhpc_work(prep, prep.parts.step), min_s),
             calibrate(bare_work(prep), min_s))
    result = interleave("harness", "samples/s", sides, repeats, load)
    result.goal = 0.95
    result.sides = {"mlhpc": "mlhpc.run.step.train_step on the parts mlhpc.run.assemble.build makes "
                             "(benchmarks/throughput.py one_batch)",
                    "reference": "bare PyTorch loop: the workload's model, loss, optimizer and "
                                 "scheduler built directly; forward, backward, step, zero_grad"}
    result.extra.update(batches=len(prep.batches), batch_size=prep.config.train.global_batch_size)
    return result


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:160]}"


def compile_switch(prep: Prepared, compiled_config: cfg.Config, repeats: int, min_s: float,
                   load: LoadWatch) -> Measured:
    """The step with ``train.compile: true`` (mlhpc side) vs the same step eager (reference
    side), samples/s; the compilation (first pass over the batches, less a steady pass) is
    reported apart in ``extra``.

    Raises:
        Skipped: torch.compile failed on this workload here (its first line said).
    """
    compiled = prepare(compiled_config, str(prep.job.rt.device), len(prep.batches))
    compiled.batches = prep.batches  # the very same tensors on both sides
    compiled.parts.model.train()
    prep.parts.model.train()
    work = mlhpc_work(compiled, compiled.parts.step)
    start = time.perf_counter()
    try:
        work()  # compiles (and, for batches of varying shapes, recompiles with dynamic shapes)
        first_pass_s = time.perf_counter() - start
        timed = calibrate(work, min_s)  # a second pass: what is left to compile, warm-up
    except Exception as exc:  # noqa: BLE001 - any compiler failure is this comparison's result
        raise Skipped(f"torch.compile failed on this CPU after {time.perf_counter() - start:.1f} "
                      f"s ({_first_line(exc)})") from None
    eager = calibrate(mlhpc_work(prep, prep.parts.step), min_s)
    result = interleave("compile", "samples/s", (timed, eager), repeats, load)
    steady_pass_s = sum(n for _, _, n in prep.batches) / result.mlhpc
    eager_pass_s = sum(n for _, _, n in prep.batches) / result.reference
    compile_s = max(0.0, first_pass_s + timed.warmup_s - 2 * steady_pass_s)
    saved_per_step_s = (eager_pass_s - steady_pass_s) / len(prep.batches)
    result.sides = {"mlhpc": "train.compile: true (torch.compile, default mode)",
                    "reference": "train.compile: false (eager), the same step"}
    result.extra.update(compile_s=compile_s, first_pass_s=first_pass_s,
                        second_pass_s=timed.warmup_s, steady_pass_s=steady_pass_s,
                        eager_pass_s=eager_pass_s,
                        break_even_steps=(compile_s / saved_per_step_s if saved_per_step_s > 0
                                          else None))
    return result
