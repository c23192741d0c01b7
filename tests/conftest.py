"""Shared fixtures. Paths, not state: every test works in its own tmp_path.

The session never touches the user's own files: before any test (`pytest_configure`) every default
the code reads (``MLHPC_STORE``, ``MLHPC_CACHE_DIR``, ``MLHPC_CAMPAIGN``, ``HOME``, ``XDG_*``,
``TMPDIR``, where staged copies go) is pointed into one session folder, ``mlhpc-tests-*`` in the
temporary folder, removed when the session passes (kept, and named, when it fails). The user's
default results store and the ``results/``, ``data/`` and ``published/`` folders of the
repository and of the working folder are watched: `pytest_sessionfinish` names any of them that
changed during the session. It warns rather than fails, since on a shared machine the user's own
runs may write there meanwhile; tests/test_isolation.py is the test that fails, in a child
session whose defaults all point at a watched folder.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: Environment variables the session points into its own folder (or removes).
REDIRECTED = ("HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "TMPDIR")
REMOVED = ("MLHPC_CACHE_DIR", "MLHPC_CAMPAIGN")
#: The session's folder of things made once and shared by the workers (`made_once`).
SHARED_ENV = "MLHPC_TESTS_SHARED"
_session: dict = {}


def user_defaults(env: dict[str, str] | None = None, cwd: Path | None = None) -> list[Path]:
    """The user's own places the code would write by default, read from ``env``: the results
    store as `mlhpc.store.engine` resolves it, and the ``results/``, ``data/``, ``published/``
    folders of the repository and of ``cwd``."""
    env = dict(os.environ if env is None else env)
    home = Path(env.get("HOME") or Path.home())
    places = [Path(env.get("XDG_DATA_HOME") or home / ".local" / "share") / "mlhpc"]
    store = env.get("MLHPC_STORE", "")
    if store and store != "none" and "://" not in store:
        places.append(Path(store).expanduser())
    elif store.startswith("sqlite:///"):
        places.append(Path(store[len("sqlite:///"):]))
    for base in {REPO, Path(cwd or Path.cwd())}:
        places += [base / "results", base / "data", base / "published"]
    return places


def snapshot(places: list[Path]) -> dict[str, tuple]:
    """Every file and folder under ``places`` (links not followed) -> (kind, size, mtime_ns)."""
    seen: dict[str, tuple] = {}
    for place in places:
        try:
            info = os.lstat(place)
        except OSError:
            continue
        seen[str(place)] = (info.st_mode >> 12, info.st_size, info.st_mtime_ns)
        if os.path.isdir(place) and not os.path.islink(place):
            for root, dirs, files in os.walk(place):
                for name in dirs + files:
                    path = os.path.join(root, name)
                    info = os.lstat(path)
                    seen[path] = (info.st_mode >> 12, info.st_size, info.st_mtime_ns)
    return seen


def pytest_configure(config) -> None:
    if hasattr(config, "workerinput"):
        # a pytest-xdist worker: the controlling session has pointed every default into its
        # folder already, and the worker inherited that environment; it makes no folder of its own
        return
    places = user_defaults()
    _session["places"], _session["before"] = places, snapshot(places)
    root = Path(tempfile.mkdtemp(prefix="mlhpc-tests-"))
    _session["root"] = root
    for name in REDIRECTED:
        (root / name.lower()).mkdir()
        os.environ[name] = str(root / name.lower())
    for name in REMOVED:
        os.environ.pop(name, None)
    os.environ["MLHPC_STORE"] = "none"  # runs made by tests are not recorded (store tests set their own)
    (root / "shared").mkdir()
    os.environ[SHARED_ENV] = str(root / "shared")  # read by `made_once` in every pytest-xdist worker
    tempfile.tempdir = None  # the next gettempdir() reads the new TMPDIR (pytest's tmp_path included)


def made_once(name: str, make: Callable[[Path], None]) -> Path:
    """The folder ``NAME`` of the session's shared folder, made by ``make(folder)`` once per session
    and read by every pytest-xdist worker and module after (tests must not change it). The first
    caller makes it under an exclusive lock while the others wait; a ``make`` that fails leaves
    nothing, so the next caller tries again and fails the same way."""
    shared = Path(os.environ[SHARED_ENV])
    folder = shared / name
    with open(shared / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (shared / f"{name}.made").exists():
            return folder
        shutil.rmtree(folder, ignore_errors=True)  # a failed make's remains, in the session's own folder
        make(folder)
        (shared / f"{name}.made").touch()
    return folder


def pytest_sessionfinish(session, exitstatus) -> None:
    if "places" not in _session:
        return
    before, after = _session["before"], snapshot(_session["places"])
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if changed and reporter is not None:
        reporter.write_line(f"warning: {len(changed)} of the user's own files or folders changed during the "
                            f"session (a test, or another process of yours): {', '.join(changed[:5])}", red=True)
    root = _session["root"]
    if session.exitstatus == 0:
        shutil.rmtree(root, ignore_errors=True)
    elif reporter is not None:
        reporter.write_line(f"test files kept in {root}")
# Published MLCommons result logs, shipped in the repository (see tests/data/mlperf-hpc-results/README.md).
FIXTURES = REPO / "tests" / "data" / "mlperf-hpc-results"
FIXTURES_ARCHIVE = FIXTURES / "mlperf-hpc-results.tar.xz"


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every entry under ``root`` by its relative path: a file's bytes, a link's target text, a
    FIFO as ``b"<fifo>"`` (never opened), so that a test sees any of them changed or gone."""
    found = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_fifo():
            found[rel] = b"<fifo>"
        elif path.is_symlink():
            found[rel] = os.readlink(path).encode()
        elif path.is_file():
            found[rel] = path.read_bytes()
    return found


