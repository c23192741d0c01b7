"""Benchmarks of mlhpc itself, each measured in one run, side by side (writes BENCHMARKS.md rows).

1. Harness overhead: mlhpc's training loop (`mlhpc.run.command.run`: samplers, stop checks, compliance
   log, evaluation excluded) vs a bare PyTorch loop, same mini CosmoFlow model, same in-memory
   data, same batch size; ratio of training samples/s.
2. Data path: mlhpc's CosmoFlow training loader (`mlhpc.data.loader.make_loader` over
   `CosmoFlowDataset`: memory-mapped HDF5 -> int16 batches; decode happens on the device) vs a raw
   h5py read of the same files (bytes/s), vs torch's stock DataLoader over the same bytes already
   in memory, and vs the samples/s training consumes; plus what the on-device decode costs, and
   training from the files vs training from pre-decoded memory.
3. Staging: `mlhpc.data.stage.stage` (copy + XXH3-128 manifest + verify) vs `cp -r` of the same tree
   (GB/s ratio), alternating, best of ``--repeats`` each.

Usage: python benchmarks/run.py [--data data/cosmoflow-mini] [--out BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import torch
from torch.utils.data import DataLoader, TensorDataset

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlhpc import workload as workloads  # noqa: E402
from mlhpc import config as cfg  # noqa: E402
from mlhpc import runtime  # noqa: E402
from mlhpc.run import command  # noqa: E402
from mlhpc.data import loader  # noqa: E402
from mlhpc.data import stage as staging  # noqa: E402
from mlhpc.data.claims import make_claimed_dir, remove_claimed  # noqa: E402
from mlhpc.data.files import write_text_atomic  # noqa: E402
from mlhpc.data.inputs import read_text_input  # noqa: E402
from mlhpc.data.stage.copies import remove_copy  # noqa: E402
from mlhpc.data.statefiles import record_tree, recording  # noqa: E402
from mlhpc.text import echo  # noqa: E402
from mlhpc.workload import WorkloadDataset  # noqa: E402
from mlhpc_workloads.cosmoflow import WORKLOAD as COSMOFLOW  # noqa: E402

MINI = REPO / "configs" / "cosmoflow-mini.yaml"
#: The most bytes ``/proc/cpuinfo`` may hold (a few KiB a core).
CPUINFO_BYTES = 16 << 20


def mini_config(data: Path, out: Path, *overrides: str) -> cfg.Config:
    return cfg.load(MINI, (f"data.path={data}", f"output.dir={out}", "data.staging.enabled=false",
                           "data.synthesize_if_missing=false", *overrides))


class InMemory(TensorDataset, WorkloadDataset):
    """Tensors held in memory, as a workload's dataset (torch's default collate, no decoding)."""


def in_memory(config: cfg.Config, data: Path, n: int) -> InMemory:
    """The first ``n`` training samples decoded once, as the model's float32 input."""
    ds, _ = COSMOFLOW.build_datasets(config, runtime.Runtime(), data)
    x, y = ds.__getitems__(range(min(n, len(ds))))
    return InMemory(ds.device_transform(x), y)


def _steady_rate(samples: int, epoch_times_s: list[float]) -> float:
    """Samples/s over the epochs after the first (epoch 1 warms up)."""
    return samples * (len(epoch_times_s) - 1) / sum(epoch_times_s[1:])


