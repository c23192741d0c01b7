"""Storage mode's records in a log and the figures read from them: accelerator utilisation (AU)
and samples/s, per rank, per node and in all (`emulation_figures`, which `mlhpc.log.summary`
calls for every log; None for a log of a normal run).

A storage-mode run (`mlhpc.run.emulate`) writes two kinds of record, both ``POINT_IN_TIME``:

- ``emulated_accelerator`` once before ``run_start``: ``{"accelerator", "time_per_sample_s",
  "source", "min_accelerator_utilization", "min_source", "local_batch_size"}``;
- ``emulated_compute`` after each ``epoch_stop`` (metadata ``epoch_num``): per rank of the run,
  in rank order, ``compute_s`` (the seconds its emulated accelerator computed: the sleeps,
  nominal), ``samples`` (the samples it stepped), ``first_batch_s`` (seconds from the epoch's
  start to its first batch) and ``node`` (its node's index).

AU follows MLPerf Storage's rule (mlcommons/storage Rules.md, 3.3.2
trainingAcceleratorUtilizationCheck): "AU = (total_compute_time/total_benchmark_running_time) *
100" and "All the I/O operations from the first step are excluded from the AU calculation. The
I/O operations that are excluded from the AU calculation are included in the samples/second
reported by the benchmark, however." Here, per rank: AU = its compute seconds / (the epochs'
training seconds, ``epoch_start .. epoch_stop`` as the summary counts them, less its
``first_batch_s`` of each epoch); a node's AU is the mean of its ranks', the run's the mean of
every rank's. samples/s counts every epoch's whole time.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from mlhpc.log.writer import EMULATED_ACCELERATOR, EMULATED_COMPUTE

if TYPE_CHECKING:  # the run writes these records and needs the keys, never the log reader
    from mlhpc.log.parse import Event

SETTING_KEY, EPOCH_KEY = EMULATED_ACCELERATOR, EMULATED_COMPUTE
PER_RANK = ("compute_s", "samples", "first_batch_s", "node")


def _numbers(value: Any, n: int | None) -> list[float] | None:
    """``value`` as a list of finite numbers >= 0 (of length ``n`` when given), else None."""
    if not isinstance(value, list) or (n is not None and len(value) != n):
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
               for v in value):
        return None
    return [float(v) for v in value]


def _epoch_records(events: list[Event]) -> list[dict[str, list[float]]]:
    """Every well-formed ``emulated_compute`` value between run_start and run_stop, each field a
    list of one number per rank (a record of another shape is left out)."""
    begin = next((i for i, e in enumerate(events) if e.key == "run_start"), len(events))
    end = next((i for i, e in enumerate(events) if e.key == "run_stop"), len(events))
    out: list[dict[str, list[float]]] = []
    for event in events[begin + 1:end]:
        if event.key != EPOCH_KEY or not isinstance(event.value, dict):
            continue
        ranks = len(out[0]["compute_s"]) if out else None
        fields = {k: _numbers(event.value.get(k), ranks) for k in PER_RANK}
        if all(v is not None and v for v in fields.values()):
            ranks = len(fields["compute_s"])  # type: ignore[arg-type]
            if all(len(v) == ranks for v in fields.values()):  # type: ignore[arg-type]
                out.append(fields)  # type: ignore[arg-type]
    return out


def _setting(events: list[Event]) -> dict[str, Any] | None:
    return next((e.value for e in events if e.key == SETTING_KEY and isinstance(e.value, dict)), None)


def emulation_figures(events: list[Event], train_epoch_s: list[float]) -> dict[str, Any] | None:
    """AU and samples/s of a storage-mode log (None for any other log, or one whose records do
    not say): ``accelerator_utilization`` (0..1), ``samples_per_s``, ``meets_minimum``, the
    setting as logged, ``ranks`` and ``nodes`` (per node: ``node``, ``ranks``,
    ``accelerator_utilization``, ``samples_per_s``), ``rank_accelerator_utilization``.

    ``train_epoch_s``: the training seconds of the log's epochs in order
    (`mlhpc.log.summary.RunSummary.train_epoch_s`); the first as many as there are
    ``emulated_compute`` records count.
    """
    setting, records = _setting(events), _epoch_records(events)
    epochs = min(len(records), len(train_epoch_s))
    if setting is None or epochs == 0:
        return None
    records, train_s = records[:epochs], sum(train_epoch_s[:epochs])
    ranks = len(records[0]["compute_s"])
    total = {k: [sum(r[k][i] for r in records) for i in range(ranks)] for k in PER_RANK[:3]}
    rank_au = [total["compute_s"][i] / max(train_s - total["first_batch_s"][i], 1e-9) for i in range(ranks)]
    nodes: dict[int, list[int]] = {}
    for i, node in enumerate(records[0]["node"]):
        nodes.setdefault(int(node), []).append(i)
    au = sum(rank_au) / ranks
    minimum = setting.get("min_accelerator_utilization")
    return {
        **{k: setting.get(k) for k in ("accelerator", "time_per_sample_s", "source", "local_batch_size",
                                       "min_accelerator_utilization", "min_source")},
        "accelerator_utilization": au, "samples_per_s": sum(total["samples"]) / train_s if train_s > 0 else None,
        "meets_minimum": au >= minimum if isinstance(minimum, (int, float)) else None,
        "epochs": epochs, "ranks": ranks, "rank_accelerator_utilization": rank_au,
        "nodes": [{"node": node, "ranks": len(members),
                   "accelerator_utilization": sum(rank_au[i] for i in members) / len(members),
                   "samples_per_s": sum(total["samples"][i] for i in members) / train_s if train_s > 0 else None}
                  for node, members in sorted(nodes.items())],
    }
