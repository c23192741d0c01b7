"""The report's figures as data, and the text of each cell.

`FIGURES` holds one `Figure` per figure of the report: its name with its unit (the CSV
column), its level (a run or a result folder), where its value comes from, where the report's
JSON holds the same value, how a table shows it, which views show it and where. Every view
selects from it: the terminal tables (every column with ``--wide``, the compact default),
Markdown (the wide tables), CSV (every figure of its level); JSON is the report's own dict
(`mlhpc.report.score.Report.to_dict`). Rules as data, as mlperf_logging keeps its compliance
rules (``compliance_checker/*/*.yaml``).

Adding a figure is one row of `FIGURES` plus the function that computes its value. The cell
formatters below it (`fmt`, `energy`, `flops_text`, `staging_cell`, ...) return ``str``
(``"-"`` for a missing value) and never print.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable

from mlhpc.log.facts import RunSummary
from mlhpc.report.reported import ReportedRun
from mlhpc.report.score import FolderResult, Report
from mlhpc.report.validflops import exponent_of

WIDE, COMPACT, CSV = "wide", "compact", "csv"  # the views; Markdown shows the wide tables
TABLES = frozenset({WIDE, COMPACT})


@dataclass(frozen=True)
class Frame:
    """What one table (or one CSV) shows together: the report, its folders, the view, and for
    a compact folder table the scaling of its score (``strong`` or ``weak``)."""

    report: Report
    folders: tuple[FolderResult, ...]
    view: str
    scaling: str = "strong"

    @cached_property
    def runs(self) -> list[ReportedRun]:
        return [r for f in self.folders for r in f.runs]

    @cached_property
    def energy_unit(self) -> tuple[str, float]:
        """``(unit, joules per unit)`` of the runs' energies (`energy_unit`)."""
        return energy_unit(r.power.energy_to_train_j for r in self.runs)


@dataclass(frozen=True)
class Row:
    """One row of a view: a folder, and for a run-level figure one of its runs."""

    frame: Frame
    folder: FolderResult
    run: ReportedRun = field(default=None)  # type: ignore[assignment]

@dataclass(frozen=True)
class Figure:
    """One figure of the report.

    Attributes:
        name: the name with its unit, as CSV heads its column (``time_to_train_s``).
        level: ``run`` (one value per run) or ``folder`` (one per result folder).
        value: where it comes from: the value of a `Row`, in the unit of ``name``: a run's
            facts (`mlhpc.log.facts.RunSummary`) or the report's figures of it
            (`mlhpc.report.reported.ReportedRun`), or its folder's (`FolderResult`).
        json: where the report's JSON holds the same value: of the run's dict
            (`ReportedRun.to_dict`) or the folder's (`FolderResult.to_dict`); None where JSON
            does not hold it (a cost: the prices are given when the report is shown).
        label: the heading in the tables, or a function of the `Frame` (a unit that depends on
            the runs shown).
        text: how a table shows the value: ``text(row, value)``.
        views: where it is shown: `CSV`, `WIDE` (and Markdown), `COMPACT`.
        column: its place in the tables (CSV keeps the order of `FIGURES`).
        shown: whether a table shows it (a price given, a run with power readings); CSV always does.
    """

    name: str
    level: str
    value: Callable[[Row], Any]
    json: Callable[[dict[str, Any]], Any] | None = None
    label: str | Callable[[Frame], str] = ""
    text: Callable[[Row, Any], str] = lambda row, value: fmt(value)
    views: frozenset[str] = frozenset({CSV})
    column: int = 0
    shown: Callable[[Frame], bool] = lambda frame: True

    def heading(self, frame: Frame) -> str:
        return self.label if isinstance(self.label, str) else self.label(frame)


def fmt(value: Any, digits: int = 2) -> str:
    """``value`` for a table: ``-`` for None, ``yes``/``no``, floats with ``digits`` decimals
    and thousands separators, ``inf``; anything else as ``str``."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf"
        return f"{value:,.{digits}f}"
    return str(value)


def epoch_unit(f: FolderResult) -> str:
    """``epochs`` (or ``samples`` for OpenFold): the convergence unit of a folder's runs."""
    return next((r.facts.training.epoch_unit for r in f.runs), "epochs")


def energy_unit(values: Iterable[float | None]) -> tuple[str, float]:
    """``("kWh", 3.6e6)`` when any value (joules) reaches 1 kWh, else ``("kJ", 1e3)``."""
    return ("kWh", 3.6e6) if any(v is not None and v >= 3.6e6 for v in values) else ("kJ", 1e3)


