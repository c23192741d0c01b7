"""A `Report` as rich tables, JSON, CSV or Markdown.

Two views: ``folders`` (one row per result folder: the MLCommons results table, systems x
benchmarks for strong scaling, models/min for weak scaling) and ``runs`` (one row per run: the
phases of time to train). Tables show every column (``wide``) or the compact views of
`mlhpc.report.compact`, fitted to a width; Markdown and CSV always hold every column. The text of
each cell comes from `mlhpc.report.cells`. Rendering functions return text or rich renderables;
they never print.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable
from typing import Any

from rich.console import Group
from rich.table import Table

from mlhpc.errors import ConfigError
from mlhpc.report.cells import (
    NO_POWER_COUNTER,
    STRONG_TITLE,
    WEAK_TITLE,
    any_energy,
    any_valid_flops,
    convergence_text,
    emulation_notes,
    cost,
    energy,
    energy_cell,
    energy_unit,
    epoch_unit,
    fmt,
    folder_name,
    flops_text,
    folder_nodes,
    node_energy,
    priced,
    resumed_cell,
    run_view_title,
    scale,
    staging_cell,
    strong_cell,
    system_key,
    valid_flops_header,
    valid_flops_notes,
    weak_cell,
)
from mlhpc.report.compact import compact_views, fit_widths
from mlhpc.report.energy import POWER_NOTE_PREFIX
from mlhpc.log.summary import RunSummary
from mlhpc.report.score import FolderResult, Report
from mlhpc.report.validflops import exponent_of
from mlhpc.text import cell, console, joined, styled

FORMATS = ("table", "json", "csv", "markdown")
LEVELS = ("auto", "folders", "runs")

FOLDER_COLUMNS = ("round", "submitter", "system", "division", "mode", "benchmark", "n_files", "dropped",
                  "resumed", "scaling_factor", "olympic_min", "ttta_min", "number_of_models", "models_per_min",
                  "instance_scale", "global_batch_size", "compliance", "rcp_pass", "rcp_message",
                  "rcp_normalization", "normalized_min", "convergence_unit", "mean_epochs",
                  "rcp_mean_epochs", "rcp_min_epochs", "energy_olympic_j", "cost_to_train", "notes",
                  "valid_flops_per_s", "valid_flops_per_w", "valid_flops_exponent")
RUN_COLUMNS = ("folder", "file", "benchmark", "status", "compliant", "resumed", "time_to_train_s",
               "energy_to_train_j", "mean_power_w", "mean_epoch_energy_j", "cost_to_train", "staging_s", "init_s", "epochs", "epochs_to_target", "mean_epoch_s", "samples_per_s",
               "eval_s", "residual_s", "nodes", "accelerators_per_node", "global_batch_size",
               "metric", "start_metric", "final_metric", "target", "malformed_lines", "power_note",
               "train_flops_per_sample", "samples_trained", "valid_flops_per_s", "valid_flops_per_w",
               "valid_flops_exponent", "flops_source", "valid_flops_note", "accelerator_utilization")


def folder_rows(report: Report) -> list[dict[str, Any]]:
    """One dict per result folder, keys `FOLDER_COLUMNS` (scores in minutes, as MLCommons).

    ``olympic_min`` is the score as published (times a committed ``scaling.json``, as
    result_summarizer reads it); ``rcp_pass``/``rcp_message``/``rcp_normalization`` are
    rcp_checker's verdict; ``normalized_min`` is the olympic mean times that factor.
    """
    rows = []
    for f in report.folders:
        rcp = f.rcp
        gbs = (rcp.global_batch_size if rcp and rcp.global_batch_size else None) or next(
            (r.global_batch_size for r in f.runs if r.global_batch_size), None)
        rows.append({
            "round": f.round, "submitter": f.submitter, "system": f.system, "division": f.division,
            "mode": f.kind, "benchmark": f.benchmark, "n_files": f.n_files,
            "dropped": len(f.dropped), "resumed": len(f.resumed), "scaling_factor": f.scaling_factor,
            "olympic_min": f.olympic_min, "ttta_min": f.ttta_min,
            "number_of_models": f.number_of_models, "models_per_min": f.models_per_min,
            "instance_scale": f.instance_scale, "global_batch_size": gbs,
            "compliance": f.ruleset_note or (f"hpc {f.ruleset}" if report.compliance_checked else "not checked"),
            "rcp_pass": rcp.passed if rcp else None, "rcp_message": rcp.message if rcp else None,
            "rcp_normalization": rcp.normalization if rcp and rcp.passed is not None else None,
            "normalized_min": f.normalized_min, "convergence_unit": epoch_unit(f),
            "mean_epochs": rcp.mean_epochs if rcp else None,
            "rcp_mean_epochs": rcp.rcp_mean_epochs if rcp else None,
            "rcp_min_epochs": rcp.rcp_min_epochs if rcp else None,
            "energy_olympic_j": f.energy_olympic_j,
            "cost_to_train": cost(report, folder_nodes(f), f.olympic_min, f.energy_olympic_j),
            "notes": "; ".join(f.notes + [f"{k.rsplit('/', 1)[-1]}: {v}" for k, v in f.dropped.items()]),
            "valid_flops_per_s": f.valid_flops_per_s, "valid_flops_per_w": f.valid_flops_per_w,
            "valid_flops_exponent": exponent_of(f.runs),
        })
    return rows


def run_rows(report: Report) -> list[dict[str, Any]]:
    """One dict per run, keys `RUN_COLUMNS` (times in seconds)."""
    rows = []
    for f in report.folders:
        for r in f.runs:
            rows.append({
                "folder": f.path, "file": r.path.rsplit("/", 1)[-1], "benchmark": r.benchmark,
                "status": r.status, "compliant": r.compliant, "resumed": r.resumed,
                "time_to_train_s": r.time_to_train_s, "energy_to_train_j": r.energy_to_train_j,
                "mean_power_w": r.mean_power_w, "mean_epoch_energy_j": r.mean_epoch_energy_j,
                "cost_to_train": cost(report, r.number_of_nodes, r.time_to_train_min, r.energy_to_train_j),
                "staging_s": r.staging_s, "init_s": r.init_s,
                "epochs": r.n_epochs, "epochs_to_target": r.epochs_to_target,
                "mean_epoch_s": r.mean_epoch_s, "samples_per_s": r.samples_per_s,
                "eval_s": r.total_eval_s if r.eval_s else None, "residual_s": r.residual_s,
                "nodes": r.number_of_nodes, "accelerators_per_node": r.accelerators_per_node,
                "global_batch_size": r.global_batch_size, "metric": r.metric_key,
                "start_metric": r.start_metric,  # the starting point's evaluation (epoch_num 0)
                "final_metric": r.metric_series[-1][1] if r.metric_series else None,
                "target": r.target, "malformed_lines": len(r.malformed), "power_note": r.power_note,
                **_valid_flops_fields(r),
                "accelerator_utilization": r.accelerator_utilization,  # storage mode only
            })
    return rows


def _valid_flops_fields(run: RunSummary) -> dict[str, Any]:
    """The run's Valid FLOPS columns (`mlhpc.report.validflops.ValidFlops`)."""
    v = run.valid_flops
    return {"train_flops_per_sample": v and v.train_flops_per_sample, "samples_trained": v and v.samples_trained,
            "valid_flops_per_s": v and v.valid_flops_per_s, "valid_flops_per_w": v and v.valid_flops_per_w,
            "valid_flops_exponent": v and v.exponent, "flops_source": v and v.flops_source,
            "valid_flops_note": v and v.note}


