"""OC20 data: the OCP LMDB format (read safely, written), the EMT mini data, the batching, the
extxyz preparation and the no-network baselines (workloads/opencatalyst, benchmarks/baseline_oc20.py).

The baseline figures pinned here were measured on the default synth physics
(`SynthConfig()`: 7 metals x (111: 4 sites, 100: 3 sites) x 6 adsorbates, 2x2x4 slabs, rattle
0.010 A) synthesised with 150 training / 60 validation structures, seed 0: zero 0.0635, element mean
0.0640, mean |F| 0.136 eV/A. On the full default data (2,000 / 400 structures) `benchmarks/baseline_oc20.py` measured
zero 0.0604, element mean 0.0604, mean |F| 0.129 eV/A, 17.3 atoms per structure.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import subprocess
import sys
from pathlib import Path

import lmdb
import numpy as np
import pytest
import torch
from mlhpc_workloads.opencatalyst import data, lmdb_io, prepare, synth

from mlhpc.errors import DataError

ROOT = Path(__file__).resolve().parents[1]
TARGET = 0.036


def _record(n: int = 4, seed: int = 0, edges: bool = True) -> dict:
    rng = np.random.default_rng(seed)
    rec = {"pos": rng.uniform(0, 5, (n, 3)), "cell": np.eye(3) * 6.0,
           "atomic_numbers": rng.integers(1, 80, n), "natoms": n,
           "tags": np.array([0, 1, 2, 2][:n] + [1] * max(0, n - 4)),
           "fixed": np.array([1] + [0] * (n - 1)), "force": rng.normal(0, 0.1, (n, 3)),
           "y": float(rng.normal()), "sid": seed, "fid": 3}
    if edges:
        rec["edge_index"] = np.array([[1, 0, 2], [0, 1, 1]])
        rec["cell_offsets"] = np.array([[0, 0, 0], [1, 0, 0], [0, -1, 0]])
    return rec


def _raw_lmdb(path: Path, values: dict[bytes, bytes]) -> Path:
    env = lmdb.open(str(path), map_size=1 << 24, subdir=False, lock=False)
    with env.begin(write=True) as txn:
        for key, value in values.items():
            txn.put(key, value)
    env.close()
    return path


def _one_record_file(tmp_path: Path, blob: bytes) -> Path:
    return _raw_lmdb(tmp_path / "data.0000.lmdb", {b"0": blob, b"length": pickle.dumps(1)})


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("layout", lmdb_io.LAYOUTS)
def test_records_round_trip(tmp_path, layout):
    recs = [_record(4, s) for s in range(3)] + [_record(5, 9, edges=False)]
    assert lmdb_io.write_lmdb(tmp_path / "data.0000.lmdb", recs[:2], layout) == 2
    assert lmdb_io.write_lmdb(tmp_path / "data.0001.lmdb", recs[2:], layout) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.0000.lmdb", "data.0001.lmdb"]
    folder = lmdb_io.LmdbFolder(tmp_path)
    assert len(folder) == 4 and folder.position(2) == (1, 0)
    for want, got in zip(recs, folder):
        np.testing.assert_allclose(got["pos"].numpy(), want["pos"], rtol=1e-6)
        np.testing.assert_allclose(got["forces"].numpy(), want["force"], rtol=1e-6)
        assert got["atomic_numbers"].tolist() == list(want["atomic_numbers"])
        assert got["fixed"].tolist() == [bool(v) for v in want["fixed"]]
        assert got["cell"].shape == (1, 3, 3) and got["energy"].item() == pytest.approx(want["y"])
        assert got["pos"].dtype == torch.float32 and got["atomic_numbers"].dtype == torch.int64
        assert ("edge_index" in got) == ("edge_index" in want)
    assert folder[1]["edge_index"].tolist() == [[1, 0, 2], [0, 1, 1]]
    check = lmdb_io.check_file(tmp_path / "data.0000.lmdb", full=True)
    assert (check.records, check.pos_shape) == (2, (4, 3))
    assert lmdb_io.encode_record(recs[0], layout) == lmdb_io.encode_record(recs[0], layout)


def test_written_records_are_torch_geometric_data(tmp_path):
    pyg = pytest.importorskip("torch_geometric.data", reason="torch_geometric not installed")
    rec = _record()
    obj = pickle.loads(lmdb_io.encode_record(rec))  # what the reference's LmdbDataset does
    assert isinstance(obj, pyg.Data) and obj.num_nodes == 4 and obj.natoms == 4
    assert obj.atomic_numbers.dtype == torch.float32 and obj.fixed.dtype == torch.float32  # AtomsToGraphs
    batch = pyg.Batch.from_data_list([obj, obj])
    assert batch.edge_index[:, 3:].tolist() == [[5, 4, 6], [4, 5, 5]]
    # and a Data pickled by torch_geometric itself reads back through the restricted unpickler
    real = pyg.Data(pos=torch.rand(3, 3), cell=torch.eye(3).view(1, 3, 3), natoms=3,
                    atomic_numbers=torch.Tensor([29, 29, 8]), tags=torch.LongTensor([0, 1, 2]),
                    fixed=torch.zeros(3), force=torch.rand(3, 3), y=-1.0)
    got = lmdb_io.decode_record(pickle.dumps(real, protocol=-1), "x")
    assert torch.equal(got["pos"], real.pos) and got["atomic_numbers"].tolist() == [29, 29, 8]


def test_old_and_new_layouts_read_alike():
    rec = _record()
    old = lmdb_io.load_record(lmdb_io.encode_record(rec, "pyg1"), "x")
    new = lmdb_io.load_record(lmdb_io.encode_record(rec, "pyg2"), "x")
    assert old.keys() == new.keys() and "pos" in old
    a, b = lmdb_io.validate_record(old, "x"), lmdb_io.validate_record(new, "x")
    assert all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------ refusals


class _Call:
    """Pickles as ``func(*args)``: what a crafted LMDB value would hold."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