def energy(value: float | None, scale: float) -> str:
    """Joules divided by ``scale`` (1e3: kJ, 3.6e6: kWh), three decimals; ``-`` when unmeasured."""
    return "-" if value is None else f"{value / scale:,.3f}"


def node_energy(nodes: dict[str, float] | None, scale: float) -> str:
    """Energy per power file (``{"node_K": joules, "sw_K": ...}``) in the unit of ``scale``: each
    file named up to four files, else the count with the smallest and largest node; ``-`` when
    unmeasured."""
    if not nodes:
        return "-"
    if len(nodes) <= 4:
        return ", ".join(f"{name} {energy(j, scale)}" for name, j in nodes.items())
    values = [j for name, j in nodes.items() if name.startswith("node_")] or list(nodes.values())
    return f"{len(values)} nodes: {energy(min(values), scale)} .. {energy(max(values), scale)}"


def any_energy(report: Report) -> bool:
    """Some run of ``report`` has an energy to train (power readings beside its log)."""
    return any(r.power.energy_to_train_j is not None for f in report.folders for r in f.runs)


def cost(report: Report, nodes: int | None, minutes: float | None, energy_j: float | None) -> float | None:
    """Cost to train: nodes x hours x ``price_per_node_hour`` plus kWh x ``price_per_kwh``, for
    the prices the report was given; None when no price is given or a figure a price needs
    is missing (no energy is ever assumed)."""
    pnh, pkwh = report.price_per_node_hour, report.price_per_kwh
    if pnh is None and pkwh is None:
        return None
    total = 0.0
    if pnh is not None:
        if not nodes or minutes is None:
            return None
        total += nodes * minutes / 60.0 * pnh
    if pkwh is not None:
        if energy_j is None:
            return None
        total += energy_j / 3.6e6 * pkwh
    return total


def priced(report: Report) -> bool:
    return report.price_per_node_hour is not None or report.price_per_kwh is not None


def folder_nodes(f: FolderResult) -> int | None:
    """Nodes of a result folder: the system description's ``number_of_nodes``, else the logs'."""
    nodes = f.system_desc.get("number_of_nodes")
    try:
        return int(nodes) if nodes not in (None, "") else f.nodes
    except (TypeError, ValueError, OverflowError):
        return f.nodes


def scale(f: FolderResult) -> str:
    """``nodes x accelerators per node`` (``N nodes, CPU only`` for CPU systems; ``?`` unknown)."""
    desc = f.system_desc
    if desc.get("number_of_nodes") not in (None, "") and desc.get("accelerators_per_node") not in (None, ""):
        nodes, acc = desc["number_of_nodes"], desc["accelerators_per_node"]
    else:
        nodes = f.nodes or "?"
        acc = next((r.facts.submission.accelerators_per_node for r in f.runs
                    if r.facts.submission.accelerators_per_node is not None), "?")
    return f"{nodes} nodes, CPU only" if f.cpu_only else f"{nodes} x {acc}"


def folder_name(f: FolderResult) -> str:
    """How a person knows a result folder: ``submitter: system`` for a published result; the run
    folder's own name (and its system, when logged) for an mlhpc run folder."""
    if f.kind == "runs":
        name = Path(f.path).name or f.path
        return f"{name} ({f.system})" if f.system and f.system != name else name
    return ": ".join(x for x in (f.submitter, f.system) if x) or f.path


def rcp_cell(f: FolderResult) -> str:
    """rcp_checker's verdict in a word: ``RCP pass``, ``RCP FAIL`` or ``RCP -`` (not checked)."""
    rcp = f.rcp
    if rcp is None or rcp.passed is None:
        return "RCP -"
    return "RCP pass" if rcp.passed else "RCP FAIL"


def strong_cell(f: FolderResult) -> str:
    """The score and how it was made: ``21.04 (raw 20.92 x1.006, RCP pass)`` when a
    ``scaling.json`` factor is applied, ``20.92 (RCP pass; x1.006 normalised: 21.04)`` when
    rcp_checker's factor is not applied yet, else ``20.92 (RCP pass)``; ``*``: one run dropped;
    ``invalid`` or ``-`` without a score."""
    if f.olympic_min is None:
        score = "invalid" if any(n.startswith("invalid") for n in f.notes) else "-"
        return f"{score} ({rcp_cell(f)})"
    score = f"{f.olympic_min:.2f}{'*' if f.dropped else ''}"
    if f.scaling_factor != 1.0 and f.raw_olympic_min is not None:
        return f"{score} (raw {f.raw_olympic_min:.2f} x{f.scaling_factor:.3f}, {rcp_cell(f)})"
    if f.normalized_min is not None and f.rcp is not None and f.rcp.normalization != 1.0:
        return f"{score} ({rcp_cell(f)}; x{f.rcp.normalization:.3f} normalised: {f.normalized_min:.2f})"
    return f"{score} ({rcp_cell(f)})"


