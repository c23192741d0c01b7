"""Values from files and names for files, each tried through the command line: a number read
from a references file, a log, a resume record or a store passes one range check
(`mlhpc.log.plausible.out_of_range`) before any arithmetic, so NaN, Infinity, a negative value or
a product beyond 64 bits is one line and exit status 2 (or, in a report or an ingest over many
runs, a note and the run not credited), never a traceback nor a silent pass; an output file is
written under the name asked for, never a rewritten one; a file given as the store is identified,
read-only, as an mlhpc store before anything writes to it, and refused untouched otherwise.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlhpc.cli import main
from mlhpc.power.sampler import mllog_line

sys.path.insert(0, str(Path(__file__).parent))
from test_safety_values import one_line  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(main, list(args), catch_exceptions=False, env=env)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _rec(key: str, t: int, value=None, **metadata) -> str:  # type: ignore[no-untyped-def]
    kind = "INTERVAL_START" if key.endswith("_start") else "INTERVAL_END" if key.endswith("_stop") else "POINT_IN_TIME"
    return mllog_line(key, value, t, kind, metadata)


def _log(bench: str = "deepcam", metric: str = "eval_accuracy", last: str = "0.9", nodes: int = 1,
         accelerators: int = 1) -> str:
    """Two epochs, two evaluations, run_stop: the last evaluation's value written as ``last``
    (JSON text, so ``Infinity`` can be written)."""
    lines = [_rec("submission_benchmark", 0, bench), _rec("submission_division", 0, "closed"),
             _rec("submission_platform", 0, "box"), _rec("number_of_nodes", 0, nodes),
             _rec("accelerators_per_node", 0, accelerators), _rec("train_samples", 0, 64),
             _rec("init_start", 0), _rec("init_stop", 900), _rec("run_start", 1000)]
    t = 1000
    for epoch, quality in ((1, 0.5), (2, 0.123456)):
        lines += [_rec("epoch_start", t, epoch_num=epoch), _rec("epoch_stop", t + 2000, epoch_num=epoch),
                  _rec("eval_start", t + 2000, epoch_num=epoch), _rec("eval_stop", t + 2300, epoch_num=epoch),
                  _rec(metric, t + 2300, quality, epoch_num=epoch)]
        t += 2300
    text = "".join(lines + [_rec("run_stop", t + 100, status="success")])
    return text.replace('"value": 0.123456', f'"value": {last}')


def _run_folder(path: Path, **kw) -> Path:  # type: ignore[no-untyped-def]
    path.mkdir(parents=True)
    (path / "result_0.txt").write_text(_log(**kw))
    (path / "measured_0.json").write_text(json.dumps({"perf": {"train_flops_per_sample": 4.0e9}}))
    return path


# ---- references: NaN, Infinity and negatives ------------------------------------------------------


@pytest.mark.parametrize("spec, says", [
    ("[.nan, null, 0.1, s]", "value nan is not a finite number"),
    ("[.inf, null, 0.1, s]", "value inf is not a finite number"),
    ("[1.0e+400, null, 0.1, s]", "value inf is not a finite number"),
    ("[-600.0, null, 0.1, s]", "value -600"),
    ("[0, null, 0.1, s]", "value 0"),
    ("[600.0, .nan, 0.1, s]", "lower nan is not a finite number"),
    ("[600.0, null, -.inf, s]", "upper -inf is not a finite number"),
    ("[600.0, null, -0.5, s]", "upper -0.5"),
    ("[600.0, 0.5, null, s]", "lower 0.5"),
    ("[600.0, -2.0, null, s]", "lower -2"),
    ("[1.0e+300, null, 0.1, h]", "beyond"),
])
def test_a_reference_that_is_not_finite_or_in_range_is_one_line(tmp_path, spec, says):
    """NaN or Infinity as a value or bound made the gate never fire (every comparison false) or
    always fire; a negative value or bound on the wrong side of it did the same. Now one line
    naming the file and the figure, for `results check` and ReFrame's table alike."""
    refs = tmp_path / "refs.yaml"
    refs.write_text("box:\n  cosmoflow:\n    time_to_train_s: " + spec + "\n")
    line = one_line(cli("results", "check", "--references", str(refs), "--store", str(tmp_path / "s.db")),
                    str(refs), "box.cosmoflow.time_to_train_s", says)
    assert "Traceback" not in line
    from mlhpc.errors import ConfigError
    from mlhpc.reframe.references import reference_table

    with pytest.raises(ConfigError, match="time_to_train_s"):
        reference_table(refs, "cosmoflow")


def test_a_stored_figure_that_is_not_finite_is_not_judged(tmp_path):
    """A store row holding Infinity (a store written by hand) made the measured figure Infinity:
    a regression every time. It is left out, as a run without the figure."""
    folder = _run_folder(tmp_path / "runs")
    store = tmp_path / "s.db"
    assert cli("results", "ingest", str(folder), "--store", str(store)).exit_code == 0
    with sqlite3.connect(store) as conn:
        conn.execute("UPDATE runs SET samples_per_s = 9e999")
    refs = tmp_path / "refs.yaml"
    refs.write_text("box:\n  deepcam:\n    samples_per_s: [100.0, -0.1, null, samples/s]\n")
    result = cli("results", "check", "--references", str(refs), "--store", str(store))
    assert result.exit_code == 0, result.output
    assert "over 0 run(s)" in result.output and "no runs" in result.output


