"""The store's tables: ``runs`` and a small ``schema_version`` table.

``schema_version`` holds the version of the tables a store was made with (`SCHEMA_VERSION`), so
that a later release can tell which tables it opens and migrate them; this release reads and
writes its own version only. `create` makes the current tables of a new (empty) store in the
caller's transaction, under a lock that serialises concurrent first openings (SQLite
``BEGIN IMMEDIATE``, PostgreSQL an advisory transaction lock), so several processes opening a
new store at once create it once; for a store already made it changes nothing and returns the
version it records (`mlhpc.store.engine.open_store` refuses one that is not `SCHEMA_VERSION`).
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import (
    Column,
    Connection,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    inspect,
    select,
    text,
)

from mlhpc.log.plausible import MAX_INT, out_of_range
from mlhpc.text import clip

#: The schema version this code reads and writes.
SCHEMA_VERSION = 4
#: An arbitrary 64-bit key for PostgreSQL's advisory lock around a store's creation.
_PG_LOCK_KEY = 0x6D6C687063

metadata = MetaData()

schema_version = Table(
    "schema_version", metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("applied_at", String(40), nullable=False),
)

#: One row per run, keyed by the SHA-256 of its log's bytes. ``departs_from_reference``: how an
#: own run's config departs from the reference run, e.g. a mini config (``; ``-joined, from its
#: ``measured_N.json``; None for a run that does not, or whose side file is gone);
#: ``valid_flops_*``: HPC AI500's Valid FLOPS, per watt, and the exponent they were made with
#: (`mlhpc.report.validflops`; None where FLOPs per sample are not known).
runs = Table(
    "runs", metadata,
    Column("run_id", Integer, primary_key=True, autoincrement=True),
    Column("log_sha256", String(64), nullable=False, unique=True),
    Column("source", String(16), nullable=False),  # "own" or "published"
    Column("benchmark", String(64)), Column("division", String(16)),
    Column("system", String(256)), Column("system_description", Text),  # JSON text
    Column("submitter", String(256)), Column("round", String(64)),
    Column("scaling", String(16)),  # "runs" (own), "strong" or "weak" (MLCommons layout)
    Column("folder", Text), Column("log_name", String(256)),
    Column("nodes", Integer), Column("accelerators_per_node", Integer), Column("accelerators", Integer),
    Column("global_batch_size", Integer), Column("seed", Integer), Column("config_hash", String(64)),
    Column("mlhpc_version", String(64)), Column("mlhpc_commit", String(64)),
    Column("torch_version", String(64)), Column("cuda_version", String(64)),
    Column("driver_version", String(64)), Column("mlperf_logging_version", String(64)),
    Column("status", String(16), nullable=False),
    Column("dropped_reason", Text),
    Column("run_start_ms", Float), Column("run_stop_ms", Float),
    Column("time_to_train_s", Float), Column("staging_s", Float), Column("init_s", Float),
    Column("epochs_to_target", Float), Column("metric_key", String(32)), Column("final_metric", Float),
    Column("samples_per_s", Float),
    Column("ingested_at", String(40), nullable=False),
    Column("log_bytes", Integer, nullable=False),
    Column("log_zlib", LargeBinary, nullable=False),
    Column("energy_to_train_j", Float), Column("campaign_id", String(128)),
    Column("departs_from_reference", Text),
    Column("valid_flops_per_s", Float), Column("valid_flops_per_w", Float), Column("valid_flops_exponent", Float),
    Index("ix_runs_benchmark_system", "benchmark", "system"),
    Index("ix_runs_run_start", "run_start_ms"),
    Index("ix_runs_campaign", "campaign_id"),
)


def now_utc() -> str:
    """The current time, ISO 8601 in UTC with seconds (``2025-01-31T12:00:00+00:00``)."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


#: The tables that mark a database as an mlhpc results store (any version).
MARKER_TABLES = frozenset({"schema_version", "runs"})


class BadVersionRow(ValueError):
    """The store's ``schema_version`` table holds no row, or a row that is not a version."""


class NotAStore(ValueError):
    """The database holds tables but no ``schema_version``: someone else's, never adopted."""


def checked_versions(values: list[object]) -> int:
    """The highest of the ``schema_version`` rows' ``values`` (a store's ``version`` column),
    each a whole number from 1 to 2^63 - 1 (`mlhpc.log.plausible.out_of_range`: a hand-edited
    row of ``'abc'``, ``4.5`` or Infinity is not a version).

    Raises:
        BadVersionRow: no row, or a row that is not a version (the reason in words).
    """
    if not values:
        raise BadVersionRow("holds no row")
    for value in values:
        problem = out_of_range(value, 1, MAX_INT) or (None if type(value) is int else
                                                      f"{clip(repr(value), 40)} is not a whole number")
        if problem:
            raise BadVersionRow(f"row {problem}")
    return max(values)  # type: ignore[type-var, return-value]


def current_version(conn: Connection) -> int:
    """The version the store records (its highest ``schema_version`` row; 0 for an empty database).

    Raises:
        BadVersionRow: the table holds no row or a row that is not a version (`checked_versions`).
    """
    if not inspect(conn).has_table("schema_version"):
        return 0
    return checked_versions([v for (v,) in conn.execute(select(schema_version.c.version))])


def create(conn: Connection) -> int:
    """Make the current tables of an empty store inside the caller's transaction, and record
    `SCHEMA_VERSION` in ``schema_version``; a store already made is left as it is.

    Args:
        conn: a connection inside a write transaction (SQLite: begun IMMEDIATE).

    Returns:
        the version the store records: `SCHEMA_VERSION` for one just made, else its own (the
        caller refuses a store whose version is not `SCHEMA_VERSION`).

    Raises:
        NotAStore: the database holds tables and no ``schema_version`` (a PostgreSQL database
            of the site's, say): nothing is made in it.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
    have = current_version(conn)
    if have:
        return have
    tables = sorted(inspect(conn).get_table_names())
    if tables:
        raise NotAStore(f"holds {len(tables)} table(s) ({', '.join(tables[:3])}"
                        f"{', ...' if len(tables) > 3 else ''}) but no schema_version")
    metadata.create_all(conn)
    conn.execute(schema_version.insert().values(version=SCHEMA_VERSION, applied_at=now_utc()))
    return SCHEMA_VERSION
