"""CosmoFlow datasets: map-style torch Datasets over the official HDF5 layout.

Layout (as written by `workloads.cosmoflow.synth.synthesize` and by the reference HDF5 data):
``<data_dir>/train/*.h5`` and ``<data_dir>/validation/*.h5`` (``*.hdf5`` too), sorted by name.
A file holds either one sample, ``full`` ``(S, S, S, 4)`` and ``unitPar`` ``(4,)``, or a shard of
``n``, ``full`` ``(n, S, S, S, 4)`` and ``unitPar`` ``(n, 4)``. ``full`` is int16 particle counts,
``unitPar`` the four normalised targets (floating point).

Each item is ``(x, y)``: ``x`` float32 ``(4, S, S, S)`` channels-first with ``log(counts + 1)``
applied (the reference's ``apply_log``, mlcommons/hpc ``cosmoflow/data/cosmo.py``), and ``y``
float32 ``(4,)``. Start-up reads only HDF5 metadata (shapes and dtypes); sample data are read on
access through a few lazily opened handles per process, reopened after a fork.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset

from mlhpc.errors import DataError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from mlhpc.config import Config
    from mlhpc.runtime import Runtime

N_CHANNELS = 4
N_TARGETS = 4
FILE_GLOBS = ("*.h5", "*.hdf5")
MAX_OPEN_FILES = 16  # per process; enough for sharded files, bounded for one-file-per-sample


def find_files(folder: Path) -> list[Path]:
    """Sorted HDF5 files (``*.h5``, ``*.hdf5``) directly under ``folder``.

    Raises:
        DataError: the folder is missing, not a folder, or holds no HDF5 file.
    """
    folder = Path(folder)
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise DataError(f"{folder}: dataset folder {what}; expected HDF5 files (run synthesis or "
                        f"fix data.path)")
    files = sorted({p for pattern in FILE_GLOBS for p in folder.glob(pattern) if p.is_file()})
    if not files:
        raise DataError(f"{folder}: no HDF5 files (*.h5, *.hdf5) in the dataset folder")
    return files


def _inspect(path: Path) -> tuple[int, int, bool]:
    """``(n_samples, cube_size, sharded)`` of one file, from its metadata only. Raises DataError."""
    try:
        handle = h5py.File(path, "r")
    except OSError as exc:
        kind = "is not an HDF5 file" if "signature" in str(exc) else "cannot be opened as HDF5"
        raise DataError(f"{path}: {kind} ({_short(exc)})") from None
    with handle:
        for name in ("full", "unitPar"):
            if name not in handle or not isinstance(handle[name], h5py.Dataset):
                raise DataError(f"{path}: missing dataset {name!r}; expected 'full' (int16 "
                                f"counts) and 'unitPar' (4 targets)")
        full, unit = handle["full"], handle["unitPar"]
        shape = full.shape
        if len(shape) == 4:
            n_samples, cube = 1, shape[:3]
            unit_expected: tuple[int, ...] = (N_TARGETS,)
        elif len(shape) == 5:
            n_samples, cube = shape[0], shape[1:4]
            unit_expected = (shape[0], N_TARGETS)
        else:
            raise DataError(f"{path}: dataset 'full' has shape {shape}; expected (S, S, S, 4) or "
                            f"(n, S, S, S, 4)")
        if shape[-1] != N_CHANNELS or len(set(cube)) != 1 or n_samples < 1:
            raise DataError(f"{path}: dataset 'full' has shape {shape}; expected a cube of 4 "
                            f"redshift channels, (S, S, S, 4) or (n, S, S, S, 4)")
        if full.dtype != np.int16:
            raise DataError(f"{path}: dataset 'full' has dtype {full.dtype}; expected int16 "
                            f"particle counts")
        if unit.shape != unit_expected:
            raise DataError(f"{path}: dataset 'unitPar' has shape {unit.shape}; expected "
                            f"{unit_expected} to match 'full' {shape}")
        if unit.dtype.kind != "f":
            raise DataError(f"{path}: dataset 'unitPar' has dtype {unit.dtype}; expected float32")
    return int(n_samples), int(cube[0]), len(shape) == 5


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:160]


class CosmoFlowDataset(Dataset):
    """The first ``n_samples`` samples of a list of CosmoFlow HDF5 files, in file order.

    Args:
        files: HDF5 files, read in the given order.
        n_samples: how many samples to use (None: all of them).
        folder: named in messages (default: the first file's folder).

    Attributes:
        files: the files actually used.
        cube_size: S, cells per side.
        sample_shape: ``(4, S, S, S)``, the shape of every ``x``.

    Raises:
        DataError: (at construction) a file is not HDF5 / truncated, lacks ``full`` or ``unitPar``,
            has a wrong shape or dtype, or its cube size differs from the first file's; fewer
            samples exist than asked for. (On access) a sample cannot be read; the message names
            the file and the sample's index in it.
    """

    def __init__(self, files: Sequence[Path], n_samples: Optional[int] = None,
                 folder: Optional[Path] = None) -> None:
        files = [Path(f) for f in files]
        folder = Path(folder) if folder is not None else (files[0].parent if files else Path("."))
        if not files:
            raise DataError(f"{folder}: no HDF5 files in the dataset folder")
        used: list[Path] = []
        starts: list[int] = []
        sharded: list[bool] = []
        total, cube_size = 0, None
        for path in files:
            if n_samples is not None and total >= n_samples:
                break
            count, size, is_sharded = _inspect(path)
            if cube_size is None:
                cube_size = size
            elif size != cube_size:
                raise DataError(f"{path}: cube size {size}; expected {cube_size} like "
                                f"{used[0].name} (every file of a dataset has one cube size)")
            sharded.append(is_sharded)
            used.append(path)
            starts.append(total)
            total += count
        if n_samples is not None and total < n_samples:
            raise DataError(f"{folder}: {total} samples found in {len(used)} files, "
                            f"{n_samples} asked for")
        self.files = used
        self.cube_size = int(cube_size)  # type: ignore[arg-type]
        self.sample_shape = (N_CHANNELS, self.cube_size, self.cube_size, self.cube_size)
        self._starts = starts
        self._sharded = sharded
        self._length = total if n_samples is None else n_samples
        self._handles: OrderedDict[int, h5py.File] = OrderedDict()
        self._pid = os.getpid()
        self._shift: Optional[np.ndarray] = None
        self._scale: Optional[np.ndarray] = None

    def standardize(self, mean: np.ndarray, std: np.ndarray) -> None:
        """From now on return ``(log1p(counts) - mean) / std`` per channel; ``mean`` and ``std``
        are float32 ``(4,)``."""
        self._shift = np.asarray(mean, dtype=np.float32).reshape(N_CHANNELS, 1, 1, 1)
        self._scale = (1.0 / np.asarray(std, dtype=np.float32)).reshape(N_CHANNELS, 1, 1, 1)

    def channel_stats(self, n_samples: int = 64) -> tuple[np.ndarray, np.ndarray]:
        """Per-channel mean and standard deviation of log1p(counts) over the first ``n_samples``
        samples: float32 ``(4,)`` each."""
        n = min(n_samples, self._length)
        total = np.zeros(N_CHANNELS, np.float64)
        squares = np.zeros(N_CHANNELS, np.float64)
        shift, scale = self._shift, self._scale
        self._shift = self._scale = None
        try:
            for i in range(n):
                x = self[i][0].numpy().astype(np.float64)
                total += x.mean(axis=(1, 2, 3))
                squares += (x ** 2).mean(axis=(1, 2, 3))
        finally:
            self._shift, self._scale = shift, scale
        mean = total / n
        std = np.sqrt(np.maximum(squares / n - mean ** 2, 1e-12))
        return mean.astype(np.float32), std.astype(np.float32)

    def __len__(self) -> int:
        return self._length

    def locate(self, index: int) -> tuple[Path, int]:
        """``(file, index within that file)`` of sample ``index``."""
        if not 0 <= index < self._length:
            raise IndexError(f"sample {index} out of range 0..{self._length - 1}")
        position = bisect_right(self._starts, index) - 1
        return self.files[position], index - self._starts[position]

    def _handle(self, position: int) -> h5py.File:
        if self._pid != os.getpid():  # forked into a DataLoader worker: never share handles
            self._handles = OrderedDict()
            self._pid = os.getpid()
        handle = self._handles.get(position)
        if handle is not None:
            self._handles.move_to_end(position)
            return handle
        handle = h5py.File(self.files[position], "r")
        self._handles[position] = handle
        if len(self._handles) > MAX_OPEN_FILES:
            _, oldest = self._handles.popitem(last=False)
            oldest.close()
        return handle

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if index < 0:
            index += self._length
        path, local = self.locate(index)
        position = bisect_right(self._starts, index) - 1
        try:
            handle = self._handle(position)
            if self._sharded[position]:
                counts = handle["full"][local]
                target = handle["unitPar"][local]
            else:
                counts = handle["full"][()]
                target = handle["unitPar"][()]
        except (OSError, KeyError, ValueError, IndexError) as exc:
            self._handles.pop(position, None)
            raise DataError(f"{path}: sample {local}: cannot be read ({_short(exc)})") from None
        x = np.moveaxis(np.log1p(counts.astype(np.float32)), -1, 0)
        if self._shift is not None:
            x = (x - self._shift) * self._scale
        x = torch.from_numpy(np.ascontiguousarray(x))
        y = torch.from_numpy(np.asarray(target, dtype=np.float32))
        return x, y

    def close(self) -> None:
        """Close this process's open files (they reopen on the next access)."""
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_handles"] = OrderedDict()  # h5py handles do not pickle (spawned workers)
        return state

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


def build_datasets(config: "Config", runtime: "Runtime", data_dir: Path
                   ) -> tuple[CosmoFlowDataset, CosmoFlowDataset]:
    """The (train, validation) datasets under ``data_dir/train`` and ``data_dir/validation``.

    Uses the first ``config.data.train_samples`` / ``config.data.eval_samples`` samples in file
    name order (all when None). ``runtime`` is accepted for the Workload interface; every rank
    sees the whole dataset and the harness's sampler shards it.

    Returns:
        Two `CosmoFlowDataset`; each item is ``x`` float32 ``(4, S, S, S)`` = log(counts + 1),
        ``y`` float32 ``(4,)``; ``sample_shape`` / ``cube_size`` give S.

    Raises:
        DataError: a folder is missing or empty, a file is malformed (named, with what was
            expected), fewer samples exist than asked for, or the two splits' cube sizes differ.
    """
    data_dir = Path(data_dir)
    train_dir, eval_dir = data_dir / "train", data_dir / "validation"
    train = CosmoFlowDataset(find_files(train_dir), config.data.train_samples, folder=train_dir)
    valid = CosmoFlowDataset(find_files(eval_dir), config.data.eval_samples, folder=eval_dir)
    if train.cube_size != valid.cube_size:
        raise DataError(f"{eval_dir}: cube size {valid.cube_size}; expected {train.cube_size} "
                        f"like {train_dir}")
    if getattr(getattr(config, "model", None), "input_standardization", "none") == "channel":
        mean, std = train.channel_stats()
        train.standardize(mean, std)
        valid.standardize(mean, std)
    return train, valid
