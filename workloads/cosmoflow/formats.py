"""The on-disk forms of the CosmoFlow dataset, each read into the same sample ``(x, y)``.

Every reader yields ``x`` int16 particle counts ``(S, S, S, 4)`` channels last, exactly the bytes
stored, and ``y`` float32 ``(4,)`` targets exactly as stored, so the same samples in any form give
bit-identical tensors. The reference sub-volume is S = 128 (16 MiB of int16 counts a sample).

Forms (``data.format``; detected from a split folder's file names by `detect_format`):

- ``tfrecord`` (`tfrecord_format`): one ``tf.train.Example`` per file (several accepted), feature ``x`` = the bytes of
  int16 counts ``(S, S, S, 4)`` C order, feature ``y`` = 4 floats used as they are. Written by
  mlcommons/hpc ``cosmoflow/prepare.py`` (``write_record``), read by ``cosmoflow/data/cosmo.py``
  ``_parse_data`` (``decode_raw(x, tf.int16)``, ``FixedLenFeature([4], tf.float32)``). The
  distributed ``cosmoUniverse_2019_05_4parE_tf_v2`` files are GZIP-compressed TFRecords named like
  ``22098324_univ_ics_2019-03_a13254982_000.tfrecord``; NVIDIA's variant (mlcommons
  hpc_results_v3.0 ``tools/convert_tfrecord_to_gzip.py`` and ``data/dali_tfr_gzip.py``) keeps the
  names, gzips each file and lists ``<file> <size>`` per line in ``files_data.lst``. GZIP is
  detected from the magic bytes; CRCs are verified (`tfrecord_io`).
- ``npy``: NVIDIA's converted layout (mlcommons hpc_results_v1.0 ``tools/init_datasets.sh`` running
  ``convert_tfrecord_to_numpy.py``; read by hpc_results_v3.0 ``data/dali_npy.py``): per sample
  ``<name>_data.npy`` int16 ``(S, S, S, 4)`` and ``<name>_label.npy`` float32 ``(4,)``, with
  ``files_data.lst`` / ``files_label.lst`` (one name a line, sorted) when present.
- ``hdf5``: ``full`` int16 ``(S, S, S, 4)`` or ``(n, S, S, S, 4)`` and ``unitPar`` ``(4,)`` or
  ``(n, 4)`` per file (the raw-universe names, as `synth` writes them and `data convert --to hdf5`
  writes them, contiguous so they memory-map), or the same with dataset names ``x`` and ``y``.

A raw universe (HDF5 ``full`` ``(512, 512, 512, 4)``, ``unitPar`` ``(4,)``, the input of
``prepare.py``) is not a sample: it is refused with a message naming ``mlhpc data prepare``.

Samples are ordered by file stem (the name without its format's suffix), so one dataset converted
between forms keeps its order, and hence its shuffles and its training at a fixed seed.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from mlhpc.data.inputs import read_text_input
from mlhpc.errors import DataError


N_CHANNELS = 4
N_TARGETS = 4
RAW_UNIVERSE_CUBE = 512  # cells per side of a raw N-body universe (prepare.py splits it 4 x 4 x 4)
FORMATS = ("hdf5", "tfrecord", "npy")
DATA_LIST, LABEL_LIST = "files_data.lst", "files_label.lst"
HDF5_SUFFIXES = (".h5", ".hdf5")
TFRECORD_SUFFIXES = (".tfrecord", ".tfrecord.gz", ".tfrecord.gzip", ".tfrecords")
NPY_DATA, NPY_LABEL = "_data.npy", "_label.npy"
HDF5_KEYS = (("full", "unitPar"), ("x", "y"))
DECODED_CACHE_BYTES = 256 * 2**20  # decoded TFRecord files kept per process


def _short(exc: BaseException) -> str:
    """The first line of ``exc``, at most 240 characters: a longer one keeps its start and its end
    (where a reason that names a deep path says what is wrong), the middle elided."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= 240 else f"{text[:80]} ... {text[-155:]}"


