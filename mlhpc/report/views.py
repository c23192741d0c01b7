"""What a report shows, as plain data: its tables, the notes under them, its CSV records.

Two levels: ``folders`` (one row per result folder: the MLCommons results table, systems x
benchmarks for strong scaling, models/min for weak scaling) and ``runs`` (one row per run: the
phases of time to train). Every column, heading and cell comes from the table of figures
(`mlhpc.report.figures.FIGURES`): a table shows the figures of its view (`WIDE` with
``--wide``, else `COMPACT`), the wide folder level one systems x benchmarks table per `MATRIX`
figure, CSV every figure of its level. The titles and notes come from `mlhpc.report.notes`;
`mlhpc.report.render` lays the result out as rich tables, Markdown, CSV or JSON.

The compact views hold the columns a person reads first and fit a 100-column terminal: one
table per mlhpc run folder (titled with the folder, benchmark, olympic mean and RCP verdict),
and for result folders one row per folder, sorted by benchmark and system (instead of the wide
systems x benchmarks tables).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mlhpc.errors import ConfigError
from mlhpc.report.figures import BY_NAME, COMPACT, CSV, FIGURES, MATRIX, WIDE, Figure, Frame, Row
from mlhpc.report.notes import notes, titles
from mlhpc.report.score import FolderResult, Report

LEVELS = ("auto", "folders", "runs")


@dataclass(frozen=True)
class View:
    """One table: its title, header and rows of cell text."""

    title: str
    header: list[str]
    body: list[list[str]]


@dataclass(frozen=True)
class Shown:
    """What `shown` selected from a report: the tables and notes (``tables``, ``notes``), or the
    CSV's columns and rows (``columns``, ``records``: values unformatted)."""

    level: str
    tables: list[View] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class _Table:
    """A table to fill: its kind (`mlhpc.report.notes.titles`), what it shows, and for a
    systems x benchmarks table the figure of its cells."""

    kind: str
    frame: Frame
    level: str = "folder"
    figure: Figure | None = None


def resolve_level(report: Report, level: str) -> str:
    """``auto`` -> ``runs`` when every folder is an mlhpc run folder, else ``folders``.

    Raises:
        ConfigError: an unknown level.
    """
    if level not in LEVELS:
        raise ConfigError(f"--level {level}: expected one of {', '.join(LEVELS)}")
    if level != "auto":
        return level
    return "runs" if report.folders and all(f.kind == "runs" for f in report.folders) else "folders"


def system_key(f: FolderResult) -> tuple[str, str, str, str, str]:
    """Round, submitter, system folder, division (and the folder itself for mlhpc run folders):
    names inside the logs never merge two result folders."""
    return (f.round or "", f.submitter or "", f.system or "", f.division or "",
            f.path if f.kind == "runs" else "")


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
            [[f.cell(row) for f in figures] for row in rows(level, frame)])


def records(level: str, report: Report) -> tuple[list[str], list[dict[str, Any]]]:
    """``(columns, rows)`` for CSV: every CSV figure of ``level`` by name, its value unformatted."""
    frame = Frame(report, tuple(report.folders), CSV)
    figures = selected(level, frame)
    return [f.name for f in figures], [{f.name: f.value(row) for f in figures} for row in rows(level, frame)]


def _value(name: str, row: Row) -> Any:
    return BY_NAME[("folder", name)].value(row)


def matrix(frame: Frame, figure: Figure) -> tuple[list[str], list[list[str]]]:
    """``(header, body)`` of a systems x benchmarks table: a row per system (`system_key`), a
    column per benchmark, each cell the text of ``figure`` for the folder there."""
    benches = sorted({f.benchmark or "?" for f in frame.folders})
    systems: dict[tuple[str, ...], dict[str, FolderResult]] = {}
    for f in frame.folders:
        systems.setdefault(system_key(f), {})[f.benchmark or "?"] = f
    multi_round = len({k[0] for k in systems}) > 1
    header = (["round"] if multi_round else []) + ["submitter", "system", "division", "nodes x accelerators"] + benches
    body = []
    for key in sorted(systems):
        cells = systems[key]
        first = Row(frame, next(iter(cells.values())))
        system = _value("folder_name", first) if first.folder.kind == "runs" else key[2]
        row = ([key[0]] if multi_round else []) + [key[1], system, key[3] or "?", _value("nodes_x_accelerators", first)]
        row += [figure.cell(Row(frame, cells[b])) if b in cells else "" for b in benches]
        body.append(row)
    return header, body


def _tables(report: Report, level: str, wide: bool) -> list[_Table]:
    """The tables a report shows at ``level``: one per mlhpc run folder (``runs``); else one per
    scaling, a row per folder (compact), or one systems x benchmarks table per `MATRIX`
    figure with a value (``wide``)."""
    view = WIDE if wide else COMPACT
    if level == "runs":
        return [_Table("runs", Frame(report, (f,), view), "run") for f in report.folders]
    strong = tuple(f for f in report.folders if f.kind in ("strong", "runs"))
    weak = tuple(f for f in report.folders if f.kind == "weak")
    if not wide:
        return [_Table(kind, Frame(report, tuple(sorted(folders, key=lambda f: (f.benchmark or "?", system_key(f)))),
                                   COMPACT, kind)) for kind, folders in (("strong", strong), ("weak", weak)) if folders]
    score, energy, flops = (BY_NAME[("folder", name)] for name in ("score", "energy_olympic_j_with_cost", "valid_flops_per_s"))
    out = [_Table(kind, Frame(report, folders, MATRIX, kind), figure=score)
           for kind, folders in (("strong", strong), ("weak", weak)) if folders]
    if strong or weak:
        out.append(_Table("energy", Frame(report, strong + weak, MATRIX), figure=energy))
    if any(f.valid_flops_per_s is not None for f in strong + weak):
        out.append(_Table("valid_flops", Frame(report, strong + weak, MATRIX), figure=flops))
    return out


def shown(report: Report, level: str = "auto", wide: bool = True, fmt: str = "table") -> Shown:
    """What ``report`` shows in ``fmt`` at ``level``: for CSV every CSV figure of the level, by
    name; else the tables of `WIDE` (``wide``, and Markdown) or `COMPACT` figures, titled, with
    the notes under them.

    Raises:
        ConfigError: an unknown level.
    """
    if fmt == "json":  # the report's own dict (`mlhpc.report.render.to_json`)
        return Shown(level)
    level = resolve_level(report, level)
    if fmt == "csv":
        columns, found = records("run" if level == "runs" else "folder", report)
        return Shown(level, columns=columns, records=found)
    spec = _tables(report, level, wide)
    bodies = [matrix(t.frame, t.figure) if t.figure is not None else table(t.level, t.frame) for t in spec]
    named = titles(report, [(t.kind, t.frame.folders) for t in spec])
    return Shown(level, tables=[View(title, *body) for title, body in zip(named, bodies)], notes=notes(report))
