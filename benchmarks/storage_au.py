"""Storage mode's accelerator utilisation on this machine's disk against a RAM-backed tmpfs, at
1, 2 and 4 emulated accelerators (``mlhpc run --emulate-accelerator``, `mlhpc.run.sweep`).

A fraction of CosmoFlow's reference data set (128^3 x 4 int16 samples, ``configs/cosmoflow.yaml``'s
synth section) is synthesised once into a folder on the disk under test and once into
``/dev/shm``; then, for each folder and K in (1, 2, 4), storage mode runs K ranks (torchrun), one
emulated accelerator each, reading the folder in place (no staging), and its AU and samples/s
are read back from its log as ``mlhpc report`` reads them. Before each run on the disk the page
cache is dropped (``/proc/sys/vm/drop_caches``, as root), so that its first epoch reads from the
device; MLPerf Storage asks for a data set of at least 5 x host memory instead, which a small
machine cannot hold:

    python benchmarks/storage_au.py --disk /work/storage-au --fraction 0.0004 --json storage-au.json

Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlhpc import config as cfg  # noqa: E402
from mlhpc.data.files import write_text_atomic  # noqa: E402
from mlhpc.run.emulate import minimum_utilization  # noqa: E402
from mlhpc.run.sweep import Plan, measure  # noqa: E402
from mlhpc.text import echo  # noqa: E402

BIN = Path(sys.executable).parent
CONFIG = REPO / "configs" / "cosmoflow.yaml"


def drop_page_cache() -> bool:
    """Write back and drop the page cache (``sysctl vm.drop_caches=3``, root only); False where
    it cannot."""
    os.sync()
    proc = subprocess.run(["sysctl", "-q", "-w", "vm.drop_caches=3"], capture_output=True, text=True)
    return proc.returncode == 0


def synthesise(folder: Path, fraction: float) -> None:
    proc = subprocess.run([str(BIN / "mlhpc"), "data", "synth", "cosmoflow", "--config", str(CONFIG),
                           "--out", str(folder), "--fraction", str(fraction)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"data synth {folder}: exit {proc.returncode}: {proc.stderr[-1000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--disk", type=Path, required=True, help="a folder on the disk under test")
    parser.add_argument("--fraction", type=float, default=0.0004)
    parser.add_argument("--accelerator", default="h100")
    parser.add_argument("--batch", type=int, default=4, help="each emulated accelerator's batch")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--json", dest="json_path", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="mlhpc-au-", dir=args.disk) as disk, \
            tempfile.TemporaryDirectory(prefix="mlhpc-au-", dir="/dev/shm") as ram:
        for where, base in (("disk", Path(disk)), ("tmpfs", Path(ram))):
            synthesise(base / "data", args.fraction)
            sets = (f"train.emulate_accelerator={args.accelerator}", f"data.path={base / 'data'}",
                    "data.staging.enabled=false", "data.num_workers=1", f"train.max_epochs={args.epochs}",
                    f"train.global_batch_size={args.batch}", f"output.dir={base / 'runs'}")
            config = cfg.load(CONFIG, overrides=sets)
            minimum = minimum_utilization("cosmoflow")[0]
            plan = Plan.of(CONFIG, sets, config)
            for k in (1, 2, 4):
                cold = drop_page_cache() if where == "disk" else False
                row = measure(plan, k, minimum)
                rows.append({"storage": where, "accelerators": k, "accelerator_utilization": row.accelerator_utilization,
                             "samples_per_s": row.samples_per_s, "meets_minimum": row.meets_minimum,
                             "exit_status": row.exit_status, "page_cache_dropped": cold,
                             "load_1min_before": os.getloadavg()[0]})
                echo(f"{where} K={k}: AU {row.accelerator_utilization}, {row.samples_per_s} samples/s, "
                     f"exit {row.exit_status}")
    echo("| storage | emulated accelerators | AU | samples/s | AU >= minimum |")
    echo("|---|---|---|---|---|")
    for r in rows:
        au = "-" if r["accelerator_utilization"] is None else f"{100 * r['accelerator_utilization']:.1f}%"
        rate = "-" if r["samples_per_s"] is None else f"{r['samples_per_s']:.1f}"
        echo(f"| {r['storage']} | {r['accelerators']} | {au} | {rate} | {'yes' if r['meets_minimum'] else 'no'} |")
    if args.json_path is not None:
        write_text_atomic(args.json_path, json.dumps(
            {"fraction": args.fraction, "accelerator": args.accelerator, "batch_per_accelerator": args.batch,
             "epochs": args.epochs, "minimum_au": minimum, "rows": rows,
             "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
