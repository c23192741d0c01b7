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

from mlhpc.errors import LogFormatError
from mlhpc.report.compliance import check_run, ruleset_for
from mlhpc.report.parse import parse_log
from mlhpc.report.rcp import ConvergenceCheck, ReferencePoint, check_convergence, reference_point
from mlhpc.report.runs import RunSummary, official_instance_scale, official_start_stop, summarize_run

RESULT_RE = re.compile(r"^result_.*\.txt$")
PRUNED = "pruned_results"
MAX_DROPPED = 1  # hpc benchmarks (result_summarizer: 4 only for training's unet3d)


@dataclass
class FolderResult:
    """One result folder and its score.

    Attributes:
        path: the folder.
        kind: ``"strong"``, ``"weak"`` or ``"runs"`` (an mlhpc run folder).
        round / submitter / system / benchmark: from the MLCommons layout
            ``<round>/<submitter>/results/<system>/<kind>/<benchmark>/`` where it applies, else
            from the logs.
        ruleset: the hpc ruleset the logs were checked against.
        runs: one `RunSummary` per ``result_*.txt``, sorted by file name.
        dropped: ``{file: reason}`` for runs that do not count (compliance, parse, no stop).
        scaling_factor: from ``scaling.json`` (1.0 when absent).
        olympic_min: strong/runs score in minutes (``None``: invalid or too few runs).
        ttta_min / number_of_models / models_per_min / instance_scale: weak scores.
        reference / convergence: the RCP for the folder's benchmark and global batch size, and
            how the runs' epochs to converge compare with it.
        notes: one-line remarks (why a score is missing, mismatched instance scales, ...).
        system_desc: the submission's ``systems/<system>.json`` where one exists.
    """

    path: str
    kind: str
    round: str | None = None
    submitter: str | None = None
    system: str | None = None
    benchmark: str | None = None
    ruleset: str = "3.0.0"
    runs: list[RunSummary] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)
    scaling_factor: float = 1.0
    olympic_min: float | None = None
    ttta_min: float | None = None
    number_of_models: int | None = None
    models_per_min: float | None = None
    instance_scale: int | None = None
    reference: ReferencePoint | None = None
    convergence: ConvergenceCheck | None = None
    notes: list[str] = field(default_factory=list)
    system_desc: dict[str, Any] = field(default_factory=dict)

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

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (runs included)."""
        out = {k: v for k, v in self.__dict__.items() if k not in ("runs", "reference", "convergence")}
        out["n_files"] = self.n_files
        out["reference"] = None if self.reference is None else self.reference.__dict__
        out["convergence"] = None if self.convergence is None else {
            "mean_epochs": self.convergence.mean_epochs, "passed": self.convergence.passed,
            "normalization": self.convergence.normalization}
        out["runs"] = [run.to_dict() for run in self.runs]
        return out


@dataclass
class Report:
    """Everything `build_report` found: folders in path order, and how long it took."""

    folders: list[FolderResult]
    compliance_checked: bool
    elapsed_s: float = 0.0

    @property
    def malformed(self) -> list[str]:
        return [m for f in self.folders for r in f.runs for m in r.malformed]

    def to_dict(self) -> dict[str, Any]:
        return {"compliance_checked": self.compliance_checked, "elapsed_s": self.elapsed_s,
                "folders": [f.to_dict() for f in self.folders]}


def compute_olympic_average(scores: list[float], dropped: int, max_dropped: int = MAX_DROPPED) -> float | None:
    """result_summarizer's ``_compute_olympic_average``: sort, drop ``max_dropped`` fastest and
    ``max_dropped - dropped`` slowest (dropped runs already count as the slowest), average.

    Returns ``None`` when no score remains.
    """
    ordered = sorted(scores)
    kept = ordered[max_dropped:len(ordered) - (max_dropped - dropped)]
    return sum(kept) * 1.0 / len(kept) if kept else None


def required_result_count(benchmark: str | None) -> int:
    """Result files a benchmark needs (mlperf_logging.benchmark_meta, hpc); 1 if unknown."""
    from mlperf_logging.benchmark_meta import get_result_file_counts

    return int(get_result_file_counts("hpc").get(benchmark or "", 1))


def read_scaling_factor(folder: Path) -> float:
    """``scaling_factor`` from ``folder/scaling.json``; 1.0 when the file is absent.

    Raises:
        LogFormatError: the file exists but is not JSON with a numeric ``scaling_factor``.
    """
    path = folder / "scaling.json"
    if not path.is_file():
        return 1.0
    try:
        value = json.loads(path.read_text())["scaling_factor"]
        return float(value)
    except (OSError, ValueError, KeyError, TypeError):
        raise LogFormatError(f"{path}: expected JSON {{\"scaling_factor\": <number>}}") from None


def _layout(folder: Path) -> tuple[str, str | None, str | None, str | None, str | None]:
    """kind, round, submitter, system, benchmark from the MLCommons layout (or "runs")."""
    parts = folder.parts
    if len(parts) >= 4 and parts[-2] in ("strong", "weak") and parts[-4] == "results":
        submitter = parts[-5] if len(parts) >= 5 else None
        round_ = parts[-6] if len(parts) >= 6 else None
        return parts[-2], round_, submitter, parts[-3], parts[-1]
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
        if path.is_file():
            found.setdefault(path.parent, []).append(path)
            continue
        if not path.is_dir():
            raise LogFormatError(f"{path}: no such file or folder")
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


def _system_desc(folder: Path, kind: str, system: str | None) -> dict[str, Any]:
    if kind == "runs" or system is None:
        return {}
    desc = folder.parents[3] / "systems" / f"{system}.json"
    try:
        data = json.loads(desc.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _run_target(log: Path) -> float | None:
    """The target an mlhpc run trained to: ``summary_<N>.json`` (or ``summary.json``) beside it."""
    n = re.match(r"^result_(.+)\.txt$", log.name)
    candidates = ([log.parent / f"summary_{n.group(1)}.json"] if n else []) + [log.parent / "summary.json"]
    data = None
    for candidate in candidates:
        try:
            data = json.loads(candidate.read_text())
            break
        except (OSError, ValueError):
            continue
    value = data.get("target") if isinstance(data, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def score_folder(folder: Path, files: list[Path], *, compliance: bool = True,
                 ruleset: str | None = None) -> FolderResult:
    """Parse, check and score one result folder.

    Args:
        folder: the folder; its place in the MLCommons layout decides strong/weak/runs.
        files: its ``result_*.txt`` files.
        compliance: run MLCommons' compliance checker on every log (as result_summarizer does);
            when False, only parse errors and missing run_start/run_stop drop a run.
        ruleset: hpc ruleset override (default: from the path, see `ruleset_for`).

    Raises:
        LogFormatError: a log or ``scaling.json`` cannot be read.
    """
    kind, round_, submitter, system, benchmark = _layout(folder)
    result = FolderResult(path=str(folder), kind=kind, round=round_, submitter=submitter,
                          system=system, benchmark=benchmark, ruleset=ruleset_for(folder, ruleset))
    scored: list[tuple[RunSummary, float, float]] = []
    scale_seen: int | None = None
    scales: dict[str, int | None] = {}
    for path in files:
        parsed = parse_log(path)
        run = summarize_run(parsed, target=_run_target(path) if kind == "runs" else None)
        result.runs.append(run)
        reason = None
        if compliance:
            verdict = check_run(parsed, result.ruleset)
            run.compliant, run.compliance_messages = verdict.ok, list(verdict.messages)
            if not verdict.ok:
                reason = "fails compliance: " + (verdict.messages[0] if verdict.messages else "?")
        if reason is None and parsed.malformed:
            reason = f"parse error: {parsed.malformed[0].message}"
        start, stop = official_start_stop(parsed.events)
        if reason is None and start is None:
            reason = "run_start not recorded"
        if reason is None and stop is None:
            reason = "run_stop not recorded"
        if reason is None and kind == "weak":
            scale = official_instance_scale(parsed.events)
            if scale is None:
                reason = "number_of_nodes or accelerators_per_node not recorded"
            elif scale_seen is None:
                scale_seen = scale
            elif scale != scale_seen:
                result.notes.append(f"{path.name}: instance scale {scale} differs from {scale_seen}")
        if reason is not None:
            result.dropped[str(path)] = reason
        else:
            scored.append((run, start, stop))  # type: ignore[arg-type]
            scales[str(path)] = official_instance_scale(parsed.events)

    if result.benchmark is None:
        result.benchmark = next((r.benchmark for r in result.runs if r.benchmark), None)
    if kind == "runs":
        result.system = next((r.platform for r in result.runs if r.platform), folder.name)
        result.submitter = next((r.org for r in result.runs if r.org), None)
    result.scaling_factor = read_scaling_factor(folder)

    own_throughput = kind == "runs" and len({r.instance_id for r in result.runs}) > 1 and all(
        r.instance_id is not None for r in result.runs)
    if own_throughput:  # an mlhpc throughput run (--instances K): one log per model instance
        kind = result.kind = "weak"
        scale_seen = next((v for v in scales.values() if v is not None), None)
    if kind == "weak":
        result.number_of_models = len(scored)
        result.instance_scale = scale_seen
        needed = 1 if own_throughput else required_result_count(result.benchmark)
        if scored and len(scored) >= needed:
            first = min(s for _, s, _ in scored)
            last = max(t for _, _, t in scored)
            result.ttta_min = (last - first) / 60 / 1000
            result.models_per_min = len(scored) / result.ttta_min if result.ttta_min > 0 else None
        else:
            result.notes.append(f"not enough converging weak-scaling runs: {len(scored)} < {needed}")
    else:
        scores = [(stop - start) / 60 / 1000 for _, start, stop in scored]
        dropped = len(result.dropped)
        if dropped > MAX_DROPPED:
            result.notes.append(f"invalid: {dropped} runs dropped (at most {MAX_DROPPED} allowed)")
        else:
            average = compute_olympic_average(scores, dropped)
            if average is None:
                result.notes.append(f"no olympic mean: {len(scores)} scored runs")
            else:
                result.olympic_min = average * result.scaling_factor
        gbs = next((r.global_batch_size for r in result.runs if r.global_batch_size), None)
        result.reference = reference_point(result.benchmark, gbs, result.ruleset)
        if result.reference is not None:
            result.convergence = check_convergence(result.reference, [r.epochs_to_target for r in result.runs])
    result.system_desc = _system_desc(folder, kind, system)
    return result


def build_report(paths: Iterable[Path | str], *, compliance: bool = True,
                 ruleset: str | None = None) -> Report:
    """Find every result folder under ``paths`` and score each (see the module docstring).

    Args:
        paths: round trees, submitter trees, result folders, mlhpc run folders or single logs.
        compliance: run the official compliance checker per log (needed for official scores;
            about 3 ms per log).
        ruleset: force an hpc ruleset (``"1.0.0"``, ``"2.0.0"``, ``"3.0.0"``).

    Returns:
        a `Report` with one `FolderResult` per folder, in path order.

    Raises:
        LogFormatError: a path is missing or holds no result logs, or a log is unreadable.
        ConfigError: an unknown ruleset.
    """
    started = time.perf_counter()
    folders = [score_folder(folder, files, compliance=compliance, ruleset=ruleset)
               for folder, files in find_result_folders(paths)]
    return Report(folders=folders, compliance_checked=compliance,
                  elapsed_s=time.perf_counter() - started)
