"""Storage mode (``mlhpc run CONFIG --emulate-accelerator NAME|TIME``, ``train.emulate_accelerator``):
the run's real data path (staging, loader workers, decoding, batches, the copy to the device
where there is one) with each training step replaced by a sleep as long as the step would take
on an emulated accelerator, so that a centre measures whether its storage keeps accelerators fed
without having them. This is MLPerf Storage's method (mlcommons/storage, its DLIO benchmark):
each simulated accelerator is one process that reads real batches and sleeps for the compute
time measured on a real accelerator.

The sleep. One emulated accelerator per rank: a step of ``b`` samples (the rank's local batch)
sleeps ``b x time_per_sample_s`` (`EmulatedCompute.step`), after waiting for the batch's copy to
the device. ``time_per_sample_s`` is a given time (``12.5ms``), or ``1 / samples_per_s`` of the
accelerator's published rate for the config's workload (`published_rate`), from
``accelerators.json`` beside this module.

The rates. Samples per second of one accelerator of a published MLPerf HPC v3.0 system: its
training throughput over its accelerators, the all-reduce included (benchmarks/accelerator_rates.py
derives them from MLCommons' hpc_results_v3.0 logs: for each workload and accelerator, the
closed-division strong-scaling folder of the submission on that accelerator with the fewest of
them; per log, training blocks ``epoch_start .. epoch_stop`` of one ``epoch_num`` between
``run_start`` and ``run_stop`` less the evaluation of that ``epoch_num``; a block's samples,
``train_samples``, or the growth of ``epoch_num`` where it counts samples, over the median
block's seconds and the accelerators of ``systems/<system>.json``; the median over the folder's
logs). The data file names each rate's folder and the derivation; a rate measured at another
scale or batch is an approximation of the step this run's batch would take, which is why a time
can be given instead.

Accelerator utilisation. MLPerf Storage's rule (mlcommons/storage Rules.md, 3.3.2
trainingAcceleratorUtilizationCheck): "To pass a benchmark run, the AU (Accelerator Utilization)
should be equal to or greater than the minimum value: total_compute_time = (records_per_file *
total_files) / simulated_accelerators / batch_size * computation_time * epochs; AU =
(total_compute_time/total_benchmark_running_time) * 100; All the I/O operations from the first
step are excluded from the AU calculation." Its minimums: 3D U-Net 90 %, CosmoFlow 70 %; for
the benchmarks MLPerf Storage does not define, ``accelerators.json`` takes its strictest, 90 %.
The log carries each epoch's per-rank compute seconds, samples and first-batch wait
(`EmulatedCompute.log_epoch`), and `mlhpc.log.emulated` turns them into AU and samples/s per
rank, per node and in all, which ``mlhpc report`` shows.

The run. Nothing is evaluated (no model is trained, so no quality can be claimed): the run goes
through ``train.max_epochs`` epochs and logs ``run_stop`` with status ``aborted`` and a reason
saying so, as MLPerf's logs say a run that claims no target; the command exits 0 when every
epoch ran (`mlhpc.run.outcome.exit_status`). A normal run's log is unchanged.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mlhpc import runtime
from mlhpc.config import Config
from mlhpc.config.emulation import time_per_sample_s
from mlhpc.data.inputs import read_json_object
from mlhpc.errors import ConfigError
from mlhpc.log.writer import EMULATED_COMPUTE, ComplianceLog
from mlhpc.runtime import Runtime

#: The published rates and the minimum AU per workload, with their sources.
RATES_FILE = Path(__file__).with_name("accelerators.json")
KEY = "train.emulate_accelerator"


@dataclass(frozen=True)
class PublishedRate:
    """One accelerator's published training rate for one workload.

    Attributes:
        samples_per_s: training samples per second of one accelerator (the system's over its
            accelerators).
        source: the result logs it was derived from (``hpc_results_v3.0/<submitter>/...``).
        accelerator_model: the system description's ``accelerator_model_name``.
    """

    workload: str
    accelerator: str
    samples_per_s: float
    source: str
    accelerator_model: str = ""

    @property
    def time_per_sample_s(self) -> float:
        return 1.0 / self.samples_per_s


@functools.lru_cache(maxsize=1)
def _table() -> dict[str, Any]:
    return read_json_object(RATES_FILE, what="accelerator rates")


def known_accelerators(workload: str) -> list[str]:
    """The accelerator names with a published rate for ``workload`` (sorted; [] for none)."""
    return sorted(_table().get("rates", {}).get(workload, {}))


def published_rate(workload: str, accelerator: str) -> PublishedRate:
    """``accelerator``'s published rate for ``workload`` (name case ignored).

    Raises:
        ConfigError: no rate for that name, naming the known ones.
    """
    name = accelerator.strip().lower()
    record = _table().get("rates", {}).get(workload, {}).get(name)
    if record is None:
        known = ", ".join(known_accelerators(workload)) or "none"
        raise ConfigError(f"{KEY}: unknown accelerator {accelerator!r} for {workload}; known: {known} "
                          "(or a time per sample such as 12.5ms)")
    return PublishedRate(workload, name, float(record["samples_per_s"]), str(record["source"]),
                         str(record.get("accelerator_model", "")))


def minimum_utilization(workload: str) -> tuple[float, str]:
    """The minimum AU (0..1) a storage-mode run of ``workload`` must keep, and why that value."""
    entry = _table().get("minimum_accelerator_utilization", {}).get(workload)
    if entry is None:  # a workload the file does not know: MLPerf Storage's strictest minimum
        return 0.9, "MLPerf Storage's strictest training minimum (3D U-Net, 90%)"
    return float(entry["value"]), str(entry["source"])


@dataclass(frozen=True)
class Emulation:
    """What a storage-mode run emulates: the accelerator (a name, or the time as given), its
    seconds per sample, where they come from, and the minimum AU."""

    accelerator: str
    time_per_sample_s: float
    source: str
    min_utilization: float
    min_source: str

    def compute(self, device: torch.device) -> "EmulatedCompute":
        """This rank's emulated accelerator for one epoch, made at its start."""
        return EmulatedCompute(self, device)

    def record(self, local_batch_size: int) -> dict[str, Any]:
        """The ``emulated_accelerator`` record's value (`mlhpc.log.emulated`)."""
        return {"accelerator": self.accelerator, "time_per_sample_s": self.time_per_sample_s,
                "source": self.source, "min_accelerator_utilization": self.min_utilization,
                "min_source": self.min_source, "local_batch_size": local_batch_size}


