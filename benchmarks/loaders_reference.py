"""Each workload's training loader at the REFERENCE sample size, against what one H100 consumes.

Usage:
    python benchmarks/loaders_reference.py [--json OUT] [--only NAME,...] [--data DIR]
        [--repeats 3] [--min-seconds 2.0] [--batch-size 1]

For each of cosmoflow, deepcam, oc20 and openfold: a few samples of the reference's size are
synthesised (the workload's own ``synthesize``, its ``*-mini.yaml`` with the sizes below) into a
temporary folder (or ``--data DIR``, kept and reused), read through the path `mlhpc run` reads
them (``Workload.datasets`` and `mlhpc.data.loader.make_loader`, ONE loader worker, batch
``--batch-size``), and timed: samples/s per worker, the median of ``--repeats`` measurements
each lasting at least ``--min-seconds`` (side_by_side_core's `calibrate`: one warm-up pass not
counted). Against it: the samples/s one H100 consumes in a published MLPerf HPC v3.0 run
(`mlhpc.run.emulate.published_rate`; "not available" when this checkout lacks it) and the worker
cores one H100 needs, H100 rate / per-worker rate.

Reference sizes (`CASES`): CosmoFlow 128^3 x 4 int16 cubes, one per HDF5 file; DeepCAM 16 x 768 x
1152 float32 fields with their labels, one per HDF5 file; OC20 a 4 x 4 x 4 fcc slab (64 metal
atoms) and its adsorbate, in LMDB files (a structure of OC20's S2EF size: a slab of a few layers
and an adsorbate; EMT-made, not OC20's own distribution of sizes); OpenFold chains of 256-300
residues (cropped to the reference's 256) with 2,400 aligned rows, of which the reference's
features read 2,296 (124 clusters, 1,024 extra rows; no templates: the synthetic data have no
``.hhr``). Every process uses one thread (torch, OpenBLAS, OpenMP): a worker is one core.

Output: a Markdown table (one row per workload) and, with ``--json``, every figure, the machine,
the commit and the load average. Exit status 0; 2 with one line on stderr on bad input.
"""

from __future__ import annotations

import os

if __name__ == "__main__":  # before numpy loads (run as a script only): a worker is one core
    for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_name, "1")

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from side_by_side import BadInput, check_writable, commit, machine  # noqa: E402
from side_by_side_core import LoadWatch, calibrate, figure  # noqa: E402

from mlhpc import config as cfg  # noqa: E402
from mlhpc import workload as workloads  # noqa: E402
from mlhpc.data.files import write_text_atomic  # noqa: E402
from mlhpc.data.loader import make_loader  # noqa: E402
from mlhpc.errors import MlhpcError  # noqa: E402
from mlhpc.runtime import Runtime  # noqa: E402
from mlhpc.text import echo  # noqa: E402
from mlhpc.workload import NO_PROGRESS  # noqa: E402


@dataclass(frozen=True)
class Case:
    """One workload at the reference sample size: its mini config and the overrides that make
    its synthetic samples (and the features read from them) the reference's size."""

    config: str
    sample: str
    overrides: tuple[str, ...]


CASES = {
    "cosmoflow": Case("cosmoflow-mini.yaml", "128^3 x 4 int16 cube, one per HDF5 file",
                      ("synth.cube_size=128", "synth.samples_per_file=1", "synth.train_samples=8",
                       "synth.eval_samples=1", "model.input_size=128")),
    "deepcam": Case("deepcam-mini.yaml", "16 x 768 x 1152 fields + labels, one per HDF5 file",
                    ("synth.height=768", "synth.width=1152", "synth.train_samples=4",
                     "synth.validation_samples=1")),
    "oc20": Case("opencatalyst-mini.yaml", "4 x 4 x 4 fcc slab + adsorbate (65-66 atoms), LMDB",
                 ("synth.slab_size=[4, 4, 4]", "synth.train_samples=24", "synth.validation_samples=4")),
    "openfold": Case("openfold-mini.yaml", "chain of 256-300 residues (crop 256), 2,400 a3m rows "
                     "(2,296 read)",
                     ("synth.train_chains=4", "synth.validation_chains=1", "synth.min_length=256",
                      "synth.max_length=300", "synth.msa_depth=2400", "synth.compactness=2.5",
                      "model.train_sequence_crop_size=256", "model.max_msa_clusters=124",
                      "model.max_extra_msa=1024", "model.init_checkpoint=null")),
}


def h100_rate(workload: str) -> tuple[float | None, str]:
    """Samples/s one H100 trains ``workload`` at in a published MLPerf HPC v3.0 run and where
    that comes from, or ``(None, why)`` when this checkout has no such figure."""
    try:
        from mlhpc.run.emulate import published_rate
        rate = published_rate(workload, "h100")
    except (ImportError, AttributeError, MlhpcError, KeyError) as exc:
        return None, f"not available ({type(exc).__name__})"
    return float(rate.samples_per_s), str(rate.source)