def weak_cell(f: FolderResult) -> str:
    """``models/min (models x accelerators per model)``; ``-`` without a score."""
    if f.models_per_min is None:
        return "-"
    return f"{f.models_per_min:.3f} ({f.number_of_models} x {f.instance_scale})"


def energy_cell(report: Report, f: FolderResult) -> str:
    """A folder's olympic-mean energy in kWh, with the cost to train where prices are given."""
    text = energy(f.energy_olympic_j, 3.6e6)
    price = cost(report, folder_nodes(f), f.olympic_min if f.kind != "weak" else None, f.energy_olympic_j)
    return text if price is None else f"{text} (cost {price:,.2f})"


def resumed_cell(run: RunSummary) -> str:
    """``no``, or for a resumed run the timed seconds across all its attempts, labelled as such
    (a resumed run is never scored: the figure is not a time to train)."""
    timing = run.timing
    if not timing.resumed:
        return "no"
    if timing.earlier_attempts_s is None or timing.time_to_train_total_s is None:
        return "yes (earlier attempts not logged)"
    return f"yes: {timing.time_to_train_total_s:,.2f} s all attempts, unscored"


def staged_nothing(run: RunSummary) -> bool:
    """The run copied nothing to node-local storage: a resumed run without staging records,
    staging off (``staging_stop`` with ``staged_bytes`` 0 and no per-node figures), or mlhpc's
    per-node figures showing no byte copied (the copy was already in place, as on a resume)."""
    staging = run.staging
    if staging.staging_s is None:
        return run.timing.resumed
    nodes = staging.staging_nodes or {}
    if not nodes.get("nodes"):
        return staging.staged_bytes == 0
    per_node = nodes.get("node_gb_per_s") or []
    return nodes.get("aggregate_gb_per_s") == 0 and not any(per_node)


def staging_cell(run: RunSummary, wide: bool = True) -> str:
    """Staging seconds; ``not staged`` where nothing was copied (`staged_nothing`), never a
    bandwidth of 0.00 GB/s. ``wide`` adds mlhpc's per-node figures ``(N nodes: slowest, mean s,
    aggregate GB/s, max GB per node)`` or, for a copy already in place, the seconds spent
    verifying it."""
    staging_s, nodes = run.staging.staging_s, run.staging.staging_nodes or {}
    if staged_nothing(run):
        if not wide or not nodes.get("nodes") or staging_s is None:
            return "not staged"
        return f"not staged: copy in place on {nodes['nodes']} nodes ({fmt(staging_s)} s verifying)"
    text = fmt(staging_s)
    if not wide or not nodes.get("nodes"):
        return text
    per_node = nodes.get("node_staged_bytes") or [0]
    return (f"{text} ({nodes['nodes']} nodes: slowest {fmt(nodes.get('slowest_node_s'))}, mean "
            f"{fmt(nodes.get('mean_node_s'))}, {fmt(nodes.get('aggregate_gb_per_s'))} GB/s, "
            f"<= {max(per_node) / 1e9:.3g} GB/node)")


def flops_text(value: float | None) -> str:
    """A FLOP rate (or FLOP/s per W) with an SI prefix and three figures: ``4.41 T``, ``512 M``;
    ``-`` when there is none."""
    if value is None or not math.isfinite(value):
        return "-"
    for scale, prefix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}"
    return f"{value:.3g}"


def valid_flops_header(runs: Iterable[ReportedRun]) -> str:
    """``valid FLOP/s (n=5)``: the column's name with the penalty's exponent beside it."""
    return f"valid FLOP/s (n={exponent_of(list(runs)):g})"


def any_valid_flops(report: Report, per_w: bool = False) -> bool:
    """Some run of ``report`` has Valid FLOPS (``per_w``: Valid FLOPS per watt)."""
    return any(r.valid_flops is not None and
               (r.valid_flops.valid_flops_per_w if per_w else r.valid_flops.valid_flops_per_s) is not None
               for f in report.folders for r in f.runs)


