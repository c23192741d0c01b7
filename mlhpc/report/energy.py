"""Energy to train from the MLPerf power logs beside a result: ``power/result_N/node_K.txt``
(and ``sw_K.txt``), computed exactly as MLCommons' result_summarizer computes it.

Source followed: ``mlperf_logging/result_summarizer/result_summarizer.py``,
``_compute_total_power``, ``_compute_power_node`` and ``_compute_power_sw``. Per node file, the
records sorted by ``time_ms``: from ``power_measurement_start``, each ``power_reading`` adds
value (W) x (its time_ms - the previous record's) until ``power_measurement_stop`` (or, without
one, the last reading); times ``conversion_eff`` (1.0 unless logged); scaled to the run's time to
train: ``E_node = eff x sum / (stop - start) x time_to_train_ms / 1000`` joules. A switch file
adds ``eff x interconnect_power_est x time_to_train_ms / 1000``. The run's energy is the sum over
its files. A file the summarizer could not read (no start record, an unreadable reading, an empty
window) gives no energy, with the reason; it never gives a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from mlperf_logging.mllog import constants

from mlhpc.errors import LogFormatError
from mlhpc.log.parse import Event, parse_log
from mlhpc.log.plausible import implausible
from mlhpc.log.summary import official_start_stop, pair_intervals

POWER_DIR = "power"
CONVERSION_EFF = "conversion_eff"  # no constant in mlperf_logging.mllog.constants
#: How every note that a run or folder has no power readings begins (the human formats fold them into one).
POWER_NOTE_PREFIX = "no power counter"
#: How the note of a run whose node file is shared by throughput instances begins.
SHARED_NOTE_PREFIX = "node power shared by"
_NODE = re.compile(r"^node_(\d+)\.txt$")
_SWITCH = re.compile(r"^sw_(\d+)\.txt$")


def is_power_log(name: str) -> bool:
    """Whether a file name in a result's power folder is a power log: ``node_K.txt`` (one per
    node) or ``sw_K.txt`` (one per switch), mlperf_logging's power layout."""
    return bool(_NODE.match(name) or _SWITCH.match(name))


@dataclass
class RunEnergy:
    """A run's energy from its power files.

    Attributes:
        energy_j: energy to train, joules (None: no power files, or one unreadable: ``note``).
        node_energy_j: ``{"node_K": J}`` for each node file, then ``{"sw_K": J}`` per switch file.
        readings: per node file, ``[(from_ms, to_ms, watts)]`` for each reading (conversion_eff
            applied), for the energy of a part of the run (`energy_between`).
        note: why there is no energy, or what is partial.
    """

    energy_j: float | None = None
    node_energy_j: dict[str, float] = field(default_factory=dict)
    readings: list[list[tuple[float, float, float]]] = field(default_factory=list)  # per node file
    note: str | None = None


def power_folder(log: Path) -> Path:
    """``<folder of log>/power/<log stem>``, where a result's power logs lie."""
    return Path(log).parent / POWER_DIR / Path(log).stem


def node_energy(events: list[Event], time_to_train_ms: float) -> tuple[float, list[tuple[float, float, float]]]:
    """One node file's energy in joules and its readings as ``(from_ms, to_ms, watts x eff)``.

    Raises:
        ValueError: no ``power_measurement_start``, a reading without a number, or an empty window.
    """
    start = stop = last = None
    previous, total, eff = 0.0, 0.0, 1.0
    spans: list[tuple[float, float, float]] = []
    for event in sorted(events, key=lambda e: e.time_ms):
        if event.key == constants.POWER_MEASUREMENT_START:
            start = previous = event.time_ms
        elif event.key == constants.POWER_READING and stop is None and start is not None:
            watts = event.value
            if isinstance(watts, bool) or not isinstance(watts, (int, float)):
                raise ValueError(f"power_reading at {event.time_ms:.0f} ms without a number of watts")
            if problem := implausible("power_w", watts):
                raise ValueError(f"power_reading at {event.time_ms:.0f} ms refused: {problem}")
            total += watts * (event.time_ms - previous)
            spans.append((previous, event.time_ms, float(watts)))
            previous, last = event.time_ms, max(last or event.time_ms, event.time_ms)
        elif event.key == constants.POWER_MEASUREMENT_STOP:
            stop = event.time_ms
        if event.key == CONVERSION_EFF and isinstance(event.value, (int, float)):
            eff = float(event.value)
    if start is None:
        raise ValueError("power_measurement_start not found")
    stop = last if stop is None else stop
    if stop is None or stop <= start:
        raise ValueError("no power readings after power_measurement_start")
    return eff * total * time_to_train_ms / (stop - start) / 1000.0, [(a, b, w * eff) for a, b, w in spans]