@pytest.mark.parametrize("make", ["os.system", "builtins.eval", "subprocess.call", "nested"])
def test_crafted_pickle_runs_no_code(tmp_path, make):
    marker = tmp_path / "pwned"
    shell = f"touch {marker}"
    payload = {"os.system": _Call(os.system, shell),
               "builtins.eval": _Call(eval, f"open({str(marker)!r}, 'w').close()"),
               "subprocess.call": _Call(subprocess.call, ["touch", str(marker)]),
               "nested": {"pos": _Call(os.system, shell)}}[make]
    path = _one_record_file(tmp_path, pickle.dumps(payload, protocol=2))
    folder = lmdb_io.LmdbFolder(tmp_path)
    with pytest.raises(DataError) as err:
        folder[0]
    refused = {"os.system": "posix.system", "nested": "posix.system", "builtins.eval": "builtins.eval",
               "subprocess.call": "subprocess.call"}[make]
    assert str(path) in str(err.value) and "key '0'" in str(err.value)
    assert f"refused global {refused}" in str(err.value)
    assert not marker.exists()


def _bad(name: str) -> bytes:
    rec = _record()
    if name == "foreign pickle":
        import datetime
        return pickle.dumps(datetime.datetime(2020, 1, 1))
    if name == "not a pickle":
        return b"\x80\x04garbage"
    if name == "missing key":
        del rec["force"]
    elif name == "NaN forces":
        rec["force"][1, 2] = np.nan
    elif name == "inf energy":
        rec["y"] = float("inf")
    elif name == "pos shape":
        rec["pos"] = rec["pos"][:, :2]
    elif name == "force shape":
        rec["force"] = rec["force"][:3]
    elif name == "cell shape":
        rec["cell"] = np.eye(2)
    elif name == "natoms":
        rec["natoms"] = 5
    elif name == "atomic number":
        rec["atomic_numbers"][0] = 119
    elif name == "edges":
        rec["edge_index"][0, 0] = 4
    return lmdb_io.encode_record(rec) if name != "cell shape" else _cell_2x2(rec)


