"""A `Report` as rich tables, JSON, CSV or Markdown.

Two views: ``folders`` (one row per result folder: the MLCommons results table, systems x
benchmarks for strong scaling, models/min for weak scaling) and ``runs`` (one row per run: the
phases of time to train). Rendering functions return text or rich renderables; they never print.
"""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any, Iterable

from rich.console import Console, Group
from rich.table import Table

from mlhpc.errors import ConfigError
from mlhpc.report.runs import RunSummary
from mlhpc.report.score import FolderResult, Report

FORMATS = ("table", "json", "csv", "markdown")
LEVELS = ("auto", "folders", "runs")

FOLDER_COLUMNS = ("round", "submitter", "system", "division", "mode", "benchmark", "n_files", "dropped",
                  "resumed", "scaling_factor", "olympic_min", "ttta_min", "number_of_models", "models_per_min",
                  "instance_scale", "global_batch_size", "compliance", "rcp_pass", "rcp_message",
                  "rcp_normalization", "normalized_min", "convergence_unit", "mean_epochs",
                  "rcp_mean_epochs", "rcp_min_epochs", "energy_olympic_j", "cost_to_train", "notes")
RUN_COLUMNS = ("folder", "file", "benchmark", "status", "compliant", "resumed", "time_to_train_s",
               "energy_to_train_j", "mean_power_w", "mean_epoch_energy_j", "cost_to_train", "staging_s", "init_s", "epochs", "epochs_to_target", "mean_epoch_s", "samples_per_s",
               "eval_s", "residual_s", "nodes", "accelerators_per_node", "global_batch_size",
               "metric", "final_metric", "target", "malformed_lines")


def _unit(f: FolderResult) -> str:
    return next((r.epoch_unit for r in f.runs), "epochs")


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
            "normalized_min": f.normalized_min, "convergence_unit": _unit(f),
            "mean_epochs": rcp.mean_epochs if rcp else None,
            "rcp_mean_epochs": rcp.rcp_mean_epochs if rcp else None,
            "rcp_min_epochs": rcp.rcp_min_epochs if rcp else None,
            "energy_olympic_j": f.energy_olympic_j,
            "cost_to_train": cost(report, _folder_nodes(f), f.olympic_min, f.energy_olympic_j),
            "notes": "; ".join(f.notes + [f"{k.rsplit('/', 1)[-1]}: {v}" for k, v in f.dropped.items()]),
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
                "final_metric": r.metric_series[-1][1] if r.metric_series else None,
                "target": r.target, "malformed_lines": len(r.malformed),
            })
    return rows


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


def _folder_nodes(f: FolderResult) -> int | None:
    nodes = f.system_desc.get("number_of_nodes")
    try:
        return int(nodes) if nodes not in (None, "") else f.nodes
    except (TypeError, ValueError):
        return f.nodes


def _energy_unit(values: Iterable[float | None]) -> tuple[str, float]:
    """``("kWh", 3.6e6)`` when any value reaches 1 kWh, else ``("kJ", 1e3)``."""
    return ("kWh", 3.6e6) if any(v is not None and v >= 3.6e6 for v in values) else ("kJ", 1e3)


def _energy(value: float | None, scale: float) -> str:
    return "-" if value is None else f"{value / scale:,.3f}"


def resolve_level(report: Report, level: str) -> str:
    """``auto`` -> ``runs`` when every folder is an mlhpc run folder, else ``folders``."""
    if level not in LEVELS:
        raise ConfigError(f"--level {level}: expected one of {', '.join(LEVELS)}")
    if level != "auto":
        return level
    return "runs" if report.folders and all(f.kind == "runs" for f in report.folders) else "folders"


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf"
        return f"{value:,.{digits}f}"
    return str(value)


def _benchmarks(folders: Iterable[FolderResult]) -> list[str]:
    return sorted({f.benchmark or "?" for f in folders})


def _system_key(f: FolderResult) -> tuple[str, str, str, str, str]:
    """Round, submitter, system folder, division (and the folder itself for mlhpc run folders):
    names inside the logs never merge two result folders."""
    return (f.round or "", f.submitter or "", f.system or "", f.division or "",
            f.path if f.kind == "runs" else "")


def _matrix(folders: list[FolderResult], cell) -> tuple[list[str], list[list[str]]]:  # type: ignore[no-untyped-def]
    benches = _benchmarks(folders)
    systems: dict[tuple[str, ...], dict[str, FolderResult]] = {}
    for f in folders:
        systems.setdefault(_system_key(f), {})[f.benchmark or "?"] = f
    multi_round = len({k[0] for k in systems}) > 1
    header = (["round"] if multi_round else []) + ["submitter", "system", "division", "nodes x accelerators"] + benches
    body = []
    for key in sorted(systems):
        cells = systems[key]
        any_f = next(iter(cells.values()))
        desc = any_f.system_desc
        if desc.get("number_of_nodes") not in (None, "") and desc.get("accelerators_per_node") not in (None, ""):
            nodes, acc = desc["number_of_nodes"], desc["accelerators_per_node"]
        else:
            nodes = any_f.nodes or "?"
            acc = next((r.accelerators_per_node for r in any_f.runs if r.accelerators_per_node is not None), "?")
        scale = f"{nodes} nodes, CPU only" if any_f.cpu_only else f"{nodes} x {acc}"
        row = ([key[0]] if multi_round else []) + [key[1], key[2], key[3] or "?", scale]
        row += [cell(cells[b]) if b in cells else "" for b in benches]
        body.append(row)
    return header, body