def _key(*path: str) -> Callable[[dict[str, Any]], Any]:
    """Reads ``d[path[0]][path[1]]...`` of a JSON dict, None through a missing level."""
    def read(d: dict[str, Any]) -> Any:
        for name in path:
            d = d.get(name) if isinstance(d, dict) else None
        return d
    return read


def _field(record: Any, path: str) -> Any:
    """A field of the report's own records by its dotted path; None through a missing record."""
    for name in path.split("."):
        record = None if record is None else getattr(record, name)
    return record


def _run(name: str, value: str | Callable[[ReportedRun], Any], **how: Any) -> Figure:
    """A run's figure: ``value`` the dotted path of a field of the `ReportedRun` (JSON at the
    run's key ``name`` unless ``json`` says), or a function of the run (JSON where ``json`` says)."""
    get = (lambda run: _field(run, value)) if isinstance(value, str) else value
    return Figure(name, "run", lambda row: get(row.run), **{"json": _key(name) if isinstance(value, str) else None, **how})


def _folder(name: str, value: Callable[[FolderResult], Any] | None = None, **how: Any) -> Figure:
    """A folder's figure; ``value`` of the folder (default: its field ``name``)."""
    get = value or (lambda f: _field(f, name))
    return Figure(name, "folder", lambda row: get(row.folder), **{"json": _key(name) if value is None else None, **how})


def _wide_or(test: Callable[[Report], bool]) -> Callable[[Frame], bool]:
    """Shown in every wide table; in a compact one where ``test`` finds a run with a value."""
    return lambda frame: frame.view != COMPACT or test(frame.report)


def _energy_label(prefix: str) -> Callable[[Frame], str]:
    return lambda frame: f"{prefix} {frame.energy_unit[0]}"


def _energy_text(row: Row, value: Any) -> str:
    return energy(value, row.frame.energy_unit[1])


def _fmt(digits: int) -> Callable[[Row, Any], str]:
    return lambda row, value: fmt(value, digits)


def _run_cost(row: Row) -> float | None:
    run = row.run
    return cost(row.frame.report, run.facts.submission.number_of_nodes, run.facts.timing.time_to_train_min,
                run.power.energy_to_train_j)


def _folder_cost(row: Row) -> float | None:
    f = row.folder
    return cost(row.frame.report, folder_nodes(f), f.olympic_min if f.kind != "weak" else None, f.energy_olympic_j)


def _folder_gbs(f: FolderResult) -> int | None:
    """The RCP's global batch size, else the first run's that logged one."""
    rcp = f.rcp
    return (rcp.global_batch_size if rcp and rcp.global_batch_size else None) or next(
        (r.facts.submission.global_batch_size for r in f.runs if r.facts.submission.global_batch_size), None)


def _compliance(row: Row) -> str:
    f = row.folder
    return f.ruleset_note or (f"hpc {f.ruleset}" if row.frame.report.compliance_checked else "not checked")


def _folder_notes(f: FolderResult) -> str:
    return "; ".join(f.notes + [f"{k.rsplit('/', 1)[-1]}: {v}" for k, v in f.dropped.items()])


