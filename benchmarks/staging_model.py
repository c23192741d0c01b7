"""Staging at 16 to 2,048 nodes, on paper: time and per-node storage, whole copy vs node shards.

Two steps:

``--measure``
    stages a synthetic dataset (``--files`` files of 16 MiB, the size of one CosmoFlow sample as
    int16 128^3 x 4) with ``mlhpc.data.stage.stage`` -- the code a run uses, XXH3-128 and read-back
    verification included -- from a folder on this machine's disk into each destination named
    (``/tmp`` and ``/dev/shm`` by default), ``--repeats`` times, and records the best per-node
    copy bandwidth (bytes copied / wall seconds) in a JSON file. The source was just written, so
    it is read from the page cache: the figure is this node's copy + hash + verify ceiling, not
    a parallel file system's per-node read rate.

default
    reads that JSON and models, for CosmoFlow and DeepCAM at 16, 128, 512 and 2,048 nodes,
    the staging time ``bytes per node / bandwidth per node`` and the bytes each node must hold,
    for ``shard: none`` (every node copies the whole dataset) and ``shard: node`` (node n holds
    1/N of train and validation). ``--fs-gb-per-s`` adds a shared file-system ceiling:
    staging then takes at least ``bytes read by all nodes / aggregate bandwidth``. It draws
    docs/img/staging-at-scale.png with the v3.0 time-to-train figures
    (/work/shared/fixtures/mlperf-hpc-results/expected_scores.csv, or ``--scores``) beside it.

Dataset sizes (the MLPerf HPC datasets): CosmoFlow 524,288 training and 65,536 validation
samples, 1.7 TB as distributed (compressed) and 16 MiB per sample once converted to int16;
DeepCAM 121,266 training and 15,158 validation samples, 8.8 TB.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlhpc.data.files import atomic_output, write_text_atomic, write_under  # noqa: E402
from mlhpc.data.inputs import read_text_input  # noqa: E402
from mlhpc.data.stage.copies import is_own_copy, remove_copy  # noqa: E402
from mlhpc.text import echo, plot_text  # noqa: E402

MIB = 1 << 20
#: The most bytes the bandwidth JSON (--bandwidth-json) may hold.
BANDWIDTH_JSON_BYTES = 1 << 20
#: The most bytes the scores CSV (--scores) may hold.
SCORES_CSV_BYTES = 16 << 20
NODES = (16, 128, 512, 2048)
DATASETS = {  # name -> (train samples, validation samples, total bytes staged)
    "CosmoFlow (1.7 TB compressed)": (524_288, 65_536, 1.7e12),
    "CosmoFlow (int16, 16 MiB/sample)": (524_288, 65_536, (524_288 + 65_536) * 16 * MIB),
    "DeepCAM (8.8 TB)": (121_266, 15_158, 8.8e12),
}
SCORES = Path("/work/shared/fixtures/mlperf-hpc-results/expected_scores.csv")


def measure(dests: list[Path], files: int, repeats: int, workers: int) -> dict:
    """Best copy bandwidth (bytes/s) of one node into each destination folder (each copy a fresh
    folder there, removed after through `remove_copy`)."""
    from mlhpc.runtime import Runtime
    from mlhpc.data.stage import StageOptions, stage

    out = {"file_bytes": 16 * MIB, "files": files, "workers": workers, "repeats": repeats,
           "cpu_count": os.cpu_count(), "dests": {}}
    with tempfile.TemporaryDirectory(prefix="mlhpc-stage-src-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        block = os.urandom(16 * MIB)
        for i in range(files):
            write_under(src, Path("train", f"s{i:04d}.bin"), block[i:] + block[:i])
        for dest_root in dests:
            runs = []
            for _ in range(repeats):
                dest = Path(tempfile.mkdtemp(prefix="mlhpc-stage-bench-", dir=dest_root))
                try:
                    result = stage(src, dest, Runtime(), StageOptions(workers=workers))
                    runs.append(result.copied_bytes / result.elapsed_s)
                finally:
                    if is_own_copy(dest):
                        remove_copy(dest)
            out["dests"][str(dest_root)] = {"best_bytes_per_s": max(runs), "runs_bytes_per_s": runs}
    return out


def model(bandwidth_bytes_per_s: float, fs_bytes_per_s: float | None) -> list[dict]:
    rows = []
    for name, (train, val, total) in DATASETS.items():
        for nodes in NODES:
            for shard in ("none", "node"):
                per_node = total if shard == "none" else total / nodes
                time_s = per_node / bandwidth_bytes_per_s
                if fs_bytes_per_s:
                    time_s = max(time_s, per_node * nodes / fs_bytes_per_s)
                rows.append({"dataset": name, "nodes": nodes, "shard": shard,
                             "node_bytes": per_node, "staging_min": time_s / 60,
                             "node_samples": (train + val) / (1 if shard == "none" else nodes)})
    return rows


def v3_scores(path: Path) -> list[tuple[str, str, float]]:
    """(benchmark, system, olympic mean minutes) of the v3.0 strong-scaling results."""
    out = []
    text = read_text_input(path, SCORES_CSV_BYTES, what="scores CSV")
    for row in csv.DictReader(io.StringIO(text, newline="")):
        if row["round"] == "hpc_results_v3.0" and row["mode"] == "strong" \
                and row["benchmark"] in ("cosmoflow", "deepcam") and row["olympic_min"]:
            out.append((row["benchmark"], f"{row['submitter']} {row['system']}", float(row["olympic_min"])))
    return out


def plot(rows: list[dict], scores: list[tuple[str, str, float]], bandwidth: float, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(13, 5))
    styles = {"CosmoFlow (1.7 TB compressed)": "tab:blue", "CosmoFlow (int16, 16 MiB/sample)": "tab:cyan",
              "DeepCAM (8.8 TB)": "tab:red"}
    for name, color in styles.items():
        for shard, ls in (("none", "--"), ("node", "-")):
            sel = [r for r in rows if r["dataset"] == name and r["shard"] == shard]
            label = f"{name}, shard: {shard}"
            ax_t.plot([r["nodes"] for r in sel], [r["staging_min"] for r in sel], ls, color=color,
                      marker="o", label=label)
            ax_s.plot([r["nodes"] for r in sel], [r["node_bytes"] / 1e12 for r in sel], ls,
                      color=color, marker="o", label=label)
    for bench, system, minutes in scores:
        color = "tab:blue" if bench == "cosmoflow" else "tab:red"
        ax_t.axhline(minutes, color=color, lw=0.6, alpha=0.5)
        ax_t.annotate(f"v3.0 {bench} {system}: {minutes:.1f} min", (16, minutes), fontsize=6,
                      color=color, va="bottom")
    for ax in (ax_t, ax_s):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # plain text, no mathtext
        ax.set_xticks(NODES, [str(n) for n in NODES])
        ax.set_xlabel("nodes")
        ax.grid(True, which="both", alpha=0.3)
    ax_t.set_ylabel("staging time, minutes")
    ax_t.set_title(f"Staging time at {bandwidth / 1e9:.2f} GB/s per node (measured here)")
    ax_s.set_ylabel("bytes each node holds, TB")
    ax_s.set_title("Per-node storage")
    ax_s.legend(fontsize=7)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(png) as tmp:
        fig.savefig(tmp, dpi=110, format=png.suffix[1:] or "png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measure", action="store_true", help="measure the copy bandwidth first")
    parser.add_argument("--dest", type=Path, action="append", help="destination root(s) to measure")
    parser.add_argument("--files", type=int, default=32, help="16 MiB files to stage per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--bandwidth-json", type=Path,
                        default=REPO / "benchmarks" / "staging-bandwidth-2core-cpu.json")
    parser.add_argument("--use-dest", default=None, help="which measured destination the model uses")
    parser.add_argument("--fs-gb-per-s", type=float, default=None,
                        help="an assumed shared file-system aggregate bandwidth (GB/s); none by default")
    parser.add_argument("--scores", type=Path, default=SCORES)
    parser.add_argument("--png", type=Path, default=REPO / "docs" / "img" / "staging-at-scale.png")
    args = parser.parse_args()
    if args.measure:
        dests = args.dest or [Path(tempfile.gettempdir()), Path("/dev/shm")]
        result = measure([d for d in dests if d.is_dir()], args.files, args.repeats, args.workers)
        write_text_atomic(args.bandwidth_json, json.dumps(result, indent=2) + "\n")
    measured = json.loads(read_text_input(args.bandwidth_json, BANDWIDTH_JSON_BYTES,
                                          what="bandwidth JSON"))
    dest = args.use_dest or next(iter(measured["dests"]))
    bandwidth = measured["dests"][dest]["best_bytes_per_s"]
    rows = model(bandwidth, args.fs_gb_per_s * 1e9 if args.fs_gb_per_s else None)
    scores = v3_scores(args.scores) if args.scores.is_file() else []
    with plot_text():  # system names from the scores file drawn as written, never as mathtext
        plot(rows, scores, bandwidth, args.png)
    echo(f"per-node bandwidth ({dest}): {bandwidth / 1e9:.3f} GB/s")
    echo(f"{'dataset':34} {'nodes':>5} {'shard':>5} {'TB/node':>9} {'staging min':>12}")
    for r in rows:
        echo(f"{r['dataset']:34} {r['nodes']:5d} {r['shard']:>5} {r['node_bytes'] / 1e12:9.4f} "
             f"{r['staging_min']:12.2f}")
    for bench, system, minutes in scores:
        echo(f"v3.0 time to train: {bench:9} {system:45} {minutes:7.2f} min")


if __name__ == "__main__":
    main()
