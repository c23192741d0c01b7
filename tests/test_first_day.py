"""A centre engineer's first day: text a user can read (config paths never broken, the run
summary's paths whole, every other config problem named, synthesis progress that says what is on
disk, Ctrl-C in `data synth` like a run), and figures a user can trust (the RCP cell says what the
factor multiplied, a price adds the cost column, mini runs are marked as minis in scaling)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_report_people import _folder
from test_store import make_runs

from mlhpc.cli import main
from mlhpc.report.cells import strong_cell
from mlhpc.report.cli import report_command
from mlhpc.report.rcp import RcpVerdict
from mlhpc.report.score import FolderResult
from mlhpc.store import open_store
from mlhpc.store.api import scaling_report
from mlhpc.store.ingest import ingest_paths
from mlhpc.store.queries import Filters

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("columns", [80, 120])
def test_list_never_breaks_a_config_path(columns, monkeypatch):
    monkeypatch.chdir(REPO)
    out = CliRunner().invoke(main, ["list"], env={"COLUMNS": str(columns)})
    assert out.exit_code == 0, out.output
    from mlhpc.config.catalog import describe

    configs = [c for row in describe() for c in row["configs"]]  # of the registered workloads
    assert len(configs) >= 6
    words = out.output.split()
    for config in configs:
        assert config in words, config  # whole, as one word
    assert "eval_accuracy" in words and max(len(line) for line in out.output.splitlines()) <= columns


def test_every_other_config_problem_is_named(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("workload: cosmoflow\ntrain: {global_batch_sise: 4, max_epochs: 2}\n")
    out = CliRunner().invoke(main, ["run", str(config)])
    assert out.exit_code == 2
    line = out.stderr.strip()
    assert line.endswith("did you mean train.global_batch_size? (also train.global_batch_size: required "
                         "value missing)")
    assert "(and 1 more)" not in line


def test_run_summary_prints_the_result_log_whole(capsys, monkeypatch):
    from mlhpc.progress import print_summary

    monkeypatch.setenv("COLUMNS", "60")
    path = "/scratch/a-rather-long-project-folder/results/cosmoflow-mini-campaign-2026/result_12.txt"
    print_summary({"workload": "cosmoflow", "status": "success", "metric_key": "eval_error", "target": 0.3,
                   "epochs": 3, "path": path, "checkpoint": path.replace("result", "checkpoint")})
    out = capsys.readouterr().out
    assert f"result log: {path}\n" in out and f"checkpoint: {path.replace('result', 'checkpoint')}" in out


def test_a_figure_the_log_does_not_give_is_unknown_never_zero(capsys, monkeypatch):
    """A resumed OpenFold run counts no samples trained: its throughput and FLOP/s are unknown."""
    from mlhpc.progress import print_summary

    monkeypatch.setenv("COLUMNS", "200")
    print_summary({"workload": "openfold", "status": "success", "metric_key": "eval_accuracy", "target": 0.8,
                   "samples_per_s": None, "perf": {"train_flops_per_sample": 1e9}, "path": "out/result_1.txt"})
    rows = {line.split("\u2502")[1].strip(): line.split("\u2502")[2].strip()
            for line in capsys.readouterr().out.splitlines() if line.count("\u2502") >= 3}
    assert rows["training throughput"] == "unknown" and rows["achieved FLOP/s (MFU)"] == "unknown"
    print_summary({"workload": "cosmoflow", "status": "success", "metric_key": "eval_error", "target": 0.3,
                   "samples_per_s": 737.04, "perf": {"achieved_flop_per_s": 2.5e9, "mfu": 0.125,
                                                     "peak_source": "measured matmul"}, "path": "out/result_0.txt"})
    rows = {line.split("\u2502")[1].strip(): line.split("\u2502")[2].strip()
            for line in capsys.readouterr().out.splitlines() if line.count("\u2502") >= 3}
    assert rows["training throughput"] == "737.0 samples/s"
    assert rows["achieved FLOP/s (MFU)"] == "2.50 GFLOP/s (12.5% of measured matmul)"


def test_synthesis_line_never_says_zero_kb_written():
    from mlhpc.progress import SynthLines

    event = {"done": 3, "samples": 64, "bytes": 120, "planned_bytes": None, "elapsed_s": 4.0, "eta_s": 80.0}
    line = SynthLines.line(event)
    assert "0 kB" not in line and "no data on disk yet" in line
    assert "2 MB written" in SynthLines.line({**event, "bytes": 2_000_000}).replace("2.0 MB", "2 MB")


@pytest.mark.slow  # 35 s on an idle 2-core machine: the default suite stays under 15 minutes
def test_oc20_synthesis_writes_inside_its_folder(tmp_path, monkeypatch):
    """The harness measures bytes under the folder it gave: OC20 writes there, not beside it."""
    from mlhpc_workloads.opencatalyst import lmdb_io
    from mlhpc_workloads.opencatalyst import synth as oc20_synth

    from mlhpc.config import from_dict

    written: list[Path] = []
    real = lmdb_io.write_lmdb
    monkeypatch.setattr(lmdb_io, "write_lmdb", lambda path, records: (written.append(Path(path)), real(path, records)))
    config = from_dict({"workload": "oc20", "train": {"global_batch_size": 1, "max_epochs": 1}},
                       overrides=("synth.train_samples=4", "synth.validation_samples=2", "synth.workers=1"))
    out = tmp_path / "oc20"
    oc20_synth.synthesize(out, config.synth, 0)
    assert written and all(out in p.parents for p in written)
    assert sorted(p.name for p in out.iterdir()) == ["train", "validation"]  # no temporary left


def _sigint_by_default() -> None:
    # A suite started in the background by a script inherits SIGINT ignored, and exec keeps that.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_in_data_synth_exits_130_with_its_line(tmp_path):
    """Ctrl-C as a terminal sends it, to the whole process group: exit status 130, the command's
    one line last, nothing half-written in place, and no traceback from the synthesis pool's
    worker processes (they ignore SIGINT and leave it to the command)."""
    proc = subprocess.Popen([sys.executable, "-m", "mlhpc", "data", "synth", "cosmoflow", "--out",
                             str(tmp_path / "big")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True,
                            preexec_fn=_sigint_by_default)
    deadline = time.monotonic() + 120
    line = ""
    while "writing" not in line and time.monotonic() < deadline:
        line = proc.stderr.readline()
    assert "writing" in line, line
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1] == (f"mlhpc: interrupted (SIGINT): {tmp_path / 'big'} not completed; "
                                            "nothing half-written is in its place"), err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    assert not (tmp_path / "big").exists()


def test_published_folder_is_ignored_by_git():
    assert "/published/" in (REPO / ".gitignore").read_text().splitlines()


def _folder_result(**kw) -> FolderResult:
    fields = {"olympic_min": 20.92, "rcp": RcpVerdict(True, "RCP Interpolation", 1.006), **kw}
    return FolderResult(path="x", kind="strong", raw_olympic_min=20.92, **fields)


def test_the_rcp_cell_says_what_the_factor_multiplied():
    applied = _folder_result(scaling_factor=1.006, olympic_min=20.92 * 1.006)
    assert strong_cell(applied) == "21.05 (raw 20.92 x1.006, RCP pass)"
    pending = _folder_result()
    assert strong_cell(pending) == "20.92 (RCP pass; x1.006 normalised: 21.05)"
    plain = _folder_result(rcp=RcpVerdict(True, "RCP found", 1.0))
    assert strong_cell(plain) == "20.92 (RCP pass)"


def test_a_price_adds_the_cost_column_to_the_default_table(tmp_path):
    folder = _folder(tmp_path / "runs", "cosmoflow")
    plain = CliRunner().invoke(report_command, [str(folder), "--no-compliance"], env={"COLUMNS": "100"})
    priced = CliRunner().invoke(report_command, [str(folder), "--no-compliance", "--price-per-node-hour", "2"],
                                env={"COLUMNS": "100"})
    assert plain.exit_code == priced.exit_code == 0, priced.output
    def header(text: str) -> str:
        return " ".join(line for line in text.splitlines() if "\u2503" in line)  # the header rows

    assert "cost" not in header(plain.output) and "cost" in header(priced.output)
    # 2 nodes x 100,000 s / 3600 x 2 per node-hour = 111.11 for the first run
    assert "111.11" in priced.output


def test_scaling_marks_mini_runs(tmp_path):
    mini = make_runs(tmp_path / "mini", [60.0, 61.0, 59.0], system="laptop")
    for i in range(3):
        (mini / f"measured_{i}.json").write_text(json.dumps({"departs_from_reference": ["model.input_size=32 (reference 128)"]}))
    make_runs(tmp_path / "full", [600.0, 610.0, 590.0], system="laptop", offset_ms=7)
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    assert ingest_paths(store, [mini, tmp_path / "full"]).refused == []
    rows, _ = scaling_report(store, Filters(benchmark="cosmoflow"))
    assert {r["series"] for r in rows} == {"laptop (own)", "laptop (own, mini: departs from the reference)"}
