"""What power sampling costs the training job: the sampler thread's own CPU, and interleaved A/B
throughput of the training step with and without sampling.

Part 1, CPU per wall second. A `mlhpc.power.Sampler` runs alone for ``--seconds`` at 1 Hz and at
10 Hz on each source kind; the thread's own CPU time (``time.thread_time`` read inside the thread,
CLOCK_THREAD_CPUTIME_ID) over its wall time is the fraction of one core it takes from the
process. For the node meter the command's children are counted too (``RUSAGE_CHILDREN``: the
forked, exec'd command's own CPU, which runs on the node's cores but outside the process):

- ``powercap``: a powercap-format tree in a temporary folder (``intel-rapl:0`` package and a
  ``dram`` zone), read through `mlhpc.power.sources.find_rapl` (real sysfs reads cost about the
  same syscalls; the counter does not move);
- ``nvml-fake``: a fake ``pynvml`` module (two devices with an energy counter) behind the real
  `mlhpc.power.sources.find_nvml` code: the Python side of a reading, not the driver call;
- ``meter-echo``: ``power.node_meter_command=echo 250``: the fork + exec floor of a node meter;
- ``meter-python``: ``python -c print(250)``: a meter written in Python (interpreter start-up).

Part 2, interleaved throughput. The training step `mlhpc run` uses (`mlhpc.run.step.train_step` on
`mlhpc.run.assemble.build`'s parts, one batch kept in memory, built once) is timed in repetitions of
about ``--rep-s`` seconds; each round runs every condition once, in an order rotated round by
round (a Latin square, so drift and position cancel), with the sampler started just before its
repetition and stopped just after (start and stop untimed). Per round, each condition's samples/s
is divided by that round's ``off``: the median of those ratios and their interquartile range are
the overhead and its spread. The same is done for the process's CPU seconds per sample (the
training threads, the sampler thread, and the node meter commands reaped during the repetition),
which other users' load moves less than wall time. Repetitions should span several readings
(``--rep-s`` well above the interval): ``readings_per_timed_s`` says how many fell inside.

Usage (what BENCHMARKS.md records; ``--part thread`` or ``--part ab`` runs one part):

    python benchmarks/power_overhead.py configs/cosmoflow-mini.yaml --seconds 20 --rounds 30 \\
        --json benchmarks/power-overhead-2core-cpu.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any, Callable, Iterator

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlhpc import config as cfg  # noqa: E402
from mlhpc.data.claims import make_claimed_dir, remove_claimed  # noqa: E402
from mlhpc.data.statefiles import record_tree, recording  # noqa: E402
from mlhpc.data.files import part_path, write_text_atomic, write_under  # noqa: E402
from mlhpc.data.inputs import read_text_input  # noqa: E402
from mlhpc.power.sampler import Sampler  # noqa: E402
from mlhpc.power.sources import NodeMeter, find_nvml, find_rapl  # noqa: E402
from mlhpc.text import echo  # noqa: E402

KINDS = ("powercap", "nvml-fake", "meter-echo", "meter-python")
#: The most bytes ``/proc/cpuinfo`` may hold (a few KiB a core).
CPUINFO_BYTES = 16 << 20


class TimedSampler(Sampler):
    """A `Sampler` whose thread records its own CPU seconds (``thread_cpu_s``) and wall seconds."""

    thread_cpu_s = 0.0
    thread_wall_s = 0.0
    thread_readings = 0  # taken by the thread (`stop` takes one more, in the caller's thread)

    def _loop(self) -> None:
        cpu, wall = time.thread_time(), time.monotonic()
        try:
            super()._loop()
        finally:
            self.thread_cpu_s, self.thread_wall_s = time.thread_time() - cpu, time.monotonic() - wall
            self.thread_readings = self.readings


def _powercap_tree(root: Path) -> Path:
    root.mkdir()
    for zone, name in (("intel-rapl:0", "package-0"), ("intel-rapl:0:0", "dram")):
        write_under(root, Path(zone, "name"), f"{name}\n".encode())
        write_under(root, Path(zone, "max_energy_range_uj"), b"262143328850\n")
        write_under(root, Path(zone, "energy_uj"), b"1000\n")
    return root


def _fake_pynvml() -> types.ModuleType:
    """Two GPUs with a total energy counter rising at 300 W (millijoules, as NVML)."""
    module = types.ModuleType("pynvml")
    module.NVMLError = type("NVMLError", (Exception,), {})
    start = time.monotonic()
    module.nvmlInit = module.nvmlShutdown = lambda: None
    module.nvmlDeviceGetCount = lambda: 2
    module.nvmlDeviceGetHandleByIndex = lambda index: index
    module.nvmlDeviceGetTotalEnergyConsumption = lambda handle: int((time.monotonic() - start) * 300e3)
    return module


def sources(kind: str, tmp: Path) -> list[Any]:
    """The sources of ``kind`` (see the module docstring)."""
    if kind == "powercap":
        return find_rapl(tmp / "powercap")[0]
    if kind == "nvml-fake":
        sys.modules["pynvml"] = _fake_pynvml()
        return find_nvml()[0]
    if kind == "meter-echo":
        return [NodeMeter("echo 250")]
    return [NodeMeter(f"{sys.executable} -c print(250)")]


@contextlib.contextmanager
def sampling(kind: str, interval_s: float, tmp: Path) -> Iterator[TimedSampler | None]:
    """A running sampler of ``kind`` (None for ``off``) writing into a claimed scratch folder,
    stopped and the folder removed (`remove_claimed`) at the end."""
    if kind == "off":
        yield None
        return
    folder = make_claimed_dir(tmp / f"{kind}-{time.monotonic_ns()}", "scratch")
    final = folder / "node_0.txt"
    sampler = TimedSampler(sources(kind, tmp), interval_s, part_path(final), final)
    sampler.start()
    try:
        yield sampler
    finally:
        sampler.stop()
        with recording(folder):  # the sampler's file: all the removal may delete
            record_tree(final)
        remove_claimed(folder, "scratch", "benchmark scratch folder")


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def thread_cost(kind: str, interval_s: float, seconds: float, tmp: Path) -> dict[str, float]:
    """Part 1 for one source and rate: the thread's CPU / wall, the children's CPU / wall
    (node meter), readings per second, CPU per reading."""
    children = _children_cpu_s()
    with sampling(kind, interval_s, tmp) as sampler:
        time.sleep(seconds)
        child_cpu = _children_cpu_s() - children  # the thread's commands, reaped; not stop's
    assert sampler is not None
    wall, cpu, n = sampler.thread_wall_s, sampler.thread_cpu_s, max(sampler.thread_readings, 1)
    return {"interval_s": interval_s, "wall_s": wall, "readings": sampler.thread_readings,
            "thread_cpu_s": cpu, "thread_core_fraction": cpu / wall,
            "children_cpu_s": child_cpu, "children_core_fraction": child_cpu / wall,
            "thread_cpu_per_reading_ms": 1e3 * cpu / n, "children_cpu_per_reading_ms": 1e3 * child_cpu / n}


def training_step(config: cfg.Config) -> tuple[Callable[[int], tuple[float, float]], int]:
    """``(run(steps) -> (wall seconds, process CPU seconds), batch)``: the training step of
    `mlhpc run`, built once, on one batch kept in memory (benchmarks/throughput.py's
    `one_batch`, fp32 on the CPU). The process CPU time includes a running sampler thread's."""
    from mlhpc.run.step import train_step
    from throughput import one_batch

    batch = config.train.global_batch_size
    _, parts, x, y = one_batch(config, batch, "fp32", "cpu")
    parts.model.train()

    def run(steps: int) -> tuple[float, float]:
        t0, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            train_step(parts.step, x, y)
        return time.perf_counter() - t0, time.process_time() - cpu0

    return run, batch


