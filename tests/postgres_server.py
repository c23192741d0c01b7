"""A throwaway PostgreSQL cluster for the results-store tests (tests/test_store_postgres.py).

``postgres_url`` (session scope) runs Debian's ``initdb`` and ``pg_ctl`` (from
``/usr/lib/postgresql/*/bin``, installed by .ci/install-postgres.sh) on a cluster in a temporary
folder, listening only on a unix socket in that folder, with trust authentication; as root it
runs them as the ``postgres`` user (PostgreSQL refuses to run as root). The cluster is stopped
and removed at the end of the session. The tests are skipped only where PostgreSQL's server
programs are not installed (saying so); a cluster that does not start is a test failure.

Import the fixture into a test module with ``from postgres_server import postgres_url``.
"""

from __future__ import annotations

import glob
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest


def server_bin() -> Path | None:
    """The newest ``/usr/lib/postgresql/<major>/bin`` holding initdb and pg_ctl, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    return Path(found[-1]).parent if found else None


def _reachable_by_the_server_user(path: Path) -> None:
    """Let other users traverse (``o+x``, not list) the folders above ``path`` that this test
    session made (the session folder is private, 0700), so that the ``postgres`` user reaches its
    cluster; nothing above the first folder the session does not own is touched."""
    for folder in path.parents:
        if str(folder) in ("/", "/tmp") or folder.stat().st_uid != os.geteuid():
            break
        folder.chmod(stat.S_IMODE(folder.stat().st_mode) | 0o001)


def _as_server_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", "postgres", "--"] + cmd


@pytest.fixture(scope="session")
def postgres_url():
    """``postgresql+psycopg://postgres@/postgres?host=<socket folder>`` of a fresh cluster."""
    bindir = server_bin()
    if bindir is None:
        pytest.skip("PostgreSQL server programs not found under /usr/lib/postgresql/*/bin "
                    "(install them with .ci/install-postgres.sh or apt-get install postgresql; in CI "
                    "that step is best effort and says above why it did not install them)")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("running as root without runuser to start PostgreSQL as the postgres user")
    root = Path(tempfile.mkdtemp(prefix="mlhpc-pg-"))
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        _reachable_by_the_server_user(root)
    env = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
    init = subprocess.run(_as_server_user([str(bindir / "initdb"), "-D", str(data), "-U", "postgres",
                                           "--auth=trust", "-E", "UTF8"]),
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    if init.returncode != 0:
        pytest.fail(f"initdb failed (exit {init.returncode}):\n{init.stdout}\n{init.stderr}")
    options = f"-k {root} -c listen_addresses='' -c max_connections=50 -c fsync=off"
    start = subprocess.run(_as_server_user([str(bindir / "pg_ctl"), "-D", str(data), "-o", options,
                                            "-l", str(root / "server.log"), "-w", "-t", "120", "start"]),
                           capture_output=True, text=True, timeout=300, env=env, check=False)
    if start.returncode != 0:
        log = (root / "server.log").read_text() if (root / "server.log").exists() else ""
        pytest.fail(f"pg_ctl start failed (exit {start.returncode}):\n{start.stdout}\n{start.stderr}\n{log}")
    try:
        yield f"postgresql+psycopg://postgres@/postgres?host={root}"
    finally:
        subprocess.run(_as_server_user([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]),
                       capture_output=True, text=True, timeout=120, env=env, check=False)
        shutil.rmtree(root, ignore_errors=True)


def fresh_database(url: str, name: str) -> str:
    """Create database ``name`` on the cluster at ``url`` (dropping an old one); its URL."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    base, _, query = url.partition("?")
    return f"{base.rsplit('/', 1)[0]}/{name}?{query}"
