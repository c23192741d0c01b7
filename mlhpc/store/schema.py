"""The store's tables and their migrations (a small ``schema_version`` table, one row per step).

Version 1 held the run and its log; version 2 added ``energy_to_train_j`` and ``campaign_id``
(an index on it); version 3 ``departs_from_reference`` (how an own run's config departs from the
reference run, e.g. a mini config: ``; ``-joined, from its ``measured_N.json``; None for a run
that does not, or whose side file is gone); version 4 HPC AI500's ``valid_flops_per_s``,
``valid_flops_per_w`` and the ``valid_flops_exponent`` they were made with
(`mlhpc.report.validflops`; None where FLOPs per sample are not known). `migrate` applies the missing steps in one transaction, under a lock that
serialises concurrent first openings (SQLite ``BEGIN IMMEDIATE``, PostgreSQL an advisory
transaction lock), so several processes opening a new store at once create it once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

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

#: The schema version this code reads and writes.
SCHEMA_VERSION = 4
#: An arbitrary 64-bit key for PostgreSQL's advisory lock around migrations.
_PG_LOCK_KEY = 0x6D6C687063

metadata = MetaData()

schema_version = Table(
    "schema_version", metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("applied_at", String(40), nullable=False),
)

#: One row per run, keyed by the SHA-256 of its log's bytes.
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
    Index("ix_runs_benchmark_system", "benchmark", "system"),
    Index("ix_runs_run_start", "run_start_ms"),
)

#: Columns each migration step adds to ``runs`` (step 1 creates the tables without them).
_ADDED = {2: (("energy_to_train_j", "FLOAT"), ("campaign_id", "VARCHAR(128)")),
          3: (("departs_from_reference", "TEXT"),),
          4: (("valid_flops_per_s", "FLOAT"), ("valid_flops_per_w", "FLOAT"), ("valid_flops_exponent", "FLOAT"))}

runs.append_column(Column("energy_to_train_j", Float))
runs.append_column(Column("campaign_id", String(128)))
runs.append_column(Column("departs_from_reference", Text))
for _name in ("valid_flops_per_s", "valid_flops_per_w", "valid_flops_exponent"):
    runs.append_column(Column(_name, Float))
Index("ix_runs_campaign", runs.c.campaign_id)


def now_utc() -> str:
    """The current time, ISO 8601 in UTC with seconds (``2025-01-31T12:00:00+00:00``)."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _step_1(conn: Connection) -> None:
    """Create both tables as version 1 had them (without the columns of later steps)."""
    later = {name for cols in _ADDED.values() for name, _ in cols}
    meta = MetaData()
    Table("schema_version", meta, *[c._copy() for c in schema_version.columns])
    Table("runs", meta, *[c._copy() for c in runs.columns if c.name not in later],
          Index("ix_runs_benchmark_system", "benchmark", "system"), Index("ix_runs_run_start", "run_start_ms"))
    meta.create_all(conn)


def _step_2(conn: Connection) -> None:
    for name, sql_type in _ADDED[2]:
        conn.execute(text(f"ALTER TABLE runs ADD COLUMN {name} {sql_type}"))
    conn.execute(text("CREATE INDEX ix_runs_campaign ON runs (campaign_id)"))


def _add_columns(version: int) -> Callable[[Connection], None]:
    """The migration step that adds the columns ``_ADDED[version]`` lists."""
    def step(conn: Connection) -> None:
        for name, sql_type in _ADDED[version]:
            conn.execute(text(f"ALTER TABLE runs ADD COLUMN {name} {sql_type}"))
    return step


STEPS: dict[int, Callable[[Connection], None]] = {1: _step_1, 2: _step_2, 3: _add_columns(3), 4: _add_columns(4)}


def current_version(conn: Connection) -> int:
    """The highest applied version (0 for an empty database)."""
    if not inspect(conn).has_table("schema_version"):
        return 0
    value = conn.execute(select(schema_version.c.version).order_by(schema_version.c.version.desc())).scalar()
    return int(value or 0)


def migrate(conn: Connection, upto: int = SCHEMA_VERSION) -> list[int]:
    """Apply the missing migration steps up to ``upto`` inside the caller's transaction.

    Args:
        conn: a connection inside a write transaction (SQLite: begun IMMEDIATE).
        upto: the version to reach (tests make older stores with it).

    Returns:
        the versions applied (empty when the store was current).

    Raises:
        RuntimeError: the store is newer than this code (its version above `SCHEMA_VERSION`).
    """
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
    have = current_version(conn)
    if have > SCHEMA_VERSION:
        raise RuntimeError(f"the results store has schema version {have}; this mlhpc reads up to "
                           f"{SCHEMA_VERSION}: upgrade mlhpc")
    applied = []
    for version in range(have + 1, upto + 1):
        STEPS[version](conn)
        conn.execute(schema_version.insert().values(version=version, applied_at=now_utc()))
        applied.append(version)
    return applied
