"""CosmoFlow embedded data (workloads.cosmoflow.synth) and HDF5 reader (workloads.cosmoflow.data)."""

from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np
import pytest
import torch
from pydantic import ValidationError

from mlhpc.config import DataConfig
from mlhpc.errors import DataError
from mlhpc_workloads.cosmoflow.data import CosmoFlowDataset, build_datasets, find_files
from mlhpc_workloads.cosmoflow.synth import SynthConfig, normalise, synthesize, synthesize_sample

SMALL = dict(cube_size=8, train_samples=4, eval_samples=2, workers=1)


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _config(train: int | None = None, evals: int | None = None) -> SimpleNamespace:
    return SimpleNamespace(data=DataConfig(train_samples=train, eval_samples=evals))


@pytest.fixture(scope="module")
def per_sample(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("per_sample")
    synthesize(root, SynthConfig(**SMALL), seed=7)
    return root


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sharded")
    synthesize(root, SynthConfig(**{**SMALL, "train_samples": 5, "samples_per_file": 2}), seed=7)
    return root


# ----------------------------------------------------------------------------------- config


def test_config_defaults_and_strictness():
    cfg = SynthConfig()
    assert cfg.cube_size == 32 and len(cfg.redshifts) == 4
    assert cfg.ranges().shape == (4, 2)
    with pytest.raises(ValidationError):
        SynthConfig(cube_sise=16)  # unknown key
    with pytest.raises(ValidationError):
        SynthConfig(sigma_8_range=(0.9, 0.8))
    with pytest.raises(ValidationError):
        SynthConfig(omega_m_range=(0.01, 0.3))  # below omega_b


# ----------------------------------------------------------------------------- synthesis


def test_same_seed_identical_bytes_other_seed_differs(tmp_path, per_sample):
    again = tmp_path / "again"
    synthesize(again, SynthConfig(**{**SMALL, "workers": 2}), seed=7)  # process pool this time
    assert _digest(again) == _digest(per_sample)
    other = tmp_path / "other"
    synthesize(other, SynthConfig(**SMALL), seed=8)
    a, b = _digest(per_sample), _digest(other)
    assert a.keys() == b.keys()
    assert all(a[name] != b[name] for name in a if name.endswith(".h5"))


def test_layout_dtypes_and_attributes(per_sample):
    train = sorted(p.name for p in (per_sample / "train").iterdir())
    assert train == [f"univ_{i:06d}.h5" for i in range(4)]
    assert len(list((per_sample / "validation").glob("*.h5"))) == 2
    assert not list(per_sample.rglob("*.part"))
    cfg = SynthConfig(**SMALL)
    with h5py.File(per_sample / "train" / "univ_000002.h5", "r") as f:
        assert f["full"].shape == (8, 8, 8, 4) and f["full"].dtype == np.int16
        assert f["unitPar"].shape == (4,) and f["unitPar"].dtype == np.float32
        assert f["physPar"].shape == (4,) and f["physPar"].dtype == np.float32
        assert list(f.attrs["parameter_names"]) == ["Omega_m", "sigma_8", "n_s", "H0"]
        np.testing.assert_allclose(f.attrs["parameter_ranges"], cfg.ranges())
        np.testing.assert_allclose(f.attrs["redshifts"], cfg.redshifts)
        np.testing.assert_allclose(f["unitPar"][()], normalise(f["physPar"][()], cfg.ranges()),
                                   atol=1e-5)
        full, unit, phys = synthesize_sample(cfg, 7, "train", 2)
        np.testing.assert_array_equal(f["full"][()], full)


def test_sharded_layout(sharded):
    files = sorted((sharded / "train").glob("*.h5"))
    assert [p.name for p in files] == ["univ_000000.h5", "univ_000002.h5", "univ_000004.h5"]
    with h5py.File(files[0], "r") as f:
        assert f["full"].shape == (2, 8, 8, 8, 4) and f["unitPar"].shape == (2, 4)
        second = f["full"][1]
    with h5py.File(files[-1], "r") as f:
        assert f["full"].shape == (1, 8, 8, 8, 4)
    # a sample does not depend on how samples are grouped into files
    full, _, _ = synthesize_sample(SynthConfig(**SMALL), 7, "train", 1)
    np.testing.assert_array_equal(second, full)


def test_targets_in_unit_range_and_spread(tmp_path):
    cfg = SynthConfig(cube_size=4)
    units = np.stack([synthesize_sample(cfg, 3, "train", i)[1] for i in range(40)])
    assert units.dtype == np.float32
    assert np.all(units >= -1) and np.all(units <= 1)
    assert np.all(units.std(axis=0) > 0.3)  # uniform on [-1, 1] has std 0.58


def test_rerun_writes_only_missing_files(tmp_path):
    root = tmp_path / "data"
    cfg = SynthConfig(**SMALL)
    synthesize(root, cfg, seed=1)
    before = _digest(root)
    victim = root / "train" / "univ_000001.h5"
    keep = root / "train" / "univ_000003.h5"
    os.utime(keep, ns=(1, 1))
    victim.unlink()
    synthesize(root, cfg, seed=1)
    assert keep.stat().st_mtime_ns == 1  # untouched
    assert _digest(root) == before  # the missing file came back identical
    synthesize(root, SynthConfig(**{**SMALL, "train_samples": 6}), seed=1)  # grow: adds two
    assert len(list((root / "train").glob("*.h5"))) == 6


def test_rerun_with_other_settings_is_refused(tmp_path):
    root = tmp_path / "data"
    synthesize(root, SynthConfig(**SMALL), seed=1)
    with pytest.raises(DataError, match=r"synth\.json.*seed"):
        synthesize(root, SynthConfig(**SMALL), seed=2)
    with pytest.raises(DataError, match="box_size_mpc_h"):
        synthesize(root, SynthConfig(**{**SMALL, "box_size_mpc_h": 100.0}), seed=1)


def test_mean_count_matches_mean_particles_per_cell():
    cfg = SynthConfig(cube_size=16, mean_particles_per_cell=200.0)
    for index in range(3):
        full = synthesize_sample(cfg, 0, "train", index)[0].astype(np.float64)
        means = full.mean(axis=(0, 1, 2))
        np.testing.assert_allclose(means, 200.0, rtol=0.1)


def _log_variance(cfg: SynthConfig, index: int) -> np.ndarray:
    full = synthesize_sample(cfg, 0, "train", index)[0].astype(np.float64)
    return np.log1p(full).var(axis=(0, 1, 2))  # per channel


def test_fluctuations_grow_with_sigma_8_and_towards_low_redshift():
    low = SynthConfig(cube_size=16, sigma_8_range=(0.60, 0.6001))
    high = SynthConfig(cube_size=16, sigma_8_range=(1.00, 1.0001))
    for index in range(3):  # same index: same phases, same other parameters
        v_low, v_high = _log_variance(low, index), _log_variance(high, index)
        assert np.all(v_high > v_low)
        assert np.all(np.diff(v_high) < 0)  # channels ordered z = 0, 0.5, 1.5, 3


def test_growth_between_channels_depends_on_omega_m():
    # D(z=3)/D(0) is larger for lower Omega_m: the z = 3 channel is relatively less smooth
    low = SynthConfig(cube_size=16, omega_m_range=(0.20, 0.2001), box_size_mpc_h=512.0)
    high = SynthConfig(cube_size=16, omega_m_range=(0.40, 0.4001), box_size_mpc_h=512.0)
    for index in range(3):
        v_low, v_high = _log_variance(low, index), _log_variance(high, index)
        assert v_low[3] / v_low[0] > v_high[3] / v_high[0]


# -------------------------------------------------------------------------------- reader


def test_reader_per_sample(per_sample):
    train, valid = build_datasets(_config(), None, per_sample)
    assert (len(train), len(valid)) == (4, 2)
    assert train.sample_shape == (4, 8, 8, 8) and train.cube_size == 8
    assert train.memory_mapped  # synthesize writes contiguous, unfiltered datasets
    x, y = train[3]
    assert x.dtype == torch.int16 and x.shape == (8, 8, 8, 4)
    assert y.dtype == torch.float32 and y.shape == (4,)
    with h5py.File(per_sample / "train" / "univ_000003.h5", "r") as f:
        raw, unit = f["full"][()], f["unitPar"][()]
    np.testing.assert_array_equal(x.numpy(), raw)
    np.testing.assert_array_equal(y.numpy(), unit)
    decoded = train.device_transform(x[None])
    assert decoded.dtype == torch.float32 and decoded.shape == (1, 4, 8, 8, 8)
    assert decoded.is_contiguous()
    np.testing.assert_allclose(decoded[0].numpy(),
                               np.log1p(np.moveaxis(raw, -1, 0).astype(np.float32)), rtol=1e-6)


def test_reader_sharded_and_first_n(sharded):
    train, valid = build_datasets(_config(train=3, evals=2), None, sharded)
    assert len(train) == 3 and len(train.files) == 2  # the third shard is not even opened
    x, y = train[2]
    with h5py.File(sharded / "train" / "univ_000002.h5", "r") as f:
        np.testing.assert_array_equal(y.numpy(), f["unitPar"][0])
        np.testing.assert_array_equal(x.numpy(), f["full"][0])
    assert train.locate(2) == (sharded / "train" / "univ_000002.h5", 0)
    xb, yb = train.__getitems__([2, 0])
    assert torch.equal(xb[0], x) and torch.equal(yb[0], y) and torch.equal(yb[1], train[0][1])
    everything, _ = build_datasets(_config(), None, sharded)
    assert len(everything) == 5
    with pytest.raises(IndexError):
        everything[5]
    assert torch.equal(everything[-1][0], everything[4][0])


def test_batches_match_single_items_across_shards(sharded):
    train, _ = build_datasets(_config(), None, sharded)
    order = [4, 0, 3, 1, 2]
    xb, yb = train.__getitems__(order)
    assert xb.shape == (5, 8, 8, 8, 4) and yb.shape == (5, 4)
    for row, index in enumerate(order):
        x, y = train[index]
        assert torch.equal(xb[row], x) and torch.equal(yb[row], y)
    loader = torch.utils.data.DataLoader(train, batch_size=2, collate_fn=train.collate_fn)
    batches = list(loader)
    assert [b[0].shape[0] for b in batches] == [2, 2, 1]
    assert torch.equal(torch.cat([b[1] for b in batches]), torch.stack([train[i][1] for i in range(5)]))


def test_chunked_files_read_through_h5py_like_mapped_ones(tmp_path, sharded):
    """Chunked and compressed files cannot be memory-mapped; h5py reads them, same values."""
    chunked = tmp_path / "chunked" / "train"
    chunked.mkdir(parents=True)
    for path in find_files(sharded / "train"):
        with h5py.File(path, "r") as src, h5py.File(chunked / path.name, "w") as dst:
            dst.create_dataset("full", data=src["full"][()], chunks=True, compression="gzip")
            dst.create_dataset("unitPar", data=src["unitPar"][()])
    mapped = CosmoFlowDataset(find_files(sharded / "train"))
    read = CosmoFlowDataset(find_files(chunked))
    assert mapped.memory_mapped and not read.memory_mapped
    order = list(range(5))[::-1]
    for a, b in zip(mapped.__getitems__(order), read.__getitems__(order)):
        assert torch.equal(a, b)


def test_reader_too_few_samples(per_sample):
    with pytest.raises(DataError, match=r"train: 4 samples found in 4 files, 9 asked for"):
        build_datasets(_config(train=9), None, per_sample)


def test_reader_in_dataloader_workers_and_pickle(sharded):
    train, _ = build_datasets(_config(), None, sharded)
    direct = torch.stack([train[i][0] for i in range(len(train))])  # parent holds open maps
    loader = torch.utils.data.DataLoader(train, batch_size=2, num_workers=2,
                                         collate_fn=train.collate_fn)
    through_workers = torch.cat([x for x, _ in loader])  # filled in shared memory by workers
    torch.testing.assert_close(through_workers, direct)
    clone = pickle.loads(pickle.dumps(train))
    torch.testing.assert_close(clone[4][0], train[4][0])


# ------------------------------------------------------------------------ reader errors


def _one_file_dataset(tmp_path: Path, source: Path) -> Path:
    folder = tmp_path / "bad"
    folder.mkdir()
    target = folder / "univ_000000.h5"
    target.write_bytes(source.read_bytes())
    return target


def test_missing_and_empty_folders(tmp_path, per_sample):
    with pytest.raises(DataError, match=r"nowhere.*does not exist"):
        find_files(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"empty: no HDF5 files"):
        find_files(tmp_path / "empty")
    only_train = tmp_path / "only_train"
    (only_train / "train").mkdir(parents=True)
    for p in (per_sample / "train").glob("*.h5"):
        (only_train / "train" / p.name).write_bytes(p.read_bytes())
    with pytest.raises(DataError, match=r"validation: dataset folder does not exist"):
        build_datasets(_config(), None, only_train)


def test_not_hdf5(tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "univ_000000.h5").write_text("this is not HDF5\n")
    with pytest.raises(DataError, match=r"univ_000000\.h5: is not an HDF5 file"):
        CosmoFlowDataset(find_files(folder))


def test_truncated(tmp_path, per_sample):
    path = _one_file_dataset(tmp_path, per_sample / "train" / "univ_000000.h5")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"univ_000000\.h5: cannot be opened as HDF5"):
        CosmoFlowDataset(find_files(path.parent))


