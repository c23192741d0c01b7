"""The library call behind each ``mlhpc results`` command (the CLI parses and prints)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from mlhpc.errors import ConfigError
from mlhpc.text import clip
from mlhpc.store import check as checks
from mlhpc.store import compare as comparing
from mlhpc.store import scaling as scaling_mod
from mlhpc.store.engine import Store
from mlhpc.store.queries import Filters, parse_selection, select_runs


_COMPARE_COLUMNS = ("time_to_train_s", "status", "scaling", "folder", "run_start_ms", "run_stop_ms")


def _mode(row: dict[str, Any]) -> str:
    return "weak" if row["scaling"] == "weak" else "strong"  # an own run folder scores as strong


def _selected(store: Store, expression: str) -> list[dict[str, Any]]:
    rows = select_runs(store, parse_selection(expression), _COMPARE_COLUMNS)
    if not rows:
        raise ConfigError(f"selection {clip(repr(expression), 120)}: no run in the store {store.url} matches it "
                          "(mlhpc results list shows what is stored)")
    return rows


def _pick_mode(a: list[dict[str, Any]], b: list[dict[str, Any]], labels: tuple[str, str]) -> str:
    modes_a, modes_b = {_mode(r) for r in a}, {_mode(r) for r in b}
    common = modes_a & modes_b
    if not common:
        raise ConfigError(f"A ({labels[0]}) holds only {'/'.join(sorted(modes_a))}-scaling runs and B "
                          f"({labels[1]}) only {'/'.join(sorted(modes_b))}-scaling ones: strong and weak "
                          "scaling scores are not compared")
    return "strong" if "strong" in common else "weak"


def _side(label: str, rows: list[dict[str, Any]], mode: str) -> comparing.Side:
    mine = [r for r in rows if _mode(r) == mode]
    ok = [r for r in mine if r["status"] == "success" and r["time_to_train_s"] is not None]
    return comparing.Side(
        label, tuple(r["time_to_train_s"] for r in ok), mode,
        tuple((r["run_start_ms"], r["run_stop_ms"]) for r in ok
              if r["run_start_ms"] is not None and r["run_stop_ms"] is not None),
        failed=len(mine) - len(ok), folders=len({r["folder"] for r in mine}), left_out=len(rows) - len(mine))


def compare_selections(store: Store, a: str, b: str, alpha: float = 0.05) -> comparing.Comparison:
    """Compare the runs of selection ``a`` with those of ``b`` (each a filter expression or a
    campaign id, `mlhpc.store.queries.parse_selection`) in one scaling mode: the one both
    selections ask for (``scaling=``), else strong scaling when both hold strong-scaling runs
    (own runs included), else weak; the other mode's runs are left out and counted.

    Raises:
        ConfigError: a bad selection, one that matches no run, or two selections with no
            scaling mode in common. StoreError: the store cannot be read.
    """
    rows_a, rows_b = _selected(store, a), _selected(store, b)
    mode = _pick_mode(rows_a, rows_b, (a, b))
    return comparing.compare_times(_side(a, rows_a, mode), _side(b, rows_b, mode), alpha)


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
        values = [r[ref.figure] for r in rows if checks.in_bounds(ref.figure, r[ref.figure])][-window:]
        verdicts.append(checks.judge(ref, values))
    return verdicts
