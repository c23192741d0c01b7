"""CosmoFlow's on-disk forms (workloads/cosmoflow/formats.py): each read to the same tensors, each
malformed case one DataError naming the file and the record or sample. Files come from the
independent writers in tests/cosmoflow_writers.py."""

from __future__ import annotations

import gzip
from pathlib import Path
from types import SimpleNamespace

import cosmoflow_writers as w
import h5py
import numpy as np
import pytest
import torch
from mlhpc_workloads.cosmoflow import formats, tfrecord_io
from mlhpc_workloads.cosmoflow.data import build_datasets

from mlhpc.config import DataConfig
from mlhpc.errors import DataError

FORMS = ("tfrecord", "tfrecord-plain", "npy", "npy-lst", "hdf5", "hdf5-xy")
TRAIN, VALID = w.samples(6, seed=1), w.samples(3, seed=2)


def _config(**data) -> SimpleNamespace:
    """A config whose ``data`` section holds ``data``. Tests give ``path=`` the folder they read:
    a relative default (``data``) would be looked up in the folder pytest runs in, where a user's
    own ``data/`` (the README's main job makes one) would make it look like a staged copy's source."""
    return SimpleNamespace(data=DataConfig(**data))


def _all(dataset) -> tuple[torch.Tensor, torch.Tensor]:
    return dataset.__getitems__(list(range(len(dataset))))


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    return {form: w.write_dataset(tmp_path_factory.mktemp(form), form, TRAIN, VALID) for form in FORMS}


def test_masked_crc_matches_the_independent_one():
    for data in (b"", b"a", bytes(range(256)) * 3):
        assert tfrecord_io.masked_crc(data) == w.masked(w.crc32c(data))


@pytest.mark.parametrize("form", FORMS)
def test_every_form_reads_the_same_tensors(roots, form):
    train, valid = build_datasets(_config(path=roots[form]), None, roots[form])
    assert train.format == form.split("-")[0]
    assert (len(train), len(valid), train.cube_size) == (6, 3, 8)
    x, y = _all(train)
    assert x.dtype == torch.int16 and x.shape == (6, 8, 8, 8, 4) and y.dtype == torch.float32
    assert torch.equal(x, torch.from_numpy(np.stack([s[0] for s in TRAIN])))
    assert torch.equal(y, torch.from_numpy(np.stack([s[1] for s in TRAIN])))  # bit-exact labels
    for i in (4, 0):  # single items, out of order
        xi, yi = valid[i % 3]
        assert torch.equal(xi, torch.from_numpy(VALID[i % 3][0]))
        assert torch.equal(yi, torch.from_numpy(VALID[i % 3][1]))


def test_several_examples_per_tfrecord_file_and_sample_limits(tmp_path):
    root = w.write_dataset(tmp_path, "tfrecord", TRAIN, VALID, per_file=3)
    assert len(list((root / "train").iterdir())) == 2
    train, valid = build_datasets(_config(train_samples=5, eval_samples=2, path=root), None, root)
    assert (len(train), len(valid)) == (5, 2)
    x, y = _all(train)
    assert torch.equal(x, torch.from_numpy(np.stack([s[0] for s in TRAIN[:5]])))
    assert torch.equal(y, torch.from_numpy(np.stack([s[1] for s in TRAIN[:5]])))


def test_format_override_and_mixed_folders(roots, tmp_path):
    train, _ = build_datasets(_config(path=roots["npy"]), None, roots["npy"])
    assert train.format == "npy"
    with pytest.raises(DataError, match="no hdf5 sample files|no HDF5 files"):
        build_datasets(SimpleNamespace(data=SimpleNamespace(format="hdf5", train_samples=None,
                                                            eval_samples=None)), None, roots["npy"])
    mixed = tmp_path / "mixed" / "train"
    w.write_npy(mixed, "a", *TRAIN[0])
    w.write_hdf5(mixed / "b.h5", *TRAIN[1])
    with pytest.raises(DataError, match=r"mixed/train: holds files of several forms"):
        formats.detect_format(mixed)


# ---------------------------------------------------------------------------- malformed input