def _write(path: Path, **datasets) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        for name, value in datasets.items():
            f.create_dataset(name, data=value)


GOOD_FULL = np.zeros((8, 8, 8, 4), np.int16)
GOOD_UNIT = np.zeros(4, np.float32)


@pytest.mark.parametrize("datasets, message", [
    (dict(unitPar=GOOD_UNIT), r"missing dataset 'full'"),
    (dict(full=GOOD_FULL), r"missing dataset 'unitPar'"),
    (dict(full=np.zeros((8, 8, 4), np.int16), unitPar=GOOD_UNIT), r"'full' has shape \(8, 8, 4\)"),
    (dict(full=np.zeros((8, 8, 6, 4), np.int16), unitPar=GOOD_UNIT), r"'full' has shape"),
    (dict(full=np.zeros((8, 8, 8, 3), np.int16), unitPar=GOOD_UNIT), r"'full' has shape"),
    (dict(full=GOOD_FULL.astype(np.float32), unitPar=GOOD_UNIT), r"'full' has dtype float32"),
    (dict(full=GOOD_FULL, unitPar=np.zeros(3, np.float32)), r"'unitPar' has shape \(3,\)"),
    (dict(full=np.zeros((2, 8, 8, 8, 4), np.int16), unitPar=np.zeros((3, 4), np.float32)),
     r"'unitPar' has shape \(3, 4\); expected \(2, 4\)"),
    (dict(full=GOOD_FULL, unitPar=np.zeros(4, np.int32)), r"'unitPar' has dtype int32"),
])
def test_malformed_files_name_the_file(tmp_path, datasets, message):
    path = tmp_path / "bad" / "univ_000000.h5"
    _write(path, **datasets)
    with pytest.raises(DataError, match=r"univ_000000\.h5: .*" + message):
        CosmoFlowDataset(find_files(path.parent))


