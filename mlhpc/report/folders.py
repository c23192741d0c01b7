"""Result folders found and read: where each sits in the MLCommons layout, its system
description, its logs as runs, and which runs count, as MLCommons' result_summarizer reads them.

Source followed: ``mlperf_logging/result_summarizer/result_summarizer.py`` (hpc usage): a log
that fails the compliance checker, has a malformed record line, or lacks run_start/run_stop is
dropped; a weak-scaling log without an instance scale (``_query_instance_scale``) is dropped.
``pruned_results/`` is never read. Each function returns what it found; `mlhpc.report.score`
scores the values.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from mlhpc.data.inputs import read_text_input
from mlhpc.errors import DataError, LogFormatError
from mlhpc.log.parse import ParsedLog, file_kind, parse_log
from mlhpc.log.facts import RunSummary
from mlhpc.log.summary import is_resumed, official_instance_scale, official_start_stop, summarize_run
from mlhpc.report.compliance import FolderCheck, RunCheck, round_of, run_check
from mlhpc.report.energy import run_power
from mlhpc.report.reported import ReportedRun
from mlhpc.report.validflops import run_valid_flops

RESULT_RE = re.compile(r"^result_.*\.txt$")
PRUNED = "pruned_results"


@dataclass(frozen=True)
class Layout:
    """Where a result folder sits: ``<round>/<submitter>/results/<system>/<scaling>/<benchmark>``
    (v1.0 and later), ``<round>/<submitter>/results/<system>/<benchmark>`` (v0.7, ``v07``), or
    elsewhere: an mlhpc run folder (``scaling`` ``"runs"``, names from the logs).

    Attributes:
        scaling: ``"strong"``, ``"weak"`` or ``"runs"``.
        round / submitter / system / benchmark: the folders' names (None for a run folder).
        v07: the v0.7 layout (no strong/weak level; scored as strong).
    """

    scaling: str
    round: str | None = None
    submitter: str | None = None
    system: str | None = None
    benchmark: str | None = None
    v07: bool = False

    @property
    def own(self) -> bool:
        """An mlhpc run folder (not an MLCommons results tree)."""
        return self.scaling == "runs"


def layout_of(folder: Path) -> Layout:
    """The `Layout` of ``folder``. The round is the folder above the submitter
    (``hpc_results_v1.0``); the layout without a scaling level is round v0.7 whatever the
    folder is called."""
    parts = folder.parts
    if len(parts) >= 4 and parts[-2] in ("strong", "weak") and parts[-4] == "results":
        submitter = parts[-5] if len(parts) >= 5 else None
        round_ = parts[-6] if len(parts) >= 6 else None
        return Layout(parts[-2], round_, submitter, parts[-3], parts[-1])
    if len(parts) >= 4 and parts[-3] == "results":
        round_ = parts[-5] if len(parts) >= 5 and round_of(parts[-5]) == "v0.7" else "v0.7"
        return Layout("strong", round_, parts[-4], parts[-2], parts[-1], v07=True)
    return Layout("runs")


def find_result_folders(paths: Iterable[Path | str]) -> list[tuple[Path, list[Path]]]:
    """Every folder under ``paths`` holding ``result_*.txt`` files, with those files (sorted).

    A file path names its own folder with just that file. ``pruned_results`` folders are skipped.

    Raises:
        LogFormatError: a path does not exist, or holds no ``result_*.txt`` at all.
    """
    found: dict[Path, list[Path]] = {}
    for raw in paths:
        path = Path(raw)
        kind = file_kind(path)
        if kind == "file":
            found.setdefault(path.parent, []).append(path)
            continue
        if kind != "a folder":
            raise LogFormatError(f"{path}: {kind}")
        before = len(found)
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d != PRUNED and not d.startswith("."))
            logs = sorted(Path(root) / f for f in files if RESULT_RE.match(f))
            if logs:
                found.setdefault(Path(root), []).extend(logs)
        if len(found) == before:
            raise LogFormatError(f"{path}: no result_*.txt found in this folder or below")
    return [(folder, sorted(set(files), key=natural)) for folder, files in found.items()]


def natural(path: Path) -> tuple[Any, ...]:
    """The sort key of a file name with its numbers as numbers (``result_2`` before ``result_10``)."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name))


@dataclass(frozen=True)
class SystemDescription:
    """A submission's ``systems/<system>.json`` (``data``: ``{}`` where there is none) and the
    note saying why one that exists was not read."""

    data: Mapping[str, Any]
    notes: tuple[str, ...] = ()


def system_description(folder: Path, layout: Layout) -> SystemDescription:
    """The system description of a result folder of the MLCommons layout (none for a run folder),
    read through `mlhpc.data.inputs`: a link out of the submitter's tree, a FIFO or a huge file is
    refused and noted. Never raises."""
    if layout.own or layout.system is None:
        return SystemDescription({})
    desc = folder.parents[2 if layout.v07 else 3] / "systems" / f"{layout.system}.json"
    try:
        data = json.loads(read_text_input(desc, root=desc.parents[1], what="system description"))
    except (DataError, ValueError, RecursionError) as exc:
        return SystemDescription({}, (f"system description not read: {exc}",) if os.path.lexists(desc) else ())
    return SystemDescription(data if isinstance(data, dict) else {})


