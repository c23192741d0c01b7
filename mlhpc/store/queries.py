"""Reading the store: selections of runs (filters), listing, one run shown, its log back.

A selection is a `Filters` record; on the command line it is given as options (``list``) or as
one expression ``key=value,key=value`` (``compare``), where a bare word is a campaign id. Dates
(``since``/``until``) bound the run's ``run_start`` (UTC), as ``YYYY-MM-DD`` or ISO 8601.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import zlib
from dataclasses import dataclass, fields
from typing import Any

from sqlalchemy import Select, select

from mlhpc.errors import ConfigError
from mlhpc.store import schema
from mlhpc.store.engine import Store, StoreError, read
from mlhpc.text import clip, terminal

#: The columns `list_runs` gives, in order (the JSON keys of ``mlhpc results list``).
LIST_COLUMNS = ("run_id", "benchmark", "system", "nodes", "accelerators", "global_batch_size", "status",
                "time_to_train_s", "epochs_to_target", "samples_per_s", "energy_to_train_j", "valid_flops_per_s", "source",
                "campaign_id", "run_start", "log_sha256")
FORMATS = ("table", "json", "csv")
#: The scaling modes a selection can ask for; an own run folder (``scaling`` column "runs") is
#: scored as a strong-scaling set.
SCALING_MODES = ("strong", "weak")


@dataclass(frozen=True)
class Filters:
    """Which runs: each field None for any. ``since``/``until`` in ms since the Unix epoch;
    ``scaling`` is ``strong`` (MLCommons strong-scaling folders and mlhpc's own run folders, both
    scored by the olympic mean) or ``weak`` (weak-scaling folders, scored by throughput)."""

    benchmark: str | None = None
    system: str | None = None
    nodes: int | None = None
    status: str | None = None
    source: str | None = None
    campaign: str | None = None
    scaling: str | None = None
    since_ms: float | None = None
    until_ms: float | None = None


#: The largest whole number a selection, a run id or a store column holds (SQL BIGINT, int64).
INT64_MAX = 2**63 - 1
#: Dates a selection may name: datetime's range, less a day at each end (a zone or an end of
#: day moves a date by up to a day).
_DATES = (dt.datetime(1, 1, 2, tzinfo=dt.timezone.utc), dt.datetime(9999, 12, 30, tzinfo=dt.timezone.utc))


def parse_count(text: str, what: str, least: int = 1) -> int:
    """``text`` as a whole number of ASCII digits from ``least`` to `INT64_MAX` (what the store's
    columns hold): ``"²"``, ``"٣"``, ``"+4"``, ``"1e3"`` or 20 digits are refused, not
    read by Python's ``int``, which takes any Unicode digit and any size.

    Raises:
        ConfigError: ``WHAT: VALUE is not a whole number from LEAST to 9223372036854775807``.
    """
    digits = text.strip()
    if digits and len(digits) <= 19 and all("0" <= c <= "9" for c in digits):
        value = int(digits)
        if least <= value <= INT64_MAX:
            return value
    raise ConfigError(f"{what}: {clip(repr(text), 80)} is not a whole number from {least} to {INT64_MAX}")


def parse_date_ms(value: str, end: bool = False) -> float:
    """``YYYY-MM-DD`` or ISO 8601 -> ms since the epoch (UTC when no zone; a bare date's end
    of day when ``end``), from 0001-01-02 to 9999-12-30 (datetime's range, a day kept at
    each end for zones).

    Raises:
        ConfigError: not a date of ASCII digits, or outside that range.
    """
    text = value.strip()
    try:
        if not text.isascii():
            raise ValueError(text)
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"date {clip(repr(value), 80)}: expected YYYY-MM-DD or ISO 8601") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    if not _DATES[0] <= when <= _DATES[1]:
        raise ConfigError(f"date {clip(repr(value), 80)}: outside {_DATES[0].date()} .. "
                          f"{_DATES[1].date()}; leave the bound out for no bound")
    if end and len(text) == 10:
        when += dt.timedelta(days=1)
    return when.timestamp() * 1000.0


def parse_selection(expression: str) -> Filters:
    """``"benchmark=cosmoflow,system=x,nodes=4,since=2025-01-01"`` -> `Filters`; a bare word
    (no ``=``) is a campaign id. Every value is checked where it is read (`parse_count`,
    `parse_date_ms`); a message shows at most a few hundred characters of the expression.

    Raises:
        ConfigError: an unknown key or a bad value, naming it.
    """
    if "=" not in expression:
        return Filters(campaign=expression.strip())
    values: dict[str, Any] = {}
    names = {f.name for f in fields(Filters)} - {"since_ms", "until_ms"} | {"since", "until"}
    shown = f"selection {clip(repr(expression), 120)}"
    for part in filter(None, (p.strip() for p in expression.split(","))):
        key, _, value = part.partition("=")
        key = key.strip()
        if key not in names:
            raise ConfigError(f"{shown}: unknown key {clip(repr(key), 80)} (one of {', '.join(sorted(names))})")
        if key in ("since", "until"):
            values[f"{key}_ms"] = parse_date_ms(value.strip(), end=key == "until")
        elif key == "scaling" and value.strip() not in SCALING_MODES:
            raise ConfigError(f"{shown}: scaling={clip(repr(value), 80)}: one of {', '.join(SCALING_MODES)}")
        elif key == "nodes":
            values[key] = parse_count(value, f"{shown}: nodes")
        else:
            values[key] = value.strip()
    return Filters(**values)


def _where(query: Select, filters: Filters) -> Select:
    c = schema.runs.c
    for name, column in (("benchmark", c.benchmark), ("system", c.system), ("nodes", c.nodes),
                         ("status", c.status), ("source", c.source), ("campaign", c.campaign_id)):
        value = getattr(filters, name)
        if value is not None:
            query = query.where(column == value)
    if filters.scaling is not None:
        query = query.where(c.scaling.in_(("strong", "runs") if filters.scaling == "strong" else (filters.scaling,)))
    if filters.since_ms is not None:
        query = query.where(c.run_start_ms >= filters.since_ms)
    if filters.until_ms is not None:
        query = query.where(c.run_start_ms < filters.until_ms)
    return query


def _iso(ms: float | None) -> str | None:
    if ms is None:
        return None
    return dt.datetime.fromtimestamp(ms / 1000.0, dt.timezone.utc).isoformat(timespec="seconds")


def select_runs(store: Store, filters: Filters, columns: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """The runs matching ``filters`` (without their logs), ordered by run start then id.

    Returns:
        one dict per run: every column but ``log_zlib``, plus ``run_start`` (ISO 8601 UTC).

    Raises:
        StoreError: the store cannot be read.
    """
    wanted = [col for col in schema.runs.c if col.name != "log_zlib" and (columns is None or col.name in columns
                                                                          or col.name == "run_start_ms")]
    query = _where(select(*wanted), filters).order_by(schema.runs.c.run_start_ms, schema.runs.c.run_id)
    with read(store) as conn:
        rows = [dict(row._mapping) for row in conn.execute(query)]
    for row in rows:
        row["run_start"] = _iso(row.get("run_start_ms"))
    return rows


def list_runs(store: Store, filters: Filters) -> list[dict[str, Any]]:
    """`select_runs` reduced to `LIST_COLUMNS` (what ``mlhpc results list`` shows)."""
    return [{k: row.get(k) for k in LIST_COLUMNS} for row in select_runs(store, filters, LIST_COLUMNS)]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.0f}"
    return terminal(value, newlines=False)  # escapes shown before widths are measured


def render_rows(rows: list[dict[str, Any]], fmt: str, columns: tuple[str, ...] = LIST_COLUMNS) -> str:
    """Rows as ``table`` (aligned text; ``log_sha256`` cut to 12 characters), ``json`` or ``csv``.

    Raises:
        ConfigError: an unknown format.
    """
    if fmt == "json":
        return json.dumps(rows, indent=2)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue()
    if fmt != "table":
        raise ConfigError(f"format {clip(repr(fmt), 80)}: one of {', '.join(FORMATS)}")
    cells = [[_cell(row.get(c))[:12] if c == "log_sha256" else _cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(lines) + f"\n{len(rows)} run(s)"


def get_run(store: Store, ref: str) -> dict[str, Any]:
    """One run by id or by (a unique prefix of, at least 8 characters) its log's SHA-256, with its
    log decompressed under ``log`` (text, UTF-8 else Latin-1).

    Raises:
        StoreError: no such run, or the prefix is ambiguous.
    """
    c = schema.runs.c
    shown = clip(repr(ref), 80)
    if ref.isdigit():  # a run id: ASCII digits within int64 (`parse_count`; "²" is a digit too)
        query = select(schema.runs).where(c.run_id == parse_count(ref, "run", least=0))
    elif 8 <= len(ref) <= 64 and all(ch in "0123456789abcdef" for ch in ref.lower()):
        query = select(schema.runs).where(c.log_sha256.like(ref.lower() + "%"))
    else:
        raise StoreError(f"run {shown}: give a run id or 8 to 64 hex digits of the log's SHA-256")
    with read(store) as conn:
        rows = [dict(r._mapping) for r in conn.execute(query.limit(2))]
    if not rows:
        raise StoreError(f"run {shown}: not in the store {store.url}")
    if len(rows) > 1:
        raise StoreError(f"run {shown}: more than one run's log hash starts so; give more digits")
    row = rows[0]
    data = zlib.decompress(row.pop("log_zlib"))
    try:
        row["log"] = data.decode("utf-8")
    except UnicodeDecodeError:
        row["log"] = data.decode("latin-1")
    row["run_start"] = _iso(row.get("run_start_ms"))
    return row


def show_text(row: dict[str, Any]) -> str:
    """One run as ``field: value`` lines (the log itself left out: ``--log`` prints it)."""
    return "\n".join(f"{key}: {_cell(value)}" for key, value in row.items() if key != "log")
