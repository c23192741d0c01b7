"""The classes of hostile or careless input, each tried through the command line: links and FIFOs
among secondary files, outputs not owned, secrets in URLs, implausible figures, escape sequences,
console markup and mathtext in values. Each gives one line naming the file or value (exit 2), or
a note, never a traceback, and nothing written outside the folder asked for."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlhpc.cli import main

MINI = Path(__file__).parent / "data" / "report" / "cosmoflow-mini-runs"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _own_store_and_cache(tmp_path, monkeypatch):
    """Every test here keeps its store and compliance cache in its own folder."""
    monkeypatch.setenv("MLHPC_STORE", str(tmp_path / "own-store" / "results.db"))
    monkeypatch.setenv("MLHPC_CACHE_DIR", str(tmp_path / "cache"))


def cli(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def one_line_error(result, *names: str) -> str:
    """The run ended with exit 2 and one ``mlhpc: error:`` line naming each of ``names``."""
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("mlhpc: error: "), result.output
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def run_folder(tmp_path: Path, name: str = "run", edit=None) -> Path:
    """A copy of one mini run (log and side files), its log passed through ``edit``."""
    folder = tmp_path / name
    folder.mkdir()
    for suffix in ("result_0.txt", "config_0.yaml", "env_0.json", "summary_0.json"):
        shutil.copy(MINI / suffix, folder / suffix)
    if edit is not None:
        log = folder / "result_0.txt"
        log.write_text(edit(log.read_text()))
    return folder


def _events(text: str) -> list[dict]:
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in text.splitlines() if ":::MLLOG " in line]


def _lines(events: list[dict]) -> str:
    return "".join(":::MLLOG " + json.dumps(e) + "\n" for e in events)


def _set_value(key: str, value):
    def edit(text: str) -> str:
        events = _events(text)
        for e in events:
            if e["key"] == key:
                e["value"] = value
        return _lines(events)
    return edit


def _power_log(folder: Path, watts: list[float]) -> Path:
    events = _events((folder / "result_0.txt").read_text())
    start = next(e["time_ms"] for e in events if e["key"] == "run_start")
    stop = next(e["time_ms"] for e in events if e["key"] == "run_stop")
    step = (stop - start) / len(watts)
    records = [{"namespace": "", "time_ms": start, "event_type": "INTERVAL_START",
                "key": "power_measurement_start", "value": None, "metadata": {}}]
    records += [{"namespace": "", "time_ms": start + step * (i + 1), "event_type": "POINT_IN_TIME",
                 "key": "power_reading", "value": w, "metadata": {"unit": "W"}} for i, w in enumerate(watts)]
    power = folder / "power" / "result_0"
    power.mkdir(parents=True, exist_ok=True)
    path = power / "node_0.txt"
    path.write_text(_lines(records))
    return path


# ---- 1. secondary files go through the one reader ------------------------------------------------


def test_a_fifo_among_power_files_is_a_note_not_a_stopped_report(tmp_path):
    folder = run_folder(tmp_path)
    (folder / "power" / "result_0").mkdir(parents=True)
    os.mkfifo(folder / "power" / "result_0" / "node_0.txt")
    result = cli("report", str(folder), "--no-compliance", "--format", "json")
    assert result.exit_code == 0, result.output
    run = json.loads(result.output)["folders"][0]["runs"][0]
    assert run["energy_to_train_j"] is None
    assert "a FIFO, not a regular file" in run["power_note"] and "node_0.txt" in run["power_note"]


def test_a_power_log_linked_out_of_its_folder_is_not_read(tmp_path):
    folder = run_folder(tmp_path)
    elsewhere = run_folder(tmp_path, "elsewhere")
    outside = _power_log(elsewhere, [100.0] * 4)
    (folder / "power" / "result_0").mkdir(parents=True)
    (folder / "power" / "result_0" / "node_0.txt").symlink_to(outside)
    result = cli("report", str(folder), "--no-compliance", "--format", "json")
    run = json.loads(result.output)["folders"][0]["runs"][0]
    assert run["energy_to_train_j"] is None and "symbolic link out of" in run["power_note"]


def _published_tree(tmp_path: Path) -> tuple[Path, Path]:
    """``ORG/results/SYSTEM/strong/cosmoflow/result_0.txt`` and the system description's path."""
    tree = tmp_path / "hpc_results_v3.0" / "ORG"
    logs = tree / "results" / "sys1" / "strong" / "cosmoflow"
    logs.mkdir(parents=True)
    shutil.copy(MINI / "result_0.txt", logs / "result_0.txt")
    (tree / "systems").mkdir()
    return tree, tree / "systems" / "sys1.json"