def _tf_dataset(tmp_path: Path, body: bytes, gz: bool = True) -> Path:
    root = w.write_dataset(tmp_path / "d", "tfrecord", TRAIN[:2], VALID[:1])
    bad = root / "train" / "univ_ics_2019-03_a00001001_001.tfrecord"
    bad.write_bytes(gzip.compress(body) if gz else body)
    return bad


def _read_everything(root: Path) -> None:
    train, valid = build_datasets(_config(path=root), None, root)
    _all(train), _all(valid)


@pytest.mark.parametrize("case, message", [
    ("data_crc", r"record 0: data CRC mismatch"),
    ("length_crc", r"record 0: length CRC mismatch"),
    ("truncated_record", r"record 0: truncated"),
    ("truncated_gzip", r"truncated GZIP stream"),
    ("not_gzip_body", r"corrupt GZIP stream"),
    ("wrong_shape", r"record 0: feature x holds 12 int16 values; expected S\*\*3 \* 4"),
    ("wrong_cube", r"cube size 4; expected 8"),
    ("missing_labels", r"record 0: feature y \(labels\) missing"),
    ("short_labels", r"record 0: feature y holds 3 floats"),
    ("nan_labels", r"sample 0: target \[nan, .*not finite"),
    ("negative_counts", r"sample 0: negative particle count -3"),
    ("empty", r"empty or truncated TFRecord file|no records"),
])
def test_malformed_tfrecord_names_file_and_record(tmp_path, case, message):
    x, y = TRAIN[1]
    good = w.frame(w.example(x, y))
    if case == "data_crc":
        body = bytearray(good)
        body[40] ^= 1
        bad = _tf_dataset(tmp_path, bytes(body))
    elif case == "length_crc":
        body = bytearray(good)
        body[9] ^= 1
        bad = _tf_dataset(tmp_path, bytes(body))
    elif case == "truncated_record":
        bad = _tf_dataset(tmp_path, good[:-100], gz=False)
    elif case == "truncated_gzip":
        bad = _tf_dataset(tmp_path, good)
        bad.write_bytes(bad.read_bytes()[:-30])
    elif case == "not_gzip_body":
        bad = _tf_dataset(tmp_path, good)
        data = bytearray(bad.read_bytes())
        data[12:40] = b"\xff" * 28
        bad.write_bytes(bytes(data))
    elif case == "wrong_shape":
        bad = _tf_dataset(tmp_path, w.frame(w.example(np.zeros(12, np.int16), y)))
    elif case == "wrong_cube":
        bad = _tf_dataset(tmp_path, w.frame(w.example(np.zeros((4, 4, 4, 4), np.int16), y)))
    elif case == "missing_labels":
        bad = _tf_dataset(tmp_path, w.frame(w.example(x, None)))
    elif case == "short_labels":
        bad = _tf_dataset(tmp_path, w.frame(w.example(x, y[:3])))
    elif case == "nan_labels":
        bad = _tf_dataset(tmp_path, w.frame(w.example(x, np.array([np.nan, 0, 0, 0], np.float32))))
    elif case == "negative_counts":
        xb = x.copy()
        xb[1, 2, 3, 0] = -3
        bad = _tf_dataset(tmp_path, w.frame(w.example(xb, y)))
    else:
        bad = _tf_dataset(tmp_path, b"", gz=False)
    with pytest.raises(DataError, match=str(bad).replace(".", r"\.") + ": .*" + message) as info:
        _read_everything(bad.parent.parent)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("case, message", [
    ("float_counts", r"_data\.npy: dtype float32; expected int16"),
    ("wrong_shape", r"_data\.npy: array of shape \(8, 8, 8, 3\); expected \(S, S, S, 4\)"),
    ("missing_labels", r"_label\.npy: missing labels"),
    ("nan_labels", r"_label\.npy: sample 0: target .*not finite"),
    ("negative_counts", r"_data\.npy: sample 0: negative particle count"),
    ("listed_missing", r"listed in .*files_data\.lst but missing"),
])
def test_malformed_npy_names_the_file(tmp_path, case, message):
    root = w.write_dataset(tmp_path / "d", "npy-lst" if case == "listed_missing" else "npy",
                           TRAIN[:2], VALID[:1])
    folder = root / "train"
    data = sorted(folder.glob("*_data.npy"))[1]
    label = Path(str(data).replace("_data.npy", "_label.npy"))
    if case == "float_counts":
        np.save(data, TRAIN[1][0].astype(np.float32))
    elif case == "wrong_shape":
        np.save(data, TRAIN[1][0][..., :3])
    elif case == "missing_labels":
        label.unlink()
    elif case == "nan_labels":
        np.save(label, np.array([0, np.nan, 0, 0], np.float32))
    elif case == "negative_counts":
        x = TRAIN[1][0].copy()
        x[0, 0, 0, 3] = -1
        np.save(data, x)
    else:
        data.unlink()
    with pytest.raises(DataError, match=message):
        _read_everything(root)