def prepared(name: str, root: Path, extra: tuple[str, ...]) -> tuple[Any, Any, float]:
    """``(config, training dataset, synthesis seconds)`` of workload ``name`` at the reference
    size, its data synthesised under ``root/name`` when missing."""
    case = CASES[name]
    data_dir = root / name
    config = cfg.load(REPO / "configs" / case.config,
                      (*case.overrides, f"data.path={data_dir}", "data.num_workers=1", *extra))
    workload = workloads.get(config.workload)
    start = time.perf_counter()
    workload.synthesize(data_dir, config.synth, config.train.seed, NO_PROGRESS)
    synth_s = time.perf_counter() - start
    train_ds, _ = workload.datasets(config, Runtime(), data_dir)
    return config, train_ds, synth_s


def measure(name: str, root: Path, args: argparse.Namespace, load: LoadWatch) -> dict[str, Any]:
    """Every figure of one workload (module docstring)."""
    config, train_ds, synth_s = prepared(name, root, tuple(args.overrides))
    loader = make_loader(train_ds, args.batch_size, num_workers=1)

    def one_pass() -> int:
        return sum(train_ds.batch_len(x) for x, _ in loader)

    timed = calibrate(one_pass, args.min_seconds)
    rates = []
    for _ in range(args.repeats):
        load.sample()
        rates.append(timed.measure())
    per_worker = statistics.median(rates)
    h100, source = h100_rate(config.workload)
    return {"workload": config.workload, "sample": CASES[name].sample, "samples": len(train_ds),
            "sample_bytes": _sample_bytes(root / name, len(train_ds)),
            "batch_size": args.batch_size, "synth_s": synth_s, "warmup_s": timed.warmup_s,
            "passes_per_measurement": timed.calls, "per_worker_samples_per_s": per_worker,
            "per_worker_all": rates, "h100_samples_per_s": h100, "h100_source": source,
            "worker_cores_per_h100": None if h100 is None else h100 / per_worker}


def _sample_bytes(folder: Path, samples: int) -> float:
    """Bytes on disk under ``folder``'s training split per training sample (context only)."""
    split = next((p for p in sorted(folder.iterdir()) if p.is_dir() and "train" in p.name), folder)
    size = sum(p.stat().st_size for p in split.rglob("*") if p.is_file() and not p.is_symlink())
    return size / max(samples, 1)


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The Markdown table of the figures."""
    lines = ["| workload | sample (reference size) | MB/sample | samples/s per worker | "
             "H100 samples/s | worker cores per H100 |", "|---|---|---|---|---|---|"]
    for row in rows:
        h100 = row["h100_samples_per_s"]
        cores = row["worker_cores_per_h100"]
        spread = f"{figure(min(row['per_worker_all']))}-{figure(max(row['per_worker_all']))}"
        lines.append(f"| {row['workload']} | {row['sample']} | {row['sample_bytes'] / 1e6:.3g} | "
                     f"{figure(row['per_worker_samples_per_s'])} ({spread}) | "
                     f"{'not available' if h100 is None else figure(h100)} | "
                     f"{'-' if cores is None else f'{cores:.3g}'} |")
    return lines


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    parser.add_argument("--only", default=",".join(CASES),
                        help=f"workloads, comma-separated ({', '.join(CASES)})")
    parser.add_argument("--data", type=Path, default=None,
                        help="keep the synthetic data here and reuse it (default: a temporary folder)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="one more config override for every workload")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per workload")
    parser.add_argument("--min-seconds", type=float, default=2.0, help="shortest measurement, s")
    parser.add_argument("--batch-size", type=int, default=1, help="samples per batch")
    args = parser.parse_args(argv)
    args.only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in args.only if name not in CASES]
    if unknown or args.repeats < 1 or args.batch_size < 1 or args.min_seconds < 0:
        raise BadInput(f"--only {unknown[0]!r} (known: {', '.join(CASES)})" if unknown
                       else "--repeats and --batch-size must be >= 1, --min-seconds >= 0")
    if args.data is not None and not args.data.is_dir():
        raise BadInput(f"--data {args.data}: not a folder")
    return args


def run(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """Measure every workload of ``args.only`` into ``report`` and print the table."""
    torch.set_num_threads(1)
    load = LoadWatch()
    with tempfile.TemporaryDirectory(prefix="mlhpc-loaders-") as scratch:
        root = args.data or Path(scratch)
        for name in args.only:
            row = measure(name, root, args, load)
            report["workloads"][name] = row
            echo(f"# {name}: {figure(row['per_worker_samples_per_s'])} samples/s per worker "
                 f"(synthesis {row['synth_s']:.0f} s)")
    load.sample()
    report["load_average_1min"] = load.to_json()
    for line in table(list(report["workloads"].values())):
        echo(line)


def main(argv: list[str] | None = None) -> int:
    report: dict[str, Any] = {
        "command": " ".join(["python", "benchmarks/loaders_reference.py", *(argv or sys.argv[1:])]),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(), "commit": commit(), "workloads": {}}
    try:
        args = parse(argv)
        check_writable(args.json)
        report.update(batch_size=args.batch_size, loader_workers=1, threads_per_process=1)
        run(args, report)
        if args.json:
            write_text_atomic(args.json, json.dumps(report, indent=1) + "\n")
    except (BadInput, MlhpcError) as exc:
        echo(f"loaders_reference: {exc}", err=True)
        return 2
    except OSError as exc:
        echo(f"loaders_reference: {exc.filename or ''}: {exc.strerror or exc}", err=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