def _cell_2x2(rec: dict) -> bytes:
    fields = lmdb_io.load_record(lmdb_io.encode_record({**rec, "cell": np.eye(3)}), "x")
    fields["cell"] = torch.eye(2)
    return pickle.dumps(fields)


@pytest.mark.parametrize("name, says", [
    ("foreign pickle", "refused global datetime.datetime"), ("not a pickle", "not a graph record"),
    ("missing key", "missing 'force'"), ("NaN forces", "force holds NaN"), ("inf energy", "y holds NaN"),
    ("pos shape", "pos has shape (4, 2)"), ("force shape", "force has shape (3, 3)"),
    ("cell shape", "cell has shape (2, 2)"), ("natoms", "natoms is [5]"),
    ("atomic number", "atomic_numbers holds 119"), ("edges", "edge_index holds 4")])
def test_malformed_record_names_file_and_key(tmp_path, name, says):
    path = _one_record_file(tmp_path, _bad(name))
    with pytest.raises(DataError) as err:
        lmdb_io.check_file(path, full=False)
    assert str(err.value).startswith(f"{path}: key '0': ") and says in str(err.value)


def test_truncated_and_foreign_files(tmp_path):
    path = tmp_path / "data.0000.lmdb"
    lmdb_io.write_lmdb(path, [_record(40, s) for s in range(60)])
    size = path.stat().st_size
    for keep in (size // 2, 4096 * 3, 100):
        with open(path, "r+b") as f:
            f.truncate(keep)
        with pytest.raises(DataError, match=r"truncated|not a readable LMDB") as err:
            lmdb_io.LmdbFolder(tmp_path)
        assert str(path) in str(err.value)
    path.write_bytes(b"not an lmdb file" * 1000)
    with pytest.raises(DataError, match="not a readable LMDB"):
        lmdb_io.check_file(path, full=False)


def test_quick_check_reads_one_record_full_reads_all(tmp_path):
    good = lmdb_io.encode_record(_record())
    path = _raw_lmdb(tmp_path / "data.0000.lmdb", {b"0": good, b"1": good, b"2": _bad("NaN forces"),
                                                  b"length": pickle.dumps(3)})
    assert lmdb_io.check_file(path, full=False).records == 3
    with pytest.raises(DataError, match=r"key '2': force holds NaN"):
        lmdb_io.check_file(path, full=True)
    lmdb_io.close_all()  # the reader keeps one environment per file; edit the file in place
    _raw_lmdb(path, {b"length": pickle.dumps(7)})
    with pytest.raises(DataError, match=r"key 'length' is 7"):
        lmdb_io.check_file(path, full=False)


def test_links_out_of_the_folder_are_refused(tmp_path):
    outside = tmp_path / "elsewhere.lmdb"
    lmdb_io.write_lmdb(outside, [_record()])
    split = tmp_path / "train"
    split.mkdir()
    (split / "data.0000.lmdb").symlink_to(outside)
    with pytest.raises(DataError, match="symbolic link leads outside"):
        lmdb_io.list_lmdb_files(split)


# ------------------------------------------------------------------------------- batching


def test_collate_offsets_edges_by_atoms_before():
    samples = [lmdb_io.validate_record(_record(n, s), "x") for s, n in enumerate((4, 6, 5))]
    x, y = data.collate(samples)
    assert x["natoms"].tolist() == [4, 6, 5] and x["cell"].shape == (3, 3, 3)
    assert x["batch"].tolist() == [0] * 4 + [1] * 6 + [2] * 5
    assert x["edge_index"].tolist() == [[1, 0, 2, 5, 4, 6, 11, 10, 12], [0, 1, 1, 4, 5, 5, 10, 11, 11]]
    assert x["neighbors"].tolist() == [3, 3, 3] and x["cell_offsets"].shape == (9, 3)
    assert y["forces"].shape == (15, 3) and y["energy"].shape == (3,) and y["fixed"].dtype == torch.bool
    assert x["pos"].dtype == torch.float32 and x["atomic_numbers"].dtype == torch.int64
    x, _ = data.collate([samples[0], lmdb_io.validate_record(_record(4, edges=False), "x")])
    assert "edge_index" not in x


def test_find_split_dirs(tmp_path):
    for name in ("train", "val_id", "notes"):
        (tmp_path / name).mkdir()
    assert data.find_split_dirs(tmp_path) == (tmp_path / "train", tmp_path / "val_id")
    (tmp_path / "val_ood_ads").mkdir()
    with pytest.raises(DataError, match="several folders hold 'val'"):
        data.find_split_dirs(tmp_path)
    with pytest.raises(DataError, match="no folder whose name holds 'train'"):
        data.find_split_dirs(tmp_path / "notes")


# -------------------------------------------------------------------------------- prepare


def test_radius_graph_matches_ase_neighbor_list():
    from ase.build import fcc111
    from ase.neighborlist import neighbor_list

    atoms = fcc111("Cu", size=(2, 2, 3), vacuum=5.0, periodic=True)
    atoms.rattle(0.05, seed=1)
    edge_index, offsets, _ = prepare.radius_graph_pbc(atoms.positions, atoms.cell[:], atoms.pbc,
                                                         radius=4.0, max_neighbors=1000)
    i, j, shift = neighbor_list("ijS", atoms, 4.0)
    ours = sorted(zip(edge_index[1], edge_index[0], *offsets.T))
    assert ours == sorted(zip(i, j, *shift.T))
    capped, _, capped_d = prepare.radius_graph_pbc(atoms.positions, atoms.cell[:], atoms.pbc, 6.0, 50)
    assert np.bincount(capped[1]).max() == 50 and np.all(np.diff(capped_d[capped[1] == 0]) >= 0)


def test_extxyz_to_lmdb(tmp_path):
    import ase.io
    from ase.build import add_adsorbate, fcc111
    from ase.calculators.emt import EMT
    from ase.calculators.singlepoint import SinglePointCalculator
    from ase.constraints import FixAtoms

    frames = []
    for k in range(3):
        atoms = fcc111("Pt", size=(2, 2, 3), vacuum=6.0, periodic=True)
        add_adsorbate(atoms, "O", 1.5, "fcc")
        atoms.set_constraint(FixAtoms(indices=[8, 9, 10, 11]))
        atoms.rattle(0.02, seed=k)
        atoms.calc = EMT()
        energy, forces = atoms.get_potential_energy(), atoms.get_forces(apply_constraint=False)
        atoms.calc = SinglePointCalculator(atoms, energy=energy, forces=forces)
        frames.append(atoms)
    src = tmp_path / "frames.extxyz"
    ase.io.write(src, frames, format="extxyz")
    assert prepare.extxyz_to_lmdb(src, tmp_path / "data.0000.lmdb", get_edges=True) == 3
    rec = lmdb_io.LmdbFolder(tmp_path)[2]
    np.testing.assert_allclose(rec["forces"].numpy(), frames[2].get_forces(apply_constraint=False), atol=1e-5)
    assert int(rec["fixed"].sum()) == 4 and rec["edge_index"].shape[0] == 2
    (tmp_path / "empty.extxyz").write_text("")
    with pytest.raises(DataError, match="empty.extxyz"):
        prepare.extxyz_to_lmdb(tmp_path / "empty.extxyz", tmp_path / "x.lmdb", get_edges=False)


# ---------------------------------------------------------------------------------- synth


def _tiny() -> synth.SynthConfig:
    return synth.SynthConfig(train_samples=12, validation_samples=6, metals=["Cu", "Pt"],
                             adsorbates=["O", "CO"], facets=["111"], workers=1)


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_synth_is_bit_identical_for_a_seed(tmp_path):
    synth.synthesize(tmp_path / "a", _tiny(), 5)
    synth.synthesize(tmp_path / "b", _tiny().model_copy(update={"workers": 2}), 5)
    synth.synthesize(tmp_path / "c", _tiny(), 6)
    a = _digest(tmp_path / "a")
    assert sorted(a) == ["train/data.0000.lmdb", "train/data.0001.lmdb",
                         "validation/data.0000.lmdb", "validation/data.0001.lmdb"]
    assert a == _digest(tmp_path / "b") and a != _digest(tmp_path / "c")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "c"]  # no temporary left
    train, val = data.find_split_dirs(tmp_path / "a")
    ds = data.Oc20Dataset(val)
    assert len(ds) == 6 and set(ds[0]["tags"].tolist()) == {0, 1, 2}
    assert ds[0]["fixed"].sum() == 8 and int(ds[0]["natoms"]) in (17, 18)
    assert not torch.equal(data.Oc20Dataset(train)[0]["pos"], ds[0]["pos"])