def test_a_system_description_linked_to_a_private_file_is_neither_read_nor_stored(tmp_path):
    tree, desc = _published_tree(tmp_path)
    secret = tmp_path / "private.json"
    secret.write_text(json.dumps({"number_of_nodes": 1, "secret_key": "do-not-copy"}))
    secret.chmod(0o600)
    desc.symlink_to(secret)
    report = cli("report", str(tree.parent), "--no-compliance", "--format", "json")
    assert report.exit_code == 0, report.output
    assert "do-not-copy" not in report.output
    assert any("system description not read" in n and "symbolic link out of" in n
               for f in json.loads(report.output)["folders"] for n in f["notes"])
    ingest = cli("results", "ingest", str(tree.parent))
    assert ingest.exit_code == 0, ingest.output
    shown = cli("results", "list", "--format", "json")
    assert "do-not-copy" not in shown.output
    store = Path(os.environ["MLHPC_STORE"])
    assert b"do-not-copy" not in store.read_bytes()


def test_the_reader_refuses_links_out_fifos_and_oversize_with_one_line(tmp_path):
    from mlhpc.data.inputs import InputRefused, read_input

    tree = tmp_path / "tree"
    tree.mkdir()
    (tmp_path / "out.txt").write_text("outside")
    (tree / "link").symlink_to(tmp_path / "out.txt")
    (tree / "inside").write_text("inside")
    (tree / "link-in").symlink_to(tree / "inside")
    os.mkfifo(tree / "fifo")
    (tree / "big").write_bytes(b"x" * 100)
    assert read_input(tree / "link-in", 10, tree) == b"inside"
    for name, words in (("link", "symbolic link out of"), ("fifo", "a FIFO"), ("big", "100 bytes, over the 10")):
        with pytest.raises(InputRefused) as info:
            read_input(tree / name, 10, tree)
        message = str(info.value)
        assert str(tree / name) in message and words in message and "\n" not in message


# ---- 2. outputs are owned --------------------------------------------------------------------------


def test_a_store_that_is_a_dangling_link_is_refused_and_nothing_is_created(tmp_path):
    target = tmp_path / "elsewhere" / "planted.db"
    target.parent.mkdir()
    store = tmp_path / "store" / "results.db"
    store.parent.mkdir()
    store.symlink_to(target)
    one_line_error(cli("results", "list", "--store", str(store)), str(store), "symbolic link")
    assert not target.exists()


def test_a_store_writable_by_others_or_owned_by_another_user_is_refused(tmp_path):
    store = tmp_path / "store" / "results.db"
    assert cli("results", "list", "--store", str(store)).exit_code == 0
    store.chmod(0o666)
    one_line_error(cli("results", "list", "--store", str(store)), str(store), "mode 0666")
    store.chmod(0o644)
    nobody = pwd.getpwnam("nobody").pw_uid
    os.chown(store, nobody, -1)
    one_line_error(cli("results", "list", "--store", str(store)), str(store), f"uid {nobody}")
    os.chown(store, os.geteuid(), -1)
    store.parent.chmod(0o777)
    one_line_error(cli("results", "list", "--store", str(store)), str(store.parent), "writable by no other")