def resolve_level(report: Report, level: str) -> str:
    """``auto`` -> ``runs`` when every folder is an mlhpc run folder, else ``folders``."""
    if level not in LEVELS:
        raise ConfigError(f"--level {level}: expected one of {', '.join(LEVELS)}")
    if level != "auto":
        return level
    return "runs" if report.folders and all(f.kind == "runs" for f in report.folders) else "folders"


def _benchmarks(folders: Iterable[FolderResult]) -> list[str]:
    return sorted({f.benchmark or "?" for f in folders})


def _matrix(folders: list[FolderResult], cell) -> tuple[list[str], list[list[str]]]:  # type: ignore[no-untyped-def]
    benches = _benchmarks(folders)
    systems: dict[tuple[str, ...], dict[str, FolderResult]] = {}
    for f in folders:
        systems.setdefault(system_key(f), {})[f.benchmark or "?"] = f
    multi_round = len({k[0] for k in systems}) > 1
    header = (["round"] if multi_round else []) + ["submitter", "system", "division", "nodes x accelerators"] + benches
    body = []
    for key in sorted(systems):
        cells = systems[key]
        any_f = next(iter(cells.values()))
        system = folder_name(any_f) if any_f.kind == "runs" else key[2]
        row = ([key[0]] if multi_round else []) + [key[1], system, key[3] or "?", scale(any_f)]
        row += [cell(cells[b]) if b in cells else "" for b in benches]
        body.append(row)
    return header, body