def compliance_check(log: Path) -> subprocess.CompletedProcess:
    """Run MLCommons' own checker (hpc ruleset 3.0.0) on ``log``, in the log's folder (the checker
    writes compliance_checker.log into its working folder)."""
    return subprocess.run(
        [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "hpc",
         "--ruleset", "3.0.0", str(Path(log).resolve())], capture_output=True, text=True,
        timeout=300, cwd=Path(log).parent)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def mlperf_results(tmp_path_factory) -> Path:
    """The published trees (``hpc_results_v1.0``, ``hpc_results_v3.0``, ``expected_scores.csv``),
    unpacked once per session from the archive in tests/data into a temporary folder (about 1 s)."""
    root = tmp_path_factory.mktemp("mlperf-hpc-results")
    with tarfile.open(FIXTURES_ARCHIVE) as archive:
        archive.extractall(root, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return root


@pytest.fixture
def mlhpc_cmd() -> list[str]:
    return [sys.executable, "-m", "mlhpc"]


#: Tests that share something costly run in one pytest-xdist worker, one after another: the
#: Slurm cluster (one per machine), the PostgreSQL server, and the scoring of the published
#: rounds (test_report.py's session fixture, about 40 s, and the README's `mlhpc report`, which
#: then finds the compliance verdicts of the same logs in the session's cache). Everything else
#: is spread over the workers test by test (``--dist loadgroup`` in pyproject.toml).
SERIAL_GROUPS = {"slurm": lambda item: item.get_closest_marker("slurm") is not None,
                 "postgres": lambda item: "postgres_url" in getattr(item, "fixturenames", ()),
                 "published-scores": lambda item: item.path.name == "test_report.py" or item.name == (
                     "test_the_report_command_the_readme_gives_works")}


#: Tests that need a service are `cluster` tests whatever their module says: run by .ci/run after
#: the default tests, and by ``-m cluster``.
SERVICES = (SERIAL_GROUPS["slurm"], SERIAL_GROUPS["postgres"])


# tryfirst: pytest-xdist reads the groups, and pytest's -m the marks, in their own hooks of this name.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if any(needs(item) for needs in SERVICES):
            item.add_marker(pytest.mark.cluster)
        for group, member in SERIAL_GROUPS.items():
            if member(item):
                item.add_marker(pytest.mark.xdist_group(group))
                break


def _worker_index() -> int:
    """0 outside pytest-xdist, else N of the worker ``gwN``."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0


@pytest.fixture(autouse=True)
def _few_threads(monkeypatch):
    # Two cores on CI: keep subprocesses from oversubscribing.
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "2"))
    # Runs made by tests are not recorded in the user's results store (tests that test the
    # store set their own MLHPC_STORE).
    monkeypatch.setenv("MLHPC_STORE", "none")
    # Parallel workers each start multi-rank runs: each worker gets its own rendezvous ports
    # (mlhpc's default is 29511; a run's instances take the ports after it).
    if _worker_index() and "MASTER_PORT" not in os.environ:
        monkeypatch.setenv("MASTER_PORT", str(29511 + 1000 * _worker_index()))
