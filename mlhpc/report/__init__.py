"""``mlhpc report``: MLPerf HPC result logs -> runs -> scores -> table / JSON / CSV / Markdown / PNG.

Modules, one step each:

- `parse`: ``:::MLLOG`` lines -> events (malformed lines listed with file and line, never raised);
- `runs`: one log -> `RunSummary` (time to train, staging, init, epochs, evaluation, residual);
- `energy`: the power logs beside a result -> energy to train, as result_summarizer integrates them;
- `compliance`: MLCommons' compliance checker per log; `rcp`: reference convergence points;
- `score`: result folders -> strong (olympic mean) and weak (models/min) scores, exactly as
  MLCommons' result_summarizer;
- `render`, `plots`: output; `package`: mlhpc run folders -> a submission package.

`run_report` is the one call the CLI makes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Group

from mlhpc.errors import ConfigError
from mlhpc.report.package import PackageResult, check_package, package_runs
from mlhpc.report.parse import Event, Malformed, ParsedLog, parse_log, parse_text
from mlhpc.report.render import render, tables
from mlhpc.report.runs import RunSummary, summarize_run
from mlhpc.report.score import FolderResult, Report, build_report

__all__ = [
    "Event", "FolderResult", "Malformed", "Outcome", "PackageOptions", "PackageResult", "ParsedLog",
    "Report", "ReportOptions", "RunSummary", "build_report", "check_package", "package_runs", "parse_log", "parse_text",
    "render", "run_report", "summarize_run",
]


@dataclass(frozen=True)
class PackageOptions:
    """Lay the runs out as a submission: `package_runs` into ``out`` under ``org``/``system``
    (default: the logs' names), then `check_package` on a scratch copy when ``check``, with
    ``--rcp-bypass`` only when ``rcp_bypass``."""

    out: Path
    org: str | None = None
    system: str | None = None
    check: bool = True
    rcp_bypass: bool = False


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
        price_per_node_hour / price_per_kwh: prices for the cost to train (None: not shown).
    """

    fmt: str = "table"
    level: str = "auto"
    compliance: bool = True
    ruleset: str | None = None
    plots_dir: Path | None = None
    package: PackageOptions | None = None
    price_per_node_hour: float | None = None
    price_per_kwh: float | None = None


@dataclass
class Outcome:
    """What `run_report` produced: the report, its output, plots, package.

    ``output`` is the report rendered once in the asked format: text for ``json``, ``csv`` and
    ``markdown``; for ``table``, rich tables (`mlhpc.report.render.tables`) for a console to
    print, in colour on a terminal (`mlhpc.report.render.to_text` gives them as plain text).
    """

    report: Report
    output: str | Group
    plots: list[Path] = field(default_factory=list)
    package: PackageResult | None = None


def run_report(paths: list[Path], options: ReportOptions | None = None) -> Outcome:
    """Score ``paths``, render them as ``options.fmt``, and optionally write plots and a package.

    Args:
        paths: round trees, result folders, mlhpc run folders or single logs.
        options: see `ReportOptions` (default: a table of every log, compliance checked).

    Raises:
        LogFormatError: a path is missing, holds no logs, or a log is unreadable.
        ConfigError: a bad option value, or package names/contents that cannot be laid out.
    """
    options = options or ReportOptions()
    for name in ("price_per_node_hour", "price_per_kwh"):
        value = getattr(options, name)
        if value is not None and not (0 <= value < float("inf")):
            raise ConfigError(f"--{name.replace('_', '-')} {value}: expected a finite price >= 0")
    report = build_report(paths, compliance=options.compliance, ruleset=options.ruleset)
    report.price_per_node_hour, report.price_per_kwh = options.price_per_node_hour, options.price_per_kwh
    output = tables(report, options.level) if options.fmt == "table" else render(report, options.fmt, options.level)
    outcome = Outcome(report=report, output=output)
    if options.plots_dir is not None:
        from mlhpc.report.plots import write_plots

        outcome.plots = write_plots(report, options.plots_dir)
    if options.package is not None:
        outcome.package = _package(report, paths, options.package)
    return outcome


def _package(report: Report, paths: list[Path], options: PackageOptions) -> PackageResult:
    if any(f.kind != "runs" for f in report.folders):
        raise ConfigError("--package: give mlhpc run folders, not an MLCommons results tree")
    package = package_runs(paths, options.out, org=options.org, system=options.system)
    if options.check:
        check_package(package, rcp_bypass=options.rcp_bypass)
    return package
