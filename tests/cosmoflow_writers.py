"""Independent writers of every CosmoFlow form, for tests: nothing here uses the readers' code.

TFRecord is written from its specification (TensorFlow ``record_writer.cc``): uint64 length,
uint32 masked CRC-32C of the length, the data, uint32 masked CRC-32C of the data; CRC-32C is
computed here bit by bit (Castagnoli polynomial, reflected 0x82F63B78), and the
``tf.train.Example`` payload is encoded by hand in protocol-buffer wire format. GZIP comes from
Python's ``gzip`` module, npy from ``numpy.save``, HDF5 from h5py.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import h5py
import numpy as np

_TABLE = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _TABLE.append(_c)


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:  # length-delimited (wire type 2)
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def example(x: np.ndarray | None, y: np.ndarray | None) -> bytes:
    """A serialised tf.train.Example with features x (bytes of int16 counts) and y (floats)."""
    entries = b""
    if x is not None:
        feature = _field(1, _field(1, np.ascontiguousarray(x).astype("<i2").tobytes()))  # bytes_list
        entries += _field(1, _field(1, b"x") + _field(2, feature))
    if y is not None:
        packed = np.asarray(y, "<f4").tobytes()
        feature = _field(2, _field(1, packed))  # float_list, packed repeated float
        entries += _field(1, _field(1, b"y") + _field(2, feature))
    return _field(1, entries)  # Example.features


def frame(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return (length + struct.pack("<I", masked(crc32c(length))) + data
            + struct.pack("<I", masked(crc32c(data))))


def write_tfrecord(path: Path, samples: list[tuple[np.ndarray, np.ndarray]], gz: bool = True) -> Path:
    body = b"".join(frame(example(x, y)) for x, y in samples)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(body) if gz else body)
    return path


def write_npy(folder: Path, name: str, x: np.ndarray, y: np.ndarray) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / f"{name}_data.npy", x.astype(np.int16))
    np.save(folder / f"{name}_label.npy", y.astype(np.float32))


def write_lists(folder: Path) -> None:
    for kind in ("data", "label"):
        names = sorted(p.name for p in folder.glob(f"*_{kind}.npy"))
        (folder / f"files_{kind}.lst").write_text("".join(n + "\n" for n in names))


def write_hdf5(path: Path, x: np.ndarray, y: np.ndarray, keys=("full", "unitPar")) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        f.create_dataset(keys[0], data=x.astype(np.int16))
        f.create_dataset(keys[1], data=y.astype(np.float32))


def samples(n: int, cube: int = 8, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """``n`` random samples: int16 counts (cube, cube, cube, 4) in [0, 500), float32 (4,)."""
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, 500, (cube,) * 3 + (4,)).astype(np.int16),
             rng.uniform(-1, 1, 4).astype(np.float32)) for _ in range(n)]


def write_dataset(root: Path, form: str, train, valid, per_file: int = 1) -> Path:
    """A dataset root with train/ and validation/ in ``form``: tfrecord (GZIP), tfrecord-plain,
    npy, npy-lst, hdf5, hdf5-xy. Names follow the distributed pattern ``..._NNN``."""
    for split, items in (("train", train), ("validation", valid)):
        folder = root / split
        folder.mkdir(parents=True, exist_ok=True)
        for start in range(0, len(items), per_file):
            chunk = items[start:start + per_file]
            name = f"univ_ics_2019-03_a{1000 + start:08d}_{start % 64:03d}"
            if form.startswith("tfrecord"):
                write_tfrecord(folder / f"{name}.tfrecord", chunk, gz=form == "tfrecord")
            elif form.startswith("npy"):
                assert per_file == 1
                write_npy(folder, name, *chunk[0])
            else:
                x = np.stack([c[0] for c in chunk]) if per_file > 1 else chunk[0][0]
                y = np.stack([c[1] for c in chunk]) if per_file > 1 else chunk[0][1]
                write_hdf5(folder / f"{name}.h5", x, y,
                           keys=("x", "y") if form == "hdf5-xy" else ("full", "unitPar"))
        if form == "npy-lst":
            write_lists(folder)
    return root
