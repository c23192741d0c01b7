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


def test_a_database_of_someone_elses_is_refused_untouched_postgres(url):
    """A PostgreSQL database that already holds a table and no schema_version (a site's own) is
    not adopted: `mlhpc results list` says so in one line, exit 2, and makes nothing in it."""
    from click.testing import CliRunner

    from mlhpc.cli import main

    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE jobs (id integer primary key, name text)"))
        conn.execute(text("INSERT INTO jobs VALUES (1, 'theirs')"))
    result = CliRunner().invoke(main, ["results", "list", "--store", url])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "not an mlhpc results store" in lines[0] and "jobs" in lines[0], lines[0]
    with engine.connect() as conn:
        tables = sorted(r[0] for r in conn.execute(text(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")))
        assert tables == ["jobs"]
        assert conn.execute(text("SELECT name FROM jobs")).scalar_one() == "theirs"
    engine.dispose()