def _rcp_cell(f: FolderResult) -> str:
    rcp = f.rcp
    if rcp is None or rcp.passed is None:
        return "RCP -"
    if not rcp.passed:
        return "RCP FAIL"
    if f.normalized_min is None or rcp.normalization == 1.0:
        return "RCP pass"
    return f"RCP pass, x{rcp.normalization:.3f} = {f.normalized_min:.2f}"


def _strong_cell(f: FolderResult) -> str:
    if f.olympic_min is None:
        score = "invalid" if any(n.startswith("invalid") for n in f.notes) else "-"
    else:
        score = f"{f.olympic_min:.2f}{'*' if f.dropped else ''}"
    return f"{score} ({_rcp_cell(f)})"


def _weak_cell(f: FolderResult) -> str:
    if f.models_per_min is None:
        return "-"
    return f"{f.models_per_min:.3f} ({f.number_of_models} x {f.instance_scale})"


def _run_table_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    unit = next((r.epoch_unit for f in report.folders for r in f.runs), "epochs")
    runs = [r for f in report.folders for r in f.runs]  # the order of run_rows
    eunit, scale = _energy_unit(r.energy_to_train_j for r in runs)
    measured = any(r.energy_to_train_j is not None for r in runs)  # else a note says why not
    priced = report.price_per_node_hour is not None or report.price_per_kwh is not None
    header = ["run", "status", "compliant", "time to train s"]
    header += [f"energy {eunit}", "mean power W"] if measured else []
    header += ["staging s", "init s", "epochs", f"{unit} to target", "mean epoch s"]
    header += [f"epoch energy {eunit}"] if measured else []
    header += ["samples/s", "eval s", "residual s", "resumed"] + (["cost"] if priced else [])
    body = []
    for row, run in zip(run_rows(report), runs):
        power = [_energy(row["energy_to_train_j"], scale), _fmt(row["mean_power_w"], 1)] if measured else []
        body.append([row["file"], row["status"], _fmt(row["compliant"]), _fmt(row["time_to_train_s"])] + power + [
                     _fmt(row["staging_s"]) + _staging_nodes_note(getattr(run, "staging_nodes", None)),
                     _fmt(row["init_s"]), _fmt(row["epochs"]),
                     _fmt(row["epochs_to_target"], 0), _fmt(row["mean_epoch_s"])]
                    + ([_energy(row["mean_epoch_energy_j"], scale)] if measured else []) + [
                     _fmt(row["samples_per_s"], 1), _fmt(row["eval_s"]), _fmt(row["residual_s"]),
                     _resumed_cell(run)] + ([_fmt(row["cost_to_train"])] if priced else []))
    return header, body


def _resumed_cell(run: RunSummary) -> str:
    """``no``, or for a resumed run the timed seconds across all its attempts, labelled as such
    (a resumed run is never scored: the figure is not a time to train)."""
    if not run.resumed:
        return "no"
    if run.earlier_attempts_s is None or run.time_to_train_total_s is None:
        return "yes (earlier attempts not logged)"
    return f"yes: {run.time_to_train_total_s:,.2f} s all attempts, unscored"


def _staging_nodes_note(nodes: dict[str, Any] | None) -> str:
    """`` (N nodes: slowest, mean s, aggregate GB/s, max bytes per node)`` for a run whose
    ``staging_stop`` carries mlhpc's per-node figures (`RunSummary.staging_nodes`); empty otherwise."""
    if not nodes or not nodes.get("nodes"):
        return ""
    per_node = nodes.get("node_staged_bytes") or [0]
    return (f" ({nodes['nodes']} nodes: slowest {_fmt(nodes.get('slowest_node_s'))}, mean "
            f"{_fmt(nodes.get('mean_node_s'))}, {_fmt(nodes.get('aggregate_gb_per_s'))} GB/s, "
            f"<= {max(per_node) / 1e9:.3g} GB/node)")


def _convergence_text(f: FolderResult) -> str:
    """rcp_checker's verdict in words, with the figures it compared and the factor."""
    rcp = f.rcp
    if rcp is None:
        return "RCP: -"
    if rcp.passed is None:
        return f"RCP {rcp.message}"
    unit = _unit(f)
    text = f"RCP {rcp.label}"
    if rcp.mean_epochs is not None and rcp.rcp_mean_epochs is not None:
        text += (f" ({unit} to converge {rcp.mean_epochs:,.2f} vs RCP mean {rcp.rcp_mean_epochs:,.2f},"
                 f" at least {rcp.rcp_min_epochs:,.2f})")
    if rcp.passed:
        text += f"; factor {rcp.normalization:.4f}"
        if f.normalized_min is not None:
            text += f", score with it {f.normalized_min:.3f} min"
    return text