ALL = TABLES | {CSV}
_priced = lambda frame: priced(frame.report)  # noqa: E731 (a price given: a cost column)
_RUN_FIGURES = (
    Figure("folder", "run", lambda row: row.folder.path),
    _run("file", lambda r: r.facts.path.rsplit("/", 1)[-1], json=lambda d: d["path"].rsplit("/", 1)[-1], label="run",
         views=ALL, column=10), _run("benchmark", "facts.submission.benchmark"),
    _run("status", "facts.timing.status", label="status", views=ALL, column=20),
    _run("compliant", "compliant", label="compliant", views=ALL, column=30),
    _run("resumed", "facts.timing.resumed", label="resumed", text=lambda row, value: resumed_cell(row.run.facts),
         views=ALL, column=190),
    _run("time_to_train_s", "facts.timing.time_to_train_s", label="time to train s", views=ALL, column=40),
    _run("energy_to_train_j", "power.energy_to_train_j", label=_energy_label("energy"), text=_energy_text,
         views=ALL, column=50, shown=_wide_or(any_energy)),
    _run("mean_power_w", "power.mean_power_w", label="mean power W", text=_fmt(1), views=ALL - {COMPACT}, column=60),
    _run("mean_epoch_energy_j", "power.mean_epoch_energy_j", label=_energy_label("epoch energy"), text=_energy_text,
         views=ALL - {COMPACT}, column=130),
    Figure("cost_to_train", "run", _run_cost, label="cost", views=ALL, column=200, shown=_priced),
    _run("staging_s", "facts.staging.staging_s", label="staging s",
         text=lambda row, value: staging_cell(row.run.facts, row.frame.view != COMPACT), views=ALL, column=80),
    _run("init_s", "facts.staging.init_s", label="init s", views=ALL - {COMPACT}, column=90),
    _run("epochs", "facts.training.n_epochs", json=_key("n_epochs"), label="epochs", views=ALL, column=100),
    _run("epochs_to_target", "facts.quality.epochs_to_target",
         label=lambda frame: f"{next((r.facts.training.epoch_unit for r in frame.runs), 'epochs')} to target",
         text=_fmt(0), views=ALL - {COMPACT}, column=110),
    _run("mean_epoch_s", "facts.training.mean_epoch_s", label="mean epoch s", views=ALL - {COMPACT}, column=120),
    _run("samples_per_s", "facts.training.samples_per_s", label="samples/s", text=_fmt(1), views=ALL, column=140),
    _run("eval_s", lambda r: r.facts.training.total_eval_s if r.facts.training.eval_s else None,
         json=lambda d: d["total_eval_s"] if d["eval_s"] else None, label="eval s", views=ALL - {COMPACT}, column=170),
    _run("residual_s", "facts.training.residual_s", label="residual s", views=ALL - {COMPACT}, column=180),
    _run("nodes", "facts.submission.number_of_nodes", json=_key("number_of_nodes")),
    _run("accelerators_per_node", "facts.submission.accelerators_per_node"),
    _run("global_batch_size", "facts.submission.global_batch_size"),
    _run("metric", "facts.quality.metric_key", json=_key("metric_key")),
    _run("start_metric", "facts.quality.start_metric"),  # the starting point's evaluation (epoch_num 0)
    _run("final_metric", lambda r: r.facts.quality.metric_series[-1][1] if r.facts.quality.metric_series else None,
         json=lambda d: d["metric_series"][-1][1] if d["metric_series"] else None), _run("target", "facts.quality.target"),
    _run("malformed_lines", lambda r: len(r.facts.malformed), json=lambda d: len(d["malformed"])),
    _run("power_note", "power.power_note"),
    _run("train_flops_per_sample", "valid_flops.train_flops_per_sample",
         json=_key("valid_flops", "train_flops_per_sample")),
    _run("samples_trained", "valid_flops.samples_trained", json=_key("valid_flops", "samples_trained")),
    _run("valid_flops_per_s", "valid_flops.valid_flops_per_s", json=_key("valid_flops", "valid_flops_per_s"),
         label=lambda frame: valid_flops_header(frame.runs) if frame.view != COMPACT else "valid FLOP/s",
         text=lambda row, value: flops_text(value), views=ALL, column=150, shown=_wide_or(any_valid_flops)),
    _run("valid_flops_per_w", "valid_flops.valid_flops_per_w", json=_key("valid_flops", "valid_flops_per_w"),
         label="valid FLOP/s per W", text=lambda row, value: flops_text(value), views=ALL, column=160,
         shown=_wide_or(lambda report: any_valid_flops(report, per_w=True))),
    _run("valid_flops_exponent", "valid_flops.exponent", json=_key("valid_flops", "exponent")),
    _run("flops_source", "valid_flops.flops_source", json=_key("valid_flops", "flops_source")),
    _run("valid_flops_note", "valid_flops.note", json=_key("valid_flops", "note")),
    _run("accelerator_utilization", "facts.accelerator_utilization"),  # storage mode only
    _run("node_energy_j", lambda r: r.power.node_energy_j or None, json=lambda d: d["node_energy_j"] or None,
         label=_energy_label("energy per node"), text=lambda row, value: node_energy(value, row.frame.energy_unit[1]),
         views=frozenset({WIDE, CSV}), column=70),  # joules per power file; CSV: a JSON object
)
_FOLDER_FIGURES = (
    _folder("round"), _folder("submitter"), _folder("system"),
    _folder("division", label="division", text=lambda row, value: value or "?", views=ALL, column=30),
    _folder("mode", lambda f: f.kind, json=_key("kind")),
    _folder("benchmark", label="benchmark", text=lambda row, value: value or "?", views=ALL, column=10),
    _folder("n_files"),
    _folder("dropped", lambda f: len(f.dropped), json=lambda d: len(d["dropped"])),
    _folder("resumed", lambda f: len(f.resumed), json=lambda d: len(d["resumed"])),
    _folder("scaling_factor"), _folder("olympic_min"), _folder("ttta_min"), _folder("number_of_models"),
    _folder("models_per_min"), _folder("instance_scale"),
    _folder("global_batch_size", _folder_gbs),
    Figure("compliance", "folder", _compliance),
    _folder("rcp_pass", lambda f: _field(f.rcp, "passed"), json=_key("rcp", "passed")),
    _folder("rcp_message", lambda f: _field(f.rcp, "message"), json=_key("rcp", "message")),
    _folder("rcp_normalization", lambda f: f.rcp.normalization if f.rcp and f.rcp.passed is not None else None),
    _folder("normalized_min"),
    _folder("convergence_unit", lambda f: epoch_unit(f)),
    _folder("mean_epochs", lambda f: _field(f.rcp, "mean_epochs"), json=_key("rcp", "mean_epochs")),
    _folder("rcp_mean_epochs", lambda f: _field(f.rcp, "rcp_mean_epochs"), json=_key("rcp", "rcp_mean_epochs")),
    _folder("rcp_min_epochs", lambda f: _field(f.rcp, "rcp_min_epochs"), json=_key("rcp", "rcp_min_epochs")),
    _folder("energy_olympic_j", label="energy kWh", text=lambda row, value: energy(value, 3.6e6),
            views=ALL - {WIDE}, column=60,
            shown=lambda frame: any(f.energy_olympic_j is not None for f in frame.folders)),
    Figure("cost_to_train", "folder", _folder_cost, label="cost", views=ALL - {WIDE}, column=70, shown=_priced),
    _folder("notes", _folder_notes),
    _folder("valid_flops_per_s", label=lambda frame: valid_flops_header(frame.runs),
            text=lambda row, value: flops_text(value), views=ALL - {WIDE}, column=80,
            shown=lambda frame: any(f.valid_flops_per_s is not None for f in frame.folders)),
    _folder("valid_flops_per_w"),
    _folder("valid_flops_exponent", lambda f: exponent_of(f.runs)),
    # the compact folder tables' own columns
    _folder("folder_name", lambda f: folder_name(f), label="system", views=frozenset({COMPACT}), column=20,
            text=lambda row, value: (f"{row.folder.round} {value}" if row.folder.round and len(
                {f.round for f in row.frame.folders}) > 1 else value)),
    _folder("nodes_x_accelerators", lambda f: scale(f), label="nodes x accelerators", views=frozenset({COMPACT}),
            column=40, text=lambda row, value: value),
    _folder("score", lambda f: f.models_per_min if f.kind == "weak" else f.olympic_min, views=frozenset({COMPACT}),
            label=lambda frame: "models/min (models x accelerators)" if frame.scaling == "weak" else "minutes (RCP)",
            text=lambda row, value: (weak_cell if row.frame.scaling == "weak" else strong_cell)(row.folder), column=50),
)
FIGURES: tuple[Figure, ...] = _RUN_FIGURES + _FOLDER_FIGURES


