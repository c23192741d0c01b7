"""CosmoFlow's on-disk forms, read and converted, next to what the hardware allows.

1. Reading: samples/s of `CosmoFlowDataset` batches (shuffled order, batch 4, page cache warm)
   for each form: GZIP TFRecord (as distributed), plain TFRecord, NVIDIA .npy, HDF5; next to
   - raw decompression: ``zlib.decompress(bytes, wbits=31)`` of the same GZIP files already read
     into memory (the rate GZIP alone allows; the goal is TFRecord >= 0.8x of it),
   - the training step's consumption: samples/s of one forward+backward+SGD step of the
     reference model (configs/cosmoflow.yaml: 128^3, 5 conv layers, 32 filters) on this machine.
2. Conversion: `mlhpc.data.convert.convert` (GZIP TFRecord -> npy, npy -> HDF5, ``--workers``) in
   GB/s of bytes read and written, next to ``cp -r`` of the same source folder (goal >= 0.5x).

Samples are int16 counts drawn as Poisson counts of a log-normal density (mean 8 particles a
cell), so that GZIP finds a ratio of the order the distributed files show; they are written by
this script, GZIP at zlib's default level 6 (TensorFlow's GZIP writer's level).

Usage: python benchmarks/formats.py [--samples 16] [--cube 128] [--workers 2] [--repeats 3]
       [--json benchmarks/formats-2core-cpu.json] [--only-convert | --only-decode]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import cosmoflow_writers as writers
import crc32c

writers.crc32c = crc32c.crc32c  # the writers' bit-by-bit CRC is for tests; the value is the same
from mlhpc_workloads.cosmoflow.data import build_datasets

from mlhpc.data import convert as data_convert
from mlhpc.config import DataConfig
from mlhpc.data.claims import make_claimed_dir, remove_claimed
from mlhpc.data.files import write_text_atomic
from mlhpc.data.inputs import read_input
from mlhpc.text import echo
from mlhpc.workload import get

#: The most bytes one GZIP TFRecord file of this script's samples may hold (one 128^3 x 4 int16
#: sample is 16 MiB before GZIP).
TFRECORD_FILE_BYTES = 1 << 30
#: What `remove_claimed` names the scratch folders of a copy or conversion.
SCRATCH_WHAT = "benchmark scratch folder"


def make_samples(n: int, cube: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        density = np.exp(rng.normal(0.0, 1.0, (cube,) * 3 + (4,)) - 0.5) * 8.0
        counts = np.minimum(rng.poisson(density), 32767).astype(np.int16)
        out.append((counts, rng.uniform(-1, 1, 4).astype(np.float32)))
    return out


def write_forms(root: Path, samples: list, valid: list) -> dict[str, Path]:
    forms = {}
    for form in ("tfrecord", "tfrecord-plain", "npy", "hdf5"):
        forms[form] = writers.write_dataset(root / form, form, samples, valid)
    return forms


def read_rate(root: Path, repeats: int, batch: int = 4) -> float:
    """Best samples/s over ``repeats`` epochs of shuffled batches (fresh dataset each epoch, so
    TFRecord files are read and inflated again)."""
    best = 0.0
    for r in range(repeats + 1):  # the first pass warms the page cache
        train, _ = build_datasets(SimpleConfig(), None, root)
        order = np.random.default_rng(r).permutation(len(train))
        start = time.perf_counter()
        for i in range(0, len(order), batch):
            train.__getitems__(order[i:i + batch].tolist())
        rate = len(order) / (time.perf_counter() - start)
        if r:
            best = max(best, rate)
        train.close()
    return best


class SimpleConfig:
    data = DataConfig()


def raw_gunzip_rate(root: Path, repeats: int) -> float:
    blobs = [read_input(p, TFRECORD_FILE_BYTES, root, "TFRecord file")
             for p in sorted((root / "train").glob("*.tfrecord"))]
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        for blob in blobs:
            zlib.decompress(blob, wbits=31)
        best = max(best, len(blobs) / (time.perf_counter() - start))
    return best


def decode_vs_inflate(root: Path, repeats: int) -> dict:
    """Per file, alternating, best of ``repeats``: the TFRecord reader's whole work on one GZIP
    file (read, inflate, CRCs, Example decode, value checks) vs ``zlib.decompress`` of the same
    bytes already in memory. Less exposed to other work on a shared machine than whole passes."""
    from mlhpc_workloads.cosmoflow.tfrecord_format import decode_examples

    reader_s, inflate_s = [], []
    for path in sorted((root / "train").glob("*.tfrecord")):
        blob = read_input(path, TFRECORD_FILE_BYTES, root, "TFRecord file")
        best_reader = best_inflate = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            decode_examples(path)
            best_reader = min(best_reader, time.perf_counter() - start)
            start = time.perf_counter()
            zlib.decompress(blob, wbits=31)
            best_inflate = min(best_inflate, time.perf_counter() - start)
        reader_s.append(best_reader)
        inflate_s.append(best_inflate)
    return {"reader_ms_per_sample": 1e3 * float(np.median(reader_s)),
            "inflate_ms_per_sample": 1e3 * float(np.median(inflate_s)),
            "reader_vs_inflate": float(np.median(np.asarray(inflate_s) / np.asarray(reader_s)))}


def training_rate(cube: int, steps: int = 2, batch: int = 2) -> float:
    """Samples/s of forward + backward + SGD step of the reference model on this CPU."""
    workload = get("cosmoflow")
    model = workload.build_model(workload.model_config(input_size=cube))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x, y = torch.randn(batch, 4, cube, cube, cube), torch.randn(batch, 4)
    best = 0.0
    for step in range(steps + 1):
        start = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if step:
            best = max(best, batch / (time.perf_counter() - start))
    return best


def folder_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _sync() -> None:
    subprocess.run(["sync"], check=True)


def cp_rate(src: Path, scratch: Path, repeats: int) -> dict:
    """Best GB/s of ``cp -r`` (bytes of the source), without and with the closing ``sync``; each
    copy goes into a claimed scratch folder, removed through `remove_claimed`."""
    size = folder_bytes(src)
    best = {"gb_per_s": 0.0, "synced_gb_per_s": 0.0}
    for r in range(repeats):
        folder = make_claimed_dir(scratch / f"cp{r}", "scratch")
        _sync()
        start = time.perf_counter()
        subprocess.run(["cp", "-r", str(src), str(folder / "data")], check=True)
        copied = time.perf_counter() - start
        _sync()
        synced = time.perf_counter() - start
        best["gb_per_s"] = max(best["gb_per_s"], size / copied / 1e9)
        best["synced_gb_per_s"] = max(best["synced_gb_per_s"], size / synced / 1e9)
        remove_claimed(folder, "scratch", SCRATCH_WHAT)
    return best


def convert_rate(src: Path, scratch: Path, to: str, workers: int, repeats: int) -> dict:
    """Best GB/s (bytes read, bytes written) of `mlhpc.data.convert.convert`, without and with the
    closing ``sync``; each output goes into a claimed scratch folder, removed through
    `remove_claimed`."""
    best: dict = {}
    for r in range(repeats):
        folder = make_claimed_dir(scratch / f"conv-{to}{r}", "scratch")
        _sync()
        start = time.perf_counter()
        result = data_convert.convert(get("cosmoflow"), src, folder / "data", to,
                                      data_convert.ConvertOptions(workers=workers))
        done = time.perf_counter() - start
        _sync()
        synced = time.perf_counter() - start
        rates = {"read_gb_per_s": result.bytes_read / done / 1e9,
                 "written_gb_per_s": result.bytes_written / done / 1e9,
                 "synced_read_gb_per_s": result.bytes_read / synced / 1e9,
                 "synced_written_gb_per_s": result.bytes_written / synced / 1e9,
                 "bytes_read": result.bytes_read, "bytes_written": result.bytes_written}
        if rates["read_gb_per_s"] > best.get("read_gb_per_s", 0):
            best = rates
        remove_claimed(folder, "scratch", SCRATCH_WHAT)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--cube", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--only-decode", action="store_true",
                        help="Only the per-file reader vs inflate comparison.")
    parser.add_argument("--only-convert", action="store_true",
                        help="Only the conversions next to cp.")
    args = parser.parse_args()
    if args.only_decode:
        with tempfile.TemporaryDirectory(prefix="mlhpc-formats-") as tmp:
            samples = make_samples(args.samples, args.cube)
            root = writers.write_dataset(Path(tmp) / "tf", "tfrecord", samples, samples[:1])
            echo(json.dumps(decode_vs_inflate(root, args.repeats), indent=2))
        return
    with tempfile.TemporaryDirectory(prefix="mlhpc-formats-") as tmp:
        scratch = Path(tmp)
        samples = make_samples(args.samples, args.cube)
        forms = write_forms(scratch / "forms", samples, samples[:2])
        gz_bytes = folder_bytes(forms["tfrecord"] / "train")
        raw_bytes = sum(s[0].nbytes for s in samples)
        result = {
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores "
                       f"(shared with other work), torch {torch.__version__}",
            "samples": args.samples, "cube": args.cube,
            "gzip_ratio": raw_bytes / gz_bytes,
        }
        if not args.only_convert:
            result.update(measure_reading(forms, args))
        for name, src, to in (("tfrecord_gz_to_npy", forms["tfrecord"], "npy"),
                              ("npy_to_hdf5", forms["npy"], "hdf5")):
            conv = convert_rate(src, scratch, to, args.workers, args.repeats)
            cp = cp_rate(src, scratch, args.repeats)
            result[name] = {**conv, "cp_gb_per_s": cp["gb_per_s"],
                            "cp_synced_gb_per_s": cp["synced_gb_per_s"],
                            "read_ratio_to_cp": conv["read_gb_per_s"] / cp["gb_per_s"],
                            "synced_read_ratio_to_cp": (conv["synced_read_gb_per_s"]
                                                        / cp["synced_gb_per_s"])}
    text = json.dumps(result, indent=2)
    echo(text)
    if args.json:
        write_text_atomic(args.json, text + "\n")


def measure_reading(forms: dict[str, Path], args: argparse.Namespace) -> dict:
    """Reading rates of every form, raw GZIP inflate, the training step, per-file decode."""
    result = {
        "read_samples_per_s": {form: read_rate(path, args.repeats) for form, path in forms.items()},
        "raw_gunzip_samples_per_s": raw_gunzip_rate(forms["tfrecord"], args.repeats),
        "training_step_samples_per_s": training_rate(args.cube),
    }
    result["tfrecord_vs_raw_gunzip"] = (result["read_samples_per_s"]["tfrecord"]
                                        / result["raw_gunzip_samples_per_s"])
    result["per_file_decode_vs_inflate"] = decode_vs_inflate(forms["tfrecord"], args.repeats)
    return result

if __name__ == "__main__":
    main()
