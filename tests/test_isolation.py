"""The test suite leaves the user's own files alone: every default the code reads points into the
session's temporary folder (tests/conftest.py), and a pytest session started with the user's
defaults pointed at a watched folder leaves that folder exactly as it was."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from conftest import snapshot, user_defaults

from mlhpc.report.compliance import _cache_dir as cache_dir
from mlhpc.store import open_store, record_run
from mlhpc.store.engine import resolve_url

REPO = Path(__file__).resolve().parents[1]


def _session_root() -> Path:
    return Path(os.environ["HOME"]).parent


def test_defaults_point_into_the_session_folder(monkeypatch):
    root = _session_root()
    assert root.name.startswith("mlhpc-tests-")
    assert os.environ["MLHPC_STORE"] == "none" and "MLHPC_CACHE_DIR" not in os.environ
    for path in (Path.home(), Path(tempfile.gettempdir()), cache_dir()):
        assert root in path.parents, path
    monkeypatch.delenv("MLHPC_STORE")
    assert resolve_url().startswith(f"sqlite:///{root}/")


def test_a_run_recorded_with_the_defaults_lands_in_the_session_folder(tmp_path, monkeypatch):
    """What a run does at its end (record itself into the default store), with MLHPC_STORE unset."""
    from test_store import write_log

    monkeypatch.delenv("MLHPC_STORE")
    log = write_log(tmp_path / "run" / "result_0.txt", 3.0)
    assert record_run(log.parent, log, lambda line: None) == 1
    store = _session_root() / "xdg_data_home" / "mlhpc" / "results.db"
    assert store.is_file()
    assert open_store(f"sqlite:///{store}").url.endswith("results.db")


def test_a_session_leaves_the_users_defaults_untouched(tmp_path):
    """Run a few tests that write through the defaults in a child pytest whose HOME, XDG folders,
    store and working folder are the watched folder's: nothing in it changes, and the child's
    own temporary folder is gone when it passes."""
    watched, scratch = tmp_path / "watched", tmp_path / "tmp"
    for name in ("home", "data", "cache", "cwd/results", "cwd/data"):
        (watched / name).mkdir(parents=True)
    scratch.mkdir()
    store = watched / "data" / "mlhpc" / "results.db"
    open_store(f"sqlite:///{store}")  # the user's own store exists, with its tables
    env = {**os.environ, "HOME": str(watched / "home"), "XDG_DATA_HOME": str(watched / "data"),
           "XDG_CACHE_HOME": str(watched / "cache"), "MLHPC_STORE": str(store), "TMPDIR": str(scratch)}
    watched_places = user_defaults(env, watched / "cwd")
    assert store in watched_places or store.parent in watched_places
    before = snapshot([watched])
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:benchmark",  # no ./.benchmarks
         "--rootdir", str(REPO),
         str(REPO / "tests" / "test_isolation.py") + "::test_defaults_point_into_the_session_folder",
         str(REPO / "tests" / "test_isolation.py") + "::test_a_run_recorded_with_the_defaults_lands_in_the_session_folder",
         str(REPO / "tests" / "test_store.py") + "::test_default_location_and_network_fs_warning"],
        cwd=watched / "cwd", env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "3 passed" in proc.stdout
    assert snapshot([watched]) == before
    assert list(scratch.iterdir()) == []  # the child's session folder was removed


def test_the_finish_check_sees_a_change(tmp_path):
    places = [tmp_path / "results", tmp_path / "store.db"]
    places[0].mkdir()
    before = snapshot(places)
    (places[0] / "result_0.txt").write_text("x")
    assert snapshot(places) != before