def _identity(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


def check_extent(path: Path, size_bytes: int, offset: int, nbytes: int, what: str,
                 exact: bool = False) -> None:
    """Raise DataError when a file of ``size_bytes`` cannot hold the ``nbytes`` its header
    announces at ``offset`` (truncated; with ``exact``, also when it holds more): the cheap
    check of a quick ``data check``, a comparison of header and file size, no data read."""
    end = offset + nbytes
    if size_bytes < end or (exact and size_bytes != end):
        kind = "truncated" if size_bytes < end else "longer than its header says"
        raise DataError(f"{path}: {kind}: {what} ends at byte {end}, the file has {size_bytes} bytes")


def stem(name: str) -> str:
    """A sample file's name without its format's suffix (the sort key shared by every form)."""
    for suffix in (NPY_DATA, NPY_LABEL) + TFRECORD_SUFFIXES + HDF5_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def cube_of(n_values: int, what: str) -> int:
    """S for ``n_values = S**3 * 4`` int16 counts. Raises ValueError naming ``what``."""
    cells = n_values // N_CHANNELS
    side = max(1, round(cells ** (1 / 3)))
    if side**3 * N_CHANNELS != n_values:
        raise ValueError(f"{what} holds {n_values} int16 values; expected S**3 * 4 "
                         f"(a cube of 4 redshift channels)")
    return side


def check_targets(path: Path, targets: np.ndarray, first_index: int = 0) -> None:
    """Raise DataError naming ``path`` and the sample when a target is NaN or infinite."""
    bad = ~np.isfinite(targets).all(axis=1)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DataError(f"{path}: sample {first_index + row}: target {targets[row].tolist()} is "
                        f"not finite (NaN or infinite labels)")


def check_counts(path: Path, counts: np.ndarray, first_index: int = 0) -> None:
    """Raise DataError naming ``path`` and the sample when a particle count is negative.
    ``counts`` is ``(n, S, S, S, 4)``."""
    mins = counts.reshape(counts.shape[0], -1).min(axis=1)
    if (mins < 0).any():
        row = int(np.flatnonzero(mins < 0)[0])
        raise DataError(f"{path}: sample {first_index + row}: negative particle count "
                        f"{int(mins[row])} (counts are >= 0)")


@dataclass(frozen=True)
class FileInfo:
    """What a reader learnt of one file before reading its samples.

    ``targets`` float32 ``(n, 4)``, or None when they are only known once the file is read
    (TFRecord, npy); ``offset`` is the byte offset of a memory-mappable counts array (None: read
    another way); ``keys`` the HDF5 dataset names; ``identity`` ``(inode, size, mtime_ns)``."""

    n_samples: int
    cube: int
    targets: np.ndarray | None
    identity: tuple[int, int, int]
    offset: int | None = None
    keys: tuple[str, str] = ("full", "unitPar")


class Source:
    """One opened file: ``counts[i]`` int16 ``(S, S, S, 4)``, ``targets`` float32 ``(n, 4)``;
    ``checked`` is True when the counts' values were already checked when decoding."""

    def __init__(self, counts: Any, targets: np.ndarray, handle: Any = None,
                 checked: bool = False) -> None:
        self.counts, self.targets, self.handle, self.checked = counts, targets, handle, checked

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None
        self.counts = None


def _map(path: Path, offset: int, shape: tuple[int, ...]) -> np.ndarray:
    """A read-only int16 ndarray of ``shape`` over the file's bytes from ``offset`` (a private
    memory map: pages come from the page cache on first touch, nothing is read up front).
    Raises ValueError when the file is shorter than the array."""
    nbytes = int(np.prod(shape)) * 2
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size < offset + nbytes:
            raise ValueError(f"file is {size} bytes, the counts need {offset + nbytes} (truncated)")
        mapping = mmap.mmap(handle.fileno(), offset + nbytes, flags=mmap.MAP_PRIVATE,
                            prot=mmap.PROT_READ)
    return np.frombuffer(mapping, dtype=np.int16, count=nbytes // 2, offset=offset).reshape(shape)


def _list_file(folder: Path, name: str) -> list[str] | None:
    """The names in a ``files_*.lst`` (first field of each line; NVIDIA's gzip-TFRecord lists add
    ``<size>``), or None when the folder has none."""
    path = folder / name
    if not path.is_file():
        return None
    try:
        lines = read_text_input(path, root=folder, what="file list", error=DataError).splitlines()
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: file list cannot be read ({_short(exc)})") from None
    names = [line.split()[0] for line in lines if line.strip()]
    seen: set[str] = set()
    for name in names:
        if "/" in name or name in (".", ".."):
            raise DataError(f"{path}: entry {name!r} is not a file name in this folder")
        if name in seen:  # MLPerf HPC rules: each datum appears exactly once per epoch
            raise DataError(f"{path}: {name!r} is listed twice (it would be trained on twice an "
                            "epoch; each datum appears exactly once per epoch)")
        seen.add(name)
    return names


def _present(folder: Path, names: list[str], listing: str) -> list[Path]:
    paths = [folder / name for name in names]
    for path in paths:
        if not path.is_file():
            raise DataError(f"{path}: listed in {folder / listing} but missing")
    return paths


# ----------------------------------------------------------------------------------- HDF5


class Hdf5Format:
    """Reader of HDF5 sample files (``full``/``unitPar`` or ``x``/``y``), see the module doc."""

    name = "hdf5"
    max_open = 64  # open files per process: all shards of a mini dataset

    def list_files(self, folder: Path) -> list[Path]:
        files = [p for p in folder.iterdir() if p.name.endswith(HDF5_SUFFIXES) and p.is_file()]
        return sorted(files, key=lambda p: (stem(p.name), p.name))

    def inspect(self, path: Path, full: bool = True) -> FileInfo:
        """Metadata and targets (no sample data); targets are checked to be finite.
        Raises DataError naming the file."""
        del full  # the targets are small: always read
        try:
            identity = _identity(path)
            handle = h5py.File(path, "r")
        except OSError as exc:
            kind = "is not an HDF5 file" if "signature" in str(exc) else "cannot be opened as HDF5"
            raise DataError(f"{path}: {kind} ({_short(exc)})") from None
        with handle:
            keys, n_samples, cube = self._layout(path, handle)
            try:
                targets = np.asarray(handle[keys[1]][()], np.float32).reshape(n_samples, N_TARGETS)
            except OSError as exc:
                raise DataError(f"{path}: dataset {keys[1]!r} cannot be read ({_short(exc)})") from None
            check_targets(path, targets)
            offset = _byte_offset(handle[keys[0]])
            if offset is not None:  # contiguous counts: their extent must lie inside the file
                check_extent(path, identity[1], offset, handle[keys[0]].nbytes,
                             f"dataset {keys[0]!r}")
            return FileInfo(n_samples, cube, targets, identity, offset, keys)

    def _layout(self, path: Path, handle: h5py.File) -> tuple[tuple[str, str], int, int]:
        keys = HDF5_KEYS[1] if "x" in handle and "full" not in handle else HDF5_KEYS[0]
        for name in keys:
            if name not in handle or not isinstance(handle[name], h5py.Dataset):
                raise DataError(f"{path}: missing dataset {name!r}; expected {keys[0]!r} (int16 "
                                f"counts) and {keys[1]!r} (4 targets)")
        full, unit = handle[keys[0]], handle[keys[1]]
        shape = full.shape
        if len(shape) == 4:
            n_samples, cube = 1, shape[:3]
            unit_expected: tuple[int, ...] = (N_TARGETS,)
        elif len(shape) == 5:
            n_samples, cube = shape[0], shape[1:4]
            unit_expected = (shape[0], N_TARGETS)
        else:
            raise DataError(f"{path}: dataset {keys[0]!r} has shape {shape}; expected (S, S, S, 4) "
                            f"or (n, S, S, S, 4)")
        if shape[-1] != N_CHANNELS or len(set(cube)) != 1 or n_samples < 1:
            raise DataError(f"{path}: dataset {keys[0]!r} has shape {shape}; expected a cube of 4 "
                            f"redshift channels, (S, S, S, 4) or (n, S, S, S, 4)")
        if len(shape) == 4 and cube[0] >= RAW_UNIVERSE_CUBE:
            raise DataError(f"{path}: a raw {cube[0]}^3 universe, not a training sample; split it "
                            f"into 128^3 samples first: mlhpc data prepare cosmoflow RAW_DIR DST")
        if full.dtype != np.int16:
            raise DataError(f"{path}: dataset {keys[0]!r} has dtype {full.dtype}; expected int16 "
                            f"particle counts")
        if unit.shape != unit_expected:
            raise DataError(f"{path}: dataset {keys[1]!r} has shape {unit.shape}; expected "
                            f"{unit_expected} to match {keys[0]!r} {shape} (missing labels?)")
        if unit.dtype.kind != "f":
            raise DataError(f"{path}: dataset {keys[1]!r} has dtype {unit.dtype}; expected float32")
        return keys, int(n_samples), int(cube[0])

    def open(self, path: Path, info: FileInfo) -> Source:
        """Raises DataError / ValueError / OSError (the dataset names the file and sample)."""
        if _identity(path) != info.identity:  # replaced since construction: look again
            now = self.inspect(path)
            if (now.n_samples, now.cube) != (info.n_samples, info.cube):
                raise ValueError(f"{now.n_samples} samples of cube size {now.cube}; the index "
                                 f"expected {info.n_samples} of {info.cube} (file changed after "
                                 f"the dataset was built)")
            info = now
        shape = (info.n_samples,) + (info.cube,) * 3 + (N_CHANNELS,)
        if info.offset is not None:
            return Source(_map(path, info.offset, shape), info.targets)
        handle = h5py.File(path, "r")
        full = handle[info.keys[0]]
        return Source(full if len(full.shape) == 5 else _Single(full), info.targets, handle)


def _byte_offset(full: h5py.Dataset) -> int | None:
    """File offset of ``full``'s data when it can be memory-mapped (contiguous, unfiltered,
    allocated, little-endian int16); None otherwise."""
    if full.chunks is not None or full.compression is not None or full.dtype != np.dtype("<i2"):
        return None
    try:
        return full.id.get_offset()
    except Exception:  # pragma: no cover - h5py versions without get_offset
        return None


class _Single:
    """A one-sample file's ``full`` ``(S, S, S, 4)`` indexed like a shard of one."""

    def __init__(self, full: h5py.Dataset) -> None:
        self.full = full

    def __getitem__(self, index: int) -> np.ndarray:
        if index != 0:
            raise IndexError(index)
        return self.full[()]


def _try_identity(path: Path) -> tuple[int, int, int]:
    try:
        return _identity(path)
    except OSError as exc:
        raise DataError(f"{path}: cannot be read ({exc.strerror or exc})") from None


# ------------------------------------------------------------------------------------ npy


def read_npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype, bool, int]:
    """``(shape, dtype, fortran_order, data offset)`` of a ``.npy`` file (numpy's own header
    parser, ``numpy.lib.format``). Raises DataError naming the file."""
    from numpy.lib import format as npy_format

    try:
        with open(path, "rb") as handle:
            version = npy_format.read_magic(handle)
            if version == (1, 0):
                shape, fortran, dtype = npy_format.read_array_header_1_0(handle)
            else:
                shape, fortran, dtype = npy_format.read_array_header_2_0(handle)
            return tuple(shape), np.dtype(dtype), bool(fortran), handle.tell()
    except OSError as exc:
        raise DataError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except (ValueError, SyntaxError) as exc:
        raise DataError(f"{path}: not a .npy file ({_short(exc)})") from None


def label_path(data_path: Path) -> Path:
    """``<name>_label.npy`` beside ``<name>_data.npy``."""
    return data_path.with_name(data_path.name[: -len(NPY_DATA)] + NPY_LABEL)


class NpyFormat:
    """Reader of NVIDIA's per-sample ``.npy`` layout, see the module doc. Counts are memory-mapped
    (C order, little-endian int16); labels are read when the sample is first used."""

    name = "npy"
    max_open = 64

    def list_files(self, folder: Path) -> list[Path]:
        data_names, label_names = _list_file(folder, DATA_LIST), _list_file(folder, LABEL_LIST)
        if data_names is not None:
            files = _present(folder, data_names, DATA_LIST)
            if label_names is not None:
                expected = sorted(label_path(p).name for p in files)
                if sorted(label_names) != expected:
                    extra = sorted(set(expected) ^ set(label_names))
                    raise DataError(f"{folder / LABEL_LIST}: does not pair with {DATA_LIST} "
                                    f"(first difference: {extra[0] if extra else '?'})")
        else:
            files = [p for p in folder.iterdir() if p.name.endswith(NPY_DATA) and p.is_file()]
        for path in files:
            if not path.name.endswith(NPY_DATA):
                raise DataError(f"{path}: expected a <name>_data.npy file")
        return sorted(files, key=lambda p: (stem(p.name), p.name))

    def inspect(self, path: Path, full: bool = False) -> FileInfo:
        """``full``: read both headers and the labels; otherwise only the counts' header.
        Raises DataError naming the file."""
        shape, dtype, fortran, offset = read_npy_header(path)
        if len(shape) not in (4, 5) or shape[-1] != N_CHANNELS or len(set(shape[-4:-1])) != 1:
            raise DataError(f"{path}: array of shape {shape}; expected (S, S, S, 4) int16 counts")
        if dtype != np.dtype("<i2"):
            raise DataError(f"{path}: dtype {dtype}; expected int16 particle counts")
        if fortran:
            raise DataError(f"{path}: stored in Fortran order; expected C order")
        if len(shape) == 4 and shape[0] >= RAW_UNIVERSE_CUBE:
            raise DataError(f"{path}: a raw {shape[0]}^3 universe, not a training sample; split it "
                            f"first: mlhpc data prepare cosmoflow RAW_DIR DST")
        n = 1 if len(shape) == 4 else int(shape[0])
        identity = _try_identity(path)
        check_extent(path, identity[1], offset, int(np.prod(shape)) * dtype.itemsize,
                     f"the header's {shape} {dtype} array", exact=True)
        targets = self._labels(path, n) if full else None
        return FileInfo(n, int(shape[-2]), targets, identity, offset)

    def _labels(self, path: Path, n: int) -> np.ndarray:
        labels = label_path(path)
        if not labels.is_file():
            raise DataError(f"{labels}: missing labels for {path.name}")
        try:
            values = np.load(labels, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise DataError(f"{labels}: cannot be read as .npy ({_short(exc)})") from None
        if values.dtype.kind != "f" or values.size != n * N_TARGETS:
            raise DataError(f"{labels}: labels of shape {values.shape} and dtype {values.dtype}; "
                            f"expected float32 ({N_TARGETS},) per sample")
        targets = np.asarray(values, np.float32).reshape(n, N_TARGETS)
        check_targets(labels, targets)
        return targets

    def open(self, path: Path, info: FileInfo) -> Source:
        if info.targets is None or _identity(path) != info.identity:
            info = self.inspect(path, full=True)
        shape = (info.n_samples,) + (info.cube,) * 3 + (N_CHANNELS,)
        return Source(_map(path, info.offset or 0, shape), info.targets)


def detect_format(folder: Path) -> str:
    """The form of a split folder's samples, from its file names.

    Raises:
        DataError: the folder is missing, holds no sample file of any form, or files of several
            forms (set ``data.format``).
    """
    folder = Path(folder)
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise DataError(f"{folder}: dataset folder {what}; expected CosmoFlow samples (TFRecord, "
                        f"NVIDIA .npy or HDF5) in train/ and validation/")
    found = set()
    with os.scandir(folder) as entries:
        for entry in entries:
            name = entry.name
            if name.endswith(NPY_DATA):
                found.add("npy")
            elif name.endswith(TFRECORD_SUFFIXES):
                found.add("tfrecord")
            elif name.endswith(HDF5_SUFFIXES):
                found.add("hdf5")
            if len(found) > 1:
                raise DataError(f"{folder}: holds files of several forms ({', '.join(sorted(found))}); "
                                f"keep one per folder or set data.format")
    if not found:
        raise DataError(f"{folder}: no CosmoFlow sample files (*.tfrecord[.gz], *_data.npy, *.h5, "
                        f"*.hdf5) in the dataset folder")
    return found.pop()
