"""``mlhpc report``: score MLPerf HPC result logs and mlhpc run folders; package runs for submission."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from mlhpc.report.render import FORMATS, LEVELS
from mlhpc.text import console, echo, one_line

if TYPE_CHECKING:
    from mlhpc.report import Outcome, ReportOptions
    from mlhpc.report.automl_render import AutomlOutcome


@click.command("report", context_settings={"help_option_names": ["-h", "--help"]})  # also when invoked alone
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
              help="Output format.")
@click.option("--level", type=click.Choice(LEVELS), default="auto", show_default=True,
              help="One row per result folder (scores) or per run (phases); auto: runs for mlhpc run folders.")
@click.option("--wide", is_flag=True, default=False,
              help="With --format table: every column, as wide as the tables need (default: the key "
                   "columns, fitted to the terminal's width, or $COLUMNS, else 100 columns).")
@click.option("--compliance/--no-compliance", default=True, show_default=True,
              help="Check every log with MLCommons' compliance checker (needed for official scores).")
@click.option("--ruleset", type=click.Choice(["1.0.0", "2.0.0", "3.0.0"]), default=None,
              help="hpc ruleset for compliance and RCPs (default: from the path's round, else 3.0.0).")
@click.option("--plots", "plots_dir", type=click.Path(path_type=Path), default=None,
              help="Write report-time-split.png, report-convergence.png, report-scaling.png here.")
@click.option("--package", "package_dir", type=click.Path(path_type=Path), default=None,
              help="Lay the run folders out as an MLPerf HPC submission under this folder.")
@click.option("--org", default=None, help="Submitter name for --package (default: the logs' submission_org).")
@click.option("--system", "system_name", default=None,
              help="System name for --package (default: the logs' submission_platform).")
@click.option("--check/--no-check", "check_package", default=True, show_default=True,
              help="With --package: run mlperf_logging's package checker on a scratch copy.")
@click.option("--rcp-bypass", is_flag=True, default=False,
              help="With --package: run the package checker with --rcp-bypass (a failed RCP check is "
                   "then accepted, to be reviewed by the submission committee); default: without.")
@click.option("--price-per-node-hour", type=click.FloatRange(min=0), default=None,
              help="Cost to train: nodes x hours of time to train x this price.")
@click.option("--price-per-kwh", type=click.FloatRange(min=0), default=None,
              help="Cost to train: kWh of measured energy to train (power/result_N/node_K.txt, as "
                   "result_summarizer integrates it; GPUs by NVML and CPU/DRAM by RAPL, or the node "
                   "meter; switches only from sw_K.txt) x this price. No energy, no cost.")
@click.option("--valid-flops-exponent", type=click.FloatRange(min=0, max=1e6), default=5.0, show_default=True,
              help="n of HPC AI500's quality penalty in Valid FLOPS: FLOPS x min(1, (achieved/target)^n), "
                   "the ratio inverted for an error.")
def report_command(paths: tuple[Path, ...], fmt: str, level: str, wide: bool, compliance: bool,
                   ruleset: str | None, plots_dir: Path | None, package_dir: Path | None,
                   org: str | None, system_name: str | None, check_package: bool, rcp_bypass: bool,
                   price_per_node_hour: float | None, price_per_kwh: float | None,
                   valid_flops_exponent: float) -> None:
    """Score result logs under PATHS: round trees, result folders, mlhpc run folders or logs.

    Energy to train (and mean power) comes from the MLPerf power logs beside each result,
    power/result_N/node_K.txt, integrated as MLCommons' result_summarizer does; "-" where a
    run has none (no power counter, or a published round without power). Valid FLOPS (HPC
    AI500) is the counted training FLOPs over time to train, penalised for quality short of the
    target; per watt where energy was measured.

    A folder holding study.json (an `mlhpc automl` search) is reported alone, as AIPerf scores
    it: score and regulated score per time mark, the gates, the best trial; --format and --plots
    (automl-scores.png) apply, --package, --org, --system, --rcp-bypass and the prices are
    refused, the other options are not used."""
    from mlhpc.errors import MlhpcError
    from mlhpc.report import PackageOptions, ReportOptions

    width = _console_width()
    refused = [name for name, value in (("--package", package_dir), ("--org", org), ("--system", system_name),
                                        ("--price-per-node-hour", price_per_node_hour),
                                        ("--price-per-kwh", price_per_kwh), ("--rcp-bypass", rcp_bypass or None))
               if value is not None]
    try:
        package = None if package_dir is None else PackageOptions(
            package_dir, org=org, system=system_name, check=check_package, rcp_bypass=rcp_bypass)
        options = ReportOptions(fmt=fmt, level=level, compliance=compliance, ruleset=ruleset, plots_dir=plots_dir,
                                package=package, price_per_node_hour=price_per_node_hour,
                                price_per_kwh=price_per_kwh, wide=wide, width=width,
                                valid_flops_exponent=valid_flops_exponent)
        outcome = _outcome(list(paths), options, refused)
    except MlhpcError as exc:  # the project's convention: one line on stderr, exit status 2
        echo(f"mlhpc: error: {one_line(exc)}", err=True)
        raise SystemExit(2) from None
    _print(outcome, width)


def _outcome(paths: list[Path], options: ReportOptions, refused: list[str]) -> Outcome | AutomlOutcome:
    """The report of ``paths``: an AutoML folder's (one holding ``study.json``) read
    (`mlhpc.report.automl_folder.read_search`), scored (`mlhpc.report.automl.score_search`) and
    shown (`mlhpc.report.automl_render.automl_report`); else result logs scored and shown
    (`mlhpc.report.run_report`).

    Raises:
        ConfigError: an option in ``refused`` given for an AutoML folder, --org, --system or
            --rcp-bypass without --package, or bad input (`run_report`, `read_search`).
    """
    from mlhpc.errors import ConfigError
    from mlhpc.report import run_report
    from mlhpc.report.automl import score_search
    from mlhpc.report.automl_folder import automl_folder, read_search
    from mlhpc.report.automl_render import automl_report

    folder = automl_folder(paths)
    if folder is not None:
        if refused:
            raise ConfigError(f"{', '.join(refused)}: not used for an AutoML folder ({folder})")
        search = read_search(folder)
        score = score_search(search)
        return automl_report(score, options.fmt, options.plots_dir)
    if options.package is None and {"--org", "--system", "--rcp-bypass"} & set(refused):
        raise ConfigError("--org/--system/--rcp-bypass: only used with --package OUT")
    return run_report(paths, options)


def _print(outcome: Outcome | AutomlOutcome, width: int) -> None:
    """A report's warnings (stderr), its output (stdout: text as it is, tables on a console as
    wide as they need, at least ``width`` columns), the PNGs written and why any was not
    (stderr), then what was packaged and the package checker's verdict (exit 1 if it rejects)."""
    for line in outcome.warnings:
        echo(f"warning: {line}", err=True)
    if isinstance(outcome.output, str):
        echo(outcome.output, nl=not outcome.output.endswith("\n"))
    else:
        console(width=max(width, outcome.width)).print(outcome.output)
    for path in outcome.plots:
        echo(f"wrote {path}", err=True)
    for line in outcome.plots_skipped:
        echo(line, err=True)
    package = outcome.package
    if package is None:
        return
    echo(f"packaged {len(package.result_files)} runs into {package.root}", err=True)
    for warning in package.warnings:
        echo(f"warning: {warning}", err=True)
    if package.checker_ok is None:
        return
    how = "with --rcp-bypass" if package.rcp_bypass else "without RCP bypass"
    if not package.checker_ok:
        first = package.checker_messages[0] if package.checker_messages else "see its log"
        echo(f"mlhpc: error: package_checker ({how}) rejected {package.root}: {first}", err=True)
        raise SystemExit(1)
    echo(f"package_checker ({how}): accepted", err=True)


def _console_width() -> int:
    """Columns for the table: the terminal's width on a terminal, else ``$COLUMNS`` when set,
    else 100."""
    import os

    probe = console()
    if probe.is_terminal or os.environ.get("COLUMNS", "").strip().isdigit():
        return max(probe.width, 20)
    return 100
