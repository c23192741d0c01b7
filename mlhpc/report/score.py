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

Each step is a function that returns what it computes: `mlhpc.report.folders.read_folder` reads
a folder once (`FolderRead`: its layout, system description, logs and runs); `folder_kind` its
kind and `judge` which runs count (`Verdicts`); `score_strong` and `score_weak` a `Score`; `mlhpc.report.rcp.check_folder` an RCP verdict;
`mlhpc.report.energy.folder_energy` and `mlhpc.report.validflops.folder_valid_flops` the energy
and Valid FLOPS; `score_read` assembles one `FolderResult` from those values.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from mlhpc import rules
from mlhpc.errors import ConfigError
from mlhpc.log.facts import RunSummary
from mlhpc.log.summary import official_instance_scale, official_start_stop
from mlhpc.report.compliance import RunCheck
from mlhpc.report.energy import folder_energy
from mlhpc.report.folders import FolderRead, Layout, Log, find_result_folders, read_folder
from mlhpc.report.rcp import RcpVerdict, check_folder
from mlhpc.report.reported import ReportedRun
from mlhpc.report.validflops import DEFAULT_EXPONENT, folder_valid_flops


@dataclass(frozen=True)
class FolderResult:
    """One result folder and its score, built once by `score_folder` from the values each step
    returns (layout, system description, runs and their verdicts, score, RCP verdict, energy,
    Valid FLOPS) and never changed after.

    Attributes:
        path: the folder.
        kind: ``"strong"``, ``"weak"`` or ``"runs"`` (an mlhpc run folder).
        round / submitter / system / benchmark: from the MLCommons layout
            ``<round>/<submitter>/results/<system>/<kind>/<benchmark>/`` where it applies, else
            from the logs.
        division: ``closed``/``open`` (the logs' ``submission_division``, else the system
            description's).
        ruleset: the hpc ruleset the logs were checked against (default `mlhpc.rules`' current
            one; ``None``: mlperf_logging has none for the round; ``ruleset_note`` then says so).
        runs: one `mlhpc.report.reported.ReportedRun` per ``result_*.txt``, sorted by file name.
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
    ruleset: str | None = rules.ruleset().version
    ruleset_note: str | None = None
    runs: list[ReportedRun] = field(default_factory=list)
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
            if run.facts.submission.number_of_nodes:
                return run.facts.submission.number_of_nodes
        return None

    @property
    def accelerators(self) -> int | None:
        """Accelerators used by one model: number_of_nodes x max(accelerators_per_node, 1)."""
        for run in self.runs:
            sub = run.facts.submission
            if sub.number_of_nodes:
                return sub.number_of_nodes * max(sub.accelerators_per_node or 0, 1)
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
        values = [r.facts.submission.accelerators_per_node for r in self.runs
                  if r.facts.submission.accelerators_per_node is not None]
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


@dataclass(frozen=True)
class Report:
    """Everything `build_report` found: folders in path order, and how long it took; the prices
    of the cost to train are given when it is made (`mlhpc.report.run_report`)."""

    folders: list[FolderResult]
    compliance_checked: bool
    elapsed_s: float = 0.0
    price_per_node_hour: float | None = None  # for cost to train (`mlhpc.report.figures.cost`)
    price_per_kwh: float | None = None

    @property
    def malformed(self) -> list[str]:
        return [m for f in self.folders for r in f.runs for m in r.facts.malformed]

    def to_dict(self) -> dict[str, Any]:
        return {"compliance_checked": self.compliance_checked, "elapsed_s": self.elapsed_s,
                "price_per_node_hour": self.price_per_node_hour, "price_per_kwh": self.price_per_kwh,
                "folders": [f.to_dict() for f in self.folders]}


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


def judge(logs: list[Log], runs: list[ReportedRun], checks: list[RunCheck | None], weak_layout: bool) -> Verdicts:
    """The `Verdicts` of a folder's ``logs`` and their ``runs``, by each log's compliance check
    (``checks``, `mlhpc.report.compliance.run_check`; None: kept apart, a resumed log or a
    stopped attempt that a resumed log continues): a run whose check drops it does not count,
    nor, in a weak-scaling folder of the MLCommons layout (``weak_layout``), one without an
    instance scale. Never raises."""
    resumed, dropped, counted, notes = [], {}, [], []
    first_scale: int | None = None
    for log, run, verdict in zip(logs, runs, checks):
        if verdict is None:  # kept apart: never an ordinary run
            resumed.append(str(log.path))
            continue
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


@dataclass(frozen=True)
class Score:
    """A folder's score: strong (``olympic_min``, ``raw_olympic_min``, minutes) or weak
    (``ttta_min`` minutes, ``number_of_models``, ``models_per_min``, ``instance_scale``), and the
    notes saying why a score is missing or what it leaves out."""

    olympic_min: float | None = None
    raw_olympic_min: float | None = None
    ttta_min: float | None = None
    number_of_models: int | None = None
    models_per_min: float | None = None
    instance_scale: int | None = None
    notes: tuple[str, ...] = ()


def score_strong(times_min: list[float], dropped: int, max_dropped: int, scaling_factor: float) -> Score:
    """result_summarizer's strong-scaling score of the counted runs' times to train
    (``times_min``, minutes) with ``dropped`` runs dropped: invalid past ``max_dropped``, else the
    olympic mean (`compute_olympic_average`) times ``scaling_factor``."""
    if dropped > max_dropped:
        return Score(notes=(f"invalid: {dropped} runs dropped (at most {max_dropped} allowed)",))
    average = compute_olympic_average(times_min, dropped, max_dropped)
    if average is None:
        return Score(notes=(f"no olympic mean: {len(times_min)} scored runs",))
    return Score(olympic_min=average * scaling_factor, raw_olympic_min=average)


def score_weak(spans_ms: list[tuple[float, float]], instance_scale: int | None, needed: int,
               system_desc: Mapping[str, Any]) -> Score:
    """result_summarizer's weak-scaling score of the counted runs ``(run_start_ms, run_stop_ms)``
    (`weak_throughput`), none below ``needed`` models; a note when the models times
    ``instance_scale`` exceed the nodes (accelerators) of the system description."""
    models, notes = len(spans_ms), []
    ttta_min = per_min = None
    if spans_ms and models >= needed:
        ttta_min, per_min = weak_throughput(spans_ms)
    else:
        notes.append(f"not enough converging weak-scaling runs: {models} < {needed}")
    nodes = _int_or_none(system_desc.get("number_of_nodes"))
    per_node = _int_or_none(system_desc.get("accelerators_per_node"))
    if nodes and instance_scale and models and models * instance_scale > nodes * max(per_node or 0, 1):
        unit = "nodes" if (per_node or 0) == 0 else "accelerators"
        notes.append(f"warning: {models} models x {instance_scale} {unit} each (instance scale as logged) "
                     f"exceed the {nodes * max(per_node or 0, 1)} {unit} of the system description")
    return Score(ttta_min=ttta_min, number_of_models=models, models_per_min=per_min,
                 instance_scale=instance_scale, notes=tuple(notes))


@dataclass(frozen=True)
class Names:
    """What a folder is called where the layout does not say: benchmark and division (and for an
    mlhpc run folder system and submitter) from the logs, else the system description."""

    benchmark: str | None
    division: str | None
    system: str | None
    submitter: str | None


def names_of(folder: Path, layout: Layout, runs: tuple[RunSummary, ...], desc: Mapping[str, Any]) -> Names:
    """The `Names` of ``folder``: the layout's, else the first log that names each."""
    subs = [r.submission for r in runs]
    division = next((s.division for s in subs if s.division), None) or (
        str(desc.get("division")) if desc.get("division") else None)
    benchmark = layout.benchmark or next((s.benchmark for s in subs if s.benchmark), None)
    if not layout.own:
        return Names(benchmark, division, layout.system, layout.submitter)
    return Names(benchmark, division, next((s.platform for s in subs if s.platform), folder.name),
                 next((s.org for s in subs if s.org), None))