def emulation(config: Config, workload: str) -> Emulation | None:
    """The emulation ``train.emulate_accelerator`` asks for (None: a normal run).

    Raises:
        ConfigError: an unknown accelerator name for ``workload`` (the known ones listed), or a
            run of several instances (storage mode emulates one job's accelerators).
    """
    value = config.train.emulate_accelerator
    if value is None:
        return None
    if config.train.instances != 1:
        raise ConfigError(f"{config.source}: {KEY}: storage mode runs one instance "
                          f"(train.instances is {config.train.instances})")
    minimum, why = minimum_utilization(workload)
    seconds = time_per_sample_s(value)
    if seconds is not None:
        return Emulation(value.strip().lower(), seconds, "given", minimum, why)
    try:
        rate = published_rate(workload, value)
    except ConfigError as exc:
        raise ConfigError(f"{config.source}: {exc}") from None
    return Emulation(rate.accelerator, rate.time_per_sample_s, rate.source, minimum, why)


class EmulatedCompute:
    """One epoch of this rank's emulated accelerator: each `step` sleeps for the batch's compute
    and counts it. Made at the epoch's start (after ``epoch_start``), which times the wait for
    the first batch (MLPerf Storage leaves the first step's I/O out of AU)."""

    def __init__(self, emulated: Emulation, device: torch.device) -> None:
        self.emulated, self.device = emulated, device
        self.start = time.perf_counter()
        self.compute_s, self.samples, self.first_batch_s = 0.0, 0, None
        self.zero = torch.zeros((), dtype=torch.float64, device=device)

    def step(self, samples: int) -> torch.Tensor:
        """The training step on a batch of ``samples`` already on the device: wait for its copy,
        sleep ``samples x time_per_sample_s``; returns a loss of 0 (nothing is trained)."""
        if self.first_batch_s is None:
            self.first_batch_s = time.perf_counter() - self.start
        if self.device.type == "cuda":  # the batch's copy to the device has landed, as a real step waits for it
            torch.cuda.synchronize(self.device)
        seconds = samples * self.emulated.time_per_sample_s
        time.sleep(seconds)
        self.compute_s += seconds
        self.samples += samples
        return self.zero


    def log_epoch(self, log: ComplianceLog, rt: Runtime, epoch_num: int) -> None:
        """The epoch's ``emulated_compute`` record (after its ``epoch_stop``): every rank's
        compute seconds, samples, first-batch wait and node, gathered with one all-reduce over
        the instance's ranks (each rank fills its own slot); the ``emulated_accelerator`` record
        (`Emulation.record`) is logged before ``run_start``."""
        size = rt.world_size
        values = [0.0] * (4 * size)
        mine = (self.compute_s, float(self.samples), self.first_batch_s or 0.0, float(rt.node_rank))
        for k, value in enumerate(mine):
            values[k * size + rt.rank] = value
        summed = runtime.all_reduce(values, rt)
        log.event(EMULATED_COMPUTE, {"compute_s": summed[:size], "samples": [int(v) for v in summed[size:2 * size]],
                                     "first_batch_s": summed[2 * size:3 * size],
                                     "node": [int(v) for v in summed[3 * size:]]},
                  metadata={"epoch_num": epoch_num})
