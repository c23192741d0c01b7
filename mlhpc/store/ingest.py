"""Filling the store: run folders and MLCommons result trees -> one row per log.

The figures come from `mlhpc.report` (`score_folder`, which parses each log with `parse_log`
and summarises it with `summarize_run`, energy included), never from a second reading of the
log; the folder's place in the MLCommons layout gives round, submitter, system and its
description. Each log is read by the report's log reader (`mlhpc.log.parse.read_log`) and
refused, with one line naming it, when it is a link, not a regular file, larger than
`mlhpc.log.parse.MAX_LOG_BYTES`, holds no MLLOG record, has a malformed
record line, or names no benchmark; the other logs are ingested. A folder's rows go in one
transaction: a kill leaves the folder wholly in or wholly out. A log already present (same
SHA-256 of its bytes) is not added again.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, select

from mlhpc.data.inputs import SIDE_FILE_BYTES, read_input, read_json_object
from mlhpc.errors import DataError, LogFormatError
from mlhpc.log.parse import ParsedLog, decode_log, read_log
from mlhpc.log.plausible import out_of_range
from mlhpc.report.folders import find_result_folders, sidecars
from mlhpc.report.reported import ReportedRun
from mlhpc.report.score import FolderResult, score_folder
from mlhpc.store import schema
from mlhpc.store.engine import Store, retrying


@dataclass
class IngestResult:
    """What an ingest did: new run ids, logs already stored, and refusals (one line each)."""

    added: list[int] = field(default_factory=list)
    already: int = 0
    refused: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Log:
    data: bytes
    parsed: ParsedLog


def screen(path: Path) -> _Log | str:
    """Read and parse one log, or say in one line why it is refused (see the module docstring)."""
    if os.path.islink(path):  # a log named in a tree is stored under its own name
        return f"{path}: a symbolic link, not followed"
    try:
        parsed = decode_log(data := read_log(path), path)
    except LogFormatError as exc:
        return str(exc)
    if parsed.malformed:
        return f"{parsed.malformed[0].message} (malformed record line)"
    if not parsed.events:
        return f"{path}: no MLLOG records"
    return _Log(data, parsed)


def _software(log: Path) -> dict[str, Any]:
    """Software versions from ``env_N.json`` beside an mlhpc log (None where absent)."""
    env = next((read_json_object(p, "side file") for p in sidecars(log, "env", ".json")), {})
    versions = env.get("versions") if isinstance(env.get("versions"), dict) else {}
    commit = env.get("git_commit")
    return {"mlhpc_version": versions.get("mlhpc"), "mlhpc_commit": commit if isinstance(commit, str) else None,
            "torch_version": versions.get("torch"), "cuda_version": env.get("cuda"),
            "driver_version": env.get("driver") or env.get("driver_version"),
            "mlperf_logging_version": versions.get("mlperf-logging"),
            "_host": {k: env[k] for k in ("hostname", "cpu_model", "gpu_names") if k in env}}


def _config_hash(log: Path) -> str | None:
    for path in sidecars(log, "config", ".yaml"):
        try:
            return hashlib.sha256(read_input(path, SIDE_FILE_BYTES, path.parent, "side file")).hexdigest()
        except DataError:
            continue
    return None


def _departures(log: Path) -> str | None:
    """How an mlhpc run departs from the reference (``departs_from_reference`` of its
    ``measured_N.json``), ``; ``-joined; None when it does not or the file is absent."""
    listed = next((read_json_object(p, "side file").get("departs_from_reference")
                   for p in sidecars(log, "measured", ".json")), None)
    return "; ".join(str(item) for item in listed)[:4000] if isinstance(listed, list) and listed else None


def _seed(parsed: ParsedLog) -> int | None:
    event = parsed.first("seed")
    value = event.value if event is not None else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any, limit: int = 256) -> str | None:
    return None if value is None else str(value)[:limit]


def _valid_flops(run: ReportedRun) -> dict[str, Any]:
    """HPC AI500's figures of the run (`mlhpc.report.validflops`, n = 5), None where unknown."""
    v = run.valid_flops
    if v is None or v.valid_flops_per_s is None:
        return {"valid_flops_per_s": None, "valid_flops_per_w": None, "valid_flops_exponent": None}
    return {"valid_flops_per_s": v.valid_flops_per_s, "valid_flops_per_w": v.valid_flops_per_w,
            "valid_flops_exponent": v.exponent}