def _views(report: Report, level: str) -> list[tuple[str, list[str], list[list[str]]]]:
    level = resolve_level(report, level)
    views = []
    if level == "runs":
        for f in report.folders:
            sub = Report([f], report.compliance_checked)
            header, body = _run_table_rows(sub)
            title = f"{f.path}: {f.benchmark or '?'}, {len(f.runs)} runs"
            if f.olympic_min is not None:
                title += f", olympic mean {f.olympic_min:.3f} min"
            if f.energy_olympic_j is not None:
                title += f", energy {f.energy_olympic_j / 3.6e6:.4f} kWh (olympic mean)"
            title += f"; {_convergence_text(f)}"
            views.append((title, header, body))
        return views
    strong = [f for f in report.folders if f.kind in ("strong", "runs")]
    weak = [f for f in report.folders if f.kind == "weak"]
    if strong:
        header, body = _matrix(strong, _strong_cell)
        views.append(("Strong scaling: time to train, olympic mean in minutes as published (* one run "
                      "dropped), then rcp_checker's verdict, its normalisation factor and the score with it",
                      header, body))
    if weak:
        header, body = _matrix(weak, _weak_cell)
        views.append(("Weak scaling: throughput, models/min (M models x accelerators each)", header, body))
    if strong or weak:
        header, body = _matrix(strong + weak, lambda f: _energy_cell(report, f))
        views.append(("Energy to train, kWh: olympic mean as result_summarizer scores power (- : no power "
                      "readings)" + ("; cost to train" if report.price_per_node_hour is not None
                                     or report.price_per_kwh is not None else ""), header, body))
    return views


def _energy_cell(report: Report, f: FolderResult) -> str:
    text = _energy(f.energy_olympic_j, 3.6e6)
    price = cost(report, _folder_nodes(f), f.olympic_min if f.kind != "weak" else None, f.energy_olympic_j)
    return text if price is None else f"{text} (cost {price:,.2f})"


def _notes(report: Report) -> list[str]:
    notes = []
    for f in report.folders:
        where = "/".join(x for x in (f.round, f.submitter, f.system, f.division, f.kind, f.benchmark) if x) or f.path
        notes += [f"{where}: {n}" for n in f.notes]
        if f.kind != "weak" and f.rcp is not None and f.rcp.passed is not None:
            notes.append(f"{where}: {_convergence_text(f)}")
        if f.ruleset_note:
            notes.append(f"{where}: compliance {f.ruleset_note}")
        notes += [f"{where}: dropped {p.rsplit('/', 1)[-1]}: {r}" for p, r in f.dropped.items()]
    notes += [f"malformed line {m}" for m in report.malformed]
    if not report.compliance_checked:
        notes.append("compliance not checked (--no-compliance): scores assume every log complies")
    return notes


def tables(report: Report, level: str = "auto") -> Group:
    """The report as rich tables (and notes), for a console to print."""
    parts: list[Any] = []
    for title, header, body in _views(report, level):
        table = Table(title=title, title_justify="left", header_style="bold")
        for i, name in enumerate(header):
            left = name in ("run", "status", "submitter", "system", "round")
            table.add_column(name, justify="left" if left else "right", no_wrap=left)
        for row in body:
            table.add_row(*row)
        parts.append(table)
    for note in _notes(report):
        parts.append(f"[yellow]note[/]: {note}")
    return Group(*parts)


def to_text(report: Report, level: str = "auto", width: int = 200) -> str:
    """The rich tables as plain text (no colour), ``width`` columns wide."""
    buffer = io.StringIO()
    Console(file=buffer, width=width, color_system=None, force_terminal=False).print(tables(report, level))
    return buffer.getvalue()


def to_markdown(report: Report, level: str = "auto") -> str:
    """GitHub-flavoured Markdown: one pipe table per view, then the notes as a list."""
    out = []
    for title, header, body in _views(report, level):
        out.append(f"**{title}**\n")
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "|".join("---" if i < 2 else "---:" for i in range(len(header))) + "|")
        for row in body:
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
        out.append("")
    notes = _notes(report)
    if notes:
        out += [f"- {n}" for n in notes] + [""]
    return "\n".join(out)


def to_csv(report: Report, level: str = "auto") -> str:
    """CSV with a header row: `FOLDER_COLUMNS` per folder, or `RUN_COLUMNS` per run."""
    level = resolve_level(report, level)
    columns, rows = (RUN_COLUMNS, run_rows(report)) if level == "runs" else (FOLDER_COLUMNS, folder_rows(report))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else repr(v) if isinstance(v, float) else v) for k, v in row.items()})
    return buffer.getvalue()


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def to_json(report: Report) -> str:
    """The whole report (every folder and run, with metric series) as indented JSON; infinite
    or NaN numbers become ``null``."""
    return json.dumps(_finite(report.to_dict()), indent=2, default=str, allow_nan=False)


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