def _run_table_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """Every column of the runs view: energy, mean power, energy per node and per epoch are
    shown (``-`` where unmeasured) even when no run has power readings."""
    unit = next((r.epoch_unit for f in report.folders for r in f.runs), "epochs")
    runs = [r for f in report.folders for r in f.runs]  # the order of run_rows
    eunit, per = energy_unit(r.energy_to_train_j for r in runs)
    header = ["run", "status", "compliant", "time to train s", f"energy {eunit}", "mean power W",
              f"energy per node {eunit}", "staging s", "init s", "epochs", f"{unit} to target",
              "mean epoch s", f"epoch energy {eunit}", "samples/s", valid_flops_header(runs), "valid FLOP/s per W",
              "eval s", "residual s", "resumed"]
    header += ["cost"] if priced(report) else []
    body = []
    for row, run in zip(run_rows(report), runs):
        body.append([row["file"], row["status"], fmt(row["compliant"]), fmt(row["time_to_train_s"]),
                     energy(row["energy_to_train_j"], per), fmt(row["mean_power_w"], 1),
                     node_energy(run, per), staging_cell(run), fmt(row["init_s"]), fmt(row["epochs"]),
                     fmt(row["epochs_to_target"], 0), fmt(row["mean_epoch_s"]),
                     energy(row["mean_epoch_energy_j"], per), fmt(row["samples_per_s"], 1),
                     flops_text(row["valid_flops_per_s"]), flops_text(row["valid_flops_per_w"]), fmt(row["eval_s"]), fmt(row["residual_s"]), resumed_cell(run)]
                    + ([fmt(row["cost_to_train"])] if priced(report) else []))
    return header, body


def _views(report: Report, level: str, wide: bool = True) -> list[tuple[str, list[str], list[list[str]]]]:
    """``(title, header, rows)`` per table: every column (``wide``), else the compact views of
    `mlhpc.report.compact` that fit 100 columns."""
    level = resolve_level(report, level)
    if not wide:
        return compact_views(report, level)
    if level == "runs":
        return [(run_view_title(f), *_run_table_rows(Report([f], report.compliance_checked,
                                                            price_per_node_hour=report.price_per_node_hour,
                                                            price_per_kwh=report.price_per_kwh)))
                for f in report.folders]
    views = []
    strong = [f for f in report.folders if f.kind in ("strong", "runs")]
    weak = [f for f in report.folders if f.kind == "weak"]
    if strong:
        views.append((STRONG_TITLE, *_matrix(strong, strong_cell)))
    if weak:
        views.append((WEAK_TITLE, *_matrix(weak, weak_cell)))
    if strong or weak:
        header, body = _matrix(strong + weak, lambda f: energy_cell(report, f))
        views.append(("Energy to train, kWh: olympic mean as result_summarizer scores power (- : no power "
                      "readings)" + ("; cost to train" if priced(report) else ""), header, body))
    if any(f.valid_flops_per_s is not None for f in strong + weak):
        header, body = _matrix(strong + weak, lambda f: flops_text(f.valid_flops_per_s))
        views.append((f"{valid_flops_header(r for f in report.folders for r in f.runs)}, HPC AI500: mean over "
                      "each folder's runs, a system figure, not an MLPerf score (- : FLOPs per sample not known)",
                      header, body))
    return views


def notes(report: Report) -> list[str]:
    """The notes under the tables: each folder's notes, RCP verdicts, compliance, dropped runs,
    malformed lines; one ``no power counter`` line (`NO_POWER_COUNTER`) when no run has power
    readings, in place of each folder's own."""
    out = []
    no_power = not any_energy(report) and any(f.runs for f in report.folders)
    for f in report.folders:
        where = "/".join(x for x in (f.round, f.submitter, f.system, f.division, f.kind, f.benchmark) if x) or f.path
        if f.kind == "runs" and f.path not in where:
            where = f"{f.path} ({where})"
        out += [f"{where}: {n}" for n in f.notes if not (no_power and n.startswith(POWER_NOTE_PREFIX))]
        if f.kind != "weak" and f.rcp is not None and f.rcp.passed is not None:
            out.append(f"{where}: {convergence_text(f)}")
        if f.ruleset_note:
            out.append(f"{where}: compliance {f.ruleset_note}")
        out += [f"{where}: dropped {p.rsplit('/', 1)[-1]}: {r}" for p, r in f.dropped.items()]
    out += [f"malformed line {m}" for m in report.malformed]
    out += valid_flops_notes(report)
    out += emulation_notes(report)
    if no_power:
        out.append(NO_POWER_COUNTER)
    if not report.compliance_checked:
        out.append("compliance not checked (--no-compliance): scores assume every log complies")
    return out


