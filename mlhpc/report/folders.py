"""Result folders found and read: where each sits in the MLCommons layout, its system
description, its logs as runs, and which runs count, as MLCommons' result_summarizer reads them.

Source followed: ``mlperf_logging/result_summarizer/result_summarizer.py`` (hpc usage): a log
that fails the compliance checker, has a malformed record line, or lacks run_start/run_stop is
dropped; a weak-scaling log without an instance scale (``_query_instance_scale``) is dropped.
``pruned_results/`` is never read. Each function returns what it found; `read_folder` reads a
folder once, every log with its facts, energy, Valid FLOPS and compliance check (`FolderRead`);
`mlhpc.report.score` decides which runs count and scores them.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from mlhpc.data.inputs import read_text_input
from mlhpc.errors import ConfigError, DataError, LogFormatError
from mlhpc.log.facts import RunSummary
from mlhpc.log.parse import ParsedLog, file_kind, parse_log
from mlhpc.log.summary import is_resumed, resumed_from, summarize_run
from mlhpc.report.compliance import (
    FolderCheck,
    RunCheck,
    folder_check,
    round_of,
    run_check,
)
from mlhpc.report.reported import ReportedRun, report_run

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


def read_scaling_factor(folder: Path) -> float:
    """``scaling_factor`` from ``folder/scaling.json``; 1.0 when the file is absent.

    Raises:
        LogFormatError: the file exists but is not JSON with a numeric ``scaling_factor``.
    """
    path = folder / "scaling.json"
    if not path.is_file():
        return 1.0
    try:
        value = float(json.loads(read_text_input(path, root=folder, error=LogFormatError))["scaling_factor"])
    except (ValueError, KeyError, TypeError, RecursionError):
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise LogFormatError(f"{path}: expected JSON {{\"scaling_factor\": <positive number>}}") from None
    return value


def sidecars(log: Path, stem: str, suffix: str) -> list[Path]:
    """The file beside ``result_<N>.txt`` that belongs to its run, ``<stem>_<N><suffix>``, when it
    exists (mlhpc writes ``summary_N.json``, ``config_N.yaml``, ``env_N.json``, ``measured_N.json``
    per run: `mlhpc.log.writer.RUN_FILES`); an empty list otherwise."""
    match = re.match(r"^result_(.+)\.txt$", log.name)
    candidate = log.parent / f"{stem}_{match.group(1)}{suffix}" if match else None
    return [candidate] if candidate is not None and candidate.is_file() else []


def read_mapping(path: Path | None, kind: str) -> dict[str, Any]:
    """The mapping in a run's file ``path`` (``kind`` ``json``: JSON, else YAML; ``kind`` names
    it in messages), read inside its folder (`mlhpc.data.inputs.read_text_input`); ``{}`` when
    ``path`` is None or the file holds no mapping.

    Raises:
        ConfigError: the reader refuses the file, or it is not JSON/YAML (one line naming it).
    """
    if path is None:
        return {}
    try:
        text = read_text_input(path, root=path.parent, what=f"run's {kind} file", error=ConfigError)
        data = json.loads(text) if kind == "json" else yaml.safe_load(text)
    except (ValueError, RecursionError, yaml.YAMLError):
        raise ConfigError(f"{path}: cannot read this run's {kind} file") from None
    return data if isinstance(data, dict) else {}


def side_mapping(log: Path, stem: str, suffix: str) -> dict[str, Any]:
    """`read_mapping` of the side file ``<stem>_<N><suffix>`` of ``log`` (`sidecars`; JSON for
    ``.json``, else YAML); ``{}`` when the run has none."""
    found = sidecars(log, stem, suffix)
    return read_mapping(found[0] if found else None, "json" if suffix == ".json" else "yaml")


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
    target = run_target(path) if own else None
    parsed = parse_log(path, root=path.parent)
    return Log(path, parsed, summarize_run(parsed, target=target))


@dataclass(frozen=True)
class FolderRead:
    """One result folder as `read_folder` read it: everything its score needs.

    Attributes:
        path / files: the folder and its ``result_*.txt`` files.
        layout / check / desc: its place in the MLCommons layout, the ruleset its logs are
            checked against, its system description.
        scaling_factor: ``scaling.json``'s factor (1.0 without one).
        logs / runs / checks: each log read, its run as the report shows it, and its compliance
            check (None: kept apart, a resumed log or a stopped attempt a resumed log continues).
    """

    path: Path
    files: tuple[Path, ...]
    layout: Layout
    check: FolderCheck
    desc: SystemDescription
    scaling_factor: float
    logs: tuple[Log, ...]
    runs: tuple[ReportedRun, ...]
    checks: tuple[RunCheck | None, ...]


def read_folder(folder: Path, files: list[Path], *, compliance: bool = True, ruleset: str | None = None,
                exponent: float) -> FolderRead:
    """Read one result folder once: its layout, system description and ``scaling.json``, every
    log with its facts, energy and Valid FLOPS (penalty exponent ``exponent``,
    `mlhpc.report.reported.report_run`) and, unless kept apart, its compliance check
    (``compliance``: run MLCommons' checker; ``ruleset``: an override).

    Raises:
        LogFormatError: a log or ``scaling.json`` cannot be read.
        ConfigError: an unknown ruleset.
    """
    layout = layout_of(folder)
    desc, scaling_factor = system_description(folder, layout), read_scaling_factor(folder)
    logs = [read_log(path, layout.own) for path in files]
    superseded = {name for log in logs if (name := resumed_from(log.parsed))}  # stopped attempts
    apart = [is_resumed(log.parsed) or log.path.name in superseded for log in logs]
    check = folder_check(folder, layout.round, layout.v07, ruleset, compliance)
    checks = [None if kept else run_check(log.parsed, check) for log, kept in zip(logs, apart)]
    runs = [report_run(log.facts, log.path, log.parsed.events, verdict, exponent) for log, verdict in zip(logs, checks)]
    return FolderRead(folder, tuple(files), layout, check, desc, scaling_factor, tuple(logs), tuple(runs),
                      tuple(checks))