def switch_energy(events: list[Event], time_to_train_ms: float) -> float:
    """A switch file's ``conversion_eff x interconnect_power_est x time to train`` in joules."""
    eff, watts = 1.0, 0.0
    for event in events:
        if event.key == CONVERSION_EFF and isinstance(event.value, (int, float)):
            eff = float(event.value)
        if event.key == constants.INTERCONNECT_POWER_EST and isinstance(event.value, (int, float)):
            watts = float(event.value)
            break
    return eff * watts * time_to_train_ms / 1000.0


def run_energy(log: Path, time_to_train_ms: float | None) -> RunEnergy:
    """The energy of the run logged in ``log`` from ``power/<log stem>/`` (see the module doc)."""
    folder = power_folder(log)
    if folder.parent.is_symlink() or folder.is_symlink():
        return RunEnergy(note=f"{folder}: a symbolic link, not followed: no energy")
    if not folder.is_dir():
        return RunEnergy(note=f"{POWER_NOTE_PREFIX}, or power sampling off: no power readings")
    files = sorted(folder.iterdir(), key=lambda p: p.name)
    nodes = [p for p in files if _NODE.match(p.name)]
    if not nodes:
        return RunEnergy(note=f"{folder}: no node_K.txt power log")
    if time_to_train_ms is None:
        return RunEnergy(note="no time to train: energy not computed")
    out = RunEnergy(energy_j=0.0)
    for path in nodes + [p for p in files if _SWITCH.match(p.name)]:
        try:  # parse_log: no link out of the power folder, no FIFO, size capped
            parsed = parse_log(path, root=folder)
            if parsed.malformed:
                raise ValueError(parsed.malformed[0].message)
            if _SWITCH.match(path.name):
                joules = switch_energy(parsed.events, time_to_train_ms)
            else:
                joules, spans = node_energy(parsed.events, time_to_train_ms)
                out.readings.append(spans)
            if problem := implausible("energy_j", joules):
                raise ValueError(f"refused: {problem}")
        except LogFormatError as exc:
            return RunEnergy(note=f"{exc}: no energy")
        except ValueError as exc:
            return RunEnergy(note=f"{path}: {exc}: no energy")
        out.node_energy_j[path.stem] = joules
        out.energy_j += joules
        shared = _instances_on_node(parsed.events)
        if shared > 1:
            out.note = (f"{SHARED_NOTE_PREFIX} {shared} instances: {path.name} holds the whole "
                        "node's energy over this run; the instances' energies overlap, do not add them")
    return out


def _instances_on_node(events: list[Event]) -> int:
    """``instances_on_node`` of a node file's ``power_measurement_start`` (1 when absent): how
    many throughput instances shared the node whose whole readings the file holds."""
    for event in events:
        if event.key == constants.POWER_MEASUREMENT_START and isinstance(event.metadata, dict):
            value = event.metadata.get("instances_on_node", 1)
            return value if isinstance(value, int) and not isinstance(value, bool) else 1
    return 1


def energy_between(energy: RunEnergy, start_ms: float, stop_ms: float) -> float | None:
    """Joules the node files' readings give between ``start_ms`` and ``stop_ms`` (each reading
    stands for the interval before it, as the summarizer counts it); None without readings or
    when the interval is not covered by every node's window."""
    if not energy.readings:
        return None
    total = 0.0
    for spans in energy.readings:
        if not spans or spans[0][0] > start_ms or spans[-1][1] < stop_ms:
            return None
        total += sum(w * max(0.0, min(b, stop_ms) - max(a, start_ms)) for a, b, w in spans) / 1000.0
    return total


@dataclass(frozen=True)
class RunPower:
    """A run's energy as the report shows it (`run_power`); ``power_note`` says why there is
    none, or what is partial.

    Attributes:
        energy_to_train_j / mean_power_w: joules over the time to train, and joules / seconds.
        node_energy_j: joules per node (and switch) file.
        mean_epoch_energy_j: the readings' energy over each ``epoch_start .. epoch_stop``, averaged.
        power_note: why no energy (None where measured and whole).
    """

    energy_to_train_j: float | None = None
    mean_power_w: float | None = None
    node_energy_j: dict[str, float] = field(default_factory=dict)
    mean_epoch_energy_j: float | None = None
    power_note: str | None = None


