"""``mlhpc run CONFIG --emulate-accelerator NAME --sweep-accelerators [--max-accelerators N]``:
the most emulated accelerators one node's storage keeps fed, MLPerf Storage's headline figure
(mlcommons/storage: the most simulated accelerators whose accelerator utilisation, AU, stays at
or above the workload's minimum; the AU rule is its Rules.md 3.3.2).

The sweep. On this node, K = 1, 2, 4, ... ranks (the largest power of two under the maximum,
then the maximum itself), each rank one emulated accelerator (storage mode, `mlhpc.run.emulate`):
each K is an ordinary ``mlhpc run`` started by ``torchrun --standalone --nproc-per-node K`` (a
rendezvous of its own on this node, the launcher variables of this process removed,
`mlhpc.runtime.single_process_env`), into ``<output.dir>/accelerators_K/`` with its output in
``output.txt`` there, and the global batch K x the config's, so that each rank keeps the
config's local batch as each of MLPerf Storage's simulated accelerators keeps its own. Each
run's AU and samples/s are read back from its log (`mlhpc.log.summary.read_summary`, whose
``emulation`` is `mlhpc.log.emulated.emulation_figures`), as ``mlhpc report`` reads them. The
sweep stops after the first K whose AU is below the workload's minimum (or whose run failed),
or at the maximum (default: the CPUs this process may use).

The answer (`Sweep`): a row per K (accelerators, AU 0..1, samples/s, meets the minimum, the
run's exit status and folder) and the headline, the largest K that met the minimum and its
samples/s; ``<output.dir>/sweep.json`` holds the same (written once).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from mlhpc import runtime
from mlhpc.config import Config
from mlhpc.data.statefiles import open_state_file
from mlhpc.errors import ConfigError, LogFormatError, OutputError
from mlhpc.log.summary import read_summary
from mlhpc.run.emulate import Emulation, emulation
from mlhpc.run.result import check_output_dir, write_json

SWEEP_FILE = "sweep.json"
FOLDER = "accelerators_{k}"
FORMAT = "mlhpc accelerator sweep 1"


@dataclass(frozen=True)
class Row:
    """One K of the sweep.

    Attributes:
        accelerators: K, the ranks of the run, one emulated accelerator each.
        accelerator_utilization: the run's AU (0..1, mean over its ranks), None when its log
            gives none (the run failed).
        samples_per_s: the run's samples per second over all its ranks, None likewise.
        meets_minimum: the run ended (exit status 0) and its AU is at or above the minimum.
        exit_status: the run's exit status (negative: killed by that signal).
        folder: the run's folder.
    """

    accelerators: int
    accelerator_utilization: float | None
    samples_per_s: float | None
    meets_minimum: bool
    exit_status: int = 0
    folder: str = ""


@dataclass
class Sweep:
    """The sweep's setting, its rows in order of K, and why it stopped."""

    workload: str
    emulated: dict[str, Any]
    max_accelerators: int
    rows: list[Row] = field(default_factory=list)

    @property
    def best(self) -> Row | None:
        """The row of the most accelerators that met the minimum (None: not even one did)."""
        met = [r for r in self.rows if r.meets_minimum]
        return max(met, key=lambda r: r.accelerators) if met else None

    @property
    def exit_status(self) -> int:
        """0: at least one accelerator met the minimum; 1: not even one did."""
        return 0 if self.best is not None else 1

    def stopped(self) -> str:
        """Why the sweep ended, in words."""
        last = self.rows[-1] if self.rows else None
        if last is None:
            return "no run"
        if last.exit_status != 0 or last.accelerator_utilization is None:
            return f"the run of {last.accelerators} failed (exit status {last.exit_status})"
        if not last.meets_minimum:
            return f"AU fell below the minimum at {last.accelerators}"
        return f"the maximum, {self.max_accelerators}, met the minimum"

    def to_dict(self) -> dict[str, Any]:
        """What ``sweep.json`` holds: the setting, ``rows``, ``headline`` (``accelerators``, 0
        when none met the minimum, and its ``samples_per_s``) and ``stopped``."""
        best = self.best
        return {"format": FORMAT, "workload": self.workload, **self.emulated,
                "max_accelerators": self.max_accelerators, "rows": [asdict(r) for r in self.rows],
                "headline": {"accelerators": best.accelerators if best else 0,
                             "samples_per_s": best.samples_per_s if best else None},
                "stopped": self.stopped()}


