"""``mlhpc report``: MLPerf HPC result logs -> runs -> scores -> table / JSON / CSV / Markdown / PNG.

Modules, one step each:

- `parse`: ``:::MLLOG`` lines -> events (malformed lines listed with file and line, never raised);
- `runs`: one log -> `RunSummary` (time to train, staging, init, epochs, evaluation, residual);
- `compliance`: MLCommons' compliance checker per log; `rcp`: reference convergence points;
- `score`: result folders -> strong (olympic mean) and weak (models/min) scores, exactly as
  MLCommons' result_summarizer;
- `render`, `plots`: output; `package`: mlhpc run folders -> a submission package.

`run_report` is the one call the CLI makes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mlhpc.errors import ConfigError
from mlhpc.report.package import PackageResult, check_package, package_runs
from mlhpc.report.parse import Event, Malformed, ParsedLog, parse_log, parse_text
from mlhpc.report.render import render
from mlhpc.report.runs import RunSummary, summarize_run
from mlhpc.report.score import FolderResult, Report, build_report

__all__ = [
    "Event", "FolderResult", "Malformed", "Outcome", "PackageResult", "ParsedLog", "Report",
    "RunSummary", "build_report", "check_package", "package_runs", "parse_log", "parse_text",
    "render", "run_report", "summarize_run",
]


@dataclass
class Outcome:
    """What `run_report` produced: the report, its text in the asked format, plots, package."""

    report: Report
    text: str
    plots: list[Path] = field(default_factory=list)
    package: PackageResult | None = None


def run_report(paths: list[Path], *, fmt: str = "table", level: str = "auto", compliance: bool = True,
               ruleset: str | None = None, plots_dir: Path | None = None, package_dir: Path | None = None,
               org: str | None = None, system: str | None = None, check_package: bool = True,
               rcp_bypass: bool = False) -> Outcome:
    """Score ``paths``, render them as ``fmt``, and optionally write plots and a package.

    Args:
        paths: round trees, result folders, mlhpc run folders or single logs.
        fmt: ``table``, ``json``, ``csv`` or ``markdown``.
        level: ``auto``, ``folders`` or ``runs`` (see `mlhpc.report.render`).
        compliance: run MLCommons' compliance checker on each log.
        ruleset: force an hpc ruleset.
        plots_dir: write the PNGs of `mlhpc.report.plots` here.
        package_dir / org / system: lay the runs out as a submission under ``package_dir``
            (``paths`` must then be mlhpc run folders); ``check_package`` runs the package
            checker on a scratch copy, with ``--rcp-bypass`` only when ``rcp_bypass``.

    Raises:
        LogFormatError: a path is missing, holds no logs, or a log is unreadable.
        ConfigError: a bad option value, or package names/contents that cannot be laid out.
    """
    report = build_report(paths, compliance=compliance, ruleset=ruleset)
    outcome = Outcome(report=report, text=render(report, fmt, level))
    if plots_dir is not None:
        from mlhpc.report.plots import write_plots

        outcome.plots = write_plots(report, plots_dir)
    if package_dir is not None:
        if any(f.kind != "runs" for f in report.folders):
            raise ConfigError("--package: give mlhpc run folders, not an MLCommons results tree")
        from mlhpc.report.package import check_package as _check

        outcome.package = package_runs(paths, package_dir, org=org, system=system)
        if check_package:
            _check(outcome.package, rcp_bypass=rcp_bypass)
    elif org is not None or system is not None or rcp_bypass:
        raise ConfigError("--org/--system/--rcp-bypass: only used with --package OUT")
    return outcome