def run_power(log: Path, events: list[Event]) -> RunPower:
    """The energy of the run logged in ``log`` (its records ``events``) from the power logs
    beside it (`run_energy`), with the time to train as result_summarizer takes it
    (`official_start_stop`) and each epoch's energy from the epoch records: ``power_note``
    always, ``energy_to_train_j`` (J), ``mean_power_w`` (W), ``node_energy_j`` and
    ``mean_epoch_energy_j`` (J) where measured."""
    start, stop = official_start_stop(events)
    ttt_ms = None if start is None or stop is None else stop - start
    energy = run_energy(log, ttt_ms)
    if energy.energy_j is None or not ttt_ms:
        return RunPower(power_note=energy.note)
    begin = next((i for i, e in enumerate(events) if e.key == "run_start"), -1)
    end = next((i for i, e in enumerate(events) if e.key == "run_stop"), len(events))
    epochs = [energy_between(energy, iv.start_ms, iv.stop_ms)
              for iv in pair_intervals(events[begin + 1:end], "epoch_start", "epoch_stop")]
    per_epoch = sum(epochs) / len(epochs) if epochs and all(e is not None for e in epochs) else None  # type: ignore[arg-type]
    return RunPower(energy.energy_j, energy.energy_j / (ttt_ms / 1000.0), dict(energy.node_energy_j), per_epoch,
                    energy.note)


@dataclass(frozen=True)
class FolderEnergy:
    """A result folder's energy score: ``energy_j`` (joules; None: no score) and the notes that
    say why there is none or what it leaves out."""

    energy_j: float | None
    notes: tuple[str, ...] = ()


def folder_energy(counted: list[tuple[RunPower, float, float]], runs: list[RunPower], kind: str,
                  dropped: int, max_dropped: int, scaling_factor: float) -> FolderEnergy:
    """The energy score of a result folder as result_summarizer computes the power score:
    ``_index_olympic_average`` (strong: the runs' energies in the order of their times to train,
    the same drop as the score, times ``scaling_factor``) or ``_compute_olympic_average(power_scores,
    1, 1)`` (weak: the lowest dropped, no factor).

    Args:
        counted: the runs that count, ``(its power, run_start_ms, run_stop_ms)``.
        runs: every run's power (a measured run that does not count is named in a note).
        kind: ``"strong"``, ``"weak"`` or ``"runs"``.
        dropped / max_dropped: runs dropped, and how many the ruleset allows.
        scaling_factor: ``scaling.json``'s factor.
    """
    energies = [run.energy_to_train_j for run, _, _ in counted]
    measured = [e for e in energies if e is not None]
    shared = next((run.power_note for run, _, _ in counted
                   if run.power_note and run.power_note.startswith(SHARED_NOTE_PREFIX)), None)
    notes = (f"energy: {shared}",) if shared else ()
    if not measured:
        others = sum(run.energy_to_train_j is not None for run in runs)
        if others:  # measured, but only on runs that do not count: no contradiction with the table
            return FolderEnergy(None, notes + (f"energy: measured for {others} run(s) that the score does not "
                                               "count; no counted run has power readings, so no energy score",))
        if kind == "runs" and runs:
            return FolderEnergy(None, notes + (f"{POWER_NOTE_PREFIX}: no power readings "
                                               "(power/result_N/node_K.txt), energy not measured",))
        return FolderEnergy(None, notes)
    if len(measured) < len(energies):
        return FolderEnergy(None, notes + (f"energy: {len(energies) - len(measured)} of {len(energies)} counted "
                                           "runs have no power readings; no energy score",))
    if kind == "weak":  # _compute_olympic_average(power_scores, 1, 1): the lowest dropped
        kept = sorted(measured)[1:]
    elif dropped > max_dropped:
        return FolderEnergy(None, notes)
    else:  # _index_olympic_average: in the order of the times to train, the same drop as the score
        order = sorted(range(len(counted)), key=lambda i: counted[i][2] - counted[i][1])
        ordered = [measured[i] for i in order]
        kept = ordered[max_dropped:len(ordered) - (max_dropped - dropped)]
    if not kept:
        return FolderEnergy(None, notes)
    # result_summarizer scales the strong power score, not the weak one
    return FolderEnergy(sum(kept) / len(kept) * (1.0 if kind == "weak" else scaling_factor), notes)