def _reachable_by_others(path: Path) -> None:
    """Let other users traverse (not list) the folders above ``path`` that this test session
    made (``o+x``), so that a second user can reach what a test gives it."""
    for folder in [path, *path.parents]:
        if str(folder) in ("/", "/tmp") or folder.stat().st_uid != os.geteuid():
            break
        folder.chmod(stat.S_IMODE(folder.stat().st_mode) | 0o011)


def test_a_second_user_cannot_use_a_store_it_may_not_write(tmp_path):
    """Run as ``nobody`` (the commands imported as root, then the user switched): root's private
    store is one line and exit 2, not a traceback."""
    store = tmp_path / "store" / "results.db"
    assert cli("results", "list", "--store", str(store)).exit_code == 0
    _reachable_by_others(tmp_path)  # nobody may reach the folder, not write the store
    nobody = pwd.getpwnam("nobody")
    child = ("import os, sys, sqlite3, sqlalchemy.dialects.sqlite, mlhpc.cli, mlhpc.store.cli, "
             "mlhpc.store.api, mlhpc.store.engine, mlhpc.store.queries, mlhpc.store.schema, mlhpc.text\n"
             f"os.setgroups([]); os.setgid({nobody.pw_gid}); os.setuid({nobody.pw_uid})\n"
             f"mlhpc.cli.main(['results', 'list', '--store', {str(store)!r}])\n")
    env = {**os.environ, "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert str(store.parent) in proc.stderr


def test_the_one_writer_refuses_a_folder_others_may_write_and_never_writes_through_a_link(tmp_path):
    from mlhpc.data.files import UnsafeFolder, write_text_atomic

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UnsafeFolder):
        write_text_atomic(shared / "x.txt", "x")
    assert list(shared.iterdir()) == []
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "via").symlink_to(target)
    with pytest.raises(OSError):
        write_text_atomic(tmp_path / "via" / "x.txt", "x")
    assert list(target.iterdir()) == []


def test_a_planted_power_link_is_not_written_through(tmp_path):
    from mlhpc.power.sampler import _claim_folder

    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (out / "power").symlink_to(victim)
    with pytest.raises(OSError):
        _claim_folder(out, ("power",))
    assert list(victim.iterdir()) == []


def test_a_stale_power_folder_makes_its_slot_taken(tmp_path):
    from mlhpc.log.writer import open_next_result

    (tmp_path / "power" / "result_0").mkdir(parents=True)
    path, handle = open_next_result(tmp_path)
    handle.close()
    assert path.name == "result_1.txt"


# ---- 3. secrets are never shown --------------------------------------------------------------------

SECRET_URLS = [
    "postgresql+psycopg://alice:s3cret@127.0.0.1:1/db",
    "postgresql://127.0.0.1:1/db?password=s3cret",
    "postgresql://127.0.0.1:1/db?user=alice&PASSWORD=s3cret",
    "postgresql://127.0.0.1:1/db?pass%77ord=s3cret",
    "postgresql://127.0.0.1:1/db?sslpassword=s3cret&sslmode=require",
    "postgresql://127.0.0.1:1/db?passfile=/home/alice/s3cret",
    "postgresql://:s3cret@127.0.0.1:1/db",
    "postgresql:///db?dbname=host%3D127.0.0.1%20password%3Ds3cret",
    "postgresql+psycopg://alice:s3c%40ret@127.0.0.1:1/db?password=s3cret",
    "not a url password=s3cret",
]


@pytest.mark.parametrize("url", SECRET_URLS)
def test_every_credential_form_is_masked(url):
    from mlhpc.text import mask_urls, show_url

    assert "s3cret" not in show_url(url) and "s3c%40ret" not in show_url(url)
    assert "s3cret" not in mask_urls(f"could not connect to {url}: refused")