def test_mixed_cube_sizes(tmp_path):
    _write(tmp_path / "d" / "a.h5", full=GOOD_FULL, unitPar=GOOD_UNIT)
    _write(tmp_path / "d" / "b.h5", full=np.zeros((4, 4, 4, 4), np.int16), unitPar=GOOD_UNIT)
    with pytest.raises(DataError, match=r"b\.h5: cube size 4; expected 8"):
        CosmoFlowDataset(find_files(tmp_path / "d"))


def test_unreadable_sample_names_file_and_index(tmp_path, sharded):
    path = _one_file_dataset(tmp_path, sharded / "train" / "univ_000000.h5")
    dataset = CosmoFlowDataset(find_files(path.parent))
    with h5py.File(path, "r+") as f:  # replaced after the index was built
        del f["full"]
        f.create_dataset("full", data=np.zeros((1, 8, 8, 8, 4), np.int16))
    with pytest.raises(DataError, match=r"univ_000000\.h5: sample 1: cannot be read"):
        dataset[1]


def test_channel_standardization_uses_training_statistics(tmp_path):
    from mlhpc import config as cfg
    from mlhpc.runtime import Runtime
    from mlhpc_workloads.cosmoflow.data import build_datasets
    from mlhpc_workloads.cosmoflow.synth import SynthConfig, synthesize

    synthesize(tmp_path, SynthConfig(cube_size=8, train_samples=12, eval_samples=4,
                                     box_size_mpc_h=64.0, workers=1), seed=3)
    tree = {"workload": "cosmoflow", "train": {"global_batch_size": 4, "max_epochs": 1},
            "model": {"input_size": 8, "n_conv_layers": 1}}
    raw_train, _ = build_datasets(cfg.from_dict(tree), Runtime(), tmp_path)
    tree["model"]["input_standardization"] = "channel"
    train, valid = build_datasets(cfg.from_dict(tree), Runtime(), tmp_path)
    xs = train.device_transform(train.__getitems__(range(len(train)))[0])
    assert torch.allclose(xs.mean(dim=(0, 2, 3, 4)), torch.zeros(4), atol=1e-4)
    assert torch.allclose(xs.std(dim=(0, 2, 3, 4)), torch.ones(4), atol=1e-2)
    mean, std = raw_train.channel_stats()
    x_raw = raw_train.device_transform(raw_train[0][0][None])
    x_std = train.device_transform(train[0][0][None])
    assert torch.equal(x_raw, torch.log1p(raw_train[0][0].permute(3, 0, 1, 2).float())[None])
    shift, scale = torch.tensor(mean).view(1, 4, 1, 1, 1), torch.tensor(std).view(1, 4, 1, 1, 1)
    assert torch.allclose(x_std, (x_raw - shift) / scale, atol=1e-5)
    assert torch.equal(raw_train[0][1], train[0][1])
    assert valid.device_transform(valid[0][0][None]).shape == (1, 4, 8, 8, 8)


def test_file_truncated_after_the_index_names_file_and_sample(tmp_path, sharded):
    path = _one_file_dataset(tmp_path, sharded / "train" / "univ_000000.h5")
    dataset = CosmoFlowDataset(find_files(path.parent))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1024])  # the last sample's bytes are gone
    with pytest.raises(DataError, match=r"univ_000000\.h5: sample 0: cannot be read"):
        dataset[0]