def folder_rcp(read: FolderRead, verdicts: Verdicts, names: Names) -> RcpVerdict:
    """rcp_checker's verdict on the folder's logs that are not kept apart (`mlhpc.report.rcp`);
    not checked where the folder holds resumed runs."""
    resumed = verdicts.resumed
    if resumed:
        return RcpVerdict(None, "not checked: the folder holds resumed runs")
    return check_folder(read.path, benchmark=names.benchmark, ruleset=read.check.ruleset, division=names.division,
                        files=[Path(p) for p in read.files if str(p) not in resumed])


def score_folder(folder: Path, files: list[Path], *, compliance: bool = True,
                 ruleset: str | None = None, valid_flops_exponent: float = DEFAULT_EXPONENT) -> FolderResult:
    """Parse, check and score one result folder: `score_read` of `mlhpc.report.folders.read_folder`.

    Args:
        folder: the folder; its place in the MLCommons layout decides strong/weak/runs.
        files: its ``result_*.txt`` files.
        compliance: run MLCommons' compliance checker on every log (as result_summarizer does);
            when False, only parse errors and missing run_start/run_stop drop a run.
        ruleset: hpc ruleset override (default: from the path, see `ruleset_for`).
        valid_flops_exponent: the n of HPC AI500's quality penalty (`mlhpc.report.validflops`).

    Returns:
        a `FolderResult`, built once from the values each step returns.

    Raises:
        LogFormatError: a log or ``scaling.json`` cannot be read.
        ConfigError: an unknown ruleset.
    """
    return score_read(read_folder(folder, files, compliance=compliance, ruleset=ruleset,
                                  exponent=valid_flops_exponent))


