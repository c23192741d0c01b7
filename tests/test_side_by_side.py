"""benchmarks/side_by_side.py: its machinery (A B A B interleaving, medians, ratios, the printed
line), a quick run on tiny CosmoFlow data (lines, JSON), bad input (exit 2, one line), and the
OC20 model comparison's check that both sides are the same model."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_run_e2e import TINY, tiny_data  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import side_by_side_core as core

LINE = re.compile(r"^(?P<name>[a-z-]+)  mlhpc=(?P<m>[0-9.e+-]+) (?P<unit>\S+)  "
                  r"reference=(?P<r>[0-9.e+-]+) (?P=unit)  ratio=(?P<ratio>[0-9.]+)$")


def script(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "side_by_side.py"), *args],
                          capture_output=True, text=True, timeout=300, cwd=cwd,
                          check=False)


def test_interleave_alternates_the_sides_and_reports_medians():
    calls = []
    rates = {"a": iter([10, 30, 20]), "b": iter([5, 5, 40])}

    def side(name):
        def work():
            calls.append(name)
            return next(rates[name])
        return work

    class Counted(core.Timed):  # the figure is the samples a call returns, not a rate
        def measure(self) -> float:
            return float(self.work())

    timed = [Counted(side(name), 1, 0.0) for name in ("a", "b")]
    result = core.interleave("x", "samples/s", tuple(timed), 3, core.LoadWatch())
    assert calls == ["a", "b"] * 3  # A B A B A B
    assert result.mlhpc_all == [10, 30, 20] and result.reference_all == [5, 5, 40]
    assert result.mlhpc == 20 and result.reference == 5 and result.ratio == 4
    assert LINE.match(result.line()).group("ratio") == "4.000"
    assert result.to_json()["paired_ratios"] == [2.0, 6.0, 0.5]
    slower = core.Measured("t", "s", [2.0], [1.0], higher_is_better=False)
    assert slower.ratio == 0.5  # time-like: mlhpc twice as long is a ratio of 0.5
    assert core.Measured("g", "x", [9.0], [10.0], goal=0.95).met is False


def test_calibrate_warms_up_once_and_sizes_a_measurement():
    count = []

    def work():
        count.append(1)
        return 4
    timed = core.calibrate(work, 0.0)
    assert len(count) == 1 and timed.calls == 1  # the warm-up call is not measured
    assert timed.measure() > 0 and len(count) == 2


def test_quick_run_prints_one_line_per_comparison_and_writes_every_figure(tmp_path, tiny_data):
    out = tmp_path / "sbs.json"
    sets = [arg for value in TINY if value != "--set" for arg in ("--set", value)]
    proc = script("cosmoflow", "--quick", "--batches", "2", "--only", "harness,model,data",
                  "--config", str(REPO / "configs" / "cosmoflow-mini.yaml"), *sets,
                  "--set", f"data.path={tiny_data}", "--set", "data.synthesize_if_missing=false",
                  "--json", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    found = {m.group("name"): m for m in map(LINE.match, lines) if m}
    assert set(found) == {"harness", "data", "data-whole-files", "data-vs-training"}, lines
    assert all(line.startswith("# ") for line in lines if not LINE.match(line)), lines
    assert any(line.startswith("# model: skipped (") for line in lines), lines
    report = json.loads(out.read_text())
    assert set(report["comparisons"]) == set(found) and "model" in report["skipped"]
    for name, row in report["comparisons"].items():
        assert len(row["mlhpc_all"]) == len(row["reference_all"]) >= 1
        assert row["ratio"] == pytest.approx(row["mlhpc"] / row["reference"])
        assert float(found[name].group("ratio")) == pytest.approx(row["ratio"], abs=6e-4)
        assert row["unit"] == found[name].group("unit") == "samples/s"
    assert report["comparisons"]["data-vs-training"]["reference_all"] == \
        report["comparisons"]["harness"]["mlhpc_all"]
    assert report["comparisons"]["harness"]["goal"] == 0.95
    assert report["machine"]["torch"] == torch.__version__
    assert report["load_average_1min"]["samples"] >= 2 and report["threads"] == 1
    assert report["command"].startswith("python benchmarks/side_by_side.py cosmoflow")


@pytest.mark.parametrize("args, says", [
    (["nosuchworkload"], "unknown workload 'nosuchworkload'"),
    (["cosmoflow", "--json", "{tmp}/missing-folder/out.json"], "missing-folder"),
    (["cosmoflow", "--json", "{tmp}"], "is a folder"),
    (["cosmoflow", "--only", "harness,speed"], "--only 'speed'"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, says):
    import side_by_side

    status = side_by_side.main([arg.format(tmp=tmp_path) for arg in args])
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("side_by_side: ") and says in err, err


def test_bad_input_from_the_command_line_exits_2(tmp_path):
    proc = script("nosuchworkload", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stdout == ""


def test_oc20_reference_is_the_same_model_and_a_different_one_is_refused():
    pytest.importorskip("torch_geometric")
    import side_by_side_oc20 as oc20
    from mlhpc_workloads.opencatalyst import dimenet

    small = dimenet.ModelConfig(hidden_channels=16, out_emb_channels=12, num_blocks=2,
                                int_emb_size=8, basis_emb_size=4, num_spherical=3,
                                num_radial=2, cutoff=3.0, max_neighbors=20)
    g = torch.Generator().manual_seed(0)
    cell = torch.tensor([[4.0, 0.0, 0.0], [0.7, 4.0, 0.0], [0.3, -0.4, 5.0]])
    pos = torch.rand(2 * 6, 3, generator=g) @ cell
    x = {"atomic_numbers": torch.randint(1, 30, (12,), generator=g), "pos": pos,
         "cell": torch.stack([cell, cell]), "natoms": torch.tensor([6, 6]),
         "batch": torch.arange(2).repeat_interleave(6)}
    x = oc20.with_edges(x, small.cutoff, small.max_neighbors)
    assert x["neighbors"].sum() == x["edge_index"].shape[1] > 0
    ours, theirs = oc20.twin_models(small)
    worst = oc20.agreement(ours, theirs, [(x, None, 2)])
    assert worst["forces"] < oc20.RTOL_FORCES and worst["energy"] < oc20.RTOL_FORCES
    with torch.no_grad():
        theirs.interaction_blocks[0].lin_kj.weight.mul_(1.5)
    with pytest.raises(core.Skipped, match="disagree"):
        oc20.agreement(ours, theirs, [(x, None, 2)])


# ---- the readers the data comparison holds to 0.8 of a raw read: cheaper, every check kept ----


def test_deepcam_batches_are_read_in_place_and_every_read_still_checks_its_labels(tmp_path):
    import h5py
    from test_deepcam import _write_official

    from mlhpc.errors import DataError
    from mlhpc_workloads.deepcam.data import CamDataset, FilledBatch

    root = tmp_path / "data"
    _write_official(root, n_train=4)
    files = sorted((root / "train").glob("data-*.h5"))
    dataset = CamDataset(files, root / "stats.h5")
    batch = dataset.__getitems__([2, 0, 3])
    assert isinstance(batch, FilledBatch) and len(batch) == 3
    x, y = dataset.collate_fn(batch)  # the filled batch itself, no copy
    assert x.data_ptr() == batch.batch[0].data_ptr() and y.dtype == torch.int64
    for row, index in enumerate((2, 0, 3)):
        one_x, one_y = dataset[index]
        assert torch.equal(x[row], one_x) and torch.equal(y[row], one_y)
        with h5py.File(files[index]) as f:
            assert torch.equal(one_y, torch.from_numpy(f["climate/labels_0"][...].astype(np.int64)))
    with h5py.File(files[0], "r+") as f:  # values checked once a process; labels at every read
        f["climate/labels_0"][0, 0] = 7
    with pytest.raises(DataError, match=r"labels_0 holds class 7"):
        dataset.__getitems__([1, 0])
    with h5py.File(files[1], "r+") as f:
        del f["climate/labels_0"]
    with pytest.raises(DataError, match=r"dataset climate/labels_0 missing"):
        dataset[1]


@pytest.mark.parametrize("edges", [True, False])
def test_oc20_records_are_checked_once_and_read_the_same_after_and_afresh_when_changed(
        tmp_path, monkeypatch, edges):
    from test_oc20_data import _record

    from mlhpc.errors import DataError
    from mlhpc_workloads.opencatalyst import lmdb_io

    path = tmp_path / "data.0000.lmdb"
    lmdb_io.write_lmdb(path, [_record(4, 0, edges), _record(6, 1, edges), _record(5, 2, edges)])
    folder = lmdb_io.LmdbFolder(tmp_path)
    checked = []
    real = lmdb_io.validate_record
    monkeypatch.setattr(lmdb_io, "validate_record",
                        lambda fields, where: checked.append(where) or real(fields, where))
    first = [folder[i] for i in range(3)]
    again = [folder[i] for i in (2, 0, 1, 0)]
    assert len(checked) == 3  # each record's values checked once
    for a, b in zip([first[2], first[0], first[1], first[0]], again):
        assert a.keys() == b.keys() and ("edge_index" in a) == edges
        for key in a:
            assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
            assert torch.equal(a[key], b[key]), key
    bad = _record(4, 0, edges)
    bad["pos"][1, 2] = np.nan
    lmdb_io.write_lmdb(path, [bad, _record(6, 1, edges), _record(5, 2, edges)])  # a new file
    with pytest.raises(DataError, match=r"key '0': pos holds NaN"):
        folder[0]
    assert torch.equal(folder[1]["pos"], first[1]["pos"]) and len(checked) == 5