@pytest.mark.parametrize("url", SECRET_URLS[:6] + ["postgresql+nodriver://alice:s3cret@h/db?password=s3cret"])
def test_results_commands_never_print_a_password(url):
    result = cli("results", "list", "--store", url)
    assert result.exit_code == 2 and "s3cret" not in result.output, result.output


def test_a_run_that_cannot_record_itself_warns_without_the_password(tmp_path, monkeypatch):
    from mlhpc.store.record import record_run

    monkeypatch.setenv("MLHPC_STORE", "postgresql+psycopg://alice:s3cret@127.0.0.1:1/db?password=s3cret")
    folder = run_folder(tmp_path)
    said: list[str] = []
    assert record_run(folder, folder / "result_0.txt", said.append) is None
    assert said and not any("s3cret" in line for line in said), said


# ---- 6. figures are checked for range --------------------------------------------------------------


def test_run_stop_before_run_start_is_refused_never_a_success(tmp_path):
    def swap(text: str) -> str:
        events = _events(text)
        start = next(e for e in events if e["key"] == "run_start")
        stop = next(e for e in events if e["key"] == "run_stop")
        start["time_ms"], stop["time_ms"] = stop["time_ms"], start["time_ms"]
        return _lines(events)

    folder = run_folder(tmp_path, edit=swap)
    report = json.loads(cli("report", str(folder), "--no-compliance", "--format", "json").output)
    run = report["folders"][0]["runs"][0]
    assert run["status"] == "invalid" and run["time_to_train_s"] is None
    assert "run_stop before run_start" in run["reason"]
    assert cli("results", "ingest", str(folder)).exit_code == 0
    rows = json.loads(cli("results", "list", "--format", "json").output)
    assert [r["status"] for r in rows] == ["invalid"] and rows[0]["time_to_train_s"] is None


@pytest.mark.parametrize("value, stored", [("Infinity", True), ("NaN", True), ("-Infinity", True),
                                           ("123456789012345678901234567890", False), ("1e999", True)])
def test_infinite_nan_and_huge_numbers_in_a_log_are_no_traceback(tmp_path, value, stored):
    def plant(text: str) -> str:
        return "\n".join(line.replace('"value": 1,', f'"value": {value},', 1) if '"number_of_nodes"' in line
                         else line for line in text.splitlines()) + "\n"

    folder = run_folder(tmp_path, edit=plant)
    assert f'"value": {value},' in (folder / "result_0.txt").read_text()
    for fmt in ("table", "json"):
        report = cli("report", str(folder), "--no-compliance", "--format", fmt)
        assert report.exit_code == 0, report.output
    ingest = cli("results", "ingest", str(folder))
    assert ingest.exit_code == (0 if stored else 2), ingest.output
    assert "Traceback" not in ingest.output
    assert ("1 run(s) added" in ingest.output) == stored, ingest.output
    if not stored:
        assert "refused value" in ingest.output and "result_0.txt:" in ingest.output


def test_negative_watts_give_no_energy_and_say_why(tmp_path):
    folder = run_folder(tmp_path)
    _power_log(folder, [100.0, -5000.0, 100.0])
    run = json.loads(cli("report", str(folder), "--no-compliance", "--format", "json").output)["folders"][0]["runs"][0]
    assert run["energy_to_train_j"] is None
    assert "power_w -5000 W is negative" in run["power_note"]


def test_a_rapl_counter_reset_is_a_missed_reading_not_negative_energy(tmp_path):
    from mlhpc.power.sources import RaplDomain, SourceError

    zone = tmp_path / "intel-rapl:0"
    zone.mkdir()
    (zone / "energy_uj").write_text("5000000\n")
    domain = RaplDomain(zone, "package-0", max_range_uj=0)
    assert domain.read() == 0.0
    (zone / "energy_uj").write_text("1000\n")
    with pytest.raises(SourceError, match="counter reset"):
        domain.read()
    (zone / "energy_uj").write_text("2000\n")
    assert domain.read() == pytest.approx(0.001)


