"""``mlhpc report FOLDER`` for an AutoML folder (one holding ``study.json``): its AIPerf score
(`mlhpc.report.automl`) as a table, JSON, CSV or Markdown, and ``automl-scores.png``.

- ``table``: per time mark Time, Trials, Best quality, Error, Total FLOPs, Score and Regulated
  score (FLOP/s with an SI prefix), then the gates (PASS/FAIL and why), the best trial with its
  ready-to-run ``trial.yaml``, and what Error is;
- ``json``: `mlhpc.report.automl.AutomlScore.to_dict` (non-finite numbers as null);
- ``csv``: one row per mark, `MARK_COLUMNS` as the header (s, FLOP, FLOP/s);
- ``markdown``: the marks table and the gates;
- ``automl-scores.png``: both scores against elapsed time, FLOP/s on a log axis.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table

from mlhpc.errors import ConfigError
from mlhpc.report.automl import AutomlScore
from mlhpc.report.cells import flops_text
from mlhpc.report.render import csv_cell, finite
from mlhpc.text import cell, joined, styled

#: The JSON keys of a mark, the CSV's header.
MARK_COLUMNS = ("elapsed_s", "trials", "best_quality", "error", "total_flops", "score_flop_per_s",
                "regulated_score_flop_per_s")
TABLE_HEADER = ("Time", "Trials", "Best quality", "Error", "Total FLOPs", "Score", "Regulated score")
PLOT_NAME = "automl-scores.png"


@dataclass
class AutomlOutcome:
    """What `automl_report` produced: the score, its output (text, or rich tables for ``table``),
    the PNGs written and why any was not; ``width``, ``package`` and ``warnings`` as
    `mlhpc.report.Outcome` has them (no width of its own, no package; the score's warnings)."""

    score: AutomlScore
    output: str | Group
    plots: list[Path] = field(default_factory=list)
    plots_skipped: list[str] = field(default_factory=list)
    width: int = 0
    package: None = None

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.score.warnings


def automl_report(score: AutomlScore, fmt: str, plots_dir: Path | None) -> AutomlOutcome:
    """An AutoML folder's score (`mlhpc.report.automl.score_search`) in ``fmt``, with its PNG
    written under ``plots_dir`` when given.

    Raises:
        ConfigError: an unknown ``fmt``, or the PNG cannot be written.
    """
    renderers = {"table": automl_tables, "json": automl_json, "csv": automl_csv, "markdown": automl_markdown}
    if fmt not in renderers:
        raise ConfigError(f"--format {fmt}: expected one of {', '.join(renderers)}")
    outcome = AutomlOutcome(score=score, output=renderers[fmt](score))
    if plots_dir is not None:
        outcome.plots, outcome.plots_skipped = write_automl_plot(score, plots_dir)
    return outcome


def clock(seconds: float) -> str:
    """``H:MM:SS`` (seconds rounded; ``S.s s`` under a minute, where a mark can be that short)."""
    if seconds < 60:
        return f"{seconds:.3g} s"
    whole = int(round(seconds))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def rate(value: float | None, unit: str = "FLOP/s") -> str:
    """``12.3 GFLOP/s``; ``-`` for None."""
    text = flops_text(value)
    if text == "-":
        return text
    return f"{text}{unit}" if text[-1].isalpha() else f"{text} {unit}"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def mark_rows(score: AutomlScore) -> list[list[str]]:
    """The marks as table cells, in `TABLE_HEADER`'s order."""
    return [[clock(m.elapsed_s), str(m.trials), _number(m.best_quality), _number(m.error),
             rate(m.total_flops, "FLOP"), rate(m.score_flop_per_s), rate(m.regulated_score_flop_per_s)]
            for m in score.marks]


def notes(score: AutomlScore) -> list[str]:
    """The lines under the tables: the verdict, the best trial and its config, what Error is,
    the trials without FLOPs, and when there is no mark yet."""
    s, out = score.study, []
    out.append(f"valid: {'yes' if score.valid else 'no'} (every gate must pass)")
    best = score.best_trial
    if best is None:
        out.append(f"best trial: none yet (no {s.metric_key} logged)")
    else:
        out.append(f"best trial: {best.number} ({s.metric_key} {best.quality:.6g} at {clock(best.elapsed_s)}), "
                   f"log {best.log}")
        out.append(f"its config, ready to run: mlhpc run {best.config}" if best.config
                   else f"its config: no trial.yaml in {best.folder}")
    out.append(f"Error is {s.error_is} ({'higher' if s.direction == 'max' else 'lower'} {s.metric_key} is better); "
               "score = FLOPs / time, regulated score = FLOPs x ln(1/Error) / time (AIPerf), FLOPs as "
               "torch's counter counted them in each run")
    if score.trials_without_flops:
        out.append(f"{score.trials_without_flops} of {score.trials_total} trial(s) without measured FLOPs "
                   "(no measured_N.json: killed, or still running) count 0 FLOPs")
    if not score.marks:
        out.append(f"no time mark yet: the search ran {clock(score.duration_s)}, the first mark is at "
                   f"{clock(s.mark_every_s)}")
    return out


def _title(score: AutomlScore) -> str:
    s = score.study
    return (f"AutoML study {s.study_name} ({s.workload}, {s.metric_key} {s.direction}, target {s.target:g}): "
            f"{score.trials_total} trial(s), {clock(score.duration_s)} of a {clock(s.budget_s)} budget, "
            f"a mark every {clock(s.mark_every_s)}")


def automl_tables(score: AutomlScore) -> Group:
    """Rich tables for `mlhpc.text.console`: the marks, the gates, then `notes`."""
    marks = Table(title=_title(score), title_justify="left", header_style="bold")
    for name in TABLE_HEADER:
        marks.add_column(name, justify="right", overflow="fold")
    for row in mark_rows(score):
        marks.add_row(*(cell(value) for value in row))
    gates = Table(title="Gates (AIPerf's validity rules, values from the study's config)",
                  title_justify="left", header_style="bold")
    for name in ("Gate", "Verdict", "Reason"):
        gates.add_column(name, overflow="fold")
    for gate in score.gates:
        gates.add_row(cell(gate.name), styled("PASS", "green") if gate.passed else styled("FAIL", "red"),
                      cell(gate.reason))
    return Group(marks, gates, *(joined(line) for line in notes(score)))


def automl_markdown(score: AutomlScore) -> str:
    """GitHub-flavoured Markdown: the marks table, the gates table, then `notes`."""
    out = [f"**{_title(score)}**", "", "| " + " | ".join(TABLE_HEADER) + " |",
           "|" + "|".join("---:" for _ in TABLE_HEADER) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in mark_rows(score)]
    out += ["", "**Gates**", "", "| Gate | Verdict | Reason |", "|---|---|---|"]
    out += [f"| {g.name} | {'PASS' if g.passed else 'FAIL'} | {_pipes(g.reason)} |" for g in score.gates]
    return "\n".join(out + [""] + [f"- {_pipes(line)}" for line in notes(score)] + [""])


def _pipes(text: str) -> str:
    """``text`` safe in a Markdown table cell (a ``|`` escaped)."""
    return text.replace("|", "\\|")


def automl_csv(score: AutomlScore) -> str:
    """CSV: a header of `MARK_COLUMNS`, then one row per mark (empty cell for None)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=MARK_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in score.to_dict()["marks"]:
        writer.writerow({k: csv_cell(v) for k, v in row.items()})
    return buffer.getvalue()


def automl_json(score: AutomlScore) -> str:
    """`AutomlScore.to_dict` as indented JSON; NaN or infinite numbers become null."""
    return json.dumps(finite(score.to_dict()), indent=2, allow_nan=False) + "\n"


def _time_axis(score: AutomlScore) -> tuple[float, str]:
    """(seconds per unit, unit) for the figure's time axis."""
    span = score.marks[-1].elapsed_s if score.marks else 0.0
    return (3600.0, "h") if span >= 7200 else (60.0, "min") if span >= 600 else (1.0, "s")


def scores_figure(score: AutomlScore) -> Any:
    """Both scores (FLOP/s, log axis) against elapsed time; None when no mark has a positive
    score (a log axis has nothing to show)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    series = [("score = FLOPs / time", [(m.elapsed_s, m.score_flop_per_s) for m in score.marks]),
              (f"regulated = FLOPs x ln(1/Error) / time, Error = {score.study.error_is}",
               [(m.elapsed_s, m.regulated_score_flop_per_s) for m in score.marks])]
    series = [(label, [(t, v) for t, v in points if v is not None and v > 0]) for label, points in series]
    if not any(points for _, points in series):
        return None
    per_unit, unit = _time_axis(score)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (label, points), marker in zip(series, ("o", "s")):
        if points:
            ax.plot([t / per_unit for t, _ in points], [v for _, v in points], marker=marker, label=label)
    ax.set_yscale("log")
    for axis_format in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
        axis_format(EngFormatter(unit="FLOP/s"))  # plain text: mathtext is off in plot_text
    ax.set_xlabel(f"time since the search started ({unit})")
    ax.set_ylabel("score")
    ax.set_title(f"AIPerf scores of {score.study.study_name} ({score.study.workload})", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def write_automl_plot(score: AutomlScore, out_dir: Path | str) -> tuple[list[Path], list[str]]:
    """``(written, skipped)``: `PLOT_NAME` in ``out_dir`` (150 dpi) when a mark has a positive
    score, else one line saying why not.

    Raises:
        ConfigError: ``out_dir`` cannot be created or the PNG cannot be written.
    """
    from mlhpc.report.plots import plots_folder, save_png
    from mlhpc.text import plot_text

    out = plots_folder(out_dir)
    with plot_text():  # names drawn as written, never read as mathtext
        fig = scores_figure(score)
        if fig is None:
            return [], [f"no {PLOT_NAME}: no time mark with FLOPs counted yet"]
        path = out / PLOT_NAME
        save_png(fig, path)
    return [path], []
