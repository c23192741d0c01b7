"""The per-accelerator training rates of mlhpc/run/accelerators.json, derived from MLCommons'
published MLPerf HPC v3.0 result logs (mlcommons/hpc_results_v3.0 at dfea490b; a copy sits in
the project's shared fixtures, never in the repository).

For each (workload, accelerator) one folder of closed-division strong-scaling logs is read
(`SOURCES`: on each accelerator the submission that trained on the fewest of them, so that the
least of a step is spent all-reducing across a large machine). For each log:

- the training blocks: every ``epoch_start .. epoch_stop`` pair between ``run_start`` and
  ``run_stop``, minus the ``eval_start .. eval_stop`` nested in it (evaluation is not training);
- the samples of a block: ``train_samples`` (an epoch is one pass), or for OpenFold, whose
  ``epoch_num`` counts the samples trained so far, the growth of ``epoch_num`` over the block;
- the log's rate: samples of a block / the median block's training seconds (the median keeps a
  block slowed by a checkpoint, a file-system stall or the first epoch's warm-up out) / the
  accelerators (``number_of_nodes`` x ``accelerators_per_node`` of ``systems/<system>.json``).

The folder's rate is the median of its logs' rates, samples per second per accelerator:

    python benchmarks/accelerator_rates.py /work/shared/fixtures/mlperf-hpc-results/hpc_results_v3.0

prints the table as JSON (the numbers accelerators.json holds; tests/test_emulate.py recomputes
them where the fixtures exist).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlhpc.data.inputs import read_json_object  # noqa: E402
from mlhpc.log.parse import Event, parse_log  # noqa: E402
from mlhpc.text import echo  # noqa: E402

#: (workload, accelerator) -> (submitter, system) of the folder its rate comes from.
SOURCES: dict[tuple[str, str], tuple[str, str]] = {
    ("cosmoflow", "h100"): ("NVIDIA", "eos_n64_ngc23.09_pytorch"),
    ("deepcam", "h100"): ("NVIDIA", "eos_n256_ngc23.09_pytorch"),
    ("oc20", "h100"): ("NVIDIA", "eos_n80_ngc23.09_pytorch"),
    ("openfold", "h100"): ("NVIDIA", "eos_n260_ngc23.09_pytorch"),
    ("cosmoflow", "a100"): ("HPE+LBNL", "perlmutter_128x4"),
    ("deepcam", "a100"): ("Dell", "32xXE8545x4A100-SXM4-40GB"),
    ("oc20", "a100"): ("HPE+LBNL", "perlmutter_128x4"),
    ("openfold", "a100"): ("HPE+LBNL", "perlmutter_224x4"),
    ("deepcam", "a100-pcie"): ("Clemson", "18xR750-2xA100-PCIe-80GB"),
    ("openfold", "a100-pcie"): ("Clemson", "18xR750-2xA100-PCIe-80GB"),
}

#: Workloads whose ``epoch_num`` counts samples trained (mlhpc.rules: sample-counted epochs).
SAMPLE_COUNTED = ("openfold",)


def _timed(events: list[Event]) -> list[Event]:
    begin = next((i for i, e in enumerate(events) if e.key == "run_start"), len(events))
    end = next((i for i, e in enumerate(events) if e.key == "run_stop"), len(events))
    return events[begin + 1:end]


def blocks(events: list[Event], sample_counted: bool, train_samples: int) -> list[tuple[float, float]]:
    """``(samples, training seconds)`` of every training block of the timed run (`events`
    between run_start and run_stop): ``epoch_start .. epoch_stop`` of one ``epoch_num`` less the
    overlap of the evaluation of that ``epoch_num`` (an evaluation of another one runs
    concurrently with training, as NVIDIA's OC20 and every OpenFold log do, and is not taken
    off)."""
    timed = _timed(events)
    starts = {e.metadata.get("epoch_num"): e.time_ms for e in timed if e.key == "epoch_start"}
    evals, opened = {}, {}
    for e in timed:
        num = e.metadata.get("epoch_num")
        if e.key == "eval_start":
            opened[num] = e.time_ms
        elif e.key == "eval_stop" and num in opened:
            evals[num] = (opened.pop(num), e.time_ms)
    out, last_count = [], 0.0
    for e in (e for e in timed if e.key == "epoch_stop"):
        num = e.metadata.get("epoch_num")
        if num not in starts:
            continue
        start, stop = starts[num], e.time_ms
        ev = evals.get(num, (0.0, 0.0))
        overlap = max(0.0, min(stop, ev[1]) - max(start, ev[0]))
        count = float(num or 0)
        samples = count - last_count if sample_counted else float(train_samples)
        last_count = count
        out.append((samples, (stop - start - overlap) / 1000.0))
    return [(n, s) for n, s in out if n > 0 and s > 0]


def log_rate(path: Path, workload: str, accelerators: int) -> float:
    """Samples/s per accelerator of one log: a block's samples over the median block's seconds."""
    events = parse_log(path).events
    first = {}
    for event in events:
        first.setdefault(event.key, event.value)
    found = blocks(events, workload in SAMPLE_COUNTED, int(first.get("train_samples") or 0))
    samples = statistics.median(n for n, _ in found)
    return samples / statistics.median(s for _, s in found) / accelerators


def folder_rate(root: Path, workload: str, submitter: str, system: str) -> dict[str, Any]:
    """The median over the folder's logs of `log_rate`, with what it was read from."""
    desc = read_json_object(root / submitter / "systems" / f"{system}.json", what="system description")
    accelerators = int(desc["number_of_nodes"]) * int(desc["accelerators_per_node"])
    folder = root / submitter / "results" / system / "strong" / workload
    logs = sorted(folder.glob("result_*.txt"))
    rates = [log_rate(p, workload, accelerators) for p in logs]
    return {"samples_per_s": round(statistics.median(rates), 4),
            "accelerators": accelerators, "accelerator_model": desc.get("accelerator_model_name"),
            "logs": len(logs),
            "source": f"hpc_results_v3.0/{submitter}/results/{system}/strong/{workload}/result_*.txt "
                      f"({len(logs)} logs, {accelerators} accelerators; systems/{system}.json)"}


def derive(root: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """Every rate of `SOURCES`, as ``{workload: {accelerator: record}}``."""
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for (workload, accelerator), (submitter, system) in SOURCES.items():
        table.setdefault(workload, {})[accelerator] = folder_rate(root, workload, submitter, system)
    return table


if __name__ == "__main__":
    import json

    echo(json.dumps(derive(Path(sys.argv[1])), indent=2))