# ---- 7. text into sinks with their own syntax ------------------------------------------------------

HOSTILE = "x\x1b]0;pwned\x07\x1b[31mred\r[gpu] n[1-4] data[1].h5"


def test_escape_sequences_and_brackets_in_log_values_reach_no_terminal(tmp_path):
    folder = run_folder(tmp_path, edit=_set_value("submission_platform", HOSTILE))
    report = cli("report", str(folder), "--no-compliance", "--level", "runs")
    assert report.exit_code == 0, report.output
    assert "\x1b" not in report.output and "\x07" not in report.output and "\r" not in report.output
    assert cli("results", "ingest", str(folder)).exit_code == 0
    listed = cli("results", "list")
    shown = cli("results", "show", "1")
    for out in (listed.output, shown.output):
        assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    assert "[gpu] n[1-4] data[1].h5" in shown.output and "\\x1b]0;pwned" in shown.output


def test_brackets_show_verbatim_in_errors_warnings_tables_and_the_run_summary(tmp_path, capsys, monkeypatch):
    from mlhpc.progress import RunProgress, print_summary

    monkeypatch.setenv("COLUMNS", "400")
    missing = tmp_path / "data[1].h5"
    one_line_error(cli("report", str(missing)), "data[1].h5")
    RunProgress()({"kind": "warning", "message": "pip install 'mlhpc[gpu]' on n[1-4]"})
    assert "pip install 'mlhpc[gpu]' on n[1-4]" in capsys.readouterr().out
    summary = json.loads((MINI / "summary_0.json").read_text())
    summary.update(path=str(tmp_path / "data[1].h5" / "result_0.txt"), workload="mlhpc[gpu]")
    print_summary(summary)
    out = capsys.readouterr().out
    assert "mlhpc[gpu]" in out and "data[1].h5" in out
    folder = run_folder(tmp_path, edit=_set_value("submission_platform", "n[1-4]"))
    table = cli("report", str(folder), "--no-compliance", "--level", "runs")
    assert "n[1-4]" in table.output or "n[1-4]" in cli("report", str(folder), "--no-compliance",
                                                          "--format", "markdown").output


def test_mathtext_in_names_is_drawn_as_written(tmp_path):
    folder = run_folder(tmp_path, name="$\\frac{run", edit=_set_value("submission_platform", "$\\frac{x"))
    result = cli("report", str(folder), "--no-compliance", "--plots", str(tmp_path / "plots"))
    assert result.exit_code == 0, result.output
    assert list((tmp_path / "plots").glob("*.png"))
    assert cli("results", "ingest", str(folder)).exit_code == 0
    scaled = cli("results", "scaling", "--plot", str(tmp_path / "scaling.png"))
    assert scaled.exit_code in (0, 2) and "Traceback" not in scaled.output, scaled.output


def test_an_absolute_submission_benchmark_never_becomes_a_path(tmp_path):
    folder = run_folder(tmp_path, edit=_set_value("submission_benchmark", str(tmp_path / "escaped")))
    result = cli("report", str(folder), "--no-compliance", "--package", str(tmp_path / "pkg"))
    one_line_error(result, "submission_benchmark")
    assert not (tmp_path / "escaped").exists()


# ---- 5. native readers never trust on-disk pointers ------------------------------------------------

FLIP_SCRIPT = """
import struct, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from mlhpc.errors import DataError
from mlhpc_workloads.opencatalyst import lmdb_io
from test_oc20_data import _record
folder = Path({folder!r})
good = folder / "good.lmdb"
lmdb_io.write_lmdb(good, [_record(6, s) for s in range(40)])
data = good.read_bytes()
tree = [p for p in range(2, len(data) // 4096) if struct.unpack_from("<H", data, p * 4096 + 10)[0] & 3]
offsets = [p * 4096 + k for p in tree for k in range(0, 4096, 5)] + list(range(0, 8192, 97))
bad = folder / "data.0000.lmdb"
refused = 0
for i, off in enumerate(offsets):
    flipped = bytearray(data)
    flipped[off] ^= 0xFF if i % 2 else 0x40
    lmdb_io.close_all()
    bad.write_bytes(flipped)
    try:
        lmdb_io.check_file(bad, full=False)
    except DataError as exc:
        assert str(bad) in str(exc) and "\\n" not in str(exc) and len(str(exc)) < 600, exc
        refused += 1
print(len(offsets), refused)
"""


