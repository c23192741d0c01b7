"""The one library call behind each ``mlhpc results`` command (the CLI parses and prints)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from mlhpc.errors import ConfigError
from mlhpc.store import check as checks
from mlhpc.store import compare as comparing
from mlhpc.store import scaling as scaling_mod
from mlhpc.store.engine import Store
from mlhpc.store.queries import Filters, parse_selection, select_runs


def _times(store: Store, filters: Filters) -> list[float]:
    rows = select_runs(store, replace(filters, status="success"), ("time_to_train_s",))
    return [r["time_to_train_s"] for r in rows if r["time_to_train_s"] is not None]


def compare_selections(store: Store, a: str, b: str, alpha: float = 0.05) -> comparing.Comparison:
    """Compare the successful runs of selection ``a`` with those of ``b`` (each a filter
    expression or a campaign id, `mlhpc.store.queries.parse_selection`).

    Raises:
        ConfigError: a bad selection. StoreError: the store cannot be read.
    """
    sides = [comparing.Side(expr, tuple(_times(store, parse_selection(expr)))) for expr in (a, b)]
    return comparing.compare_times(sides[0], sides[1], alpha)


def scaling_report(store: Store, filters: Filters, mode: str = "strong",
                   png: Path | None = None) -> tuple[list[dict[str, Any]], Path | None]:
    """Scaling of ``filters.benchmark`` (required): table rows (`mlhpc.store.scaling.table_rows`)
    and, when ``png`` is given, the plot written there.

    ``filters.campaign`` selects the own runs of that campaign only: published runs carry no
    campaign, and the published systems of the benchmark stay beside the campaign's runs
    (``filters.source="own"`` leaves them out).

    Raises:
        ConfigError: no benchmark given, or no successful run with a node count selected.
        StoreError: the store cannot be read. OSError: the PNG cannot be written.
    """
    if not filters.benchmark:
        raise ConfigError("scaling: give --benchmark (one benchmark per plot)")
    rows = select_runs(store, replace(filters, campaign=None))
    if filters.campaign is not None:
        rows = [r for r in rows if r["source"] != "own" or r["campaign_id"] == filters.campaign]
    series = scaling_mod.build_series(rows, mode)
    if not series:
        raise ConfigError(f"scaling: no successful {filters.benchmark} run with a node count in the store")
    written = None
    if png is not None:
        written = scaling_mod.plot(series, png, f"{filters.benchmark}: {mode} scaling", mode)
    return scaling_mod.table_rows(series), written


def check_references(store: Store, references: Path, window: int = 5,
                     filters: Filters | None = None) -> list[checks.Verdict]:
    """Judge each reference in the file against the last ``window`` successful runs of its system
    and benchmark (within ``filters``, e.g. a date range), `mlhpc.store.check.judge`.

    Raises:
        ConfigError: a bad references file or window. StoreError: the store cannot be read.
    """
    if window < 1:
        raise ConfigError(f"--window {window}: expected at least 1 run")
    base = filters or Filters()
    verdicts = []
    for ref in checks.load_references(references):
        rows = select_runs(store, replace(base, system=ref.system, benchmark=ref.benchmark, status="success"),
                           (ref.figure,))
        values = [r[ref.figure] for r in rows if r[ref.figure] is not None][-window:]
        verdicts.append(checks.judge(ref, values))
    return verdicts