def interleaved(run: Callable[[int], tuple[float, float]], batch: int, conditions: list[tuple[str, str, float]],
                rounds: int, rep_s: float, tmp: Path) -> dict[str, Any]:
    """Part 2: samples/s per condition per round, and each condition's ratio to that round's
    ``off`` (conditions: (label, kind, interval_s), the first ``off``)."""
    run(10)
    steps = max(5, round(rep_s * 10 / run(10)[0]))  # calibrated on the (loaded) machine, once
    rates: dict[str, list[float]] = {label: [] for label, _, _ in conditions}
    cpu: dict[str, list[float]] = {label: [] for label, _, _ in conditions}  # CPU s per sample
    timed: dict[str, list[float]] = {label: [0.0, 0.0] for label, _, _ in conditions}  # seconds, readings
    for r in range(rounds):
        order = conditions[r % len(conditions):] + conditions[:r % len(conditions)]
        for label, kind, interval_s in order:
            children = _children_cpu_s()
            with sampling(kind, interval_s, tmp) as sampler:
                seconds, cpu_s = run(steps)
                timed[label][1] += sampler.readings if sampler is not None else 0
                cpu_s += _children_cpu_s() - children  # the node meter commands reaped so far
            timed[label][0] += seconds
            rates[label].append(steps * batch / seconds)
            cpu[label].append(cpu_s / (steps * batch))
    out: dict[str, Any] = {"steps_per_rep": steps, "rounds": rounds, "samples_per_s": rates,
                           "cpu_s_per_sample": cpu, "conditions": {}}
    for label, _, _ in conditions[1:]:
        out["conditions"][label] = {
            "throughput": _paired(rates[conditions[0][0]], rates[label], lower_is_worse=True),
            "cpu_per_sample": _paired(cpu[conditions[0][0]], cpu[label], lower_is_worse=False),
            "readings_per_timed_s": timed[label][1] / timed[label][0]}
    return out


