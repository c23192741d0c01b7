"""Result folders -> scores, exactly as MLCommons' result_summarizer computes them.

Source followed: ``mlperf_logging/result_summarizer/result_summarizer.py`` (hpc usage):

- strong scaling (``<system>/strong/<benchmark>/``): each ``result_*.txt`` scores
  ``(run_stop - run_start) / 60 / 1000`` minutes; a log that fails the compliance checker, has a
  malformed record line, or lacks run_start/run_stop is *dropped* and counts as the slowest run.
  With at most one dropped run the score is the olympic mean (sort, drop the fastest and the
  slowest, average the rest) times ``scaling_factor`` from ``scaling.json`` where present; with
  more than one the result is invalid (no score).
- weak scaling (``<system>/weak/<benchmark>/``; ``pruned_results/`` is never read): M = the
  number of logs that pass, TTTa = (latest run_stop - earliest run_start) / 60 / 1000 minutes,
  throughput = M / TTTa models per minute, instance scale = number_of_nodes x
  max(accelerators_per_node, 1); no score when M is below the benchmark's required count.

- round v0.7 (``<round>/<submitter>/results/<system>/<benchmark>/``, no strong/weak level):
  time to train only, scored with that round's rule, the olympic mean of the runs' times to
  train (drop the fastest and the slowest, average the rest), as in the MLPerf Training v0.7
  rules that the HPC v0.7 round followed (github.com/mlcommons/training_policies, branch
  hpc-0.5.0, hpc_training_rules.adoc and training_rules.adoc "Benchmark Results"). mlperf_logging
  ships no hpc ruleset for v0.7: compliance is "not checked", no RCP applies.

Rows are keyed on the folders, never on names inside the logs: round + submitter + system folder
+ division + benchmark. A log marked resumed (`mlhpc.log.summary.is_resumed`) is kept apart: it
is listed, never scored as an ordinary run of its folder, and so is the stopped attempt it
continues (`mlhpc.log.summary.superseded_logs`), which is not a failed run of the folder.

mlhpc's own run folders (any other folder holding ``result_*.txt``) are scored like a strong
result and shown run by run.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from mlhpc import rules
from mlhpc.data.inputs import read_text_input
from mlhpc.errors import DataError, LogFormatError
from mlhpc.report.compliance import check_run, not_checked_reason, round_of, ruleset_for
from mlhpc.report.energy import attach_energy, score_energy
from mlhpc.log.parse import ParsedLog, file_kind, parse_log, read_scaling_factor
from mlhpc.report.rcp import RcpVerdict, check_folder
from mlhpc.log.summary import (RunSummary, is_resumed, official_instance_scale, official_start_stop,
                               summarize_run, superseded_logs)
from mlhpc.report.validflops import DEFAULT_EXPONENT, attach_valid_flops, folder_valid_flops

RESULT_RE = re.compile(r"^result_.*\.txt$")
PRUNED = "pruned_results"


@dataclass
class FolderResult:
    """One result folder and its score.

    Attributes:
        path: the folder.
        kind: ``"strong"``, ``"weak"`` or ``"runs"`` (an mlhpc run folder).
        round / submitter / system / benchmark: from the MLCommons layout
            ``<round>/<submitter>/results/<system>/<kind>/<benchmark>/`` where it applies, else
            from the logs.
        division: ``closed``/``open`` (the logs' ``submission_division``, else the system
            description's).
        ruleset: the hpc ruleset the logs were checked against (``None``: mlperf_logging has
            none for the round; ``ruleset_note`` then says so).
        runs: one `RunSummary` per ``result_*.txt``, sorted by file name.
        dropped: ``{file: reason}`` for runs that do not count (compliance, parse, no stop).
        scaling_factor: from ``scaling.json`` (1.0 when absent).
        olympic_min: strong/runs score in minutes (``None``: invalid or too few runs).
        ttta_min / number_of_models / models_per_min / instance_scale: weak scores.
        raw_olympic_min: the olympic mean without any ``scaling.json`` factor.
        rcp: rcp_checker's verdict, message and normalisation factor (`mlhpc.report.rcp`).
        resumed: logs marked resumed, kept apart from the score.
        notes: one-line remarks (why a score is missing, mismatched instance scales, ...).
        system_desc: the submission's ``systems/<system>.json`` where one exists.
        energy_olympic_j: energy to train of the folder, joules, as result_summarizer scores
            power: the runs' energies in the order of their times to train, the same olympic
            drop, times ``scaling_factor`` (weak scaling: its ``_compute_olympic_average(E, 1, 1)``);
            None when a counted run has no power readings.
        valid_flops_per_s / valid_flops_per_w: HPC AI500's figures of the folder
            (`mlhpc.report.validflops.folder_valid_flops`).
    """

    path: str
    kind: str
    round: str | None = None
    submitter: str | None = None
    system: str | None = None
    benchmark: str | None = None
    division: str | None = None
    ruleset: str | None = "3.0.0"
    ruleset_note: str | None = None
    runs: list[RunSummary] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)
    scaling_factor: float = 1.0
    olympic_min: float | None = None
    raw_olympic_min: float | None = None
    ttta_min: float | None = None
    number_of_models: int | None = None
    models_per_min: float | None = None
    instance_scale: int | None = None
    rcp: RcpVerdict | None = None
    resumed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    system_desc: dict[str, Any] = field(default_factory=dict)
    energy_olympic_j: float | None = None
    valid_flops_per_s: float | None = None
    valid_flops_per_w: float | None = None

    @property
    def n_files(self) -> int:
        return len(self.runs)

    @property
    def nodes(self) -> int | None:
        for run in self.runs:
            if run.number_of_nodes:
                return run.number_of_nodes
        return None

    @property
    def accelerators(self) -> int | None:
        """Accelerators used by one model: number_of_nodes x max(accelerators_per_node, 1)."""
        for run in self.runs:
            if run.number_of_nodes:
                return run.number_of_nodes * max(run.accelerators_per_node or 0, 1)
        return None

    @property
    def normalized_min(self) -> float | None:
        """The olympic mean times rcp_checker's normalisation factor (what the score becomes
        when the checker writes its ``scaling.json``); ``None`` without a passing RCP verdict."""
        if self.raw_olympic_min is None or self.rcp is None or not self.rcp.passed:
            return None
        return self.raw_olympic_min * self.rcp.normalization

    @property
    def cpu_only(self) -> bool:
        """Every run logs ``accelerators_per_node`` 0 (e.g. Fugaku's A64FX): no accelerators."""
        values = [r.accelerators_per_node for r in self.runs if r.accelerators_per_node is not None]
        if not values and self.system_desc.get("accelerators_per_node") not in (None, ""):
            values = [_int_or_none(self.system_desc.get("accelerators_per_node"))]
        return bool(values) and all(v == 0 for v in values)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (runs included)."""
        out = {k: v for k, v in self.__dict__.items() if k not in ("runs", "rcp")}
        out["n_files"] = self.n_files
        out["normalized_min"] = self.normalized_min
        out["rcp"] = None if self.rcp is None else {
            "passed": self.rcp.passed, "message": self.rcp.message, "normalization": self.rcp.normalization,
            "global_batch_size": self.rcp.global_batch_size, "mean_epochs": self.rcp.mean_epochs,
            "rcp_mean_epochs": self.rcp.rcp_mean_epochs, "rcp_min_epochs": self.rcp.rcp_min_epochs}
        out["runs"] = [run.to_dict() for run in self.runs]
        return out


@dataclass
class Report:
    """Everything `build_report` found: folders in path order, and how long it took."""

    folders: list[FolderResult]
    compliance_checked: bool
    elapsed_s: float = 0.0
    price_per_node_hour: float | None = None  # for cost to train (`mlhpc.report.render.cost`)
    price_per_kwh: float | None = None

    @property
    def malformed(self) -> list[str]:
        return [m for f in self.folders for r in f.runs for m in r.malformed]

    def to_dict(self) -> dict[str, Any]:
        return {"compliance_checked": self.compliance_checked, "elapsed_s": self.elapsed_s,
                "price_per_node_hour": self.price_per_node_hour, "price_per_kwh": self.price_per_kwh,
                "folders": [f.to_dict() for f in self.folders]}


def compute_olympic_average(scores: list[float], dropped: int,
                            max_dropped: int | None = None) -> float | None:
    """result_summarizer's ``_compute_olympic_average``: sort, drop ``max_dropped`` fastest and
    ``max_dropped - dropped`` slowest (dropped runs already count as the slowest), average.
    ``max_dropped`` defaults to the current ruleset's (`mlhpc.rules.Ruleset.max_dropped`).

    Returns ``None`` when no score remains.
    """
    if max_dropped is None:
        max_dropped = rules.ruleset().max_dropped
    ordered = sorted(scores)
    kept = ordered[max_dropped:len(ordered) - (max_dropped - dropped)]
    return sum(kept) * 1.0 / len(kept) if kept else None


def weak_throughput(spans_ms: list[tuple[float, float]]) -> tuple[float, float | None]:
    """result_summarizer's weak-scaling score of M counted runs ``(run_start_ms, run_stop_ms)``:
    TTTa = (latest stop - earliest start) / 60000 min and M / TTTa models/min (None if TTTa is 0)."""
    ttta_min = (max(t for _, t in spans_ms) - min(s for s, _ in spans_ms)) / 60 / 1000
    return ttta_min, (len(spans_ms) / ttta_min if ttta_min > 0 else None)




def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _layout(folder: Path) -> tuple[str, str | None, str | None, str | None, str | None]:
    """kind, round, submitter, system, benchmark from the MLCommons layout (or "runs").

    v1.0 and later: ``<round>/<submitter>/results/<system>/{strong,weak}/<benchmark>``; v0.7:
    ``<round>/<submitter>/results/<system>/<benchmark>`` (time to train only). The round is the
    folder above the submitter (``hpc_results_v1.0``); the layout without a scaling level is
    round v0.7 whatever the folder is called.
    """
    parts = folder.parts
    if len(parts) >= 4 and parts[-2] in ("strong", "weak") and parts[-4] == "results":
        submitter = parts[-5] if len(parts) >= 5 else None
        round_ = parts[-6] if len(parts) >= 6 else None
        return parts[-2], round_, submitter, parts[-3], parts[-1]
    if len(parts) >= 4 and parts[-3] == "results":
        round_ = parts[-5] if len(parts) >= 5 and round_of(parts[-5]) == "v0.7" else "v0.7"
        return "strong", round_, parts[-4], parts[-2], parts[-1]
    return "runs", None, None, None, None


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
    return [(folder, sorted(set(files), key=_natural)) for folder, files in found.items()]


def _natural(path: Path) -> tuple[Any, ...]:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name))


def _system_desc(folder: Path, kind: str, system: str | None, v07: bool, notes: list[str]) -> dict[str, Any]:
    if kind == "runs" or system is None:
        return {}
    desc = folder.parents[2 if v07 else 3] / "systems" / f"{system}.json"
    try:  # the one reader: a link out of the submitter's tree, a FIFO or a huge file refused
        data = json.loads(read_text_input(desc, root=desc.parents[1], what="system description"))
    except (DataError, ValueError, RecursionError) as exc:
        notes += [f"system description not read: {exc}"] if os.path.lexists(desc) else []
        return {}
    return data if isinstance(data, dict) else {}


def sidecars(log: Path, stem: str, suffix: str) -> list[Path]:
    """The files beside ``result_<N>.txt`` that belong to its run: ``<stem>_<N><suffix>`` then the
    folder's ``<stem><suffix>``, those that exist, in that order (mlhpc writes ``summary_N.json``,
    ``config_N.yaml``, ``env_N.json`` per run; older run folders hold one of each)."""
    match = re.match(r"^result_(.+)\.txt$", log.name)
    candidates = ([log.parent / f"{stem}_{match.group(1)}{suffix}"] if match else []) + [log.parent / f"{stem}{suffix}"]
    return [candidate for candidate in candidates if candidate.is_file()]


def _run_target(log: Path) -> float | None:
    """The target an mlhpc run trained to: ``summary_<N>.json`` (or ``summary.json``) beside it."""
    data = None
    for candidate in sidecars(log, "summary", ".json"):
        try:
            data = json.loads(read_text_input(candidate, root=log.parent, what="run summary"))
            break
        except (DataError, ValueError, RecursionError):
            continue
    value = data.get("target") if isinstance(data, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _new_result(folder: Path, ruleset: str | None) -> FolderResult:
    """An empty `FolderResult` for ``folder``: its place in the layout, ruleset, system description."""
    kind, round_, submitter, system, benchmark = _layout(folder)
    v07 = kind == "strong" and folder.parts[-3] == "results"
    result = FolderResult(path=str(folder), kind=kind, round=round_, submitter=submitter,
                          system=system, benchmark=benchmark,
                          ruleset=None if v07 and ruleset is None else ruleset_for(folder, ruleset))
    if result.ruleset is None:
        result.ruleset_note = not_checked_reason(round_of(round_ or "") or round_)
    result.system_desc = _system_desc(folder, kind, system, v07, result.notes)
    return result


def _drop_reason(result: FolderResult, parsed: ParsedLog, run: RunSummary, compliance: bool) -> str | None:
    """Why ``run`` does not count, as result_summarizer drops it (compliance, parse error,
    run_start or run_stop missing), else None. Records the compliance verdict on ``run``."""
    reason = None
    if compliance and result.ruleset is not None:
        verdict = check_run(parsed, result.ruleset)
        run.compliant, run.compliance_messages = verdict.ok, list(verdict.messages)
        if not verdict.ok:
            reason = "fails compliance: " + (verdict.messages[0] if verdict.messages else "?")
    elif compliance:
        run.compliance_messages = [result.ruleset_note or ""]
    if reason is None and parsed.malformed:
        reason = f"parse error: {parsed.malformed[0].message}"
    start, stop = official_start_stop(parsed.events)
    if reason is None and start is None:
        reason = "run_start not recorded"
    if reason is None and stop is None:
        reason = "run_stop not recorded"
    return reason


@dataclass
class _Tally:
    """The runs of a folder that count: ``(run, run_start_ms, run_stop_ms)``, and the instance
    scales seen (the first counted weak-scaling one, and each counted log's)."""

    scored: list[tuple[RunSummary, float, float]] = field(default_factory=list)
    scale_seen: int | None = None
    scales: dict[str, int | None] = field(default_factory=dict)


def _weak_scale_reason(result: FolderResult, parsed: ParsedLog, path: Path, tally: _Tally) -> str | None:
    """A weak-scaling log without an instance scale is dropped; one whose scale differs from the
    first is noted."""
    scale = official_instance_scale(parsed.events)
    if scale is None:
        return "number_of_nodes or accelerators_per_node not recorded"
    if tally.scale_seen is None:
        tally.scale_seen = scale
    elif scale != tally.scale_seen:
        result.notes.append(f"{path.name}: instance scale {scale} differs from {tally.scale_seen}")
    return None


def _read_runs(result: FolderResult, files: list[Path], compliance: bool, exponent: float) -> _Tally:
    """Parse and summarize every log into ``result.runs``; keep resumed runs apart, drop the
    runs that do not count (``result.dropped``) and return those that do."""
    tally = _Tally()
    superseded = superseded_logs(files)  # stopped attempts that a resumed log continues
    for path in files:
        parsed = parse_log(path, root=path.parent)  # no link out of the folder, no FIFO
        run = summarize_run(parsed, target=_run_target(path) if result.kind == "runs" else None)
        attach_energy(run, path, parsed.events)
        attach_valid_flops(run, path, parsed.events, exponent)
        result.runs.append(run)
        if is_resumed(parsed) or path.name in superseded:  # kept apart: never an ordinary run
            result.resumed.append(str(path))
            continue
        reason = _drop_reason(result, parsed, run, compliance)
        if reason is None and result.kind == "weak":
            reason = _weak_scale_reason(result, parsed, path, tally)
        if reason is not None:
            result.dropped[str(path)] = reason
            continue
        start, stop = official_start_stop(parsed.events)
        tally.scored.append((run, start, stop))  # type: ignore[arg-type]
        tally.scales[str(path)] = official_instance_scale(parsed.events)
    return tally


def _name_from_runs(result: FolderResult, folder: Path) -> None:
    """Benchmark, division (and for mlhpc run folders system and submitter) from the logs where
    the layout does not give them; the note on resumed runs kept apart."""
    if result.benchmark is None:
        result.benchmark = next((r.benchmark for r in result.runs if r.benchmark), None)
    result.division = next((r.division for r in result.runs if r.division), None) or (
        str(result.system_desc.get("division")) if result.system_desc.get("division") else None)
    if result.kind == "runs":
        result.system = next((r.platform for r in result.runs if r.platform), folder.name)
        result.submitter = next((r.org for r in result.runs if r.org), None)
    if result.resumed:
        result.notes.append(f"{len(result.resumed)} resumed run(s) kept apart, not scored: "
                            + ", ".join(Path(p).name for p in result.resumed))


def score_folder(folder: Path, files: list[Path], *, compliance: bool = True,
                 ruleset: str | None = None, valid_flops_exponent: float = DEFAULT_EXPONENT) -> FolderResult:
    """Parse, check and score one result folder.

    Args:
        folder: the folder; its place in the MLCommons layout decides strong/weak/runs.
        files: its ``result_*.txt`` files.
        compliance: run MLCommons' compliance checker on every log (as result_summarizer does);
            when False, only parse errors and missing run_start/run_stop drop a run.
        ruleset: hpc ruleset override (default: from the path, see `ruleset_for`).
        valid_flops_exponent: the n of HPC AI500's quality penalty (`mlhpc.report.validflops`).

    Raises:
        LogFormatError: a log or ``scaling.json`` cannot be read.
    """
    result = _new_result(folder, ruleset)
    tally = _read_runs(result, files, compliance, valid_flops_exponent)
    _name_from_runs(result, folder)
    result.scaling_factor = read_scaling_factor(folder)

    own_throughput = result.kind == "runs" and len({r.instance_id for r in result.runs}) > 1 and all(
        r.instance_id is not None for r in result.runs)
    if own_throughput:  # an mlhpc throughput run (--instances K): one log per model instance
        result.kind = "weak"
        tally.scale_seen = next((v for v in tally.scales.values() if v is not None), None)
    if result.kind == "weak":
        table = rules.of_round(result.ruleset, result.round).runs
        needed = 1 if own_throughput else table.get(result.benchmark or "", 1)
        _score_weak(result, tally.scored, tally.scale_seen, needed)
    else:
        _score_strong(result, tally.scored, folder, [Path(p) for p in files if str(p) not in result.resumed])
    score_energy(result, tally.scored, rules.of_round(result.ruleset, result.round).max_dropped)
    folder_valid_flops(result)
    return result


def _score_weak(result: FolderResult, scored: list[tuple[RunSummary, float, float]],
                scale_seen: int | None, needed: int) -> None:
    result.number_of_models = len(scored)
    result.instance_scale = scale_seen
    if scored and len(scored) >= needed:
        result.ttta_min, result.models_per_min = weak_throughput([(s, t) for _, s, t in scored])
    else:
        result.notes.append(f"not enough converging weak-scaling runs: {len(scored)} < {needed}")
    nodes = _int_or_none(result.system_desc.get("number_of_nodes"))
    per_node = _int_or_none(result.system_desc.get("accelerators_per_node"))
    if nodes and scale_seen and result.number_of_models:
        available = nodes * max(per_node or 0, 1)
        if result.number_of_models * scale_seen > available:
            unit = "nodes" if (per_node or 0) == 0 else "accelerators"
            result.notes.append(
                f"warning: {result.number_of_models} models x {scale_seen} {unit} each (instance scale as "
                f"logged) exceed the {available} {unit} of the system description")


def _score_strong(result: FolderResult, scored: list[tuple[RunSummary, float, float]], folder: Path,
                  files: list[Path]) -> None:
    scores = [(stop - start) / 60 / 1000 for _, start, stop in scored]
    dropped, max_dropped = len(result.dropped), rules.of_round(result.ruleset, result.round).max_dropped
    if dropped > max_dropped:
        result.notes.append(f"invalid: {dropped} runs dropped (at most {max_dropped} allowed)")
    else:
        average = compute_olympic_average(scores, dropped, max_dropped)
        if average is None:
            result.notes.append(f"no olympic mean: {len(scores)} scored runs")
        else:
            result.raw_olympic_min = average
            result.olympic_min = average * result.scaling_factor
    if result.resumed:
        result.rcp = RcpVerdict(None, "not checked: the folder holds resumed runs")
    else:
        result.rcp = check_folder(folder, benchmark=result.benchmark, ruleset=result.ruleset,
                                  division=result.division, files=files)


def build_report(paths: Iterable[Path | str], *, compliance: bool = True, ruleset: str | None = None,
                 valid_flops_exponent: float = DEFAULT_EXPONENT) -> Report:
    """Find every result folder under ``paths`` and score each (see the module docstring).

    Args:
        paths: round trees, submitter trees, result folders, mlhpc run folders or single logs.
        compliance: run the official compliance checker per log (needed for official scores;
            about 3 ms per log).
        ruleset: force an hpc ruleset (``"1.0.0"``, ``"2.0.0"``, ``"3.0.0"``).
        valid_flops_exponent: the n of HPC AI500's quality penalty (default 5).

    Returns:
        a `Report` with one `FolderResult` per folder, in path order.

    Raises:
        LogFormatError: a path is missing or holds no result logs, or a log is unreadable.
        ConfigError: an unknown ruleset.
    """
    started = time.perf_counter()
    folders = [score_folder(folder, files, compliance=compliance, ruleset=ruleset,
                            valid_flops_exponent=valid_flops_exponent) for folder, files in find_result_folders(paths)]
    return Report(folders=folders, compliance_checked=compliance,
                  elapsed_s=time.perf_counter() - started)
