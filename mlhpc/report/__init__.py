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
- `figures`: the table of the report's figures (name with unit, level, value, views) and each
  cell's text; `render`: the views selected from it (tables, JSON, CSV, Markdown), with the
  titles and notes of `notes`; `plots`: PNG figures;
  `package`: mlhpc run folders -> a submission package.

`run_report` is the only call the CLI makes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from rich.console import Group

from mlhpc.errors import ConfigError
from mlhpc.report.package import PackageResult, check_package, package_runs
from mlhpc.log.parse import Event, Malformed, ParsedLog, parse_log, parse_text
from mlhpc.report.render import render, tables
from mlhpc.log.facts import RunSummary
from mlhpc.log.summary import summarize_run
from mlhpc.report.score import FolderResult, Report, build_report
from mlhpc.report.validflops import DEFAULT_EXPONENT, check_exponent

__all__ = [
    "Event", "FolderResult", "Malformed", "Outcome", "PackageOptions", "PackageResult", "ParsedLog",
    "Report", "ReportOptions", "RunSummary", "build_report", "check_package", "package_runs", "parse_log", "parse_text",
    "render", "run_report", "summarize_run",
]


PRICE_KEYS = ("price_per_node_hour", "price_per_kwh")  # the command line's options, systems/*.json keys


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
    """What `run_report` produced: the report, its output, plots (and why any was left out:
    `mlhpc.report.plots.PlotFiles`), package.

    ``output`` is the report rendered once in the asked format: text for ``json``, ``csv`` and
    ``markdown``; for ``table``, rich tables (`mlhpc.report.render.tables`) for a console to
    print, in colour on a terminal (`mlhpc.report.render.to_text` gives them as plain text).
    """

    report: Report
    output: str | Group
    plots: list[Path] = field(default_factory=list)
    plots_skipped: list[str] = field(default_factory=list)
    package: PackageResult | None = None


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
                          valid_flops_exponent=exponent)
    report = replace(report, **{name: _price(report, options, name) for name in PRICE_KEYS})
    output = (tables(report, options.level, options.wide, options.width) if options.fmt == "table"
              else render(report, options.fmt, options.level))
    outcome = Outcome(report=report, output=output)
    if options.plots_dir is not None:
        from mlhpc.report.plots import write_plots

        files = write_plots(report, options.plots_dir)
        outcome.plots, outcome.plots_skipped = files.written, files.skipped
    if options.package is not None:
        outcome.package = _package(report, paths, options.package)
    return outcome


def _price(report: Report, options: ReportOptions, name: str) -> float | None:
    """The price ``name`` (``price_per_node_hour`` or ``price_per_kwh``) for the cost to train:
    the command line's when given; else the one the scored folders' system descriptions
    (``systems/<system>.json``, key ``name``, a number or a numeric string) give, when every
    description that names a price gives the same; else None (no cost shown).

    Raises:
        ConfigError: a description's price is not a finite number >= 0, or two descriptions
            give different prices (one report has one price: give it on the command line).
    """
    if getattr(options, name) is not None:
        return getattr(options, name)
    found: dict[float, str] = {}
    for folder in report.folders:
        raw = folder.system_desc.get(name)
        if raw is None or raw == "":
            continue
        where = f"system description {folder.system}.json of {folder.path}"
        try:
            value = float(raw) if not isinstance(raw, bool) else float("nan")
        except (TypeError, ValueError):
            value = float("nan")
        if not 0 <= value < float("inf"):
            raise ConfigError(f"{where}: {name} {raw!r}: expected a finite price >= 0")
        found.setdefault(value, where)
    if len(found) > 1:
        (a, first), (b, second) = list(found.items())[:2]
        raise ConfigError(f"{name}: {first} gives {a:g}, {second} gives {b:g}; report the systems "
                          f"apart or give --{name.replace('_', '-')}")
    return next(iter(found), None)


def _package(report: Report, paths: list[Path], options: PackageOptions) -> PackageResult:
    if any(f.kind != "runs" for f in report.folders):
        raise ConfigError("--package: give mlhpc run folders, not an MLCommons results tree")
    package = package_runs(paths, options.out, org=options.org, system=options.system)
    if options.check:
        check_package(package, rcp_bypass=options.rcp_bypass)
    return package