def test_empty_split_and_nan_hdf5_labels(tmp_path):
    root = w.write_dataset(tmp_path / "d", "tfrecord", TRAIN[:2], VALID[:1])
    for p in (root / "validation").iterdir():
        p.unlink()
    with pytest.raises(DataError, match=r"validation: no CosmoFlow sample files"):
        build_datasets(_config(path=root), None, root)
    h5 = w.write_dataset(tmp_path / "h", "hdf5", TRAIN[:2], VALID[:1])
    bad = sorted((h5 / "train").iterdir())[0]
    with h5py.File(bad, "r+") as f:
        f["unitPar"][2] = np.inf
    with pytest.raises(DataError, match=rf"{bad.name}: sample 0: target .*not finite"):
        build_datasets(_config(path=h5), None, h5)


def test_raw_universe_names_data_prepare(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    with h5py.File(raw / "univ_ics_2019-03_a10000668.hdf5", "w") as f:  # allocated lazily: tiny
        f.create_dataset("full", shape=(512, 512, 512, 4), dtype=np.int16, chunks=(64, 64, 64, 4))
        f.create_dataset("unitPar", data=np.zeros(4, np.float32))
    with pytest.raises(DataError, match=r"a10000668\.hdf5: a raw 512\^3 universe.*mlhpc data prepare"):
        build_datasets(_config(path=raw), None, raw)
    root = tmp_path / "root"
    (root / "train").mkdir(parents=True)
    (root / "validation").mkdir()
    (raw / "univ_ics_2019-03_a10000668.hdf5").rename(root / "train" / "u.hdf5")
    w.write_hdf5(root / "validation" / "v.h5", *VALID[0])
    with pytest.raises(DataError, match=r"u\.hdf5: a raw 512\^3 universe.*mlhpc data prepare"):
        build_datasets(_config(path=root), None, root)


def test_tfrecord_file_read_once_per_epoch(roots, monkeypatch):
    train, _ = build_datasets(_config(path=roots["tfrecord"]), None, roots["tfrecord"])
    reads: list[Path] = []
    real = tfrecord_io.read_file
    monkeypatch.setattr(tfrecord_io, "read_file", lambda p: reads.append(p) or real(p))
    for batch in ([3, 1], [0, 5], [2, 4]):
        train.__getitems__(batch)
    assert sorted(reads) == sorted(train.files) and len(reads) == 6


def test_errors_in_a_staged_copy_name_the_source_file(tmp_path):
    import shutil

    source = w.write_dataset(tmp_path / "source", "tfrecord", TRAIN[:2], VALID[:1])
    staged = tmp_path / "node-local" / "copy"
    shutil.copytree(source, staged)
    bad = staged / "train" / "univ_ics_2019-03_a00001001_001.tfrecord"
    bad.write_bytes(bad.read_bytes()[:-9])
    with pytest.raises(DataError) as info:
        _all(build_datasets(_config(path=source), None, staged)[0])
    assert str(info.value).startswith(f"{source}/train/univ_ics_2019-03_a00001001_001.tfrecord: ")
    assert str(info.value).endswith(f"[read from the staged copy {staged}]")