# ---- a log's quality metric of Infinity -----------------------------------------------------------


@pytest.mark.parametrize("last", ["Infinity", "NaN", "-Infinity"])
def test_a_non_finite_quality_earns_no_valid_flops(tmp_path, last):
    """An eval_accuracy of Infinity is past every target: the penalty was 1 and the run earned
    full Valid FLOPS, in the report and in the store. It is a malformed value: no credit, the
    note says why."""
    folder = _run_folder(tmp_path / "runs", last=last)
    result = CliRunner().invoke(main, ["report", str(folder), "--format", "json", "--no-compliance"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output[-2000:]
    data = json.loads(result.output)["folders"][0]
    flops = data["runs"][0]["valid_flops"]
    assert flops["valid_flops_per_s"] is None and data["valid_flops_per_s"] is None
    assert "eval_accuracy" in flops["note"] and "not a finite number" in flops["note"]
    store = tmp_path / "s.db"
    assert cli("results", "ingest", str(folder), "--store", str(store)).exit_code == 0
    with sqlite3.connect(store) as conn:  # stored as a run, its quality not a number, no credit
        assert conn.execute("SELECT valid_flops_per_s, final_metric FROM runs").fetchall() == [(None, None)]


def test_a_finite_quality_still_earns_its_valid_flops(tmp_path):
    folder = _run_folder(tmp_path / "runs", last="0.9")
    result = cli("report", str(folder), "--format", "json", "--no-compliance")
    assert json.loads(result.output)["folders"][0]["runs"][0]["valid_flops"]["valid_flops_per_s"] > 0


# ---- values from logs and stores: resume records, version rows, products ---------------------------


@pytest.mark.parametrize("earlier, says", [
    ('"abc"', "'abc' is not a number"),
    ("Infinity", "inf is not a finite number"),
    ("-5", "-5"),
    ("[1, 2]", "is not a number"),
])
def test_a_resume_record_out_of_range_is_one_line(tmp_path, earlier, says):
    """The earlier attempts' seconds a resumed log records were read with ``float()``: a string
    was a ValueError traceback, Infinity carried on as the time before. Now one line naming the
    log and the field, before the checkpoint is read, nothing written."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    log = run_dir / "result_0.txt"
    log.write_text(_rec("run_start", 1000) + _rec("resume", 1000, {"earlier_attempts_s": 0.123456}, resumed=True)
                   .replace("0.123456", earlier) + _rec("run_stop", 5000, status="aborted", signal="SIGTERM"))
    (run_dir / "checkpoint_0.pt").write_bytes(b"not read")
    one_line(cli("run", "--resume", str(run_dir)), str(log), "earlier_attempts_s", says)
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint_0.pt", "result_0.txt"]


@pytest.mark.parametrize("version", ["'abc'", "9e999", "-9e999", "4.5", "'4'", "NULL"])
def test_a_store_version_row_that_is_not_a_version_is_one_line(tmp_path, version):
    """``int()`` of the version row: 'abc' was a ValueError, Infinity an OverflowError, both
    tracebacks; now one line naming the store and the row, and the store unchanged."""
    store = tmp_path / "s.db"
    assert cli("results", "list", "--store", str(store)).exit_code == 0
    with sqlite3.connect(store) as conn:  # a table without mlhpc's column types holds any value
        conn.executescript("ALTER TABLE schema_version RENAME TO old; DROP TABLE old; "
                           "CREATE TABLE schema_version (version, applied_at); "
                           f"INSERT INTO schema_version VALUES ({version}, 'x');")
    before = _sha(store)
    one_line(cli("results", "list", "--store", str(store)), str(store), "schema_version")
    assert _sha(store) == before


def test_a_product_of_two_in_range_log_values_beyond_64_bits_is_refused(tmp_path):
    """number_of_nodes and accelerators_per_node each fit 64 bits; their product, the row's
    accelerators, did not: an OverflowError traceback from the database driver. Now the log is
    refused in one line and the others are stored."""
    bad = _run_folder(tmp_path / "bad", nodes=2**62, accelerators=8)
    good = _run_folder(tmp_path / "good")
    store = tmp_path / "s.db"
    result = cli("results", "ingest", str(bad), str(good), "--store", str(store))
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output[-2000:]
    refused = [line for line in result.output.splitlines() if str(bad / "result_0.txt") in line]
    assert len(refused) == 1 and "accelerators" in refused[0], result.output
    with sqlite3.connect(store) as conn:
        assert conn.execute("SELECT folder FROM runs").fetchall() == [(str(good),)]


# ---- an output name used as given -----------------------------------------------------------------


@pytest.fixture
def cheap_roofline(monkeypatch):
    """`mlhpc profile --roofline` with the step's roofline made of fixed figures (its drawing and
    writing are what is tried, not the measuring)."""
    from mlhpc.run import profile
    from mlhpc.run.roofline_figure import Ceilings, Roofline, RooflinePoint

    roof = Roofline("cosmoflow", Ceilings(4.0e10, 3.0e10, 5.0e9, "fp32", "cpu", ("k",)),
                    RooflinePoint("training step", 2.0e9, 1.0e8, 0.5),
                    [RooflinePoint("mm [8x128]", 1.0e8, 4.0e7, 0.01)], [])
    monkeypatch.setattr(profile, "_roofline", lambda *a, **k: roof)


TINY = ["--set", "synth.cube_size=16", "--set", "synth.train_samples=8", "--set", "synth.eval_samples=8",
        "--set", "model.input_size=16", "--set", "model.conv_channels=2", "--set", "model.n_conv_layers=2",
        "--set", "train.global_batch_size=4", "--set", "train.threads=1", "--set", "model.dropout=0.0"]


def test_an_output_name_is_used_as_given_never_rewritten(tmp_path, cheap_roofline):
    """``--roofline 'my roof.png'`` was written as ``my_roof.png``, over the user's file of that
    name, and the path printed did not exist. Now the file asked for is written and printed, and
    the other file is untouched."""
    theirs = tmp_path / "my_roof.png"
    theirs.write_bytes(b"the user's own file")
    asked = tmp_path / "my roof.png"
    result = cli("profile", str(ROOT / "configs" / "cosmoflow-mini.yaml"), "--steps", "1", "--warmup", "0",
                 "--roofline", str(asked), "--trace", str(tmp_path / "trace.json"),
                 "--set", f"data.path={tmp_path / 'data'}", "--set", f"output.dir={tmp_path / 'out'}", *TINY)
    assert result.exit_code == 0, result.output[-3000:]
    assert theirs.read_bytes() == b"the user's own file"
    assert asked.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"roofline: {asked} " in " ".join(result.output.split("\n"))


def test_an_output_name_that_cannot_be_written_as_given_is_refused_before_any_step(tmp_path):
    """A name with a control character cannot be shown as it is written: refused in one line,
    before data are made or a step runs."""
    asked = tmp_path / "roof\nx.png"
    result = cli("profile", str(ROOT / "configs" / "cosmoflow-mini.yaml"), "--roofline", str(asked),
                 "--set", f"data.path={tmp_path / 'data'}", "--set", f"output.dir={tmp_path / 'out'}")
    one_line(result, "--roofline", "control character")
    assert not (tmp_path / "data").exists() and not list(tmp_path.glob("roof*"))


# ---- a store identified before anything writes to it ----------------------------------------------


def _foreign_db(path: Path) -> Path:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE mine (x INTEGER)")
        conn.execute("INSERT INTO mine VALUES (42)")
    return path


def _old_store(path: Path, version: int) -> Path:
    """mlhpc's tables with another version, made the way an older release made them, in
    SQLite's default rollback-journal mode."""
    from sqlalchemy import create_engine

    from mlhpc.store import schema

    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        schema.metadata.create_all(conn)
        conn.execute(schema.schema_version.insert().values(version=version, applied_at=schema.now_utc()))
    engine.dispose()
    return path


@pytest.mark.parametrize("how", ["--store", "MLHPC_STORE"])
@pytest.mark.parametrize("make, says", [
    (_foreign_db, "not an mlhpc results store"),
    (lambda p: (p.write_text("my notes\n" * 20), p)[1], "not a SQLite database"),
    (lambda p: _old_store(p, 3), "schema version 3"),
    (lambda p: _old_store(p, 99), "schema version 99"),
])
def test_a_file_that_is_not_this_mlhpcs_store_is_refused_untouched(tmp_path, how, make, says):
    """A user's SQLite file given as the store was adopted (mlhpc's tables written into it); a
    store of another version was refused only after its journal mode was switched to WAL (its
    bytes changed). Now each is identified read-only first and refused with its bytes as they
    were, nothing created beside it."""
    path = make(tmp_path / "mine.db")
    before, names = _sha(path), sorted(p.name for p in tmp_path.iterdir())
    args, env = (["--store", str(path)], None) if how == "--store" else ([], {"MLHPC_STORE": str(path)})
    for command in (["list"], ["ingest", str(_run_folder(tmp_path / "runs"))]):
        one_line(cli("results", *command, *args, env=env), str(path), says)
        assert _sha(path) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "runs") == names


def test_a_new_or_empty_path_still_makes_a_store(tmp_path):
    empty = tmp_path / "empty.db"
    empty.touch()
    for path in (tmp_path / "new.db", empty):
        assert cli("results", "list", "--store", str(path)).exit_code == 0
        with sqlite3.connect(path) as conn:
            assert conn.execute("SELECT version FROM schema_version").fetchall() == [(4,)]
        assert cli("results", "list", "--store", str(path)).exit_code == 0