def sidecars(log: Path, stem: str, suffix: str) -> list[Path]:
    """The file beside ``result_<N>.txt`` that belongs to its run, ``<stem>_<N><suffix>``, when it
    exists (mlhpc writes ``summary_N.json``, ``config_N.yaml``, ``env_N.json``, ``measured_N.json``
    per run: `mlhpc.log.writer.RUN_FILES`); an empty list otherwise."""
    match = re.match(r"^result_(.+)\.txt$", log.name)
    candidate = log.parent / f"{stem}_{match.group(1)}{suffix}" if match else None
    return [candidate] if candidate is not None and candidate.is_file() else []


def run_target(log: Path) -> float | None:
    """The target an mlhpc run trained to: ``target`` of ``summary_<N>.json`` beside it."""
    data = None
    for candidate in sidecars(log, "summary", ".json"):
        try:
            data = json.loads(read_text_input(candidate, root=log.parent, what="run summary"))
            break
        except (DataError, ValueError, RecursionError):
            continue
    value = data.get("target") if isinstance(data, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Log:
    """One ``result_*.txt`` read: its path, its records and what it says about its run."""

    path: Path
    parsed: ParsedLog
    facts: RunSummary


def read_log(path: Path, own: bool) -> Log:
    """Parse and summarize one log (no link out of its folder, no FIFO); an mlhpc run folder's
    log (``own``) gets its run's target (`run_target`).

    Raises:
        LogFormatError: the log cannot be read.
    """
    parsed = parse_log(path, root=path.parent)
    return Log(path, parsed, summarize_run(parsed, target=run_target(path) if own else None))


def report_run(log: Log, verdict: RunCheck | None, exponent: float) -> ReportedRun:
    """The `ReportedRun` of ``log``: its facts, its energy (`mlhpc.report.energy.run_power`), its
    Valid FLOPS (penalty exponent ``exponent``, `mlhpc.report.validflops.run_valid_flops`) and its
    compliance ``verdict`` (None: not checked, a run kept apart)."""
    events = log.parsed.events
    power = run_power(log.path, events)
    flops = run_valid_flops(log.facts, power.mean_power_w, log.path, events, exponent)
    if verdict is None:
        return ReportedRun(log.facts, power, flops)
    return ReportedRun(log.facts, power, flops, verdict.compliant, tuple(verdict.messages))


def folder_kind(layout: Layout, runs: list[RunSummary]) -> str:
    """``"strong"``, ``"weak"`` or ``"runs"``: the layout's, except that an mlhpc run folder
    whose logs each name a different ``instance_id`` (a throughput run, ``--instances K``: one
    log per model instance) is scored as weak scaling."""
    instances = {r.submission.instance_id for r in runs}
    if layout.own and len(instances) > 1 and all(r.submission.instance_id is not None for r in runs):
        return "weak"
    return layout.scaling


@dataclass(frozen=True)
class Counted:
    """A run that counts: the run, its run_start and run_stop (ms) and instance scale."""

    run: ReportedRun
    start_ms: float
    stop_ms: float
    scale: int | None


@dataclass(frozen=True)
class Verdicts:
    """Which runs of a folder count.

    Attributes:
        runs: every log's run in file order, with its compliance verdict.
        resumed: logs kept apart (resumed, or a stopped attempt a resumed log continues).
        dropped: ``{log: reason}`` of the runs that do not count.
        counted: the runs that do, in file order.
        notes: weak-scaling logs whose instance scale differs from the first.
    """

    runs: tuple[ReportedRun, ...]
    resumed: tuple[str, ...]
    dropped: Mapping[str, str]
    counted: tuple[Counted, ...]
    notes: tuple[str, ...]

    @property
    def instance_scale(self) -> int | None:
        """The first counted run's instance scale that is logged."""
        return next((c.scale for c in self.counted if c.scale is not None), None)


def judge(logs: list[Log], superseded: set[str], check: FolderCheck, weak_layout: bool,
          exponent: float) -> Verdicts:
    """The `Verdicts` of a folder's ``logs``, each run reported once (`report_run`): a resumed
    log, or one in ``superseded`` (stopped attempts a resumed log continues:
    `mlhpc.log.summary.superseded_logs`), is kept apart; the others are checked
    (`mlhpc.report.compliance.run_check`) and, in a weak-scaling folder of the MLCommons layout
    (``weak_layout``), one without an instance scale is dropped. Never raises."""
    runs, resumed, dropped, counted, notes = [], [], {}, [], []
    first_scale: int | None = None
    for log in logs:
        if is_resumed(log.parsed) or log.path.name in superseded:  # kept apart: never an ordinary run
            runs.append(report_run(log, None, exponent))
            resumed.append(str(log.path))
            continue
        verdict = run_check(log.parsed, check)
        run = report_run(log, verdict, exponent)
        runs.append(run)
        reason, scale = verdict.drop, official_instance_scale(log.parsed.events)
        if reason is None and weak_layout:
            if scale is None:
                reason = "number_of_nodes or accelerators_per_node not recorded"
            elif first_scale is None:
                first_scale = scale
            elif scale != first_scale:
                notes.append(f"{log.path.name}: instance scale {scale} differs from {first_scale}")
        if reason is not None:
            dropped[str(log.path)] = reason
            continue
        start, stop = official_start_stop(log.parsed.events)
        counted.append(Counted(run, start, stop, scale))  # type: ignore[arg-type]
    return Verdicts(tuple(runs), tuple(resumed), dropped, tuple(counted), tuple(notes))
