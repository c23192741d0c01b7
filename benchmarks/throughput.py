"""Training-step throughput and MFU of one workload at a chosen size, data loading excluded.

One real batch of the workload's own data (synthesised first when missing, as `mlhpc run` does)
is decoded once and kept on the device; the timed loop calls `mlhpc.run.step.train_step`, the step
`mlhpc run` trains with (forward, loss, backward, optimizer and scheduler step), on the parts
`mlhpc run` trains (`mlhpc.run.assemble.build`: the config's model, optimizer, ``train.compile`` mode
and ``model.channels_last`` switch); ``--precision bf16``
runs it under bf16 autocast on any device. This is the compute ceiling the data path has to keep fed
(`benchmarks/run.py` measures the data path). FLOPs per sample are counted with
torch.utils.flop_counter.FlopCounterMode (`mlhpc.run.step.count_flops_on_meta`); the peak comes from
`mlhpc.run.step.device_peak` (a data-sheet entry for known GPUs, else a measured matrix product; the
source is printed with it).

Usage (the reference CosmoFlow in bf16 on a GPU, 64 synthetic cubes of 128^3 x 4):

    python benchmarks/throughput.py configs/cosmoflow.yaml --batch 32 --precision bf16 \\
        --set data.path=/tmp/cosmoflow-128 --set synth.cube_size=128 \\
        --set synth.train_samples=64 --set synth.eval_samples=8 \\
        --set model.channels_last=true --json cosmoflow-h100.json

Prints one line and, with ``--json``, writes every figure. Exit status 2 with one line on bad
input (config, data).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlhpc import workload as workloads  # noqa: E402
from mlhpc import config as cfg  # noqa: E402
from mlhpc import runtime  # noqa: E402
from mlhpc.run import assemble  # noqa: E402
from mlhpc.errors import MlhpcError  # noqa: E402
from mlhpc.run.step import compile_mode, device_peak, train_step  # noqa: E402
from mlhpc.data.ready import ensure_data  # noqa: E402
from mlhpc.data.files import write_text_atomic  # noqa: E402
from mlhpc.text import echo  # noqa: E402


def one_batch(config: cfg.Config, batch_size: int, precision: str,
              device: str) -> tuple[assemble.Job, assemble.Parts, torch.Tensor, Any]:
    """The run's parts (`mlhpc.run.assemble.build`: model, optimizer, compiled step) at local batch
    ``batch_size`` and ``precision`` (``"fp32"`` or ``"bf16"``) on ``device``, the data
    synthesised first when missing (as `mlhpc run`), and ``(x, y)``: their first training batch,
    decoded on the device (``x`` of shape ``(batch_size, ...)``). Returns ``(job, parts, x, y)``;
    benchmarks/power_overhead.py times the same step on it.

    Raises:
        ConfigError, DataError: as `mlhpc run`; DataError also when the training split holds
            fewer than ``batch_size`` samples.
    """
    from mlhpc.errors import DataError

    rt = runtime.detect(device=device)
    if config.train.threads:
        torch.set_num_threads(config.train.threads)
    job = assemble.tool_job(config, workloads.get(config.workload), rt)
    ensure_data(config, job.workload, rt)
    parts = assemble.build(job, None, batch_size, precision_name=precision)
    if len(parts.train_ds) < batch_size:
        raise DataError(f"{config.data.path}: {len(parts.train_ds)} training samples, fewer than "
                        f"the batch of {batch_size}")
    x, y = next(iter(parts.train_loader))  # on the device, decoded
    return job, parts, x, y


def measure(config: cfg.Config, batch_size: int, steps: int, warmup: int, precision: str,
            device: str) -> dict:
    """Samples/s, FLOPs per sample, achieved FLOP/s and MFU of ``steps`` timed training steps
    after ``warmup`` untimed ones (compilation happens there), local batch ``batch_size``.

    Raises:
        ConfigError, DataError: as `one_batch`.
    """
    job, parts, x, y = one_batch(config, batch_size, precision, device)
    rt, workload, model, flops, train = job.rt, job.workload, parts.model, parts.flops, parts.step
    mode = compile_mode(config.train.compile)
    cuda = rt.device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(rt.device)

    def step() -> None:
        train_step(train, x, y)

    model.train()
    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    sync()
    warmup_s = time.perf_counter() - t0
    if cuda:
        torch.cuda.reset_peak_memory_stats(rt.device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    timed_s = time.perf_counter() - t0

    samples_per_s = steps * batch_size / timed_s
    achieved = flops.train_flops * samples_per_s
    peak, peak_source = device_peak(rt.device, precision)
    return {
        "workload": workload.name, "device": (torch.cuda.get_device_name(rt.device) if cuda
                                              else f"cpu ({torch.get_num_threads()} threads)"),
        "torch": torch.__version__, "precision": precision, "compile": mode,
        "model_settings": workload.model_settings(config.model),
        "sample_shape": list(x.shape[1:]), "batch_size": batch_size, "steps": steps,
        "warmup_steps": warmup, "warmup_s": warmup_s, "timed_s": timed_s,
        "samples_per_s": samples_per_s, "forward_flops_per_sample": flops.forward_flops,
        "train_flops_per_sample": flops.train_flops, "achieved_flop_per_s": achieved,
        "peak_flop_per_s": peak, "peak_source": peak_source, "mfu": achieved / peak,
        "parameters": sum(p.numel() for p in model.parameters()),
        "cuda_peak_memory_bytes": torch.cuda.max_memory_allocated(rt.device) if cuda else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a config value (repeatable)")
    parser.add_argument("--batch", type=int, default=None,
                        help="local batch size (default: train.global_batch_size)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = parser.parse_args()
    try:
        config = cfg.load(args.config, tuple(args.overrides))
        batch = args.batch or config.train.global_batch_size
        result = measure(config, batch, args.steps, args.warmup, args.precision, args.device)
    except MlhpcError as exc:
        echo(f"throughput: {exc}", err=True)
        sys.exit(2)
    echo(f"{result['workload']} {tuple(result['sample_shape'])} batch {batch} "
         f"{result['precision']} on {result['device']}: {result['samples_per_s']:,.1f} samples/s, "
         f"{result['train_flops_per_sample'] / 1e9:.3f} GFLOP/sample, "
         f"{result['achieved_flop_per_s'] / 1e12:.3f} TFLOP/s, MFU {result['mfu']:.1%} "
         f"({result['peak_source']})")
    if args.json:
        write_text_atomic(args.json, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
