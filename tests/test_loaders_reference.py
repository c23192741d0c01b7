"""benchmarks/loaders_reference.py: a run on tiny CosmoFlow samples (the table, the JSON, the
worker cores per H100 worked out from the published rate), the line printed when no published
rate can be imported, and bad input (exit 2, one line)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import loaders_reference as bench  # noqa: E402

TINY = bench.Case("cosmoflow-mini.yaml", "tiny cube", (
    "synth.cube_size=8", "synth.samples_per_file=1", "synth.train_samples=3",
    "synth.eval_samples=1", "synth.workers=1", "model.input_size=8"))


def _run(tmp_path: Path, capsys, monkeypatch) -> tuple[int, str, str]:
    monkeypatch.setitem(bench.CASES, "cosmoflow", TINY)
    status = bench.main(["--only", "cosmoflow", "--data", str(tmp_path), "--repeats", "2",
                         "--min-seconds", "0", "--json", str(tmp_path / "out.json")])
    out, err = capsys.readouterr()
    return status, out, err


def test_tiny_run_prints_the_table_and_writes_every_figure(tmp_path, capsys, monkeypatch):
    status, out, err = _run(tmp_path, capsys, monkeypatch)
    assert status == 0, err
    rows = [line for line in out.splitlines() if line.startswith("| cosmoflow |")]
    assert len(rows) == 1 and "tiny cube" in rows[0]
    report = json.loads((tmp_path / "out.json").read_text())
    row = report["workloads"]["cosmoflow"]
    assert row["samples"] == 3 and row["per_worker_samples_per_s"] > 0
    assert len(row["per_worker_all"]) == 2 and row["batch_size"] == 1
    from mlhpc.run.emulate import published_rate

    h100 = published_rate("cosmoflow", "h100").samples_per_s
    assert row["h100_samples_per_s"] == h100
    assert row["worker_cores_per_h100"] == pytest.approx(h100 / row["per_worker_samples_per_s"])
    assert report["loader_workers"] == 1 and report["commit"]


def test_without_a_published_rate_the_table_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlhpc.run.emulate", None)  # the import fails
    status, out, err = _run(tmp_path, capsys, monkeypatch)
    assert status == 0, err
    row = next(line for line in out.splitlines() if line.startswith("| cosmoflow |"))
    assert row.endswith("| not available | - |")
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["workloads"]["cosmoflow"]["worker_cores_per_h100"] is None


@pytest.mark.parametrize("args, says", [
    (["--only", "cosmoflow,nosuch"], "--only 'nosuch'"),
    (["--repeats", "0"], "--repeats"),
    (["--data", "{tmp}/missing"], "not a folder"),
    (["--json", "{tmp}"], "is a folder"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, says):
    status = bench.main([arg.format(tmp=tmp_path) for arg in args])
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("loaders_reference: ") and says in err, err