def tables(report: Report, level: str = "auto", wide: bool = True, width: int = 100) -> Group:
    """The report as rich tables (and notes), for a console to print: every column at its
    natural width (``wide``), or the compact views fitted to ``width`` columns
    (`mlhpc.report.compact.fit_widths`: no column narrower than its longest word, names kept on
    one line where they fit). No cell is ever cut short with an ellipsis: text wraps at
    spaces, and only where even the narrowest layout is too wide does a word fold."""
    parts: list[Any] = []
    for title, header, body in _views(report, level, wide):
        widths = None
        if not wide:
            names = {i for i, name in enumerate(header) if name in _NAME_COLUMNS}
            widths = fit_widths(header, body, width, names) or fit_widths(header, body, width, set())
        parts.append(_table(title, header, body, wide, widths))
    for note in notes(report):
        parts.append(joined(styled("note", "yellow"), ": ", note))
    return Group(*parts)


_NAME_COLUMNS = ("run", "status", "submitter", "system", "round", "benchmark")


def _table(title: str, header: list[str], body: list[list[str]], wide: bool, widths: list[int] | None) -> Table:
    """A rich table; cells are plain text (never console markup). ``widths``: fixed content
    widths; else natural widths, names on one line when ``wide``."""
    table = Table(title=title, title_justify="left", header_style="bold")
    for i, name in enumerate(header):
        left = name in _NAME_COLUMNS
        table.add_column(name, justify="left" if left else "right", overflow="fold",
                         no_wrap=left and wide and widths is None, width=widths[i] if widths else None)
    for row in body:
        table.add_row(*(cell(value) for value in row))
    return table


def natural_width(group: Group) -> int:
    """Columns ``group`` needs so that no table is squeezed (at least 100)."""
    probe = console(width=100_000, color_system=None, force_terminal=False)
    return max(100, min(100_000, probe.measure(group).maximum))


def to_text(report: Report, level: str = "auto", width: int | None = None, wide: bool = True) -> str:
    """The rich tables as plain text (no colour), ``width`` columns wide (None: as wide as the
    tables need, `natural_width`, for ``wide``; 100 for the compact views)."""
    if width is None and not wide:
        width = 100
    group = tables(report, level, wide, width or 100)
    buffer = io.StringIO()
    console(file=buffer, width=width or natural_width(group), color_system=None,
            force_terminal=False).print(group)
    return buffer.getvalue()


def to_markdown(report: Report, level: str = "auto") -> str:
    """GitHub-flavoured Markdown: one pipe table per view (every column), then the notes."""
    out = []
    for title, header, body in _views(report, level):
        out.append(f"**{title}**\n")
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "|".join("---" if i < 2 else "---:" for i in range(len(header))) + "|")
        for row in body:
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
        out.append("")
    text_notes = notes(report)
    if text_notes:
        out += [f"- {n}" for n in text_notes] + [""]
    return "\n".join(out)


def to_csv(report: Report, level: str = "auto") -> str:
    """CSV with a header row: `FOLDER_COLUMNS` per folder, or `RUN_COLUMNS` per run."""
    level = resolve_level(report, level)
    columns, rows = (RUN_COLUMNS, run_rows(report)) if level == "runs" else (FOLDER_COLUMNS, folder_rows(report))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: csv_cell(v) for k, v in row.items()})
    return buffer.getvalue()


def csv_cell(value: Any) -> Any:
    """A CSV cell: empty for None, a float at full precision (``repr``), anything else as is."""
    return "" if value is None else repr(value) if isinstance(value, float) else value


def finite(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float (in dicts, lists, tuples) made None, for JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def to_json(report: Report) -> str:
    """The whole report (every folder and run, with metric series) as indented JSON; infinite
    or NaN numbers become ``null``."""
    return json.dumps(finite(report.to_dict()), indent=2, default=str, allow_nan=False)


def render(report: Report, fmt: str = "table", level: str = "auto") -> str:
    """The report as text in ``fmt`` (``table``, ``json``, ``csv`` or ``markdown``).

    Raises:
        ConfigError: an unknown format or level.
    """
    if fmt == "table":
        return to_text(report, level)
    if fmt == "json":
        return to_json(report)
    if fmt == "csv":
        return to_csv(report, level)
    if fmt == "markdown":
        return to_markdown(report, level)
    raise ConfigError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
