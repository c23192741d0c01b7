"""The report's figures as data.

`FIGURES` holds one `Figure` per figure of the report: its name with its unit (the CSV
column), its level (a run or a result folder), where its value comes from, where the report's
JSON holds the same value, how a table shows it, which views show it and where. Every view
selects from it (`mlhpc.report.views`): the terminal tables (every column with ``--wide``, the
compact default), the systems x benchmarks tables of the wide folder level (`MATRIX`),
Markdown (the wide tables), CSV (every figure of its level); JSON is the report's own dict
(`mlhpc.report.score.Report.to_dict`). Rules as data, as mlperf_logging keeps its compliance
rules (``compliance_checker/*/*.yaml``).

Adding a figure is one row of `FIGURES` plus the function that computes its value; the text of
its cells comes from `mlhpc.report.cells`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from mlhpc.report.cells import (any_energy, any_valid_flops, cost, energy, energy_cell, energy_unit, epoch_unit,
                                flops_text, fmt, folder_name, folder_nodes, node_energy, priced, resumed_cell, scale,
                                staging_cell, strong_cell, valid_flops_header, weak_cell)
from mlhpc.report.reported import ReportedRun
from mlhpc.report.score import FolderResult, Report
from mlhpc.report.validflops import exponent_of

WIDE, COMPACT, CSV = "wide", "compact", "csv"  # the views; Markdown shows the wide tables
MATRIX = "matrix"  # the wide folder level: systems x benchmarks, one table per figure shown so
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

    def cell(self, row: Row) -> str:
        """The text of this figure's cell in ``row``."""
        return self.text(row, self.value(row))


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
            text=lambda row, value: flops_text(value), views=ALL - {WIDE} | {MATRIX}, column=80,
            shown=lambda frame: any(f.valid_flops_per_s is not None for f in frame.folders)),
    _folder("valid_flops_per_w"),
    _folder("valid_flops_exponent", lambda f: exponent_of(f.runs)),
    # the compact folder tables' own columns
    _folder("folder_name", lambda f: folder_name(f), label="system", views=frozenset({COMPACT}), column=20,
            text=lambda row, value: (f"{row.folder.round} {value}" if row.folder.round and len(
                {f.round for f in row.frame.folders}) > 1 else value)),
    _folder("nodes_x_accelerators", lambda f: scale(f), label="nodes x accelerators", views=frozenset({COMPACT}),
            column=40, text=lambda row, value: value),
    _folder("score", lambda f: f.models_per_min if f.kind == "weak" else f.olympic_min, views=frozenset({COMPACT, MATRIX}),
            label=lambda frame: "models/min (models x accelerators)" if frame.scaling == "weak" else "minutes (RCP)",
            text=lambda row, value: (weak_cell if row.frame.scaling == "weak" else strong_cell)(row.folder), column=50),
    # the energy table of the wide folder level: olympic-mean kWh with the cost to train
    _folder("energy_olympic_j_with_cost", lambda f: f.energy_olympic_j, views=frozenset({MATRIX}),
            text=lambda row, value: energy_cell(row.frame.report, row.folder)),
)
FIGURES: tuple[Figure, ...] = _RUN_FIGURES + _FOLDER_FIGURES
#: The figures by level and name (`mlhpc.report.views` reads the systems x benchmarks tables' cells here).
BY_NAME: dict[tuple[str, str], Figure] = {(f.level, f.name): f for f in FIGURES}
