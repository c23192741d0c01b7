"""A report as rich tables, JSON, CSV or Markdown.

What is shown comes from `mlhpc.report.views.shown` (tables, titles, notes, CSV records, all
from the table of figures); this module lays it out: rich tables of every column at their
natural width (``wide``) or the compact views fitted to a width (`fit_widths`), Markdown (the
wide tables), CSV, and JSON (the report's own dict, `mlhpc.report.score.Report.to_dict`).
Rendering functions return text or rich renderables; they never print.
"""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any

from rich.cells import cell_len
from rich.console import Group
from rich.table import Table

from mlhpc.errors import ConfigError
from mlhpc.report.score import Report
from mlhpc.report.views import LEVELS, Shown, shown
from mlhpc.text import cell, console, joined, styled

FORMATS = ("table", "json", "csv", "markdown")
__all__ = ["FORMATS", "LEVELS", "fit_widths", "natural_width", "output", "render", "tables", "to_csv",
           "to_json", "to_markdown", "to_text"]


def output(report: Report, content: Shown, fmt: str, wide: bool = True, width: int = 100) -> str | Group:
    """``content`` (`mlhpc.report.views.shown` of ``report``) laid out in ``fmt``: rich tables for
    ``table`` (`group`), else text (``json``: the whole report).

    Raises:
        ConfigError: an unknown format.
    """
    if fmt == "table":
        return group(content, wide, width)
    if fmt == "csv":
        return csv_text(content)
    if fmt == "markdown":
        return markdown(content)
    if fmt == "json":
        return to_json(report)
    raise ConfigError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")


def group(content: Shown, wide: bool = True, width: int = 100) -> Group:
    """The tables (and notes) as rich tables, for a console to print: every column at its
    natural width (``wide``), or the compact views fitted to ``width`` columns
    (`fit_widths`: no column narrower than its longest word, names kept on
    one line where they fit). No cell is ever cut short with an ellipsis: text wraps at
    spaces, and only where even the narrowest layout is too wide does a word fold."""
    parts: list[Any] = []
    for view in content.tables:
        widths = None
        if not wide:
            names = {i for i, name in enumerate(view.header) if name in _NAME_COLUMNS}
            widths = fit_widths(view.header, view.body, width, names) or fit_widths(view.header, view.body, width, set())
        parts.append(_table(view.title, view.header, view.body, wide, widths))
    for note in content.notes:
        parts.append(joined(styled("note", "yellow"), ": ", note))
    return Group(*parts)


def markdown(content: Shown) -> str:
    """GitHub-flavoured Markdown: one pipe table per view, then the notes."""
    out = []
    for view in content.tables:
        out.append(f"**{view.title}**\n")
        out.append("| " + " | ".join(view.header) + " |")
        out.append("|" + "|".join("---" if i < 2 else "---:" for i in range(len(view.header))) + "|")
        for row in view.body:
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
        out.append("")
    if content.notes:
        out += [f"- {n}" for n in content.notes] + [""]
    return "\n".join(out)


def csv_text(content: Shown) -> str:
    """CSV with a header row: the records of ``content`` (every CSV figure of its level)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=content.columns, lineterminator="\n")
    writer.writeheader()
    for row in content.records:
        writer.writerow({k: csv_cell(v) for k, v in row.items()})
    return buffer.getvalue()


def tables(report: Report, level: str = "auto", wide: bool = True, width: int = 100) -> Group:
    """`group` of ``report``'s tables at ``level``."""
    return group(shown(report, level, wide), wide, width)


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


def natural_width(renderable: Group) -> int:
    """Columns ``renderable`` needs so that no table is squeezed (at least 100)."""
    probe = console(width=100_000, color_system=None, force_terminal=False)
    return max(100, min(100_000, probe.measure(renderable).maximum))


def to_text(report: Report, level: str = "auto", width: int | None = None, wide: bool = True) -> str:
    """The rich tables as plain text (no colour), ``width`` columns wide (None: as wide as the
    tables need, `natural_width`, for ``wide``; 100 for the compact views)."""
    if width is None and not wide:
        width = 100
    tables_ = tables(report, level, wide, width or 100)
    buffer = io.StringIO()
    console(file=buffer, width=width or natural_width(tables_), color_system=None,
            force_terminal=False).print(tables_)
    return buffer.getvalue()


def to_markdown(report: Report, level: str = "auto") -> str:
    """GitHub-flavoured Markdown: one pipe table per view (every column), then the notes."""
    return markdown(shown(report, level, wide=True, fmt="markdown"))


def to_csv(report: Report, level: str = "auto") -> str:
    """CSV with a header row: every CSV figure (`mlhpc.report.figures.FIGURES`) of a folder, or
    of a run, one row each."""
    return csv_text(shown(report, level, fmt="csv"))


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
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
    text = output(report, shown(report, level, fmt=fmt), fmt)
    assert isinstance(text, str)
    return text


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
