"""Synthesis rate of full-size data by 1 rank against 2 (``mlhpc data synth`` under torchrun).

Writes a fraction of a reference config's data set (reference sample sizes: CosmoFlow 128^3 x 4
int16, DeepCAM 768 x 1152 x 16) once with one process and ``--workers 1``, then with
``torchrun --nproc-per-node 2 --no-python mlhpc data synth ... --workers 1``, into fresh
folders, and checks that the two are the same bytes. Each rate is the data set's bytes (its
manifest's ``total_bytes``) over the command's wall time, start-up included, and the per-rank
rates the command printed itself:

    python benchmarks/synth_ranks.py --workload cosmoflow --fraction 0.0002 --json synth-ranks.json

Run it on an otherwise idle machine: a second job on the cores halves the 2-rank figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlhpc.data.files import write_text_atomic  # noqa: E402
from mlhpc.data.inputs import read_json_object  # noqa: E402
from mlhpc.text import echo  # noqa: E402

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def synth(workload: str, fraction: float, out: Path, ranks: int) -> dict:
    """One ``mlhpc data synth`` of ``fraction`` of ``configs/<workload>.yaml``'s data set by
    ``ranks`` ranks: bytes, wall seconds, GB/s in all and each rank's printed rate."""
    cmd = [str(BIN / "mlhpc"), "data", "synth", workload, "--config", str(REPO / "configs" / f"{workload}.yaml"),
           "--out", str(out), "--fraction", str(fraction), "--workers", "1"]
    if ranks > 1:
        cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(ranks), "--no-python", *cmd]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    load = os.getloadavg()[0]
    began = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall_s = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    total = read_json_object(out / ".mlhpc-manifest.json", what="manifest")["total_bytes"]
    per_rank = {int(r): v for r, v in re.findall(r"rank (\d+) ([\d.]+ [MG]B/s)", proc.stderr)}
    return {"ranks": ranks, "bytes": total, "wall_s": wall_s, "gb_per_s": total / wall_s / 1e9,
            "printed_per_rank": per_rank, "load_1min_before": load}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=["cosmoflow", "deepcam"], required=True)
    parser.add_argument("--fraction", type=float, required=True)
    parser.add_argument("--where", type=Path, default=None, help="folder to write in (default: a temporary one)")
    parser.add_argument("--json", dest="json_path", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mlhpc-synth-ranks-", dir=args.where) as tmp:
        base = Path(tmp)
        rows = [synth(args.workload, args.fraction, base / f"ranks_{n}", n) for n in (1, 2)]
        one, two = (read_json_object(base / f"ranks_{n}" / ".mlhpc-manifest.json", what="manifest")["files"]
                    for n in (1, 2))
        identical = one == two  # every file's path, size and xxh3_128
    speedup = rows[1]["gb_per_s"] / rows[0]["gb_per_s"]
    echo("| workload | ranks | bytes | wall | GB/s in all | per rank (printed) |")
    echo("|---|---|---|---|---|---|")
    for r in rows:
        printed = ", ".join(f"rank {k} {v}" for k, v in sorted(r["printed_per_rank"].items())) or "-"
        echo(f"| {args.workload} | {r['ranks']} | {r['bytes'] / 1e9:.2f} GB | {r['wall_s']:.1f} s | "
             f"{r['gb_per_s']:.3f} | {printed} |")
    echo(f"2 ranks / 1 rank: {speedup:.2f} x; same bytes: {identical}")
    if args.json_path is not None:
        write_text_atomic(args.json_path, json.dumps(
            {"workload": args.workload, "fraction": args.fraction, "rows": rows, "speedup": speedup,
             "identical": identical, "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}},
            indent=2) + "\n")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