def test_an_interrupted_synth_leaves_whole_files_and_resumes_with_the_missing(tmp_path, monkeypatch):
    """Each LMDB file is written whole or not at all; a re-run writes only the missing files
    (the harness makes the data set itself complete or absent: tests/test_embedded.py)."""
    calls = []

    def failing(path, records, layout="pyg2"):
        calls.append(path)
        if len(calls) == 3 and fail:
            raise OSError(28, "No space left on device", str(path))
        return real(path, records, layout)

    real, fail = lmdb_io.write_lmdb, True
    monkeypatch.setattr(lmdb_io, "write_lmdb", failing)
    with pytest.raises(DataError, match="No space left"):
        synth.synthesize(tmp_path / "oc20", _tiny(), 0)
    fail = False
    left = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert [str(p) for p in left] == ["oc20/train/data.0000.lmdb", "oc20/train/data.0001.lmdb"]
    kept = {p: (tmp_path / p).stat().st_mtime_ns for p in left}
    calls.clear()
    synth.synthesize(tmp_path / "oc20", _tiny(), 0)
    assert [p.relative_to(tmp_path / "oc20").as_posix() for p in calls] == [
        "validation/data.0000.lmdb", "validation/data.0001.lmdb"]
    assert all((tmp_path / p).stat().st_mtime_ns == stamp for p, stamp in kept.items())
    fresh = tmp_path / "fresh"
    synth.synthesize(fresh, _tiny(), 0)
    assert _digest(fresh) == _digest(tmp_path / "oc20")