def run_row(folder: FolderResult, run: ReportedRun, log: _Log, campaign_id: str | None) -> dict[str, Any]:
    """The ``runs`` row of one summarised log (see `mlhpc.store.schema.runs`)."""
    path = Path(run.facts.path)
    own = folder.kind == "runs"
    software = _software(path) if own else {}
    host = software.pop("_host", {})
    facts = run.facts
    said, timing = facts.submission, facts.timing
    nodes = said.number_of_nodes
    description = folder.system_desc if not own else host
    return {
        "log_sha256": log.parsed.sha256, "source": "own" if own else "published",
        "benchmark": _text(folder.benchmark or said.benchmark, 64), "division": _text(said.division or folder.division, 16),
        "system": _text(folder.system), "system_description": json.dumps(description, sort_keys=True) if description else None,
        "submitter": _text(folder.submitter), "round": _text(folder.round, 64), "scaling": folder.kind,
        "folder": str(path.parent), "log_name": path.name,
        "nodes": nodes, "accelerators_per_node": said.accelerators_per_node,
        "accelerators": nodes * max(said.accelerators_per_node or 0, 1) if nodes else None,
        "global_batch_size": said.global_batch_size, "seed": _seed(log.parsed),
        "config_hash": _config_hash(path) if own else None,
        "departs_from_reference": _departures(path) if own else None,
        **{k: _text(v, 64) for k, v in software.items()},
        "status": timing.status, "dropped_reason": folder.dropped.get(facts.path),
        "run_start_ms": timing.run_start_ms, "run_stop_ms": timing.run_stop_ms,
        "time_to_train_s": timing.time_to_train_s, "staging_s": facts.staging.staging_s, "init_s": facts.staging.init_s,
        "epochs_to_target": facts.quality.epochs_to_target, "metric_key": facts.quality.metric_key,
        "final_metric": _finite(facts.quality.metric_series[-1][1]) if facts.quality.metric_series else None,
        "samples_per_s": facts.training.samples_per_s, "energy_to_train_j": run.power.energy_to_train_j,
        **_valid_flops(run),
        "campaign_id": campaign_id, "ingested_at": schema.now_utc(),
        "log_bytes": len(log.data), "log_zlib": zlib.compress(log.data, 6),
    }


def _finite(value: float) -> float | None:
    """``value``, or None where it is not a finite number (a diverged run's NaN quality is kept
    as "not measured": the run is stored, never credited)."""
    return None if out_of_range(value) else value


def _row_problem(row: dict[str, Any]) -> str | None:
    """Why a row cannot be stored as it is, or None: each number in it (read from the log or
    made from its values, such as accelerators = nodes x accelerators per node) passes the one
    range check (`mlhpc.log.plausible.out_of_range`: finite, an integer within 64 bits)."""
    for key, value in row.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and (problem := out_of_range(value)):
            return f"{key} {problem}"
    return None


def _insert(conn: Connection, rows: list[dict[str, Any]]) -> tuple[list[int], int]:
    """Insert the rows whose log is not stored yet; (new run ids, rows already present)."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    added, already = [], 0
    for row in rows:
        statement = insert(schema.runs).values(**row).on_conflict_do_nothing(index_elements=["log_sha256"])
        run_id = conn.execute(statement.returning(schema.runs.c.run_id)).scalar()
        if run_id is None:
            already += 1
        else:
            added.append(int(run_id))
    return added, already


def _stored(store: Store, hashes: list[str]) -> set[str]:
    with store.engine.connect() as conn:
        found = conn.execute(select(schema.runs.c.log_sha256).where(schema.runs.c.log_sha256.in_(hashes)))
        return {h for (h,) in found}


def ingest_folder(store: Store, folder: Path, files: list[Path], campaign_id: str | None) -> IngestResult:
    """Screen, score and store one result folder's logs in one transaction (see the module).

    Raises:
        StoreError: the store cannot be written.
    """
    result = IngestResult()
    logs: dict[str, _Log] = {}
    for path in files:
        screened = screen(path)
        if isinstance(screened, str):
            result.refused.append(screened)
        else:
            logs[str(path)] = screened
    if not logs:
        return result
    present = _stored(store, [log.parsed.sha256 for log in logs.values()])
    try:
        scored = score_folder(folder, [Path(p) for p in logs], compliance=False)
    except LogFormatError as exc:
        result.refused.append(f"{folder}: {exc}")
        return result
    rows = []
    for run in scored.runs:
        log = logs[run.facts.path]
        if log.parsed.sha256 in present:
            result.already += 1
        elif not (scored.benchmark or run.facts.submission.benchmark):
            result.refused.append(f"{run.facts.path}: names no benchmark (no submission_benchmark record)")
        else:
            row = run_row(scored, run, log, campaign_id)
            if problem := _row_problem(row):
                result.refused.append(f"{run.facts.path}: {problem} (not stored)")
            else:
                rows.append(row)
    if rows:
        added, already = retrying(store, _insert, rows)
        result.added += added
        result.already += already
    return result


def ingest_paths(store: Store, paths: list[Path], campaign_id: str | None = None) -> IngestResult:
    """Ingest every result folder under ``paths`` (mlhpc run folders, MLCommons trees, logs).

    A path that holds no ``result_*.txt`` is refused (one line); the rest go on.

    Raises:
        StoreError: the store cannot be written.
    """
    total = IngestResult()
    for path in paths:
        try:
            folders = find_result_folders([path])
        except LogFormatError as exc:
            total.refused.append(str(exc))
            continue
        for folder, files in folders:
            part = ingest_folder(store, folder, files, campaign_id)
            total.added += part.added
            total.already += part.already
            total.refused += part.refused
    return total