def test_flipped_bytes_in_an_lmdb_file_are_one_line_never_a_signal(tmp_path):
    """Bytes flipped at every fifth offset of the file's tree pages and across its meta pages:
    each open is a DataError naming the file or a readable file, and the process never dies of
    SIGBUS (it did, exit 135, before `lmdb_verify` checked the pages liblmdb maps)."""
    code = FLIP_SCRIPT.format(tests=str(Path(__file__).parent), folder=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    tried, refused = map(int, proc.stdout.split())
    assert tried > 800 and refused > 50


# ---- 8, 9. checked at load; children bounded --------------------------------------------------------


def _pids_running(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_a_hanging_node_meter_is_killed_with_its_children_within_its_bound():
    import time

    from mlhpc.power.sources import NodeMeter, SourceError

    marker = f"mlhpc-meter-child-{os.getpid()}"
    meter = NodeMeter(f"sh -c 'exec -a {marker} sleep 60 & echo 5; sleep 60'", timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(SourceError, match="timed out after 1.0 s; its process group was killed"):
        meter.read()
    assert time.monotonic() - started < 5
    time.sleep(0.2)
    assert not _pids_running(marker)
    with pytest.raises(SourceError, match="printed more than 4096 bytes"):
        NodeMeter("yes 1", timeout_s=5.0).read()


def _config_with(tmp_path: Path, section: str, key: str, value) -> Path:
    import yaml

    data = yaml.safe_load((ROOT / "configs" / "cosmoflow-mini.yaml").read_text())
    data.setdefault(section, {})[key] = value
    data.setdefault("output", {}).setdefault("dir", str(tmp_path / "results"))
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("section, key, value, says", [
    ("power", "node_meter_command", 'ipmitool "dcmi power reading', "No closing quotation"),
    ("output", "dir", "results\n", "control character"),
])
def test_what_can_be_checked_is_checked_when_the_config_is_loaded(tmp_path, section, key, value, says):
    config = _config_with(tmp_path, section, key, value)
    line = one_line_error(cli("run", str(config)), str(config), f"{section}.{key}", says)
    assert "\n" not in line
    assert not (tmp_path / "results").exists() and not (tmp_path / "results\n").exists()


def test_a_sweep_of_a_million_points_is_refused_before_anything_is_rendered(tmp_path):
    import time

    config = _config_with(tmp_path, "train", "seed", 1)
    values = ",".join(str(i) for i in range(1000))
    started = time.monotonic()
    result = cli("submit", str(config), "--dry-run", "--sweep", f"train.seed={values}",
                 "--sweep", f"train.max_epochs={values}")
    line = one_line_error(result, "1000 x 1000 = 1000000 points")
    assert "split the sweep" in line and time.monotonic() - started < 30


def _others_may_enter(path: Path) -> bool:
    """Whether a user other than the owner may traverse every folder down to ``path``."""
    return all(stat.S_IMODE(p.stat().st_mode) & 0o001 for p in [path, *path.parents])


def test_a_store_on_a_read_only_folder_can_be_listed_and_refuses_additions_in_one_line(tmp_path):
    """As ``nobody``, owner of a store in a folder it may not write (as a read-only mount is):
    ``results list`` shows the runs, ``results ingest`` is one line and exit 2. The second user
    runs the installed packages (mlperf_logging reads its rule files as it checks), so the test
    needs an environment others may enter; a private copy (CI's) skips it, saying so."""
    if not _others_may_enter(Path(sys.prefix).resolve()) or not _others_may_enter(ROOT.resolve()):
        pytest.skip("the Python environment or the checkout sits in a folder only its owner may "
                    "enter: a second user cannot run it")
    folder = run_folder(tmp_path)
    store = tmp_path / "ro" / "results.db"
    ingest = subprocess.run([sys.executable, "-m", "mlhpc", "results", "ingest", "--store", str(store), str(folder)],
                            capture_output=True, text=True, cwd=ROOT, timeout=300)  # closed on exit
    assert ingest.returncode == 0, ingest.stderr
    nobody = pwd.getpwnam("nobody")
    for path in (store.parent, *store.parent.iterdir(), folder, *folder.iterdir()):
        os.chown(path, nobody.pw_uid, nobody.pw_gid)
    store.chmod(0o444)
    store.parent.chmod(0o555)
    _reachable_by_others(tmp_path)

    def as_nobody(*args: str) -> subprocess.CompletedProcess:
        # every module imported as root first: the checkout (and its venv) may sit in a folder
        # only root may enter, as CI's private copy does
        child = ("import os, importlib, pkgutil, sqlite3, sqlalchemy.dialects.sqlite, mlhpc\n"
                 "for m in pkgutil.walk_packages(mlhpc.__path__, 'mlhpc.'):\n"
                 "    if not m.name.endswith('__main__'): importlib.import_module(m.name)\n"
                 f"os.setgroups([]); os.setgid({nobody.pw_gid}); os.setuid({nobody.pw_uid})\n"
                 f"mlhpc.cli.main({list(args)!r})\n")
        return subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, cwd=tmp_path,
                              env={**os.environ, "HOME": str(tmp_path), "MLHPC_CACHE_DIR": str(tmp_path / "c")},
                              timeout=300)

    listed = as_nobody("results", "list", "--store", str(store), "--format", "json")
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)) == 1 and "read-only" in listed.stderr
    other = run_folder(tmp_path, "other", edit=_set_value("submission_platform", "another"))
    for path in (other, *other.iterdir()):
        os.chown(path, nobody.pw_uid, nobody.pw_gid)
    added = as_nobody("results", "ingest", "--store", str(store), str(other))
    assert added.returncode == 2 and "Traceback" not in added.stderr, added.stderr
    assert sorted(p.name for p in store.parent.iterdir()) == ["results.db"]


