"""The data commands on a full disk, on GZIP TFRecords whose stream is damaged where a header-only
look cannot see it, on trajectories whose cell multiplies periodic images, and the LMDB writer's
map sized by its data: each through the command line, one line naming the file and exit 2, or a
bound stated and kept."""

from __future__ import annotations

import errno
import gzip
import os
import shutil
import subprocess
import sys
from pathlib import Path

import lmdb
import numpy as np
import pytest
from click.testing import CliRunner
from mlhpc_workloads.opencatalyst import images, lmdb_io

from mlhpc.cli import main
from mlhpc.errors import DataError

sys.path.insert(0, str(Path(__file__).parent))
import cosmoflow_writers as writers
from test_oc20_data import _record


def cli(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def one_error_line(result, *names: str) -> str:
    """Exit 2, no traceback, and exactly one ``mlhpc: error:`` line, naming each of ``names``."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("mlhpc: error: ")]
    assert len(errors) == 1, result.output
    for name in names:
        assert name in errors[0], (name, errors[0])
    return errors[0]


def _oc20(root: Path, records: int = 6) -> Path:
    for split in ("train", "val_id"):
        (root / split).mkdir(parents=True)
        lmdb_io.write_lmdb(root / split / "data.0000.lmdb", [_record(6, s) for s in range(records)])
    return root


def _trajectories(raw: Path, cells: list[np.ndarray]) -> Path:
    """One extxyz per cell: a few Cu atoms with EMT energies and forces."""
    import ase.io
    from ase import Atoms
    from ase.calculators.emt import EMT
    from ase.calculators.singlepoint import SinglePointCalculator

    raw.mkdir(parents=True)
    for k, cell in enumerate(cells):
        atoms = Atoms("Cu4", positions=[[0, 0, 0], [1.8, 0, 0], [0, 1.8, 0], [1.8, 1.8, 0.01]],
                      cell=cell, pbc=True)
        atoms.calc = EMT()
        energy, forces = atoms.get_potential_energy(), atoms.get_forces()
        atoms.calc = SinglePointCalculator(atoms, energy=energy, forces=forces)
        ase.io.write(raw / f"t{k}.extxyz", [atoms], format="extxyz")
    return raw


def _no_partial_files(folder: Path) -> None:
    left = [p for p in folder.rglob("*") if "mlhpc-part" in p.name or p.name.endswith("-lock")]
    assert not left, left


# ---- 9b. a full disk: one line, exit 2, nothing left half-written ---------------------------------


def _full_disk(*_args, **_kwargs):
    raise lmdb.Error("mdb_txn_commit: No space left on device")


def test_a_full_disk_during_oc20_convert_is_one_line(tmp_path, monkeypatch):
    data = _oc20(tmp_path / "data")
    monkeypatch.setattr(lmdb_io, "_put_all", _full_disk)
    out = tmp_path / "out"
    line = one_error_line(cli("data", "convert", "oc20", str(data), str(out), "--to", "lmdb", "--workers", "1"),
                          str(out / "train" / "data.0000.lmdb"), "no space left on device",
                          str(data / "train" / "data.0000.lmdb"))
    assert "run the command again to resume" in line
    _no_partial_files(out)


def test_a_full_disk_during_oc20_prepare_is_one_line(tmp_path, monkeypatch):
    raw = _trajectories(tmp_path / "raw", [np.eye(3) * 8.0, np.eye(3) * 9.0])
    monkeypatch.setattr(lmdb_io, "_put_all", _full_disk)
    out = tmp_path / "out"
    one_error_line(cli("data", "prepare", "oc20", str(raw), str(out), "--workers", "1"),
                   str(out / "train" / "t0.lmdb"), "no space left on device", str(raw / "t0.extxyz"))
    _no_partial_files(out)


def test_a_write_cut_short_without_an_errno_on_a_full_disk_says_so(tmp_path, monkeypatch):
    """numpy's ``tofile`` reports a short write as ``N requested and M written`` with no errno;
    with the file system full, the line says what it means."""
    from mlhpc_workloads.cosmoflow.convert import DATA_TOOLS

    from mlhpc.data import convert

    data = writers.write_dataset(tmp_path / "data", "tfrecord", writers.samples(2), writers.samples(1, seed=1))

    def short(*_args, **_kwargs):
        raise OSError("131072 requested and 131008 written")

    monkeypatch.setattr(type(DATA_TOOLS), "convert_file", short)  # the class: undone cleanly
    monkeypatch.setattr(convert, "disk_full", lambda folder: True)
    out = tmp_path / "out"
    one_error_line(cli("data", "convert", "cosmoflow", str(data), str(out), "--to", "npy", "--workers", "1"),
                   str(out / "train"), "no space left on device", str(data / "train"))
    monkeypatch.setattr(convert, "disk_full", lambda folder: False)
    one_error_line(cli("data", "convert", "cosmoflow", str(data), str(out), "--to", "npy", "--workers", "1"),
                   "131072 requested and 131008 written")


def _tmpfs(folder: Path, size: str):
    """Mount a tmpfs of ``size`` on ``folder`` (root with CAP_SYS_ADMIN), or skip."""
    folder.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small file system needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(folder)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()[:100]})")


@pytest.mark.parametrize("workload, to", [("oc20", "lmdb"), ("cosmoflow", "npy"), ("cosmoflow", "hdf5")])
def test_a_real_full_disk_during_convert_is_one_line(tmp_path, workload, to):
    """Converting into a 256 KiB file system that fills up: one line naming the output and the
    full disk, exit 2, no partial file left."""
    if workload == "oc20":
        data = _oc20(tmp_path / "data", records=120)
    else:
        data = writers.write_dataset(tmp_path / "data", "tfrecord", writers.samples(8, cube=32),
                                     writers.samples(4, cube=32, seed=1), per_file=2)
    small = tmp_path / "small"
    _tmpfs(small, "256k")
    try:
        out = small / "out"
        result = cli("data", "convert", workload, str(data), str(out), "--to", to, "--workers", "1")
        one_error_line(result, str(out / "train"), "no space left on device")
        _no_partial_files(out)
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


# ---- 9c. quick check of a GZIP TFRecord verifies its stream ---------------------------------------


def _gzip_dataset(root: Path) -> Path:
    return writers.write_dataset(root, "tfrecord", writers.samples(4), writers.samples(2, seed=1), per_file=2)


def _damage(path: Path, at: int, value: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    data[at] = (data[at] ^ 0xFF) if value is None else value
    path.write_bytes(bytes(data))


def _victim(root: Path) -> Path:
    return min((root / "train").glob("*.tfrecord"))


@pytest.mark.parametrize("where, says", [
    (-8, "incorrect data check"),  # the GZIP CRC-32 of the inflated data
    (-3, "incorrect length check"),  # ISIZE's high byte: what the header-only look relies on
    ("middle", "corrupt GZIP stream"),
])
def test_quick_check_of_a_gzip_tfrecord_verifies_its_stream(tmp_path, where, says):
    root = _gzip_dataset(tmp_path / "data")
    assert cli("data", "check", "cosmoflow", str(root)).exit_code == 0
    victim = _victim(root)
    size = victim.stat().st_size
    _damage(victim, size // 2 if where == "middle" else size + where)
    result = cli("data", "check", "cosmoflow", str(root))
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    naming = [line for line in result.output.splitlines() if str(victim) in line]
    assert len(naming) == 1 and says in naming[0], result.output


def test_quick_check_walks_the_record_headers_inside_the_stream(tmp_path):
    """A record header whose length CRC is wrong, GZIP-compressed intact: quick check inflates
    the stream and names the record."""
    root = _gzip_dataset(tmp_path / "data")
    victim = _victim(root)
    body = bytearray(gzip.decompress(victim.read_bytes()))
    second = int.from_bytes(body[:8], "little") + 16
    body[second + 8] ^= 0xFF
    victim.write_bytes(gzip.compress(bytes(body)))
    result = cli("data", "check", "cosmoflow", str(root))
    naming = [line for line in result.output.splitlines() if str(victim) in line]
    assert result.exit_code == 2 and len(naming) == 1, result.output
    assert "record 1: length CRC mismatch" in naming[0]


def test_quick_check_takes_several_gzip_members_and_zero_padding(tmp_path):
    from mlhpc_workloads.cosmoflow import tfrecord_io

    root = _gzip_dataset(tmp_path / "data")
    victim = _victim(root)
    body = gzip.decompress(victim.read_bytes())
    half = int.from_bytes(body[:8], "little") + 16
    victim.write_bytes(gzip.compress(body[:half]) + gzip.compress(body[half:]) + b"\0" * 100)
    assert tfrecord_io.count_gzip_frames(victim) == 2
    assert cli("data", "check", "cosmoflow", str(root)).exit_code == 0
    victim.write_bytes(gzip.compress(body) + b"garbage")
    with pytest.raises(DataError, match="garbage after the GZIP stream"):
        tfrecord_io.count_gzip_frames(victim)
    victim.write_bytes(gzip.compress(body)[:-20])
    with pytest.raises(DataError, match="truncated GZIP stream"):
        tfrecord_io.count_gzip_frames(victim)


# ---- 4. periodic images counted before they are built ---------------------------------------------


def test_prepare_refuses_a_needle_cell_by_its_stated_bound(tmp_path):
    """A cell 0.01 A thin along one axis (volume 0.64 A^3 would also fail; 2 A^3 here): 3 x 3 x
    1201 images within 6 A, refused from the cell before any is built, naming file and frame."""
    raw = _trajectories(tmp_path / "raw", [np.eye(3) * 8.0, np.diag([8.0, 8.0, 0.03125])])
    out = tmp_path / "out"
    line = one_error_line(cli("data", "prepare", "oc20", str(raw), str(out), "--workers", "1"),
                          f"{raw / 't1.extxyz'}: frame 0", f"over the bound of {images.MAX_PERIODIC_IMAGES}")
    assert "3 x 3 x 385" in line
    _no_partial_files(out)


def test_the_image_bound_is_counted_without_building_the_images():
    cell = np.diag([8.0, 8.0, 1e-9])
    with pytest.raises(DataError, match="number 1.08e\\+11 \\(3 x 3 x 12000000001\\)"):
        images.check_images(cell, np.ones(3, dtype=bool), 4, 6.0, "s")
    with pytest.raises(DataError, match="computes .* distances, over the bound"):
        images.check_images(np.eye(3) * 3.0, np.ones(3, dtype=bool), 2000, 6.0, "s")
    assert images.check_images(np.eye(3) * 3.0, np.array([True, True, False]), 10, 6.0, "s").tolist() == [2, 2, 0]


# ---- 4. the LMDB writer's map follows its data ----------------------------------------------------


def _map_bytes(path: Path) -> int:
    """The map size the newest meta page records (liblmdb ``MDB_meta.mm_mapsize``, after its
    16-byte page header, magic, version and address; the transaction id at 144)."""
    data = path.read_bytes()
    psize = int.from_bytes(data[16 + 24:16 + 28], "little")  # the free DB's md_pad: the page size
    metas = [(int.from_bytes(data[b + 144:b + 152], "little"), int.from_bytes(data[b + 32:b + 40], "little"))
             for b in (0, psize)]
    return max(metas)[1]


def test_the_lmdb_map_starts_small_and_grows_with_the_data(tmp_path, monkeypatch):
    """The reference maps a fixed 2 TiB; the writer maps `FIRST_MAP_BYTES` and doubles the map
    when a transaction fills it (replaying the transaction), every record kept."""
    small = tmp_path / "small.lmdb"
    lmdb_io.write_lmdb(small, [_record(6, s) for s in range(4)])
    assert _map_bytes(small) == lmdb_io.FIRST_MAP_BYTES == 16 << 20
    monkeypatch.setattr(lmdb_io, "FIRST_MAP_BYTES", 64 << 10)
    monkeypatch.setattr(lmdb_io, "RECORDS_PER_TXN", 16)
    grown = tmp_path / "grown.lmdb"
    assert lmdb_io.write_lmdb(grown, [_record(6, s) for s in range(100)]) == 100
    assert _map_bytes(grown) in (128 << 10, 256 << 10, 512 << 10, 1 << 20)
    assert lmdb_io.check_file(grown, full=True).records == 100


def test_the_lmdb_map_is_bounded_by_the_largest_file_the_reader_opens(tmp_path, monkeypatch):
    monkeypatch.setattr(lmdb_io, "FIRST_MAP_BYTES", 64 << 10)
    monkeypatch.setattr(lmdb_io, "MAX_FILE_BYTES", 128 << 10)
    with pytest.raises(DataError, match="over 131072 bytes, the largest the reader opens"):
        lmdb_io.write_lmdb(tmp_path / "x.lmdb", [_record(6, s) for s in range(100)])
    assert not list(tmp_path.iterdir())


def test_a_full_disk_is_enospc_from_the_writer(tmp_path, monkeypatch):
    monkeypatch.setattr(lmdb_io, "_put_all", _full_disk)
    with pytest.raises(OSError) as raised:
        lmdb_io.write_lmdb(tmp_path / "x.lmdb", [_record(6, 0)])
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(tmp_path / "x.lmdb")
    assert not list(tmp_path.iterdir())
