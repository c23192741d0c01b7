"""A check's verdict from the run itself: its exit status, its result log and the official
compliance checker; its performance figures from the log and its side files.

Nothing here matches patterns in a program's output. The job script writes the exit status of
the launched ``mlhpc run`` (or ``mlhpc stage``) to `EXIT_STATUS_FILE` (`exit_status_commands`,
run right after the launcher line: Slurm's ``squeue`` scheduler reports no exit status of its
own). The log is read and scored by `mlhpc.report.score.score_folder`, the code ``mlhpc report``
runs on a folder: `mlhpc.log.parse` (the log reader), `mlhpc.log.summary` (time to train,
staging, epochs to target, samples/s), `mlhpc.report.energy` (energy to train from the
``power/`` side files) and MLCommons' compliance checker through `mlhpc.report.compliance` and
its adapter. The figures a check reports are therefore the ones ``mlhpc report`` prints for the
same log. Standard error is read only to quote mlhpc's own one-line reason
(``mlhpc: error: ...``) when a run ends with a non-zero status.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mlhpc.data.inputs import read_text_input
from mlhpc.errors import MlhpcError
from mlhpc.report.reported import ReportedRun
from mlhpc.report.score import score_folder
from mlhpc.text import one_line

#: Where the job script leaves the launched command's exit status (in the check's stage folder).
EXIT_STATUS_FILE = "mlhpc-exit-status"


def exit_status_commands(then: list[str] | None = None) -> list[str]:
    """The job script's lines right after the launcher's: keep its exit status in
    `EXIT_STATUS_FILE`, run ``then`` (clean-up), exit with the kept status."""
    return (["mlhpc_status=$?", f'echo "$mlhpc_status" > {EXIT_STATUS_FILE}', *(then or []),
             'exit "$mlhpc_status"'])
#: The run's results folder, relative to the check's stage folder (``output.dir``).
RESULTS_DIR = "results"
#: The most of a standard error or output file read (bytes).
MAX_OUTPUT_BYTES = 64 << 20
ERROR_PREFIX = "mlhpc: error: "


class CheckFailed(MlhpcError):
    """The run did not pass: one line saying why (the check's sanity failure)."""


@dataclass(frozen=True)
class Figure:
    """One performance figure: a ReFrame performance variable's name, value and unit."""

    name: str
    value: float
    unit: str


def exit_status(stage_dir: Path) -> int | None:
    """The exit status the job script recorded in ``stage_dir``; None when it recorded none (the
    job ended before the command returned: killed, out of time) or it is not a number."""
    try:
        text = read_text_input(stage_dir / EXIT_STATUS_FILE, 64, what="exit status file").strip()
    except MlhpcError:
        return None
    return int(text) if text.lstrip("-").isdigit() else None


def mlhpc_reason(stderr: Path) -> str | None:
    """mlhpc's own one-line reason in ``stderr``: the last ``mlhpc: error: ...`` line (every rank
    that stops prints the same), or None."""
    try:
        text = read_text_input(stderr, MAX_OUTPUT_BYTES, what="standard error")
    except MlhpcError:
        return None
    lines = [line.strip() for line in text.splitlines() if ERROR_PREFIX in line]
    return one_line(lines[-1][lines[-1].index(ERROR_PREFIX):]) if lines else None


def _ended(status: int | None, stderr: Path, command: str) -> str:
    """Why a command did not end well, in one line: mlhpc's reason, else its exit status."""
    reason = mlhpc_reason(stderr)
    if status is None:
        return reason or (f"{command} recorded no exit status: the job ended before it returned "
                          f"(killed or out of time; see {stderr})")
    return f"{command} exited {status}: " + (reason or f"no reason given (see {stderr})")


def judge_run(stage_dir: Path, stderr: Path) -> ReportedRun:
    """The run of a check, if it passed: exit status 0 (target reached), one result log in
    ``stage_dir/results``, run_stop ``success`` and the log accepted by MLCommons' compliance
    checker (hpc ruleset of `mlhpc.report.compliance.ruleset_for`, as ``mlhpc report``).

    Returns:
        the run as ``mlhpc report`` summarises it (energy attached where measured).

    Raises:
        CheckFailed: one line naming what failed (mlhpc's own reason where it gave one).
        LogFormatError: the log cannot be read (one line naming it).
    """
    status = exit_status(stage_dir)
    results = stage_dir / RESULTS_DIR
    logs = sorted(results.glob("result_*.txt")) if results.is_dir() else []
    if status not in (0, 1) or not logs:
        raise CheckFailed(_ended(status, stderr, "mlhpc run") if status != 0
                          else f"mlhpc run exited 0 but wrote no result log in {results}")
    if len(logs) != 1:
        raise CheckFailed(f"{results}: expected one result log, found {len(logs)} "
                          f"({', '.join(p.name for p in logs)})")
    folder = score_folder(results, logs)
    run = folder.runs[0]
    timing = run.facts.timing
    if status != 0 or timing.status != "success":
        raise CheckFailed(f"{logs[0]}: the run missed its target (run_stop {timing.status}"
                          f"{': ' + timing.reason if timing.reason else ''}; mlhpc run exited {status})")
    if run.compliant is not True:
        said = run.compliance_messages[0] if run.compliance_messages else "?"
        raise CheckFailed(f"{logs[0]}: the official compliance checker (hpc {folder.ruleset}) "
                          f"rejects it: {one_line(said)}")
    return run


def run_figures(run: ReportedRun) -> list[Figure]:
    """A passed run's performance figures, those the log holds: time to train (min), staging
    (s), epochs to target (epochs, or samples where the benchmark counts them), throughput
    (samples/s, training samples per second of training epochs) and energy to train (kJ, where
    the ``power/`` side files measured it). The same values as ``mlhpc report --format json``
    (``time_to_train_s`` / 60, ``staging_s``, ``epochs_to_target``, ``samples_per_s``,
    ``energy_to_train_j`` / 1000)."""
    energy_j, facts = run.power.energy_to_train_j, run.facts
    energy_kj = None if energy_j is None else energy_j / 1e3
    found = [Figure("time_to_train", facts.timing.time_to_train_min, "min"),  # type: ignore[arg-type]
             Figure("staging", facts.staging.staging_s, "s"),  # type: ignore[arg-type]
             Figure("epochs_to_target", facts.quality.epochs_to_target, facts.training.epoch_unit),  # type: ignore[arg-type]
             Figure("throughput", facts.training.samples_per_s, "samples/s"),  # type: ignore[arg-type]
             Figure("energy_to_train", energy_kj, "kJ")]  # type: ignore[arg-type]
    return [figure for figure in found if figure.value is not None]


def _json_object(text: str, source: Path) -> dict:
    """The first JSON object that starts a line of ``text`` (``mlhpc stage --format json``)."""
    decoder = json.JSONDecoder()
    offset = 0
    for line in text.splitlines(keepends=True):
        if line.startswith("{"):
            try:
                found, _ = decoder.raw_decode(text, offset)
            except ValueError:
                found = None
            if isinstance(found, dict):
                return found
        offset += len(line)
    raise CheckFailed(f"{source}: mlhpc stage printed no JSON summary")


def stage_figures(stage_dir: Path, stdout: Path, stderr: Path) -> list[Figure]:
    """A timed ``mlhpc stage --format json``'s figures, if it passed (exit status 0, every file
    of the plan copied this time, so the time is a whole copy's): staging (s, the slowest
    node's), aggregate bandwidth (GB/s over every node) and the bytes staged (GB).

    Raises:
        CheckFailed: one line naming what failed (mlhpc's own reason where it gave one).
    """
    status = exit_status(stage_dir)
    if status != 0:
        raise CheckFailed(_ended(status, stderr, "mlhpc stage"))
    summary = _json_object(read_text_input(stdout, MAX_OUTPUT_BYTES, what="standard output",
                                           error=CheckFailed), stdout)
    if summary.get("copied_bytes") != summary.get("staged_bytes") or not summary.get("staged_files"):
        raise CheckFailed(f"mlhpc stage copied {summary.get('copied_bytes')} of {summary.get('staged_bytes')} "
                          f"bytes to {summary.get('dest')}: no whole copy was timed")
    nodes = summary.get("nodes_summary") or {}
    return [Figure("staging", float(nodes.get("slowest_node_s", summary["elapsed_s"])), "s"),
            Figure("bandwidth", float(nodes.get("aggregate_gb_per_s", summary["gb_per_s"])), "GB/s"),
            Figure("staged", summary["staged_bytes"] / 1e9, "GB")]
