"""A `Report` as rich tables, JSON, CSV or Markdown.

Two levels: ``folders`` (one row per result folder: the MLCommons results table, systems x
benchmarks for strong scaling, models/min for weak scaling) and ``runs`` (one row per run: the
phases of time to train). The columns, their headings and the text of each cell come from the
table of figures (`mlhpc.report.figures`): a table shows every column of its view (``wide``),
or the compact view (the default), fitted to a width (`fit_widths`); Markdown shows the wide
tables and CSV every figure of its level. The titles and notes come from
`mlhpc.report.notes`. Rendering functions return text or rich renderables; they never print.

The compact views hold the columns a person reads first and fit a 100-column terminal: one
table per mlhpc run folder (titled with the folder, benchmark, olympic mean and RCP verdict),
and for result folders one row per folder, sorted by benchmark and system (instead of the wide
systems x benchmarks matrix).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable
from typing import Any

from rich.cells import cell_len
from rich.console import Group
from rich.table import Table

from mlhpc.errors import ConfigError
from mlhpc.report.figures import (COMPACT, WIDE, Frame, energy_cell, flops_text, folder_name, priced, records, scale,
                                  strong_cell, table, valid_flops_header, weak_cell)
from mlhpc.report.notes import STRONG_TITLE, WEAK_TITLE, notes, run_view_title
from mlhpc.report.score import FolderResult, Report
from mlhpc.text import cell, console, joined, styled

FORMATS = ("table", "json", "csv", "markdown")
LEVELS = ("auto", "folders", "runs")

View = tuple[str, list[str], list[list[str]]]


def resolve_level(report: Report, level: str) -> str:
    """``auto`` -> ``runs`` when every folder is an mlhpc run folder, else ``folders``."""
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


def _views(report: Report, level: str, wide: bool = True) -> list[View]:
    """``(title, header, rows)`` per table: every column (``wide``), else the compact views
    that fit 100 columns."""
    level = resolve_level(report, level)
    view = WIDE if wide else COMPACT
    if level == "runs":
        return [(run_view_title(f), *table("run", Frame(report, (f,), view))) for f in report.folders]
    if not wide:
        return _compact_folders(report)
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


def _compact_folders(report: Report) -> list[View]:
    """One compact table per scaling (strong and mlhpc run folders, then weak): a row per
    folder, sorted by benchmark and system."""
    views = []
    for kinds, title, scaling in ((("strong", "runs"), STRONG_TITLE, "strong"), (("weak",), WEAK_TITLE, "weak")):
        folders = sorted((f for f in report.folders if f.kind in kinds),
                         key=lambda f: (f.benchmark or "?", system_key(f)))
        if folders:
            views.append((title, *table("folder", Frame(report, tuple(folders), COMPACT, scaling))))
    return views


def tables(report: Report, level: str = "auto", wide: bool = True, width: int = 100) -> Group:
    """The report as rich tables (and notes), for a console to print: every column at its
    natural width (``wide``), or the compact views fitted to ``width`` columns
    (`fit_widths`: no column narrower than its longest word, names kept on
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
    """CSV with a header row: every CSV figure (`mlhpc.report.figures.FIGURES`) of a folder, or
    of a run, one row each."""
    columns, rows = records("run" if resolve_level(report, level) == "runs" else "folder", report)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: csv_cell(v) for k, v in row.items()})
    return buffer.getvalue()


def csv_cell(value: Any) -> Any:
    """A CSV cell: empty for None, a float at full precision (``repr``), a dict as a JSON object,
    anything else as is."""
    if isinstance(value, dict):
        return json.dumps(value)
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


#: A cell up to this many columns stays on one line (``not staged``, ``82944 x 4``).
SHORT = 12


def _least(text: str) -> int:
    """The narrowest a cell may be: whole when short (`SHORT`), else its longest word."""
    if cell_len(text) <= SHORT:
        return cell_len(text)
    return max((cell_len(word) for word in text.split()), default=0)


def _lines(text: str) -> int:
    return max((cell_len(line) for line in text.splitlines()), default=0)


def fit_widths(header: list[str], body: list[list[str]], width: int, whole: set[int]) -> list[int] | None:
    """Content widths (padding and borders excluded) for a rich table of ``header`` and ``body``
    to be at most ``width`` columns wide, or None when even the narrowest layout is wider.

    A column is never narrower than its longest word (so no number is folded or cut short) nor
    than its longest cell of at most `SHORT` columns (a header may wrap), and the columns in ``whole`` never narrower than their longest cell (a name kept on one line).
    Width beyond the minimums goes to the columns in proportion to the width their longest lines
    would take, up to that. Widths are terminal cells (`rich.cells.cell_len`).
    """
    columns = list(zip(header, *body))
    longest = [max(_lines(text) for text in col) for col in columns]
    least = [max([_least(text) for text in col[1:]] + [_least(col[0] + " " * SHORT)]) for col in columns]
    least = [longest[i] if i in whole else least[i] for i in range(len(columns))]
    space_chars = width - (3 * len(columns) + 1)  # a border and two padding cells per column, one border more
    if sum(least) > space_chars:
        return None
    if sum(longest) <= space_chars:
        return longest
    extra, want = space_chars - sum(least), [b - a for a, b in zip(least, longest)]
    widths = [a + extra * w // sum(want) for a, w in zip(least, want)]
    # the spare cells go first to the column furthest below its longest line
    for i in sorted(range(len(widths)), key=lambda i: widths[i] - longest[i]):
        if sum(widths) < space_chars and widths[i] < longest[i]:
            widths[i] += 1
    return widths