def score_read(read: FolderRead) -> FolderResult:
    """The `FolderResult` of a folder read once (`mlhpc.report.folders.read_folder`): its kind
    (`folder_kind`), which runs count (`judge`), its names, its score (strong or weak), RCP
    verdict, energy and Valid FLOPS. Reads no file but the RCP checker's."""
    layout, desc = read.layout, read.desc
    kind = folder_kind(layout, [log.facts for log in read.logs])
    verdicts = judge(list(read.logs), list(read.runs), list(read.checks), layout.scaling == "weak")
    names = names_of(read.path, layout, tuple(r.facts for r in verdicts.runs), desc.data)
    table = rules.of_round(read.check.ruleset, layout.round)
    if kind == "weak":
        needed = 1 if layout.own else table.runs.get(names.benchmark or "", 1)
        score = score_weak([(c.start_ms, c.stop_ms) for c in verdicts.counted], verdicts.instance_scale,
                           needed, desc.data)
        rcp = None
    else:
        score = score_strong([(c.stop_ms - c.start_ms) / 60 / 1000 for c in verdicts.counted],
                             len(verdicts.dropped), table.max_dropped, read.scaling_factor)
        rcp = folder_rcp(read, verdicts, names)
    energy = folder_energy([(c.run.power, c.start_ms, c.stop_ms) for c in verdicts.counted],
                           [r.power for r in verdicts.runs], kind, len(verdicts.dropped), table.max_dropped,
                           read.scaling_factor)
    flops = folder_valid_flops([r for r in verdicts.runs if r.facts.path not in verdicts.resumed], kind,
                               score.ttta_min)
    resumed_note = (f"{len(verdicts.resumed)} resumed run(s) kept apart, not scored: "
                    + ", ".join(Path(p).name for p in verdicts.resumed),) if verdicts.resumed else ()
    return FolderResult(
        path=str(read.path), kind=kind, round=layout.round, submitter=names.submitter, system=names.system,
        benchmark=names.benchmark, division=names.division, ruleset=read.check.ruleset, ruleset_note=read.check.note,
        runs=list(verdicts.runs), dropped=dict(verdicts.dropped), scaling_factor=read.scaling_factor,
        olympic_min=score.olympic_min, raw_olympic_min=score.raw_olympic_min, ttta_min=score.ttta_min,
        number_of_models=score.number_of_models, models_per_min=score.models_per_min,
        instance_scale=score.instance_scale, rcp=rcp, resumed=list(verdicts.resumed),
        notes=[*desc.notes, *verdicts.notes, *resumed_note, *score.notes, *energy.notes],
        system_desc=dict(desc.data), energy_olympic_j=energy.energy_j,
        valid_flops_per_s=flops[0], valid_flops_per_w=flops[1])


def build_report(paths: Iterable[Path | str], *, compliance: bool = True, ruleset: str | None = None,
                 valid_flops_exponent: float = DEFAULT_EXPONENT, price_per_node_hour: float | None = None,
                 price_per_kwh: float | None = None) -> Report:
    """Find every result folder under ``paths``, read each once and score it (see the module
    docstring).

    Args:
        paths: round trees, submitter trees, result folders, mlhpc run folders or single logs.
        compliance: run the official compliance checker per log (needed for official scores;
            about 3 ms per log).
        ruleset: force an hpc ruleset (one of `mlhpc.report.compliance.supported_rulesets`).
        valid_flops_exponent: the n of HPC AI500's quality penalty (default 5).
        price_per_node_hour / price_per_kwh: the prices of the cost to train; None: the
            system descriptions' (`described_price`).

    Returns:
        a `Report` with one `FolderResult` per folder, in path order.

    Raises:
        LogFormatError: a path is missing or holds no result logs, or a log is unreadable.
        ConfigError: an unknown ruleset; a bad or ambiguous price in a system description.
    """
    started = time.perf_counter()
    folders = [score_read(read_folder(folder, files, compliance=compliance, ruleset=ruleset,
                                      exponent=valid_flops_exponent))
               for folder, files in find_result_folders(paths)]
    return Report(folders=folders, compliance_checked=compliance, elapsed_s=time.perf_counter() - started,
                  price_per_node_hour=described_price(folders, "price_per_node_hour", price_per_node_hour),
                  price_per_kwh=described_price(folders, "price_per_kwh", price_per_kwh))


def described_price(folders: list[FolderResult], name: str, given: float | None) -> float | None:
    """The price ``name`` (``price_per_node_hour`` or ``price_per_kwh``) for the cost to train:
    ``given`` (the command line's) when not None; else the one the folders' system descriptions
    (``systems/<system>.json``, key ``name``, a number or a numeric string) give, when every
    description that names a price gives the same; else None (no cost shown).

    Raises:
        ConfigError: a description's price is not a finite number >= 0, or two descriptions
            give different prices (one report has one price: give it on the command line).
    """
    if given is not None:
        return given
    found: dict[float, str] = {}
    for folder in folders:
        raw = folder.system_desc.get(name)
        if raw is None or raw == "":
            continue
        where = f"system description {folder.system}.json of {folder.path}"
        try:
            value = float(raw) if not isinstance(raw, bool) else float("nan")
        except (TypeError, ValueError):
            value = float("nan")
        if not 0 <= value < float("inf"):
            raise ConfigError(f"{where}: {name} {raw!r}: expected a finite price >= 0")
        found.setdefault(value, where)
    if len(found) > 1:
        (a, first), (b, second) = list(found.items())[:2]
        raise ConfigError(f"{name}: {first} gives {a:g}, {second} gives {b:g}; report the systems "
                          f"apart or give --{name.replace('_', '-')}")
    return next(iter(found), None)