def accelerator_counts(max_accelerators: int) -> list[int]:
    """K = 1, 2, 4, ... up to ``max_accelerators``, which ends the list even when it is not a
    power of two (``6 -> [1, 2, 4, 6]``)."""
    counts, k = [], 1
    while k < max_accelerators:
        counts.append(k)
        k *= 2
    return counts + [max_accelerators]


def sweep_rows(counts: Sequence[int], measure: Callable[[int], Row],
               on_row: Callable[[Row], None] | None = None) -> list[Row]:
    """``measure(K)`` for each K of ``counts`` in order, stopping after the first row that does
    not meet the minimum (MLPerf Storage's sweep: more accelerators than the first that starve
    cannot do better). ``on_row`` sees each row as it comes."""
    rows: list[Row] = []
    for k in counts:
        row = measure(k)
        rows.append(row)
        if on_row is not None:
            on_row(row)
        if not row.meets_minimum:
            break
    return rows


def default_max_accelerators() -> int:
    """The CPUs this process may use (`mlhpc.runtime.usable_cpus`): one rank each."""
    return runtime.usable_cpus()


@dataclass(frozen=True)
class Plan:
    """What every K's run is given: the config file and ``--set`` overrides as the command got
    them (``train.emulate_accelerator`` among them, or in the file), the config's global batch
    (one rank's: its local batch x gradient accumulation) and the sweep's folder."""

    config_path: Path
    overrides: tuple[str, ...]
    global_batch_size: int
    output: Path

    @classmethod
    def of(cls, config_path: Path, overrides: tuple[str, ...], config: Config) -> "Plan":
        """The plan of ``config``, loaded from ``config_path`` with ``overrides``."""
        return cls(Path(config_path), tuple(overrides), config.train.global_batch_size,
                   Path(config.output.dir).absolute())

    def command(self, k: int) -> list[str]:
        """``torchrun --standalone --nproc-per-node K -m mlhpc run ...`` for K accelerators."""
        sets = [a for o in self.overrides for a in ("--set", o)]
        run = ["-m", "mlhpc", "run", str(self.config_path), *sets, "--set", f"train.global_batch_size={k * self.global_batch_size}",
               "--set", f"output.dir={json.dumps(str(self.output / FOLDER.format(k=k)))}"]
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={k}", *run]


def check_sweep(config: Config, max_accelerators: int | None) -> tuple[Emulation, int]:
    """The sweep's emulation and maximum, checked before anything runs.

    Raises:
        ConfigError: no ``train.emulate_accelerator``, a maximum below 1, this process one rank
            of a launched job already (the sweep starts its own ranks), or what
            `mlhpc.run.emulate.emulation` refuses.
        OutputError: the output folder cannot be written or already holds a ``sweep.json``.
    """
    emulated = emulation(config, config.workload)
    if emulated is None:
        raise ConfigError("--sweep-accelerators: give --emulate-accelerator NAME|TIME (the sweep "
                          "runs storage mode; or train.emulate_accelerator in the config)")
    if max_accelerators is not None and max_accelerators < 1:
        raise ConfigError(f"--max-accelerators: {max_accelerators} is not at least 1")
    world = runtime.detect(device="cpu").world_size
    if world > 1:
        raise ConfigError(f"--sweep-accelerators starts its own ranks (torchrun); run it as one "
                          f"process, not under a launcher (world size {world})")
    output = check_output_dir(config.output.dir)
    if os.path.lexists(output / SWEEP_FILE):
        raise OutputError("already holds a sweep; give another output.dir",
                          path=output / SWEEP_FILE)
    return emulated, max_accelerators or default_max_accelerators()