def _paired(off: list[float], on: list[float], lower_is_worse: bool) -> dict[str, Any]:
    """Per round ``on / off``; the overhead in percent (throughput lost, or CPU added) at the
    median ratio and at its quartiles; the rounds where sampling did worse."""
    ratios = sorted(b / a for a, b in zip(off, on))
    q = statistics.quantiles(ratios, n=4)
    sign = -1 if lower_is_worse else 1
    pct = [sign * 100 * (x - 1) for x in (q[0], statistics.median(ratios), q[2])]
    return {"median_off": statistics.median(off), "median_on": statistics.median(on),
            "overhead_percent_median": pct[1], "overhead_percent_iqr": sorted((pct[0], pct[2])),
            "rounds_worse": sum((x < 1) if lower_is_worse else (x > 1) for x in ratios)}


def _machine() -> dict[str, Any]:
    cpuinfo = read_text_input("/proc/cpuinfo", CPUINFO_BYTES, what="CPU description")
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()
                if line.startswith("model name")), platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "load_average_1_5_15": os.getloadavg(),
            "python": platform.python_version(), "powercap_present": Path("/sys/class/powercap").exists()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--seconds", type=float, default=20.0, help="part 1: seconds per source and rate")
    parser.add_argument("--rounds", type=int, default=30, help="part 2: rounds of every condition")
    parser.add_argument("--rep-s", type=float, default=2.0, help="part 2: seconds per repetition")
    parser.add_argument("--threads", type=int, default=None,
                        help="part 2: torch threads of the training step (default: the config's)")
    parser.add_argument("--part", choices=("both", "thread", "ab"), default="both")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    config = cfg.load(args.config, tuple(args.overrides) + ((f"train.threads={args.threads}",)
                                                             if args.threads else ()))
    result: dict[str, Any] = {"config": str(args.config), "overrides": args.overrides, "machine": _machine()}
    with tempfile.TemporaryDirectory() as folder:
        tmp = _powercap_tree(Path(folder) / "powercap").parent
        result["thread_cost"] = {f"{kind}@{1 / interval_s:g}Hz": thread_cost(kind, interval_s, args.seconds, tmp)
                                 for kind in KINDS for interval_s in (1.0, 0.1) if args.part != "ab"}
        for label, cost in result["thread_cost"].items():
            echo(f"{label:>18}: thread {100 * cost['thread_core_fraction']:.4f}% of a core "
                 f"({cost['thread_cpu_per_reading_ms']:.3f} ms/reading), command "
                 f"{100 * cost['children_core_fraction']:.3f}% ({cost['children_cpu_per_reading_ms']:.3f} ms/reading), "
                 f"{cost['readings']} readings")
        if args.part != "thread":
            run, batch = training_step(config)
            conditions = [("off", "off", 0.0), ("powercap@1Hz", "powercap", 1.0), ("powercap@10Hz", "powercap", 0.1),
                          ("meter-echo@1Hz", "meter-echo", 1.0), ("meter-python@1Hz", "meter-python", 1.0)]
            result["interleaved"] = interleaved(run, batch, conditions, args.rounds, args.rep_s, tmp)
            result["interleaved"]["torch_threads"] = __import__("torch").get_num_threads()
    result["machine"]["load_average_after"] = os.getloadavg()
    for label, c in result.get("interleaved", {}).get("conditions", {}).items():
        for what, unit, scale in (("throughput", "samples/s", 1.0), ("cpu_per_sample", "CPU ms/sample", 1e3)):
            f = c[what]
            echo(f"{label:>18} {what:>14}: {f['median_on'] * scale:.3f} vs {f['median_off'] * scale:.3f} {unit} off; "
                 f"overhead {f['overhead_percent_median']:+.2f}% (IQR {f['overhead_percent_iqr'][0]:+.2f} .. "
                 f"{f['overhead_percent_iqr'][1]:+.2f}%), worse in {f['rounds_worse']}/{args.rounds} rounds")
        echo(f"{label:>18}: {c['readings_per_timed_s']:.2f} readings per timed s")
    if args.json:
        write_text_atomic(args.json, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
