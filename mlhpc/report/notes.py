"""The text around the report's tables: their titles (`titles`) and the notes under them (`notes`).

The notes say what the figures leave out or how they were made: each folder's notes, RCP
verdicts, compliance, dropped runs, malformed lines, Valid FLOPS (HPC AI500), storage mode's
emulated accelerators, and one ``no power counter`` line when no run has power readings.
Figures read as in the tables (`mlhpc.report.figures`). Functions return ``str`` and never
print.
"""

from __future__ import annotations

from typing import Iterable

from mlhpc.report.energy import POWER_NOTE_PREFIX
from mlhpc.report.cells import any_energy, epoch_unit, fmt, priced, valid_flops_header
from mlhpc.report.score import FolderResult, Report

#: The line the human formats give when no run of a report has power readings.
NO_POWER_COUNTER = ("no power counter: no run has power readings (power/result_N/node_K.txt), "
                    "so no energy to train ('-')")
STRONG_TITLE = ("Strong scaling: time to train, olympic mean in minutes as published (* one run "
                "dropped; raw mean x factor where scaling.json applies one), then rcp_checker's verdict")
WEAK_TITLE = "Weak scaling: throughput, models/min (M models x accelerators each)"
ENERGY_TITLE = ("Energy to train, kWh: olympic mean as result_summarizer scores power (- : no power "
                "readings)")
VALID_FLOPS_TITLE = ("HPC AI500: mean over each folder's runs, a system figure, not an MLPerf score (- : "
                     "FLOPs per sample not known)")


def titles(report: Report, tables: list[tuple[str, tuple[FolderResult, ...]]]) -> list[str]:
    """The title of each table of ``tables``, given as ``(kind, its folders)``: ``runs`` (one
    mlhpc run folder's runs: `run_view_title`), ``strong`` and ``weak`` (scores), ``energy``
    (with the cost to train where prices are given) and ``valid_flops`` (with the penalty's
    exponent of the report's runs)."""
    runs = [r for f in report.folders for r in f.runs]
    fixed = {"strong": STRONG_TITLE, "weak": WEAK_TITLE,
             "energy": ENERGY_TITLE + ("; cost to train" if priced(report) else ""),
             "valid_flops": f"{valid_flops_header(runs)}, {VALID_FLOPS_TITLE}"}
    return [run_view_title(folders[0]) if kind == "runs" else fixed[kind] for kind, folders in tables]


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


def convergence_text(f: FolderResult) -> str:
    """rcp_checker's verdict in words, with the figures it compared and the factor."""
    rcp = f.rcp
    if rcp is None:
        return "RCP: -"
    if rcp.passed is None:
        return f"RCP {rcp.message}"
    unit = epoch_unit(f)
    text = f"RCP {rcp.label}"
    if rcp.mean_epochs is not None and rcp.rcp_mean_epochs is not None:
        text += (f" ({unit} to converge {rcp.mean_epochs:,.2f} vs RCP mean {rcp.rcp_mean_epochs:,.2f},"
                 f" at least {rcp.rcp_min_epochs:,.2f})")
    if rcp.passed:
        text += f"; factor {rcp.normalization:.4f}"
        if f.normalized_min is not None:
            text += f", score with it {f.normalized_min:.3f} min"
    return text


def run_view_title(f: FolderResult) -> str:
    """``folder: benchmark, N runs[, olympic mean][, energy]; RCP verdict`` above a runs table."""
    title = f"{f.path}: {f.benchmark or '?'}, {len(f.runs)} runs"
    if f.olympic_min is not None:
        title += f", olympic mean {f.olympic_min:.3f} min"
    if f.energy_olympic_j is not None:
        title += f", energy {f.energy_olympic_j / 3.6e6:.4f} kWh (olympic mean)"
    return title + f"; {convergence_text(f)}"


def valid_flops_notes(report: Report) -> list[str]:
    """The notes under the tables on Valid FLOPS: what it is and where each run's FLOPs per
    sample came from, then why the runs without one have none (each reason once, counted)."""
    runs = [r for f in report.folders for r in f.runs if r.valid_flops is not None]
    with_figure = [r.valid_flops for r in runs if r.valid_flops.valid_flops_per_s is not None]  # type: ignore[union-attr]
    out = []
    if with_figure:
        n = f"{with_figure[0].exponent:g}"  # type: ignore[union-attr]
        sources = _counted(v.flops_source for v in with_figure)  # type: ignore[union-attr]
        out.append(f"Valid FLOPS (HPC AI500, n={n}): counted training FLOPs per sample x samples trained / "
                   f"time to train x min(1, (achieved/target)^{n}), the ratio inverted for an error; a system "
                   f"figure, not an MLPerf score. FLOPs per sample from {sources}")
    missing = [r.valid_flops.note for r in runs if r.valid_flops.valid_flops_per_s is None]  # type: ignore[union-attr]
    if missing:
        out.append(f"no Valid FLOPS for {len(missing)} run(s): {_counted(missing)}")
    return out


def _counted(items: Iterable[str | None]) -> str:
    """``"a (3 runs); b (1 run)"``: each distinct text with how many runs gave it."""
    counts: dict[str, int] = {}
    for item in items:
        counts[item or "?"] = counts.get(item or "?", 0) + 1
    return "; ".join(f"{text} ({k} run{'s' if k > 1 else ''})" for text, k in counts.items())


def emulation_notes(report: Report) -> list[str]:
    """One note per storage-mode run (`mlhpc.log.emulated`): the emulated accelerator, its
    accelerator utilisation against the workload's minimum, samples/s, and per node when the run
    spans several."""
    out = []
    for f in report.folders:
        for run in f.runs:
            e = run.facts.emulation
            if not e:
                continue
            minimum = e.get("min_accelerator_utilization")
            verdict = ("" if e.get("meets_minimum") is None else
                       f" (minimum {100 * minimum:.0f}%: {'met' if e['meets_minimum'] else 'NOT met'})")
            nodes = e.get("nodes") or []
            per_node = "; per node: " + ", ".join(
                f"node {n['node']} {100 * n['accelerator_utilization']:.1f}% {fmt(n['samples_per_s'], 1)} samples/s"
                for n in nodes) if len(nodes) > 1 else ""
            out.append(f"{run.facts.path.rsplit('/', 1)[-1]}: storage mode, {e.get('ranks')} emulated "
                       f"{e.get('accelerator')} ({1e3 * (e.get('time_per_sample_s') or 0):.3g} ms per sample): "
                       f"accelerator utilization {100 * e['accelerator_utilization']:.1f}%{verdict}, "
                       f"{fmt(e.get('samples_per_s'), 1)} samples/s{per_node}")
    return out