@pytest.mark.slow
def test_baselines_need_a_network(tmp_path):
    """The synth section's defaults (every metal, facet and adsorbate, relaxed to 0.01 eV/A):
    no-network predictors stay far from the target. Slow (about a minute: the relaxations); the
    default suite checks the same on the mini config's data
    (test_oc20_cli.py::test_the_mini_configs_baselines_are_the_readmes)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import baseline_oc20

    cfg = synth.SynthConfig(train_samples=150, validation_samples=60)
    synth.synthesize(tmp_path / "oc20", cfg, 0)
    result = baseline_oc20.baselines(tmp_path / "oc20" / "train", tmp_path / "oc20" / "validation")
    assert result["zero_mae_eV_per_A"] >= 1.25 * TARGET
    assert result["element_mean_mae_eV_per_A"] >= 1.25 * TARGET
    assert result["zero_mae_eV_per_A"] == pytest.approx(0.0635, abs=0.002)
    assert result["element_mean_mae_eV_per_A"] == pytest.approx(0.0640, abs=0.002)
    assert result["element_mean_mae_eV_per_A"] <= 0.10
    assert 17 <= result["atoms_per_structure"]["mean"] <= 18 and result["needs_network"]


def test_loader_workers_open_their_own_environments(tmp_path):
    lmdb_io.write_lmdb(tmp_path / "data.0000.lmdb", [_record(4, s) for s in range(6)])
    ds = data.Oc20Dataset(tmp_path)
    first = ds[0]  # the parent holds the file open now; forked workers must not reuse it
    loader = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=2, collate_fn=ds.collate_fn,
                                         multiprocessing_context="fork")
    batches = list(loader)
    assert [int(x["natoms"].sum()) for x, _ in batches] == [12, 12]
    assert torch.equal(batches[0][0]["pos"][:4], first["pos"])