def measure(plan: Plan, k: int, minimum: float) -> Row:
    """Run K accelerators (`Plan.command`) into ``<output>/accelerators_K/`` and read its new
    log's AU and samples/s back (a run that wrote no readable log: AU None, minimum not met).

    Raises:
        OutputError: the run's folder or its ``output.txt`` cannot be made.
    """
    folder = check_output_dir(plan.output / FOLDER.format(k=k), key=f"output.dir/{FOLDER.format(k=k)}")
    before = set(folder.glob("result_*.txt"))
    try:
        fd = open_state_file(folder / "output.txt", os.O_WRONLY | os.O_APPEND, what="run output",
                             error=OutputError)
    except OSError as exc:
        raise OutputError(f"cannot open the run's output file: {exc.strerror}",
                          path=folder / "output.txt") from None
    try:
        status = subprocess.run(plan.command(k), env=runtime.single_process_env(), stdin=subprocess.DEVNULL,
                                stdout=fd, stderr=subprocess.STDOUT, check=False,
                                preexec_fn=runtime.die_with_parent).returncode
    finally:
        os.close(fd)
    new = sorted(set(folder.glob("result_*.txt")) - before)
    figures = None
    if len(new) == 1:
        try:
            figures = read_summary(new[0]).get("emulation")
        except LogFormatError:
            figures = None
    au = figures.get("accelerator_utilization") if figures else None
    rate = figures.get("samples_per_s") if figures else None
    met = status == 0 and au is not None and au >= minimum
    return Row(k, au, rate, met, status, str(folder))


def run_sweep(config: Config, plan: Plan, max_accelerators: int | None,
              say: Callable[[str], None] | None = None) -> Sweep:
    """The sweep (module docstring) of ``config`` as ``plan`` gives it; ``sweep.json`` written
    in ``plan.output`` at its end. ``say`` gets a line as each K starts and as it ends.

    Raises:
        ConfigError, OutputError: what `check_sweep` refuses, before any run.
    """
    emulated, top = check_sweep(config, max_accelerators)
    result = Sweep(config.workload, emulated.record(config.train.global_batch_size
                                                    // config.train.gradient_accumulation_steps), top)
    tell = say or (lambda line: None)

    def one(k: int) -> Row:
        tell(f"accelerators {k}: running (torchrun --nproc-per-node {k}; output in "
             f"{plan.output / FOLDER.format(k=k) / 'output.txt'})")
        return measure(plan, k, emulated.min_utilization)

    result.rows = sweep_rows(accelerator_counts(top), one, lambda row: tell(ended_line(row)))
    write_json(plan.output / SWEEP_FILE, result.to_dict())
    return result


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _verdict(row: Row) -> str:
    if row.exit_status != 0 or row.accelerator_utilization is None:
        return f"run failed (exit status {row.exit_status}; see {row.folder}/output.txt)"
    return "yes" if row.meets_minimum else "no"


def ended_line(row: Row) -> str:
    """A row as one line, said as its run ends."""
    rate = "-" if row.samples_per_s is None else f"{row.samples_per_s:.1f}"
    return (f"accelerators {row.accelerators}: AU {_percent(row.accelerator_utilization)}, {rate} samples/s, "
            f"meets the minimum: {_verdict(row)}")


def row_line(row: Row) -> str:
    """One row as a table line (K, AU, samples/s, meets the minimum)."""
    rate = "-" if row.samples_per_s is None else f"{row.samples_per_s:.1f}"
    return f"{row.accelerators:>12}  {_percent(row.accelerator_utilization):>7}  {rate:>10}  {_verdict(row)}"


def table_lines(result: Sweep) -> list[str]:
    """The sweep's table and headline, as lines for the terminal."""
    minimum = float(result.emulated["min_accelerator_utilization"])
    given = result.emulated["source"] == "given"  # a time per sample, not an accelerator's name
    name = result.emulated["accelerator"]
    what = (f"emulated accelerators ({name} per sample)", f"emulated accelerator ({name} per sample)") if given \
        else (f"emulated {name} accelerators", f"emulated {name} accelerator")
    lines = [f"{'accelerators':>12}  {'AU':>7}  {'samples/s':>10}  meets {_percent(minimum)}",
             *(row_line(r) for r in result.rows)]
    best = result.best
    if best is None:
        lines.append(f"not even one {what[1]} kept AU >= {_percent(minimum)} "
                     f"({result.stopped()})")
    else:
        lines.append(f"most {what[0]} per node at AU >= {_percent(minimum)}: "
                     f"{best.accelerators} ({best.samples_per_s or 0:.1f} samples/s; stopped: {result.stopped()})")
    return lines
