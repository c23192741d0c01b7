"""Convergence over seeds: one mini config run to its target with train.seed 1..N, one row each.

MLPerf HPC asks for 5 to 10 runs of a benchmark ("Benchmark Results" in hpc_training_rules.adoc:
the score is an olympic mean over them), because one seed that crosses the target is not
convergence. This script runs ``mlhpc run CONFIG --set train.seed=S`` for each seed in turn,
each into its own folder, and reads each result back as ``mlhpc report`` does
(``summary_0.json``) with MLCommons' compliance checker's verdict on its log:

    python benchmarks/seeds.py configs/cosmoflow-mini.yaml --seeds 1-5 --json seeds-cosmoflow.json

Prints one Markdown row per seed (seed, status, epochs to target, time to train, final metric,
checker) and, with ``--json``, writes them with the machine, the commit and the load average
sampled before each run. The data set is made by the first run when missing (not timed).
Exit status: 0 every seed reached its target, 1 one did not, 2 bad input.
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
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlhpc.data.files import write_text_atomic  # noqa: E402
from mlhpc.data.inputs import read_json_object  # noqa: E402
from mlhpc.log.parse import parse_log  # noqa: E402
from mlhpc.report.compliance import check_run  # noqa: E402
from mlhpc.text import echo  # noqa: E402


def seed_list(text: str) -> list[int]:
    """``"1-5"`` or ``"1,3,7"`` as seeds (each >= 0)."""
    if "-" in text:
        first, last = (int(part) for part in text.split("-", 1))
        seeds = list(range(first, last + 1))
    else:
        seeds = [int(part) for part in text.split(",")]
    if not seeds or min(seeds) < 0:
        raise ValueError(f"--seeds {text}: expected seeds >= 0 such as 1-5 or 1,3,7")
    return seeds


def commit() -> str:
    proc = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return proc.stdout.strip() or "unknown"


def run_seed(config: str, seed: int, out: Path, overrides: list[str]) -> dict[str, Any]:
    """One run with ``train.seed=seed`` into ``out``: its summary's figures and the checker's verdict."""
    args = [sys.executable, "-m", "mlhpc", "run", config, "--set", f"train.seed={seed}",
            "--set", f"output.dir={out}", *(part for o in overrides for part in ("--set", o))]
    load = os.getloadavg()[0]
    began = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "MLHPC_STORE": "none"})
    wall_s = time.perf_counter() - began
    if proc.returncode == 2:
        raise SystemExit(f"seed {seed}: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else 'exit 2'}")
    summary = read_json_object(out / "summary_0.json", what="run summary")
    verdict = check_run(parse_log(out / "result_0.txt"))
    return {"seed": seed, "exit_status": proc.returncode, "status": summary["status"],
            "epochs_to_target": summary.get("epochs_to_target"), "epoch_unit": summary.get("epoch_unit"),
            "n_epochs": summary.get("n_epochs"), "time_to_train_s": summary.get("time_to_train_s"),
            "synthesis_s": summary.get("synthesis_s"), "wall_s": wall_s,
            "metric_key": summary.get("metric_key"),
            "final_metric": final_metric(out, summary.get("metric_key")), "target": summary.get("target"), "checker_ok": verdict.ok, "load_1min_before": load}


def final_metric(out: Path, key: str) -> float | None:
    """The last value of the quality metric in the run's log."""
    events = [e for e in parse_log(out / "result_0.txt").events if e.key == key]
    return float(events[-1].value) if events else None


def row(r: dict[str, Any]) -> str:
    metric = "-" if r["final_metric"] is None else f"{r['metric_key']} {r['final_metric']:.4f}"
    epochs = "-" if r["epochs_to_target"] is None else f"{r['epochs_to_target']:g}"
    return (f"| {r['seed']} | {r['status']} | {epochs} | {r['time_to_train_s']:,.1f} s | {metric} | "
            f"{'SUCCESS' if r['checker_ok'] else 'FAILED'} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("--seeds", default="1-5")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", dest="json_path", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None, help="folder for the runs (default: a temporary one)")
    args = parser.parse_args()
    try:
        seeds = seed_list(args.seeds)
    except ValueError as exc:
        echo(f"seeds.py: error: {exc}", err=True)
        return 2
    base = args.out or Path(tempfile.mkdtemp(prefix="mlhpc-seeds-"))
    echo("| seed | status | epochs to target | time to train | final metric | checker (hpc 3.0.0) |")
    echo("|---|---|---|---|---|---|")
    rows = []
    for seed in seeds:
        out = base / f"seed_{seed}"
        r = run_seed(args.config, seed, out, args.overrides)
        rows.append(r)
        echo(row(r))
        if args.json_path is not None:  # after each seed: an interrupted series keeps what it measured
            write_text_atomic(args.json_path, json.dumps(
                {"config": args.config, "overrides": args.overrides, "commit": commit(),
                 "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "runs": rows},
                indent=2) + "\n")
    return 0 if all(r["status"] == "success" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