def _bare_loop(config: cfg.Config, memory: TensorDataset, samples: int, epochs: int) -> float:
    """Samples/s of the steady epochs (2..epochs) of a plain PyTorch loop on ``memory``."""
    torch.manual_seed(config.train.seed)
    model = COSMOFLOW.build_model(config.model)
    optimizer, scheduler = COSMOFLOW.build_optimizer(model, config,
                                                     samples // config.train.global_batch_size)
    batches = DataLoader(memory, batch_size=config.train.global_batch_size, shuffle=True)
    loss_fn = COSMOFLOW.build_loss(config)
    times = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        for x, y in batches:
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
        times.append(time.perf_counter() - t0)
    return _steady_rate(samples, times)


def bench_harness(data: Path, samples: int, epochs: int, repeats: int) -> dict:
    """`mlhpc.run.command.run` on pre-decoded in-memory data vs `_bare_loop` on the same tensors,
    alternating, best of ``repeats`` each; epoch 1 of each warms up and is not counted."""
    with tempfile.TemporaryDirectory() as tmp:
        config = mini_config(data, Path(tmp) / "out", f"train.max_epochs={epochs}", "train.target=-1")
        memory = in_memory(config, data, samples)
        evalset = InMemory(memory.tensors[0][:config.train.global_batch_size],
                                memory.tensors[1][:config.train.global_batch_size])
        workloads.register(replace=True, workload=dataclasses.replace(
            COSMOFLOW, name="cosmoflow-in-memory",
            build_datasets=lambda c, rt, d: (memory, evalset)))
        config = cfg.from_dict({**config.to_dict(), "workload": "cosmoflow-in-memory"})
        harness, bare = [], []
        for repeat in range(repeats):
            result = command.run(config)
            harness.append(_steady_rate(samples, result.summary["train_epoch_s"]))
            bare.append(_bare_loop(config, memory, samples, epochs))
    return {"harness_samples_per_s": max(harness), "bare_samples_per_s": max(bare),
            "ratio": max(harness) / max(bare), "samples": samples, "epochs_timed": epochs - 1,
            "repeats": repeats, "harness_all": harness, "bare_all": bare}


def _raw_read(files: list[Path]) -> int:
    nbytes = 0
    for path in files:
        with h5py.File(path, "r") as f:
            nbytes += f["full"][...].nbytes + f["unitPar"][...].nbytes
    return nbytes


def bench_data(data: Path, workers: list[int], repeats: int,
               train_samples_per_s: float | None) -> dict:
    """mlhpc's training loader (as `mlhpc.run.train` builds it: shuffled, the mini config's batch size)
    for one epoch vs a raw h5py read of the same files, whole shards, no shuffling; the page cache
    is warmed first and the two alternate, best of ``repeats`` each."""
    files = sorted((data / "train").glob("*.h5"))
    nbytes = _raw_read(files)  # warm the page cache
    config = mini_config(data, Path(tempfile.gettempdir()))
    lbs = config.train.global_batch_size
    ds, _ = COSMOFLOW.build_datasets(config, runtime.Runtime(), data)
    # the same bytes already in memory, through torch's stock DataLoader (default_collate)
    memory = TensorDataset(*ds.__getitems__(range(len(ds))))
    raw_best = float("inf")
    loader_best = {w: float("inf") for w in workers}
    stock_best = {w: float("inf") for w in workers}

    def epoch(batches: DataLoader) -> float:
        t0 = time.perf_counter()
        n = sum(x.shape[0] for x, _ in batches)
        assert n == len(ds)
        return time.perf_counter() - t0

    for _ in range(repeats):
        t0 = time.perf_counter()
        _raw_read(files)
        raw_best = min(raw_best, time.perf_counter() - t0)
        for w in workers:  # a fresh DataLoader each time, as each training run starts one
            loader_best[w] = min(loader_best[w],
                                 epoch(loader.make_loader(ds, lbs, shuffle=True, num_workers=w)))
            stock_best[w] = min(stock_best[w],
                                epoch(DataLoader(memory, batch_size=lbs, shuffle=True,
                                                 num_workers=w)))
    # context: h5py called once per sample in the same shuffled order (the loader's earlier design)
    handles = [h5py.File(path, "r") for path in files]
    per_file = handles[0]["full"].shape[0]
    t0 = time.perf_counter()
    for i in torch.randperm(len(ds)).tolist():
        handles[i // per_file]["full"][i % per_file]
        handles[i // per_file]["unitPar"][i % per_file]
    per_sample_h5py_s = time.perf_counter() - t0
    for handle in handles:
        handle.close()
    # decoding moved to the device: what it costs per sample there (here, the CPU)
    x, _ = ds.__getitems__(range(lbs))
    ds.device_transform(x)
    t0 = time.perf_counter()
    rounds = 200
    for _ in range(rounds):
        ds.device_transform(x)
    decode_samples_per_s = rounds * lbs / (time.perf_counter() - t0)
    raw_bps = nbytes / raw_best
    out = {"files": len(files), "bytes": nbytes, "samples": len(ds), "batch_size": lbs,
           "memory_mapped": ds.memory_mapped, "raw_h5py_bytes_per_s": raw_bps,
           "per_sample_h5py_bytes_per_s": nbytes / per_sample_h5py_s,
           "repeats": repeats, "decode_on_device_samples_per_s": decode_samples_per_s,
           "loaders": {}}
    for w in workers:
        row = {"bytes_per_s": nbytes / loader_best[w], "samples_per_s": len(ds) / loader_best[w],
               "vs_raw": raw_best / loader_best[w],
               "stock_in_memory_bytes_per_s": nbytes / stock_best[w],
               "vs_stock_in_memory": stock_best[w] / loader_best[w]}
        if train_samples_per_s:
            row["vs_training"] = row["samples_per_s"] / train_samples_per_s
        out["loaders"][f"num_workers={w}"] = row
    if train_samples_per_s:
        out["train_samples_per_s"] = train_samples_per_s
    return out


def bench_from_files(data: Path, samples: int, epochs: int, repeats: int,
                     in_memory_samples_per_s: float) -> dict:
    """`mlhpc.run.command.run` on the mini config reading HDF5 through the loader (decode on the device)
    vs the same run on pre-decoded in-memory tensors (`bench_harness`): what the data path costs
    training. Best of ``repeats``; epoch 1 warms up and is not counted."""
    rates = []
    with tempfile.TemporaryDirectory() as tmp:
        batch = mini_config(data, Path(tmp)).train.global_batch_size
        for repeat in range(repeats):
            config = mini_config(data, Path(tmp) / f"out{repeat}", f"train.max_epochs={epochs}",
                                 "train.target=-1", f"data.train_samples={samples}",
                                 f"data.eval_samples={batch}")
            result = command.run(config)
            rates.append(_steady_rate(samples, result.epoch_times_s))
    return {"from_files_samples_per_s": max(rates),
            "in_memory_samples_per_s": in_memory_samples_per_s,
            "ratio": max(rates) / in_memory_samples_per_s, "samples": samples,
            "epochs_timed": epochs - 1, "repeats": repeats, "from_files_all": rates}


def bench_staging(data: Path, repeats: int) -> dict:
    total = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    cp_best, stage_best = float("inf"), float("inf")
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            folder = make_claimed_dir(Path(tmp) / f"cp{i}", "scratch")
            t0 = time.perf_counter()
            subprocess.run(["cp", "-r", str(data), str(folder / "data")], check=True)
            cp_best = min(cp_best, time.perf_counter() - t0)
            with recording(folder):  # what cp made there: all the removal may delete
                record_tree(folder / "data")
            remove_claimed(folder, "scratch", "benchmark scratch folder")
            dest = Path(tmp) / f"stage{i}"
            t0 = time.perf_counter()
            staging.stage(data, dest, runtime.Runtime(), staging.StageOptions(workers=4))
            stage_best = min(stage_best, time.perf_counter() - t0)
            remove_copy(dest)
    return {"bytes": total, "cp_r_gb_per_s": total / cp_best / 1e9,
            "stage_gb_per_s": total / stage_best / 1e9, "ratio": cp_best / stage_best,
            "repeats": repeats}


def machine() -> str:
    cpuinfo = read_text_input("/proc/cpuinfo", CPUINFO_BYTES, what="CPU description")
    cpu = next((l.split(":", 1)[1].strip() for l in cpuinfo.splitlines()
                if l.startswith("model name")), platform.processor())
    return f"{os.cpu_count()} cores ({cpu}), torch {torch.__version__}, {platform.platform()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO / "data" / "cosmoflow-mini")
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2],
                        help="DataLoader worker counts to measure the loader with")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures as JSON")
    args = parser.parse_args()
    if not (args.data / "train").is_dir():
        sys.exit(f"{args.data}: no dataset; run `mlhpc data synth cosmoflow --out {args.data} "
                 f"--config {MINI}` first")
    results = {"machine": machine(),
               "harness": bench_harness(args.data, args.samples, args.epochs, args.repeats)}
    in_memory_rate = results["harness"]["harness_samples_per_s"]
    results["data"] = bench_data(args.data, args.workers, args.repeats, in_memory_rate)
    results["from_files"] = bench_from_files(args.data, args.samples, args.epochs, args.repeats,
                                            in_memory_rate)
    results["staging"] = bench_staging(args.data, args.repeats)
    text = json.dumps(results, indent=2)
    echo(text)
    if args.json:
        write_text_atomic(args.json, text + "\n")


if __name__ == "__main__":
    main()
