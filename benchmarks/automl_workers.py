"""Does an AutoML search fill the machine? The same search with 1 worker and with K workers, in the
same time budget, each trial at one thread: trials finished, evaluations, FLOPs and AIPerf's
score at the end (`mlhpc automl`, `mlhpc report --format json`).

    python benchmarks/automl_workers.py configs/cosmoflow-automl-mini.yaml --workers 1,2 \\
        --budget-s 300 --set data.train_samples=2048 --set train.max_epochs=6 --json automl-workers.json

AIPerf's argument (arXiv:2008.07141): its trials are independent, so K workers run K times the
trials of one in the same time, as long as the machine has the cores. Prints one Markdown row per
worker count; the load average before each search is recorded in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
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
from mlhpc.text import echo  # noqa: E402


def search(config: str, workers: int, budget_s: float, out: Path, overrides: list[str]) -> dict[str, Any]:
    """One search with ``workers`` workers into ``out``: its trials and its last mark."""
    sets = [f"output.dir={out}", f"automl.budget_s={budget_s}", f"automl.mark_every_s={budget_s}",
            f"automl.min_duration_s={budget_s / 2}", "automl.trial_threads=1", *overrides]
    env = {**os.environ, "MLHPC_STORE": "none"}
    load = os.getloadavg()[0]
    began = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mlhpc", "automl", config, "--workers", str(workers),
                           *(p for s in sets for p in ("--set", s))], capture_output=True, text=True, env=env)
    wall_s = time.perf_counter() - began
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{workers} worker(s): exit {proc.returncode}: {proc.stderr.strip()[-400:]}")
    report = subprocess.run([sys.executable, "-m", "mlhpc", "report", str(out), "--format", "json"],
                            capture_output=True, text=True, env=env, check=True)
    score = json.loads(report.stdout)
    records = [read_json_object(p, what="trial record") for p in sorted(out.glob("trial_*/trial.json"))]
    last = score["marks"][-1] if score["marks"] else {}
    return {"workers": workers, "budget_s": budget_s, "wall_s": wall_s, "load_1min_before": load,
            "trials": len(records),
            "trials_ended_by_themselves": sum(r["state"] in ("COMPLETE", "PRUNED") and r.get("stopped") != "budget"
                                              for r in records),
            "evaluations": sum(len(r.get("evaluations") or []) for r in records),
            "total_flops": last.get("total_flops"), "score_flop_per_s": last.get("score_flop_per_s"),
            "best_quality": last.get("best_quality")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", dest="json_path", type=Path, default=None)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="mlhpc-automl-workers-"))
    echo("| workers | trials | ended by themselves | evaluations | total FLOPs | score | best quality | load before |")
    echo("|---|---|---|---|---|---|---|---|")
    rows = []
    for workers in (int(w) for w in args.workers.split(",")):
        r = search(args.config, workers, args.budget_s, base / f"workers_{workers}", args.overrides)
        rows.append(r)
        echo(f"| {workers} | {r['trials']} | {r['trials_ended_by_themselves']} | {r['evaluations']} | "
             f"{r['total_flops'] / 1e12:.2f} TFLOP | {r['score_flop_per_s'] / 1e9:.2f} GFLOP/s | "
             f"{r['best_quality']:.4f} | {r['load_1min_before']:.2f} |")
    if args.json_path is not None:
        write_text_atomic(args.json_path, json.dumps({"config": args.config, "overrides": args.overrides,
                                                      "runs": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
