"""`mlhpc data convert | prepare | check` (mlhpc/data/ over CosmoFlow's data tools): lossless,
resumable, parallel, with a manifest; bad files named, exit 2. Sources come from the independent
writers in tests/cosmoflow_writers.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import cosmoflow_writers as w
import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from mlhpc_workloads.cosmoflow.convert import CosmoFlowDataTools
from mlhpc_workloads.cosmoflow.data import build_datasets

from mlhpc.data.manifest import MANIFEST_NAME
from mlhpc.data import check as data_check, checksums, convert as data_convert
from mlhpc.config import DataConfig
from mlhpc.errors import DataError
from mlhpc.workload import get

TRAIN, VALID = w.samples(6, seed=3), w.samples(3, seed=4)


@pytest.fixture(scope="module")
def workload():
    return get("cosmoflow")


@pytest.fixture()
def src(tmp_path) -> Path:
    return w.write_dataset(tmp_path / "tf", "tfrecord", TRAIN, VALID)


def _tensors(root: Path) -> tuple[torch.Tensor, ...]:
    train, valid = build_datasets(SimpleNamespace(data=DataConfig()), None, root)
    return (*train.__getitems__(range(len(train))), *valid.__getitems__(range(len(valid))))


@pytest.mark.parametrize("to", ["hdf5", "npy"])
def test_convert_is_bit_exact_with_manifest(workload, src, tmp_path, to):
    result = data_convert.convert(workload, src, tmp_path / to, to, data_convert.ConvertOptions(workers=2))
    assert (result.source_files, result.samples, result.skipped_files) == (9, 9, 0)
    assert result.bytes_read == sum(p.stat().st_size for p in src.rglob("*.tfrecord"))
    for a, b in zip(_tensors(src), _tensors(tmp_path / to)):
        assert a.dtype == b.dtype and torch.equal(a, b)
    manifest = json.loads((tmp_path / to / MANIFEST_NAME).read_text())
    assert manifest["samples"] == 9 and manifest["kind"] == "convert" and manifest["complete"] is True
    for entry in manifest["files"]:
        rel = entry["path"]
        assert (tmp_path / to / rel).stat().st_size == entry["bytes"]
        assert checksums.checksum(tmp_path / to / rel) == entry["xxh3_128"]
    if to == "npy":
        listed = (tmp_path / to / "train" / "files_data.lst").read_text().split()
        assert listed == sorted(listed) and len(listed) == 6
    else:
        with h5py.File(next((tmp_path / to / "train").glob("*.h5"))) as f:
            assert f["full"].dtype == np.int16 and f["full"].chunks is None  # memory-mappable


def test_convert_resumes_and_never_leaves_a_partial_file(workload, src, tmp_path, monkeypatch):
    real = CosmoFlowDataTools.convert_file
    calls = []

    def flaky(self, path, fmt, out_dir, to):
        calls.append(path.name)
        if len(calls) == 4:  # dies while writing the 4th file's output
            from mlhpc.data.files import atomic_output
            with atomic_output(out_dir / "x.h5") as tmp:
                tmp.write_bytes(b"half")
                raise DataError(f"{path}: simulated failure")
        return real(self, path, fmt, out_dir, to)

    monkeypatch.setattr(CosmoFlowDataTools, "convert_file", flaky)
    with pytest.raises(DataError, match="simulated failure"):
        data_convert.convert(workload, src, tmp_path / "out", "hdf5")
    leftovers = [p.name for p in (tmp_path / "out").rglob("*") if ".part" in p.name or p.name == "x.h5"]
    assert leftovers == []
    monkeypatch.setattr(CosmoFlowDataTools, "convert_file", real)
    result = data_convert.convert(workload, src, tmp_path / "out", "hdf5")
    assert result.skipped_files == 3 and result.source_files == 9 and result.samples == 9
    for a, b in zip(_tensors(src), _tensors(tmp_path / "out")):
        assert torch.equal(a, b)


def test_prepare_splits_universes_like_the_reference(workload, tmp_path):
    rng = np.random.default_rng(0)
    raw = tmp_path / "raw"
    raw.mkdir()
    universes = []
    for i in range(2):
        full = rng.integers(0, 100, (16, 16, 16, 4)).astype(np.int16)
        unit = rng.uniform(-1, 1, 4).astype(np.float32)
        with h5py.File(raw / f"univ_ics_2019-03_a{i:08d}.hdf5", "w") as f:
            f["full"], f["unitPar"] = full, unit
        universes.append((full, unit))
    result = data_convert.prepare(workload, raw, tmp_path / "prep", "npy",
                                  data_convert.ConvertOptions(prepare_options={"sample_size": 8}, workers=2))
    assert result.samples == 16 and result.source_files == 2
    # prepare.py's split_universe: np.split along axis 0, then 1, then 2
    expected = [xijk for xi in np.split(universes[1][0], 2, axis=0)
                for xij in np.split(xi, 2, axis=1) for xijk in np.split(xij, 2, axis=2)]
    x, y = build_datasets(SimpleNamespace(data=DataConfig()), None, tmp_path / "prep")[1].__getitems__(range(8))
    assert torch.equal(x, torch.from_numpy(np.stack(expected)))
    assert torch.equal(y, torch.from_numpy(np.tile(universes[1][1], (8, 1))))
    names = sorted(p.name for p in (tmp_path / "prep" / "validation").glob("*_data.npy"))
    assert names[0] == "univ_ics_2019-03_a00000001_000_data.npy"


def test_check_reports_bad_files_and_exits_2(workload, src, tmp_path):
    from mlhpc.cli import main

    bad = sorted((src / "train").iterdir())[2]
    data = bytearray(bad.read_bytes())
    bad.write_bytes(bytes(data[:-20]))  # a truncated download
    report = data_check.check(workload, src, full=True)
    assert not report.ok and report.splits["train"].samples == 5
    assert report.splits["train"].bad == [f"{bad}: truncated GZIP stream (ends after "
                                          f"{len(data) - 20} compressed bytes before the end of "
                                          f"its data); fetch or copy the file again"]
    out = CliRunner().invoke(main, ["data", "check", "cosmoflow", str(src), "--full"])
    assert out.exit_code == 2, out.output
    assert f"bad: {bad}: truncated GZIP stream" in out.output
    good = CliRunner().invoke(main, ["data", "check", "cosmoflow", str(w.write_dataset(
        tmp_path / "ok", "npy", TRAIN, VALID))])
    assert good.exit_code == 0 and "form npy" in good.output and "6 samples of 8x8x8x4 int16" in good.output


def test_cli_convert_summary_and_one_line_errors(src, tmp_path):
    from mlhpc.cli import main

    out = CliRunner().invoke(main, ["data", "convert", "cosmoflow", str(src), str(tmp_path / "n"),
                                    "--to", "npy", "--workers", "2"])
    assert out.exit_code == 0, out.output
    assert "converted 9 files" in out.output and "9 samples" in out.output and "GB/s" in out.output
    again = CliRunner().invoke(main, ["data", "convert", "cosmoflow", str(src), str(tmp_path / "n"),
                                      "--to", "npy"])
    assert "(9 already done)" in again.output
    for args, message in ((["--to", "parquet"], "--to 'parquet': expected one of hdf5, npy"),
                          (["--to", "hdf5", "--format", "npy"], "no npy files")):
        bad = CliRunner().invoke(main, ["data", "convert", "cosmoflow", str(src),
                                        str(tmp_path / "m"), *args])
        assert bad.exit_code == 2 and message in bad.output
        assert "Traceback" not in bad.output


def _learnable(items):
    """Samples a tiny model fits in one epoch (counts 0/1, targets near 0), so that a run of
    configs/cosmoflow.yaml reaches the target and its log is compliant."""
    return [((x % 2).astype(np.int16), (y * 0.02).astype(np.float32)) for x, y in items]


def test_reference_config_runs_on_every_distributed_form(workload, tmp_path, repo):
    """Done-when of the real-data issue: a folder in the distributed TFRecord layout, one in
    NVIDIA's npy layout and one in HDF5 each run `mlhpc run configs/cosmoflow.yaml --set
    data.path=DIR` to a compliant log with the right sample counts and the same eval_error."""
    from conftest import compliance_check

    from mlhpc.cli import main

    tf = w.write_dataset(tmp_path / "tf", "tfrecord", _learnable(w.samples(16, cube=16, seed=1)),
                         _learnable(w.samples(8, cube=16, seed=2)))
    data_convert.convert(workload, tf, tmp_path / "npy", "npy")
    data_convert.convert(workload, tf, tmp_path / "h5", "hdf5")
    small = ["--set", "train.max_epochs=2", "--set", "train.global_batch_size=4",
             "--set", "model.input_size=16", "--set", "model.n_conv_layers=2",
             "--set", "model.conv_channels=4", "--set", "model.dropout=0.0",
             "--set", "data.num_workers=0", "--set", "train.amp=false"]
    errors = []
    for form in ("tf", "npy", "h5"):
        out = tmp_path / f"out-{form}"
        run = CliRunner().invoke(main, ["run", str(repo / "configs" / "cosmoflow.yaml"), "--set",
                                        f"data.path={tmp_path / form}", "--set",
                                        f"output.dir={out}", *small])
        assert run.exit_code == 0, run.output
        log = (out / "result_0.txt").read_text()
        lines = [json.loads(line.split(" ", 1)[1]) for line in log.splitlines()
                 if line.startswith(":::MLLOG")]
        values = {e["key"]: e["value"] for e in lines}
        assert (values["train_samples"], values["eval_samples"]) == (16, 8)
        errors.append([e["value"] for e in lines if e["key"] == "eval_error"])
        checked = compliance_check(out / "result_0.txt")
        assert "SUCCESS" in checked.stdout + checked.stderr, checked.stdout + checked.stderr
    assert errors[0] == errors[1] == errors[2] and errors[0]  # identical training in every form


@pytest.mark.parametrize("to", ["hdf5", "npy"])
def test_convert_copies_stored_counts_bit_exact(workload, tmp_path, to):
    """npy and contiguous HDF5 sources (sharded too) are copied by the kernel, not decoded."""
    for form, per_file in (("npy", 1), ("hdf5", 3)):
        source = w.write_dataset(tmp_path / f"{form}{per_file}", form, TRAIN, VALID, per_file=per_file)
        dest = tmp_path / f"{form}{per_file}-{to}"
        assert data_convert.convert(workload, source, dest, to).samples == 9
        for a, b in zip(_tensors(source), _tensors(dest)):
            assert torch.equal(a, b)
        assert data_check.check(workload, dest, full=True).ok
