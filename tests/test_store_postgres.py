"""The results store's core tests against a real PostgreSQL, started by the tests
(tests/postgres_server.py); skipped only where PostgreSQL's server programs are not installed."""

from __future__ import annotations

import itertools
import signal
import subprocess
import time

import pytest
from postgres_server import fresh_database, postgres_url  # noqa: F401 (a fixture)
from sqlalchemy import create_engine, text
from test_store import (  # noqa: F401
    _ingest_script,
    compare_verdicts,
    concurrent_writers,
    make_runs,
    test_check_references,
    test_compare_by_campaign,
    test_filters,
    test_hostile_logs_refused_rest_ingested,
    test_ingest_is_idempotent,
)

from mlhpc.store import open_store, schema
from mlhpc.store.ingest import ingest_paths

_names = itertools.count()


@pytest.fixture
def url(postgres_url):  # noqa: F811 (the fixture imported above)
    """A fresh database on the session's cluster for each test."""
    return fresh_database(postgres_url, f"store_{next(_names)}")


def test_concurrent_writers_lose_nothing_postgres(url, tmp_path):
    concurrent_writers(url, tmp_path)


def test_compare_verdicts_postgres(url, tmp_path):
    compare_verdicts(url, tmp_path)


def test_schema_version_postgres(url):
    store = open_store(url)
    with store.engine.connect() as conn:
        assert [v for (v,) in conn.execute(text("select version from schema_version order by version"))] == [schema.SCHEMA_VERSION]
    store.close()


def test_kill_mid_ingest_postgres(url, tmp_path):
    open_store(url).close()
    folders = [make_runs(tmp_path / "many" / f"f{i:03d}", [10.0 + i, 11.0 + i, 12.0 + i], offset_ms=i)
               for i in range(150)]
    engine = create_engine(url)
    proc = subprocess.Popen(_ingest_script(url, [tmp_path / "many"]))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.05)
        with engine.connect() as conn:
            if conn.execute(text("select count(*) from runs")).scalar() >= 30:
                break
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    time.sleep(0.5)  # the server notices the dropped connection and rolls its transaction back
    with engine.connect() as conn:
        per_folder = dict(conn.execute(text("select folder, count(*) from runs group by folder")).all())
    engine.dispose()
    assert 0 < len(per_folder) < len(folders)
    assert set(per_folder.values()) == {3}
    result = ingest_paths(open_store(url), [tmp_path / "many"])
    assert len(result.added) == 3 * (len(folders) - len(per_folder))