def test_a_zero_cell_is_refused_by_data_check_and_a_float8_tensor_by_the_record_check(tmp_path):
    import numpy as np
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from test_oc20_data import _record

    from mlhpc.errors import DataError
    from mlhpc_workloads.opencatalyst import lmdb_io

    for split in ("train", "val"):
        (tmp_path / "data" / split).mkdir(parents=True)
        record = _record(6, 0)
        record["cell"] = np.zeros((3, 3))
        lmdb_io.write_lmdb(tmp_path / "data" / split / "data.0000.lmdb", [record])
    result = cli("data", "check", "oc20", str(tmp_path / "data"))
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "train/data.0000.lmdb: key '0': cell volume 0 A^3" in result.output
    fields = {**_record(6, 0), "pos": torch.zeros(6, 3, dtype=torch.float8_e4m3fn)}
    with pytest.raises(DataError, match="float8_e4m3fn tensor, expected a dense real one"):
        lmdb_io.validate_record(fields, "file.lmdb: key '0'")


def test_data_prepare_refuses_a_raw_input_linked_out_of_its_folder(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    private = tmp_path / "private.extxyz"
    private.write_text("not for this dataset\n")
    (raw / "a.extxyz").symlink_to(private)
    result = cli("data", "prepare", "oc20", str(raw), str(tmp_path / "out"))
    line = one_line_error(result, str(raw / "a.extxyz"), "symbolic link out of")
    assert "Traceback" not in line and not (tmp_path / "out").exists()
