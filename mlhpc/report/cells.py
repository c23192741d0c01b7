"""The text of the report's cells: numbers with their units, scores with their verdicts, names.

Each function returns ``str`` (``"-"`` for a missing value) or a plain value a cell needs (a
cost, a unit), and never prints. The table of figures (`mlhpc.report.figures`) says which cell
shows what; the notes (`mlhpc.report.notes`) and the AutoML report read numbers the same way.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable

from mlhpc.log.facts import RunSummary
from mlhpc.report.reported import ReportedRun
from mlhpc.report.score import FolderResult, Report
from mlhpc.report.validflops import exponent_of


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
