"""DeepCAM data in the official on-disk format, and its reader.

Layout (mlcommons/hpc deepcam README and ``data/cam_hdf5_dataset.py``)::

    <data_dir>/stats.h5             climate/minval, climate/maxval: float (16,) per-channel extrema
                                    over the training set (also climate/mean, climate/sqmean,
                                    climate/count, as ``src/utils/summarize_data.py`` writes them)
    <data_dir>/train/data-*.h5      one sample per file:
    <data_dir>/validation/data-*.h5   climate/data      float32 (H, W, 16), channels in CHANNELS order
                                      climate/labels_0  int32 (H, W): 0 background,
                                                        1 tropical cyclone, 2 atmospheric river

NVIDIA's converted layout (mlcommons hpc_results_v3.0 deepcam ``src/utils/convert_hdf52npy.py``,
run per split by their ``init_datasets`` scripts, with ``stats.h5`` copied beside; read by their
DALI ``data-*.npy`` / ``label-*.npy`` numpy readers) is read too, detected from the names::

    <data_dir>/stats.h5
    <data_dir>/{train,validation}/data-<tag>.npy    float32 (H, W, 16), climate/data as stored
    <data_dir>/{train,validation}/label-<tag>.npy   integer (H, W), climate/labels_0 as stored

The reference grid is 768 x 1152 (CAM5 at 0.25 degrees). The label dtype is int32: NVIDIA's
readers of the same files (mlcommons/hpc_results_v3.0, ``cam_recordio_dali_dataset.py``)
reinterpret the raw label bytes as INT32, 768 * 1152 * 4 bytes per sample; the reference reader
casts whatever it finds to int64, so any integer dtype is accepted here.

Normalisation is the reference's min-max scaling with the training-set statistics:
``x = (data - minval) / (maxval - minval)`` per channel, then HWC -> CHW; it runs on the training
device (`CamDataset.device_transform`), not in the loader.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np
import torch
from torch.utils.data import default_collate, get_worker_info

from mlhpc.workload import SampleLocation, WorkloadDataset
from mlhpc.errors import DataError
from mlhpc.data.loader import PerChannel, channels_first

if TYPE_CHECKING:  # pragma: no cover - typing only
    from mlhpc.config import Config
    from mlhpc.runtime import Runtime

#: The 16 CAM5 variables of the DeepCAM dataset, in channel order (dataset README,
#: portal.nersc.gov/project/dasrepo/deepcam/segm_h5_v3_reformat/gb_data_readme).
CHANNELS: tuple[str, ...] = ("TMQ", "U850", "V850", "UBOT", "VBOT", "QREFHT", "PS", "PSL", "T200",
                             "T500", "PRECT", "TS", "TREFHT", "Z1000", "Z200", "ZBOT")
CLASSES: tuple[str, ...] = ("background", "tropical_cyclone", "atmospheric_river")
DATA_KEY = "climate/data"
LABEL_KEY = "climate/labels_0"
STATS_FILE = "stats.h5"
TRAIN_DIR = "train"
VALIDATION_DIR = "validation"
SAMPLE_GLOB = "data-*.h5"
NPY_GLOB = "data-*.npy"
FORMATS = ("hdf5", "npy")


def detect_format(folder: Path) -> str:
    """``hdf5`` (``data-*.h5``) or ``npy`` (``data-*.npy``, NVIDIA's layout) from a split folder's
    names. Raises DataError: missing folder, neither, or both."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"dataset folder not found (expected {SAMPLE_GLOB} or {NPY_GLOB} files)", path=folder)
    found = {fmt for fmt, glob in (("hdf5", SAMPLE_GLOB), ("npy", NPY_GLOB))
             if next(folder.glob(glob), None) is not None}
    if len(found) != 1:
        what = "both data-*.h5 and data-*.npy" if found else f"no {SAMPLE_GLOB} or {NPY_GLOB} files"
        raise DataError(f"{what} in the dataset folder (an empty split, or set data.format)", path=folder)
    return found.pop()


def label_file(data_file: Path) -> Path:
    """``label-<tag>.npy`` beside ``data-<tag>.npy`` (NVIDIA's names)."""
    return data_file.with_name("label-" + data_file.name[len("data-"):])


def list_samples(folder: Path, limit: int | None = None, fmt: str = "hdf5") -> list[Path]:
    """Sorted ``data-*.h5`` (``fmt`` hdf5) or ``data-*.npy`` (npy) files of a split folder, the
    first ``limit`` of them if given.

    Raises:
        DataError: the folder is missing, holds no such file, or fewer than ``limit``.
    """
    folder = Path(folder)
    glob = SAMPLE_GLOB if fmt == "hdf5" else NPY_GLOB
    if not folder.is_dir():
        raise DataError(f"dataset folder not found (expected {glob} files)", path=folder)
    files = sorted(folder.glob(glob))
    if not files:
        raise DataError(f"no {glob} files in dataset folder (an empty split)", path=folder)
    if limit is not None:
        if len(files) < limit:
            raise DataError(f"{len(files)} samples found, the config asks for {limit}", path=folder)
        files = files[:limit]
    return files


def read_stats(path: Path, channels: int = len(CHANNELS)) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel ``(shift, scale)`` for normalisation from a ``stats.h5``.

    Returns:
        two float32 (channels,) arrays: ``shift = minval``, ``scale = 1 / (maxval - minval)``, as
        the reference reader computes them.

    Raises:
        DataError: the file is missing or not HDF5, lacks ``climate/minval``/``climate/maxval``,
            has the wrong shape, or a channel with ``maxval <= minval``.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError("statistics file not found (expected climate/minval, climate/maxval)", path=path)
    try:
        with h5py.File(path, "r") as f:
            arrays = {}
            for key in ("climate/minval", "climate/maxval"):
                if key not in f:
                    raise DataError(f"dataset {key} missing", path=path)
                arrays[key] = np.asarray(f[key][...], dtype=np.float64)
    except OSError as exc:
        raise DataError(f"not a readable HDF5 file ({exc})", path=path) from None
    lo, hi = arrays["climate/minval"], arrays["climate/maxval"]
    for key, arr in arrays.items():
        if arr.shape != (channels,):
            raise DataError(f"{key} has shape {arr.shape}, expected ({channels},)", path=path)
    bad = np.flatnonzero(~(hi > lo))
    if bad.size:
        raise DataError(f"channel {int(bad[0])} has maxval <= minval; cannot normalise", path=path)
    return lo.astype(np.float32), (1.0 / (hi - lo)).astype(np.float32)


def _check_layout(data: Any, label: Any, channels: int, names: tuple[str, str]) -> None:
    """The layout of one sample, the same in either format: ``data`` float32 (H, W, channels),
    ``label`` integer (H, W). ``data`` and ``label`` are h5py datasets or numpy arrays (only
    their ``shape``, ``ndim`` and ``dtype`` are read); ``names`` are how the error names them.

    Raises:
        DataError: ``NAME has shape S, expected E`` or ``NAME has dtype D, expected E``.
    """
    data_name, label_name = names
    if data.ndim != 3 or data.shape[2] != channels:
        raise DataError(f"{data_name} has shape {data.shape}, expected (H, W, {channels})")
    if data.dtype != np.float32:
        raise DataError(f"{data_name} has dtype {data.dtype}, expected float32")
    if label.shape != data.shape[:2]:
        raise DataError(f"{label_name} has shape {label.shape}, expected {data.shape[:2]}")
    if label.dtype.kind not in "iu":
        raise DataError(f"{label_name} has dtype {label.dtype}, expected an integer (int32)")


def _empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor to fill; in a DataLoader worker it lives in shared memory, so handing the
    batch to the main process copies nothing (as torch's default_collate does)."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    return torch.empty(shape, dtype=dtype).share_memory_()


class FilledBatch(list):
    """What `CamDataset.__getitems__` returns: the per-sample views ``(x[i], y[i])`` of one
    batch filled in place (a plain list of samples to any other collate function) and, as
    ``batch``, the filled ``(x, y)`` itself, which `CamDataset.collate_fn` hands on uncopied."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        super().__init__(zip(x, y))
        self.batch = (x, y)


class CamDataset(WorkloadDataset):
    """Map-style dataset over ``data-*.h5`` sample files.

    ``dataset[i]`` -> ``(x, y)``: x float32 (H, W, C) as stored, y int64 (H, W) with values in
    ``[0, num_classes)``. ``device_transform`` normalises a batch on the training device with
    ``(data - minval) / (maxval - minval)`` and puts channels first, (B, C, H, W).

    Every read opens the sample file on its own and closes it, so each DataLoader worker holds
    its own handle and no HDF5 handle crosses a fork (h5py handles must not be shared between
    processes); the statistics are read once, in the constructor.

    ``fmt`` ``npy`` reads NVIDIA's ``data-*.npy`` / ``label-*.npy`` pairs instead (memory-mapped).
    Input values are checked (finite) the first time each sample is read in a process.

    Raises (from ``__getitem__``):
        DataError: naming the file, when it is not HDF5 (npy) or truncated, lacks ``climate/data``
            or ``climate/labels_0`` (its label file), has shapes or dtypes other than those of the
            first sample, a non-finite input value, or a label value outside ``[0, num_classes)``.
    """

    def __init__(self, files: list[Path], stats_file: Path, num_classes: int = len(CLASSES),
                 channels: int = len(CHANNELS), fmt: str = "hdf5") -> None:
        if not files:
            raise DataError("no sample files given")
        self.format = fmt
        self._checked: set[int] = set()
        self._pid = os.getpid()
        self.files = [Path(f) for f in files]
        self.num_classes = num_classes
        self.channels = channels
        self._normalize = PerChannel(*read_stats(stats_file, channels))
        data_shape, _ = self._peek(self.files[0])
        self.data_shape = data_shape
        self.label_shape = data_shape[:2]

    def _peek(self, path: Path) -> tuple[tuple[int, ...], tuple[int, ...]]:
        if self.format == "npy":
            data, label = self._npy(path)
            return tuple(data.shape), tuple(label.shape)
        try:
            with h5py.File(path, "r") as f:
                data, label = self._datasets(f, path)
                return tuple(data.shape), tuple(label.shape)
        except OSError as exc:
            raise DataError(f"not a readable HDF5 file ({exc})", path=path) from None

    def _datasets(self, f: h5py.File, path: Path) -> tuple[h5py.Dataset, h5py.Dataset]:
        """The two datasets of an open sample file, each looked up once, layout checked."""
        found = []
        for key in (DATA_KEY, LABEL_KEY):
            item = f.get(key)
            if not isinstance(item, h5py.Dataset):
                raise DataError(f"dataset {key} missing", path=path)
            found.append(item)
        data, label = found
        _check_layout(data, label, self.channels, (f"{path}: {DATA_KEY}", f"{path}: {LABEL_KEY}"))
        return data, label

    def __len__(self) -> int:
        return len(self.files)

    def locate(self, index: int) -> SampleLocation:
        """The file of sample ``index`` (one sample per file)."""
        return SampleLocation(self.files[index], 0)

    def _npy(self, path: Path) -> tuple[np.ndarray, np.ndarray]:
        """Memory maps of a sample's ``data-*.npy`` and ``label-*.npy``, shapes and dtypes checked."""
        arrays = []
        for file in (path, label_file(path)):
            if not file.is_file():
                what = "missing labels for " + path.name if file != path else "missing"
                raise DataError(f"{what}", path=file)
            try:
                arrays.append(np.load(file, mmap_mode="r", allow_pickle=False))
            except (OSError, ValueError, EOFError) as exc:
                raise DataError(f"not a readable .npy file ({str(exc)[:120]})", path=file) from None
        data, label = arrays
        _check_layout(data, label, self.channels, (f"{path}: array", f"{label_file(path)}: array"))
        return data, label

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        data = np.empty(self.data_shape, dtype=np.float32)
        label = np.empty(self.label_shape, dtype=np.int64)
        self._read_into(index, data, label)
        return torch.from_numpy(data), torch.from_numpy(label)

    def __getitems__(self, indices: Sequence[int]) -> "FilledBatch":
        """A batch, float32 ``(B, H, W, C)`` and int64 ``(B, H, W)``, each sample read straight
        into its row (shared memory inside a DataLoader worker): no per-sample arrays, and no
        stacking by `collate_fn` (torch's default_collate, given the per-sample views, stacks).

        Raises:
            IndexError: an index out of range. DataError: as `__getitem__`.
        """
        rows = [int(i) for i in indices]
        for index in rows:
            if not -len(self.files) <= index < len(self.files):
                raise IndexError(f"sample {index} out of range 0..{len(self.files) - 1}")
        x = _empty((len(rows), *self.data_shape), torch.float32)
        y = _empty((len(rows), *self.label_shape), torch.int64)
        xs, ys = x.numpy(), y.numpy()
        for row, index in enumerate(rows):
            self._read_into(index % len(self.files), xs[row], ys[row])
        return FilledBatch(x, y)

    def collate_fn(self, batch: Any) -> Any:
        """``(x, y)``: a `FilledBatch` as it was filled; a list of single items (the first
        sample alone, say) stacked by torch's default_collate."""
        return batch.batch if isinstance(batch, FilledBatch) else default_collate(batch)

    def _read_into(self, index: int, data: np.ndarray, label: np.ndarray) -> None:
        """Sample ``index`` into ``data`` (float32, ``data_shape``) and ``label`` (int64,
        ``label_shape``), C-contiguous arrays; values checked (`_check_values`)."""
        path = self.files[index]
        if self.format == "npy":
            data_map, label_map = self._npy(path)
            if data_map.shape != self.data_shape:
                raise DataError(f"array of shape {data_map.shape}, expected "
                                f"{self.data_shape} like {self.files[0].name}", path=path)
            np.copyto(data, data_map)
            np.copyto(label, label_map, casting="unsafe")
        else:
            self._read_hdf5(path, data, label)
        self._check_values(index, path, data, label)

    def _read_hdf5(self, path: Path, data: np.ndarray, label: np.ndarray) -> None:
        """One sample file's ``climate/data`` and ``climate/labels_0`` read straight into
        ``data`` and ``label`` (HDF5 converts the stored integer labels to int64)."""
        try:
            with h5py.File(path, "r") as f:
                data_ds, label_ds = self._datasets(f, path)
                if data_ds.shape != self.data_shape:
                    raise DataError(f"{DATA_KEY} has shape {data_ds.shape}, "
                                    f"expected {self.data_shape} like {self.files[0].name}", path=path)
                # the whole extent, straight into the rows (h5py's read_direct without its
                # selection objects; the memory type is the destination's, so HDF5 converts)
                data_ds.id.read(h5py.h5s.ALL, h5py.h5s.ALL, data)
                label_ds.id.read(h5py.h5s.ALL, h5py.h5s.ALL, label)
        except OSError as exc:
            raise DataError(f"cannot read sample ({exc})", path=path) from None

    def _check_values(self, index: int, path: Path, data: np.ndarray, label: np.ndarray) -> None:
        """Labels in range always; input values finite the first time this process reads it."""
        if self._pid != os.getpid():
            self._checked, self._pid = set(), os.getpid()
        if index not in self._checked:
            finite = np.isfinite(data)
            if not finite.all():
                y, x, c = (int(v[0]) for v in np.nonzero(~finite))
                raise DataError(f"sample {index}: input {data[y, x, c]} at pixel ({y}, {x}) "
                                f"channel {c} ({CHANNELS[c] if c < len(CHANNELS) else c}) is not finite", path=path)
            self._checked.add(index)
        lo, hi = int(label.min()), int(label.max())
        if lo < 0 or hi >= self.num_classes:
            bad = lo if lo < 0 else hi
            raise DataError(f"{LABEL_KEY} holds class {bad}, expected 0..{self.num_classes - 1}", path=path)

    def device_transform(self, data: torch.Tensor) -> torch.Tensor:
        """Normalise a batch where it lies (`mlhpc.data.loader`): float32 ``(B, H, W, C)`` as stored ->
        float32 ``(B, C, H, W)`` contiguous, ``(data - minval) / (maxval - minval)`` per channel."""
        return self._normalize.apply(*channels_first(data))


def build_datasets(config: "Config", runtime: "Runtime", data_dir: Path) -> tuple[CamDataset, CamDataset]:
    """Training and validation datasets read from the official layout under ``data_dir``.

    Uses the first ``config.data.train_samples`` / ``config.data.eval_samples`` files (sorted by
    name) of ``train/`` and ``validation/`` (every file when ``None``); ``stats.h5`` at
    ``data_dir``. The datasets are global: sharding over ranks is the harness's sampler's job.
    ``runtime`` is accepted for the `Workload` signature.

    Raises:
        DataError: a missing or empty folder, fewer files than asked for, a bad ``stats.h5``, or
            a first sample without the expected datasets, shapes and dtypes (see `CamDataset`).
    """
    del runtime
    data_dir = Path(data_dir)
    stats = data_dir / STATS_FILE
    classes = getattr(config.model, "num_classes", len(CLASSES))
    channels = getattr(config.model, "in_channels", len(CHANNELS))
    fmt = getattr(config.data, "format", "auto") or "auto"
    if fmt == "auto":
        fmt = detect_format(data_dir / TRAIN_DIR)
    elif fmt not in FORMATS:
        raise DataError(f"data.format: {fmt!r} is not a DeepCAM form; expected one of "
                        f"{', '.join(FORMATS)}")
    train_files = list_samples(data_dir / TRAIN_DIR, config.data.train_samples, fmt)
    val_files = list_samples(data_dir / VALIDATION_DIR, config.data.eval_samples, fmt)
    train = CamDataset(train_files, stats, num_classes=classes, channels=channels, fmt=fmt)
    val = CamDataset(val_files, stats, num_classes=classes, channels=channels, fmt=fmt)
    if val.data_shape != train.data_shape:
        raise DataError(f"{DATA_KEY} has shape {val.data_shape}, "
                        f"expected {train.data_shape} like the training samples", path=val.files[0])
    return train, val
