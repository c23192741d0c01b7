"""``mlhpc results``: every run kept in a results store, compared over time, across node
counts and with MLCommons' published rounds.

Modules, one job each:

- `schema`: the tables (and a ``schema_version`` table: the version a store was made with);
- `engine`: the store's URL (``--store``, ``$MLHPC_STORE``, the default SQLite file), opening it,
  SQLite's WAL, busy timeout and retried write transactions, the network-file-system warning;
- `ingest`: run folders and MLCommons trees -> rows (figures from `mlhpc.report`), logs refused
  one line each; `record`: `record_run` for ``mlhpc run``;
- `queries`: selections, list, show; `compare`, `scaling`, `check`: the three analyses;
- `api`: the library call behind each command; `cli`: the click group.
"""

from __future__ import annotations

from mlhpc.store.engine import Store, StoreError, default_path, open_store, resolve_url
from mlhpc.store.ingest import IngestResult, ingest_paths
from mlhpc.store.queries import Filters, list_runs, parse_selection
from mlhpc.store.record import record_run

__all__ = ["Filters", "IngestResult", "Store", "StoreError", "default_path", "ingest_paths", "list_runs",
           "open_store", "parse_selection", "record_run", "resolve_url"]