def selected(level: str, frame: Frame) -> list[Figure]:
    """The figures of ``level`` that ``frame``'s view shows: CSV in the order of `FIGURES`, a
    table by `Figure.column`."""
    figures = [f for f in FIGURES if f.level == level and frame.view in f.views]
    if frame.view == CSV:  # every column, each run or folder its row
        return figures
    return sorted((f for f in figures if f.shown(frame)), key=lambda f: f.column)


def rows(level: str, frame: Frame) -> list[Row]:
    """One `Row` per folder of ``frame`` (``folder``), or per run of its folders (``run``)."""
    if level == "folder":
        return [Row(frame, f) for f in frame.folders]
    return [Row(frame, f, r) for f in frame.folders for r in f.runs]


def table(level: str, frame: Frame) -> tuple[list[str], list[list[str]]]:
    """``(header, body)`` of a table of ``frame``'s view: each figure's heading and text."""
    figures = selected(level, frame)
    return ([f.heading(frame) for f in figures],
            [[f.text(row, f.value(row)) for f in figures] for row in rows(level, frame)])


def records(level: str, report: Report) -> tuple[list[str], list[dict[str, Any]]]:
    """``(columns, rows)`` for CSV: every CSV figure of ``level`` by name, its value unformatted."""
    frame = Frame(report, tuple(report.folders), CSV)
    figures = selected(level, frame)
    return [f.name for f in figures], [{f.name: f.value(row) for f in figures} for row in rows(level, frame)]

