"""``mlhpc results``: the results store's commands. Each parses, calls one library function,
prints; bad input is one line on stderr and exit status 2."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from mlhpc.errors import one_line_errors
from mlhpc.text import echo
from mlhpc.store.queries import FORMATS

STORE_HELP = ("Store URL (SQLAlchemy, e.g. postgresql+psycopg://user@host/db) or SQLite file; default "
              "$MLHPC_STORE, else $XDG_DATA_HOME/mlhpc/results.db.")


_friendly = one_line_errors(os_errors=True)  # a store's file errors are one line too


def _open(url: str | None):
    from mlhpc.store import open_store

    store = open_store(url)
    for warning in store.warnings:
        echo(f"warning: {warning}", err=True)
    return store


@dataclass(frozen=True)
class Selection:
    """The filter options of ``mlhpc results list`` and ``scaling`` as given (`filters` reads the
    dates)."""

    benchmark: str | None = None
    system: str | None = None
    nodes: int | None = None
    status: str | None = None
    source: str | None = None
    campaign: str | None = None
    scaling: str | None = None
    since: str | None = None
    until: str | None = None

    def filters(self):
        """The store's `mlhpc.store.queries.Filters`, the dates in ms since the Unix epoch.

        Raises:
            ConfigError: a date that is not ``YYYY-MM-DD`` (or out of range).
        """
        from mlhpc.store.queries import Filters, parse_date_ms

        return Filters(benchmark=self.benchmark, system=self.system, nodes=self.nodes, status=self.status,
                       source=self.source, campaign=self.campaign, scaling=self.scaling,
                       since_ms=parse_date_ms(self.since) if self.since else None,
                       until_ms=parse_date_ms(self.until, end=True) if self.until else None)


def _filter_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The filter options added to a command, which receives them as one ``selection``."""
    names = tuple(Selection.__dataclass_fields__)

    @functools.wraps(fn)
    def command(*args: Any, **params: Any) -> Any:
        return fn(*args, selection=Selection(**{name: params.pop(name) for name in names}), **params)

    options = [
        click.option("--benchmark", default=None, help="Only this benchmark (its MLPerf name, as logged in "
                     "submission_benchmark)."),
        click.option("--system", default=None, help="Only this system name."),
        click.option("--nodes", type=click.IntRange(min=1, max=2**63 - 1), default=None, help="Only runs on this many nodes."),
        click.option("--status", default=None, help="Only runs with this status (success, aborted, incomplete)."),
        click.option("--source", type=click.Choice(["own", "published"]), default=None, help="Own or published runs."),
        click.option("--campaign", default=None, help="Only runs of this campaign id (scaling: the "
                     "campaign's own runs, beside the published systems)."),
        click.option("--scaling", type=click.Choice(["strong", "weak"]), default=None,
                     help="Only strong-scaling runs (own runs included) or weak-scaling runs."),
        click.option("--since", default=None, help="Runs started on or after this date (YYYY-MM-DD, UTC)."),
        click.option("--until", default=None, help="Runs started before the end of this date (YYYY-MM-DD, UTC)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@click.group("results", context_settings={"help_option_names": ["-h", "--help"]})  # also when invoked alone
def results_group() -> None:
    """The results store: every run kept, compared over time, across node counts and with
    MLCommons' published rounds (docs/store.md)."""


@results_group.command("ingest")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--store", "url", default=None, help=STORE_HELP)
@click.option("--campaign", default=None, help="Campaign id stored with each newly added run.")
@_friendly
def ingest_command(paths: tuple[Path, ...], url: str | None, campaign: str | None) -> None:
    """Add the runs under PATHS: mlhpc run folders, MLCommons result trees, single logs.
    A log already stored is not added again; a refused log is named (exit status 2)."""
    from mlhpc.store import ingest_paths

    store = _open(url)
    result = ingest_paths(store, list(paths), campaign)
    for line in result.refused:
        echo(f"mlhpc: refused: {line}", err=True)
    echo(f"{len(result.added)} run(s) added, {result.already} already stored, "
               f"{len(result.refused)} refused ({store.url})")
    if result.refused:
        sys.exit(2)


@results_group.command("list")
@_filter_options
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@click.option("--store", "url", default=None, help=STORE_HELP)
@_friendly
def list_command(fmt: str, url: str | None, selection: Selection) -> None:
    """List stored runs (filters combine with AND)."""
    from mlhpc.store.queries import list_runs, render_rows

    output = render_rows(list_runs(_open(url), selection.filters()), fmt)
    echo(output, nl=not output.endswith("\n"))


@results_group.command("show")
@click.argument("run")
@click.option("--log", "with_log", is_flag=True, help="Print the stored log itself.")
@click.option("--store", "url", default=None, help=STORE_HELP)
@_friendly
def show_command(run: str, with_log: bool, url: str | None) -> None:
    """Show one run: RUN is its run id or a prefix (8+ hex digits) of its log's SHA-256."""
    from mlhpc.store.queries import get_run, show_text

    row = get_run(_open(url), run)
    echo(row["log"] if with_log else show_text(row), nl=not (with_log and row["log"].endswith("\n")))


@results_group.command("compare")
@click.argument("a")
@click.argument("b")
@click.option("--alpha", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.05,
              show_default=True, help="Significance level of the test.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--store", "url", default=None, help=STORE_HELP)
@_friendly
def compare_command(a: str, b: str, alpha: float, fmt: str, url: str | None) -> None:
    """Compare two selections of runs, A (before) and B (after), like with like: each a campaign
    id or 'key=value,...' (benchmark, system, nodes, scaling, source, campaign, since, until).
    One scaling mode is compared (scaling=strong|weak; by default strong when both hold strong
    runs), by MLCommons' score: the olympic mean of the times to train (strong) or models/min
    (weak). A selection that matches no stored run is an error (exit status 2)."""
    from mlhpc.store.api import compare_selections
    from mlhpc.store.compare import SCORES, TEST_NAME, render

    result = compare_selections(_open(url), a, b, alpha)
    if fmt == "json":
        sides = {name: {"selection": side.label, "times_s": side.times_s, "olympic_s": side.olympic_s,
                        "score": side.score, "runs_failed": side.failed, "folders": side.folders,
                        "left_out_other_scaling": side.left_out}
                 for name, side in (("a", result.a), ("b", result.b))}
        echo(json.dumps({"scaling": result.a.scaling, "score": SCORES[result.a.scaling],
                               "score_unit": "models/min" if result.a.scaling == "weak" else "min", **sides,
                               "test": TEST_NAME if result.a.scaling == "strong" else None,
                               "p_value": result.p_value, "ci_low_s": result.ci_low_s,
                               "ci_high_s": result.ci_high_s, "verdict": result.verdict}, indent=2))
    else:
        echo(render(result))


@results_group.command("scaling")
@_filter_options
@click.option("--mode", type=click.Choice(["strong", "weak"]), default="strong", show_default=True,
              help="strong: E = T(n0) n0 / (T(n) n); weak: E = T(n0) / T(n).")
@click.option("--plot", "png", type=click.Path(path_type=Path), default=None, help="Write the PNG here.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@click.option("--store", "url", default=None, help=STORE_HELP)
@_friendly
def scaling_command(mode: str, png: Path | None, fmt: str, url: str | None, selection: Selection) -> None:
    """Time to train and parallel efficiency against nodes for one --benchmark, own runs beside
    published systems."""
    from mlhpc.store.api import scaling_report
    from mlhpc.store.queries import render_rows

    rows, written = scaling_report(_open(url), selection.filters(), mode, png)
    columns = ("series", "source", "nodes", "runs", "time_to_train_min", "how", "efficiency", "global_batch_size")
    output = render_rows(rows, fmt, columns).replace(" run(s)", " point(s)")
    echo(output, nl=not output.endswith("\n"))
    if written is not None:
        echo(f"wrote {written}", err=True)


@results_group.command("check")
@click.option("--references", "references", type=click.Path(path_type=Path), required=True,
              help="YAML: system -> benchmark -> figure: [value, lower, upper, unit] (ReFrame's form).")
@click.option("--window", type=click.IntRange(min=1, max=2**63 - 1), default=5, show_default=True, help="Judge the last N successful runs.")
@click.option("--since", default=None, help="Only runs started on or after this date (YYYY-MM-DD, UTC).")
@click.option("--store", "url", default=None, help=STORE_HELP)
@_friendly
def check_command(references: Path, window: int, since: str | None, url: str | None) -> None:
    """Check stored runs against references; exit status 1 on a regression, 0 otherwise."""
    from mlhpc.store.api import check_references
    from mlhpc.store.check import render
    from mlhpc.store.queries import Filters, parse_date_ms

    filters = Filters(since_ms=parse_date_ms(since) if since else None)
    verdicts = check_references(_open(url), references, window, filters)
    echo(render(verdicts))
    if any(v.verdict == "regression" for v in verdicts):
        sys.exit(1)
