"""Harness throughput with and without power sampling, side by side.

The timed loop is benchmarks/throughput.py's `measure` (the training step `mlhpc run` uses, one
batch kept in memory, data loading excluded), run in alternating order: without sampling, and
with a `mlhpc.power.Sampler` thread reading (a) a node meter command (a process started per
reading, the heaviest source) and (b) a powercap-format energy counter tree (the file reads RAPL
costs; on a machine without RAPL the tree is written to a temporary folder and its counter never
moves). Each condition runs ``--repeats`` times; the median samples/s are compared.

Usage:

    python benchmarks/power_overhead.py configs/cosmoflow-mini.yaml --steps 300 --repeats 5 \\
        --json benchmarks/power-overhead-2core-cpu.json

Prints one line per condition and writes every figure with ``--json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from throughput import measure  # noqa: E402

from mlhpc import config as cfg  # noqa: E402
from mlhpc.power import Sampler  # noqa: E402
from mlhpc.power.sources import NodeMeter, find_rapl  # noqa: E402


def _powercap_tree(root: Path) -> Path:
    zone = root / "intel-rapl:0"
    zone.mkdir(parents=True)
    (zone / "name").write_text("package-0\n")
    (zone / "max_energy_range_uj").write_text("262143328850\n")
    (zone / "energy_uj").write_text("1000\n")
    return root


@contextlib.contextmanager
def _sampling(kind: str, interval_s: float, tmp: Path) -> Iterator[Sampler | None]:
    if kind == "off":
        yield None
        return
    if kind == "node_meter":
        sources = [NodeMeter(f"{sys.executable} -c print(250)")]
    else:
        sources = find_rapl(tmp / "powercap")[0]
    stamp = f"{kind}-{time.monotonic_ns()}"
    sampler = Sampler(sources, interval_s, tmp / f".{stamp}.part", tmp / stamp / "node_0.txt")
    sampler.start()
    try:
        yield sampler
    finally:
        sampler.stop()


def reading_cost_s(kind: str, tmp: Path, n: int = 20) -> dict[str, float]:
    """Wall and CPU seconds of one reading (`Sampler.read_once`), median of ``n``: the work the
    thread takes from the process once per interval."""
    walls, cpus = [], []
    with _sampling(kind, 3600.0, tmp) as sampler:
        for _ in range(n):
            time.sleep(0.002)
            wall, cpu = time.perf_counter(), time.process_time()
            sampler.read_once()
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
    return {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between readings")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    config = cfg.load(args.config, tuple(args.overrides))
    batch = config.train.global_batch_size
    kinds = ("off", "node_meter", "powercap")
    rates: dict[str, list[float]] = {k: [] for k in kinds}
    readings: dict[str, int] = {k: 0 for k in kinds}
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        _powercap_tree(tmp / "powercap")
        costs = {kind: reading_cost_s(kind, tmp) for kind in kinds[1:]}
        measure(config, batch, 20, 5, "fp32", "cpu")  # untimed: data, first build
        for _ in range(args.repeats):
            for kind in kinds:
                with _sampling(kind, args.interval, tmp) as sampler:
                    rates[kind].append(measure(config, batch, args.steps, 5, "fp32", "cpu")["samples_per_s"])
                readings[kind] += sampler.readings if sampler is not None else 0
    base = statistics.median(rates["off"])
    result = {"config": str(args.config), "batch_size": batch, "steps": args.steps, "repeats": args.repeats,
              "interval_s": args.interval, "samples_per_s": rates, "readings": readings,
              "one_reading": costs,
              "median_samples_per_s": {k: statistics.median(v) for k, v in rates.items()},
              "overhead_percent": {k: 100 * (1 - statistics.median(v) / base) for k, v in rates.items()}}
    for kind in kinds:
        print(f"{kind:>10}: median {result['median_samples_per_s'][kind]:8.1f} samples/s "
              f"({result['overhead_percent'][kind]:+.2f}% vs off; runs {', '.join(f'{r:.0f}' for r in rates[kind])}; "
              f"{readings[kind]} readings)")
    for kind, cost in costs.items():
        print(f"one {kind} reading: {cost['wall_s'] * 1e3:.3f} ms wall, {cost['cpu_s'] * 1e3:.3f} ms CPU "
              f"in this process (every {args.interval} s)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
