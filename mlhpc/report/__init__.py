"""``mlhpc report``: MLPerf HPC result logs -> runs -> scores -> table / JSON / CSV / Markdown / PNG.

Modules, one step each:

- (the log package, `mlhpc.log`: `parse` reads ``:::MLLOG`` lines into events and `summary` one log
  into a `RunSummary`; the report reads through it, as the store does);
- `reported`: a run as the report shows it, the log's facts beside what the report computes from them;
- `energy`: the power logs beside a result -> energy to train, as result_summarizer integrates them;
- `validflops`: HPC AI500's Valid FLOPS and Valid FLOPS per watt of each run and folder;
- `compliance`: MLCommons' compliance checker per log; `rcp`: reference convergence points;
- `score`: result folders -> strong (olympic mean) and weak (models/min) scores, exactly as
  MLCommons' result_summarizer;
- `figures`: the table of the report's figures (name with unit, level, value, views), each
  cell's text from `cells`; `views`: what a report shows, selected from it (tables, CSV
  records), with the titles and notes of `notes`; `render`: those laid out (rich tables, JSON,
  CSV, Markdown); `plots`: PNG figures;
  `package`: a report's runs -> a submission package, judged by `package_check`.

`run_report` is the only call the CLI makes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Group

from mlhpc.errors import ConfigError
from mlhpc.log.facts import RunSummary
from mlhpc.log.parse import Event, Malformed, ParsedLog, parse_log, parse_text
from mlhpc.log.summary import summarize_run
from mlhpc.report.package import PackageOptions, PackageResult, check_package, package_report, package_runs
from mlhpc.report.render import natural_width, output, render
from mlhpc.report.score import FolderResult, Report, build_report
from mlhpc.report.validflops import DEFAULT_EXPONENT, check_exponent
from mlhpc.report.views import shown

__all__ = [
    "Event", "FolderResult", "Malformed", "Outcome", "PackageOptions", "PackageResult", "ParsedLog",
    "Report", "ReportOptions", "RunSummary", "build_report", "check_package", "package_runs", "parse_log", "parse_text",
    "render", "run_report", "summarize_run",
]


PRICE_KEYS = ("price_per_node_hour", "price_per_kwh")  # the command line's options, systems/*.json keys


@dataclass(frozen=True)
class ReportOptions:
    """How `run_report` scores and shows the logs.

    Attributes:
        fmt: ``table``, ``json``, ``csv`` or ``markdown``.
        level: ``auto``, ``folders`` or ``runs`` (see `mlhpc.report.render`).
        compliance: run MLCommons' compliance checker on each log.
        ruleset: force an hpc ruleset.
        plots_dir: write the PNGs of `mlhpc.report.plots` here.
        package: lay the runs out as a submission (the paths must then be mlhpc run folders).
        price_per_node_hour / price_per_kwh: prices for the cost to train; None: the system
            descriptions' (`_price`), else not shown.
        valid_flops_exponent: the n of HPC AI500's quality penalty in Valid FLOPS
            (`mlhpc.report.validflops`; 5, as HPC AI500 sets it).
    """

    fmt: str = "table"
    level: str = "auto"
    compliance: bool = True
    ruleset: str | None = None
    plots_dir: Path | None = None
    package: PackageOptions | None = None
    price_per_node_hour: float | None = None
    price_per_kwh: float | None = None
    wide: bool = False
    width: int = 100
    valid_flops_exponent: float = DEFAULT_EXPONENT


@dataclass
class Outcome:
    """What `run_report` produced: the report, its output (and the columns a console needs to
    show it: ``width``), plots (and why any was left out: `mlhpc.report.plots.PlotFiles`),
    package; ``warnings`` as an AutoML report has them (none here: a results report says what
    it leaves out in its notes).

    ``output`` is the report rendered once in the asked format: text for ``json``, ``csv`` and
    ``markdown``; for ``table``, rich tables (`mlhpc.report.render.tables`) for a console to
    print, in colour on a terminal (`mlhpc.report.render.to_text` gives them as plain text).
    """

    report: Report
    output: str | Group
    width: int = 100
    plots: list[Path] = field(default_factory=list)
    plots_skipped: list[str] = field(default_factory=list)
    package: PackageResult | None = None
    warnings: tuple[str, ...] = ()


def run_report(paths: list[Path], options: ReportOptions | None = None) -> Outcome:
    """Score ``paths``, render them as ``options.fmt``, and optionally write plots and a package.

    Args:
        paths: round trees, result folders, mlhpc run folders or single logs.
        options: see `ReportOptions` (default: a table of every log, compliance checked).

    Raises:
        LogFormatError: a path is missing, holds no logs, or a log is unreadable.
        ConfigError: a bad option value (a price, the Valid FLOPS exponent), a bad or ambiguous price in a system description
            (`_price`), or package names/contents that cannot be laid out.
    """
    options = options or ReportOptions()
    for name in PRICE_KEYS:
        value = getattr(options, name)
        if value is not None and not (0 <= value < float("inf")):
            raise ConfigError(f"--{name.replace('_', '-')} {value}: expected a finite price >= 0")
    try:
        exponent = check_exponent(options.valid_flops_exponent)
    except ValueError as exc:
        raise ConfigError(f"--valid-flops-exponent {exc}") from None
    report = build_report(paths, compliance=options.compliance, ruleset=options.ruleset,
                          valid_flops_exponent=exponent, price_per_node_hour=options.price_per_node_hour,
                          price_per_kwh=options.price_per_kwh)
    content = shown(report, options.level, options.wide or options.fmt == "markdown", options.fmt)
    text = output(report, content, options.fmt, options.wide, options.width)
    outcome = Outcome(report=report, output=text, width=max(options.width, natural_width(text))
                      if options.wide and not isinstance(text, str) else options.width)
    if options.plots_dir is not None:
        from mlhpc.report.plots import write_plots

        files = write_plots(report, options.plots_dir)
        outcome.plots, outcome.plots_skipped = files.written, files.skipped
    if options.package is not None:
        outcome.package = package_report(report, options.package)
    return outcome
