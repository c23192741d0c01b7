"""The compact tables of ``mlhpc report`` (its default; ``--wide`` shows every column).

They hold the columns a person reads first and fit a 100-column terminal:

- runs (one table per mlhpc run folder, titled with the folder, benchmark, olympic mean and RCP
  verdict): run, status, compliant, time to train, energy (where any run has power readings),
  staging (``not staged`` where nothing was copied), epochs, samples/s, Valid FLOPS (and per
  watt) where any run has one (`mlhpc.report.validflops`), resumed;
- folders (one row per result folder, instead of the wide systems x benchmarks matrix):
  benchmark, system (``submitter: system``, or the run folder), division, nodes x accelerators,
  the score with its RCP verdict, energy (where any folder has an energy score) and Valid FLOPS
  (where any folder has one).

Every figure is the same text as in the wide views (`mlhpc.report.cells`).
"""

from __future__ import annotations

from rich.cells import cell_len

from mlhpc.report.cells import (STRONG_TITLE, WEAK_TITLE, any_energy, any_valid_flops, cost, energy, energy_unit,
                                flops_text, fmt, folder_name, folder_nodes, priced, resumed_cell, run_view_title,
                                scale, staging_cell, strong_cell, system_key, valid_flops_header, weak_cell)
from mlhpc.report.score import FolderResult, Report

View = tuple[str, list[str], list[list[str]]]


def compact_views(report: Report, level: str) -> list[View]:
    """``(title, header, rows)`` per compact table; ``level`` is ``runs`` or ``folders``
    (`mlhpc.report.render.resolve_level` has resolved ``auto``)."""
    if level == "runs":
        measured = any_energy(report)
        return [(run_view_title(f), *_run_rows(report, f, measured)) for f in report.folders]
    views = []
    for kinds, title, cell, score in ((("strong", "runs"), STRONG_TITLE, strong_cell, "minutes (RCP)"),
                                      (("weak",), WEAK_TITLE, weak_cell, "models/min (models x accelerators)")):
        folders = sorted((f for f in report.folders if f.kind in kinds),
                         key=lambda f: (f.benchmark or "?", system_key(f)))
        if folders:
            views.append((title, *_folder_rows(report, folders, cell, score)))
    return views


def _run_rows(report: Report, f: FolderResult, measured: bool) -> tuple[list[str], list[list[str]]]:
    """A run folder's rows; a ``cost`` column when a price was given (`mlhpc.report.cells.cost`)."""
    eunit, per = energy_unit(r.energy_to_train_j for r in f.runs)
    header = ["run", "status", "compliant", "time to train s"] + ([f"energy {eunit}"] if measured else [])
    header += ["staging s", "epochs", "samples/s"]
    flops, per_w = any_valid_flops(report), any_valid_flops(report, per_w=True)
    header += (["valid FLOP/s"] if flops else []) + (["valid FLOP/s per W"] if per_w else [])
    header += ["resumed"] + (["cost"] if priced(report) else [])
    body = []
    for r in f.runs:
        valid = r.valid_flops
        body.append([r.path.rsplit("/", 1)[-1], r.status, fmt(r.compliant), fmt(r.time_to_train_s)]
                    + ([energy(r.energy_to_train_j, per)] if measured else [])
                    + [staging_cell(r, wide=False), fmt(r.n_epochs), fmt(r.samples_per_s, 1)]
                    + ([flops_text(valid and valid.valid_flops_per_s)] if flops else [])
                    + ([flops_text(valid and valid.valid_flops_per_w)] if per_w else []) + [resumed_cell(r)]
                    + ([fmt(cost(report, r.number_of_nodes, r.time_to_train_min, r.energy_to_train_j))]
                       if priced(report) else []))
    return header, body


def _folder_rows(report: Report, folders: list[FolderResult], cell, score: str) -> tuple[list[str], list[list[str]]]:  # type: ignore[no-untyped-def]
    """One row per folder; a ``cost`` column (of the folder's score) when a price was given."""
    multi_round = len({f.round for f in folders}) > 1
    measured = any(f.energy_olympic_j is not None for f in folders)
    flops = any(f.valid_flops_per_s is not None for f in folders)
    header = ["benchmark", "system", "division", "nodes x accelerators", score]
    header += (["energy kWh"] if measured else []) + (["cost"] if priced(report) else [])
    header += [valid_flops_header(r for f in folders for r in f.runs)] if flops else []
    body = []
    for f in folders:
        system = f"{f.round} {folder_name(f)}" if multi_round and f.round else folder_name(f)
        price = cost(report, folder_nodes(f), f.olympic_min if f.kind != "weak" else None, f.energy_olympic_j)
        body.append([f.benchmark or "?", system, f.division or "?", scale(f), cell(f)]
                    + ([energy(f.energy_olympic_j, 3.6e6)] if measured else [])
                    + ([fmt(price)] if priced(report) else [])
                    + ([flops_text(f.valid_flops_per_s)] if flops else []))
    return header, body


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
