"""CosmoFlow datasets: map-style torch Datasets over the official HDF5 layout.

Layout (as written by `workloads.cosmoflow.synth.synthesize` and by the reference HDF5 data):
``<data_dir>/train/*.h5`` and ``<data_dir>/validation/*.h5`` (``*.hdf5`` too), sorted by name.
A file holds either one sample, ``full`` ``(S, S, S, 4)`` and ``unitPar`` ``(4,)``, or a shard of
``n``, ``full`` ``(n, S, S, S, 4)`` and ``unitPar`` ``(n, 4)``. ``full`` is int16 particle counts,
``unitPar`` the four normalised targets (floating point).

Each item is ``(x, y)``: ``x`` the int16 particle counts as stored, ``(S, S, S, 4)``, and ``y``
float32 ``(4,)``. Decoding is left to the device (`CosmoFlowDataset.device_transform`: ``log(counts
+ 1)``, the reference's ``apply_log`` in mlcommons/hpc ``cosmoflow/data/cosmo.py``, optional
per-channel standardisation, channels first), so the loader moves half the bytes of float32 and
the decode runs vectorised where the model runs.

Reading: a file whose ``full`` is stored contiguous and unfiltered (as `synthesize` writes it) is
memory-mapped at the dataset's byte offset, so a batch is one copy out of the page cache with no
HDF5 call per sample; chunked or compressed files are read through h5py, one call per sample.
Start-up reads HDF5 metadata (shapes, dtypes, byte offsets) and the small targets; sample data
are mapped or read on first access, a bounded number of files per process, reopened after a fork
(DataLoader workers); a file changed since start-up is re-checked through h5py.
"""

from __future__ import annotations

import mmap
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset, default_collate, get_worker_info

from mlhpc.errors import DataError
from mlhpc.loader import PerChannel, channels_first

if TYPE_CHECKING:  # pragma: no cover - typing only
    from mlhpc.config import Config
    from mlhpc.runtime import Runtime

N_CHANNELS = 4
N_TARGETS = 4
FILE_GLOBS = ("*.h5", "*.hdf5")
MAX_OPEN_FILES = 64  # per process; all shards of a mini dataset, bounded for one file per sample


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


@dataclass(frozen=True)
class _FileInfo:
    """What construction learnt of one file: sample count, cube size, the byte offset of a
    memory-mappable ``full`` (None: read through h5py), the targets float32 ``(n, 4)``, and the
    file's identity ``(inode, size, mtime_ns)`` to notice a file replaced afterwards."""

    n_samples: int
    cube: int
    offset: Optional[int]
    targets: np.ndarray
    identity: tuple[int, int, int]


def _identity(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


def _inspect(path: Path) -> _FileInfo:
    """A file's metadata and targets (no sample data). Raises DataError."""
    try:
        identity = _identity(path)
        handle = h5py.File(path, "r")
    except OSError as exc:
        kind = "is not an HDF5 file" if "signature" in str(exc) else "cannot be opened as HDF5"
        raise DataError(f"{path}: {kind} ({_short(exc)})") from None
    with handle:
        n_samples, cube = _check_layout(path, handle)
        try:
            targets = np.asarray(handle["unitPar"][()], np.float32).reshape(n_samples, N_TARGETS)
        except OSError as exc:
            raise DataError(f"{path}: dataset 'unitPar' cannot be read ({_short(exc)})") from None
        return _FileInfo(n_samples, cube, _byte_offset(handle["full"]), targets, identity)


def _check_layout(path: Path, handle: h5py.File) -> tuple[int, int]:
    """``(n_samples, cube_size)`` of an open file whose ``full`` and ``unitPar`` have the
    official layout. Raises DataError naming the file and what was expected."""
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
    return int(n_samples), int(cube[0])


def _byte_offset(full: h5py.Dataset) -> Optional[int]:
    """File offset of ``full``'s data when it can be memory-mapped (contiguous, unfiltered,
    allocated, little-endian int16); None otherwise."""
    if full.chunks is not None or full.compression is not None or full.dtype != np.dtype("<i2"):
        return None
    try:
        return full.id.get_offset()
    except Exception:  # pragma: no cover - h5py versions without get_offset
        return None


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:160]


class _Source:
    """One file's samples in this process: ``counts[i]`` int16 ``(S, S, S, 4)`` (a memory map of
    the file, or the h5py dataset) and ``targets`` float32 ``(n, 4)``.

    Raises DataError / ValueError / OSError when the file cannot be opened, or has changed since
    ``info`` was taken into something the index no longer describes."""

    def __init__(self, path: Path, info: _FileInfo) -> None:
        self.handle: Optional[h5py.File] = None
        if _identity(path) != info.identity:  # replaced since construction: look again
            now = _inspect(path)
            if (now.n_samples, now.cube) != (info.n_samples, info.cube):
                raise ValueError(f"{now.n_samples} samples of cube size {now.cube}; the index "
                                 f"expected {info.n_samples} of {info.cube} (file changed after "
                                 f"the dataset was built)")
            info = now
        self.targets = info.targets
        shape = (info.n_samples,) + (info.cube,) * 3 + (N_CHANNELS,)
        if info.offset is not None:
            self.counts: Any = _map(path, info.offset, shape)
            return
        self.handle = h5py.File(path, "r")
        full = self.handle["full"]
        self.counts = full if len(full.shape) == 5 else _Single(full)

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
            raise ValueError(f"file is {size} bytes, dataset 'full' needs {offset + nbytes}")
        mapping = mmap.mmap(handle.fileno(), offset + nbytes, flags=mmap.MAP_PRIVATE,
                            prot=mmap.PROT_READ)
    return np.frombuffer(mapping, dtype=np.int16, count=nbytes // 2, offset=offset).reshape(shape)


class _Single:
    """A one-sample file's ``full`` ``(S, S, S, 4)`` indexed like a shard of one."""

    def __init__(self, full: h5py.Dataset) -> None:
        self.full = full

    def __getitem__(self, index: int) -> np.ndarray:
        if index != 0:
            raise IndexError(index)
        return self.full[()]


def _empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor to fill; in a DataLoader worker it lives in shared memory, so handing the batch
    to the main process copies nothing (as torch's default_collate does)."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    numel = int(np.prod(shape))
    storage = torch.empty(0, dtype=dtype)._typed_storage()._new_shared(numel, device="cpu")
    return torch.empty(0, dtype=dtype).new(storage).resize_(*shape)


def collate(batch: Any) -> Any:
    """DataLoader ``collate_fn`` of `CosmoFlowDataset`: batches from ``__getitems__`` are already
    ``(x, y)`` tensors; a list of single items is stacked by torch's default_collate."""
    return batch if isinstance(batch, tuple) else default_collate(batch)


class CosmoFlowDataset(Dataset):
    """The first ``n_samples`` samples of a list of CosmoFlow HDF5 files, in file order.

    Items are ``(x, y)``: ``x`` int16 ``(S, S, S, 4)`` particle counts as stored, ``y`` float32
    ``(4,)``. ``__getitems__`` (used by DataLoader for a batch) returns ``(x, y)`` stacked,
    ``(B, S, S, S, 4)`` and ``(B, 4)``, filled in place (shared memory in a worker); pass
    ``collate_fn=dataset.collate_fn``. ``device_transform`` decodes a batch on its device.

    Args:
        files: HDF5 files, read in the given order.
        n_samples: how many samples to use (None: all of them).
        folder: named in messages (default: the first file's folder).

    Attributes:
        files: the files actually used.
        cube_size: S, cells per side.
        sample_shape: ``(4, S, S, S)``, the shape of a decoded sample (model input).
        memory_mapped: True when every file's ``full`` can be memory-mapped.

    Raises:
        DataError: (at construction) a file is not HDF5 / truncated, lacks ``full`` or ``unitPar``,
            has a wrong shape or dtype, or its cube size differs from the first file's; fewer
            samples exist than asked for. (On access) a sample cannot be read; the message names
            the file and the sample's index in it.
    """

    collate_fn = staticmethod(collate)

    def __init__(self, files: Sequence[Path], n_samples: Optional[int] = None,
                 folder: Optional[Path] = None) -> None:
        files = [Path(f) for f in files]
        folder = Path(folder) if folder is not None else (files[0].parent if files else Path("."))
        if not files:
            raise DataError(f"{folder}: no HDF5 files in the dataset folder")
        used: list[Path] = []
        starts: list[int] = []
        infos: list[_FileInfo] = []
        total, cube_size = 0, None
        for path in files:
            if n_samples is not None and total >= n_samples:
                break
            info = _inspect(path)
            count, size = info.n_samples, info.cube
            if cube_size is None:
                cube_size = size
            elif size != cube_size:
                raise DataError(f"{path}: cube size {size}; expected {cube_size} like "
                                f"{used[0].name} (every file of a dataset has one cube size)")
            used.append(path)
            starts.append(total)
            infos.append(info)
            total += count
        if n_samples is not None and total < n_samples:
            raise DataError(f"{folder}: {total} samples found in {len(used)} files, "
                            f"{n_samples} asked for")
        self.files = used
        self.cube_size = int(cube_size)  # type: ignore[arg-type]
        self.sample_shape = (N_CHANNELS, self.cube_size, self.cube_size, self.cube_size)
        self._starts = np.asarray(starts, dtype=np.int64)
        self._length = total if n_samples is None else n_samples
        self._infos = infos
        self._targets = np.concatenate([info.targets for info in infos])[:self._length]
        self.memory_mapped = all(info.offset is not None for info in infos)
        self._sources: OrderedDict[int, _Source] = OrderedDict()
        self._pid = os.getpid()
        self._standardization: Optional[PerChannel] = None

    # ------------------------------------------------------------------ decoding (on the device)

    def standardize(self, mean: np.ndarray, std: np.ndarray) -> None:
        """From now on `device_transform` returns ``(log1p(counts) - mean) / std`` per channel;
        ``mean`` and ``std`` are float32 ``(4,)``."""
        self._standardization = PerChannel(mean, 1.0 / np.asarray(std, np.float32))

    def device_transform(self, counts: torch.Tensor) -> torch.Tensor:
        """Decode a batch where it lies: int16 ``(B, S, S, S, 4)`` counts -> float32
        ``(B, 4, S, S, S)`` contiguous, ``log(counts + 1)`` then the per-channel standardisation
        set by `standardize` (if any)."""
        view, out = channels_first(counts)
        torch.log1p(view, out=out)
        return out if self._standardization is None else self._standardization.apply(out, out)

    def channel_stats(self, n_samples: int = 64) -> tuple[np.ndarray, np.ndarray]:
        """Per-channel mean and standard deviation of log1p(counts) over the first ``n_samples``
        samples: float32 ``(4,)`` each."""
        n = min(n_samples, self._length)
        x = torch.log1p(self.__getitems__(list(range(n)))[0].double())  # (n, S, S, S, 4)
        mean = x.mean(dim=(0, 1, 2, 3))
        std = (x.pow(2).mean(dim=(0, 1, 2, 3)) - mean ** 2).clamp_min(1e-12).sqrt()
        return mean.numpy().astype(np.float32), std.numpy().astype(np.float32)

    # ------------------------------------------------------------------------------- reading

    def __len__(self) -> int:
        return self._length

    def locate(self, index: int) -> tuple[Path, int]:
        """``(file, index within that file)`` of sample ``index``."""
        position, local = self._position(index)
        return self.files[position], local

    def _position(self, index: int) -> tuple[int, int]:
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError(f"sample {index} out of range 0..{self._length - 1}")
        position = int(np.searchsorted(self._starts, index, side="right")) - 1
        return position, index - int(self._starts[position])

    def _open_sources(self) -> OrderedDict[int, _Source]:
        """This process's open files; empty after a fork (a DataLoader worker never shares
        handles or maps with its parent)."""
        if self._pid != os.getpid():
            self._sources = OrderedDict()
            self._pid = os.getpid()
        return self._sources

    def _source(self, position: int) -> _Source:
        sources = self._open_sources()
        source = sources.get(position)
        if source is not None:
            sources.move_to_end(position)
            return source
        source = _Source(self.files[position], self._infos[position])
        start = int(self._starts[position])
        used = min(self._infos[position].n_samples, self._length - start)
        self._targets[start:start + used] = source.targets[:used]
        self._sources[position] = source
        if len(self._sources) > MAX_OPEN_FILES:
            _, oldest = self._sources.popitem(last=False)
            oldest.close()
        return source

    def _read(self, position: int, local: int, x_out: np.ndarray, y_out: np.ndarray) -> None:
        try:
            source = self._source(position)
        except (DataError, OSError, KeyError, ValueError) as exc:
            path = self.files[position]
            reason = str(exc).removeprefix(f"{path}: ")
            raise DataError(f"{path}: sample {local}: cannot be read ({_short(reason)})") from None
        try:
            x_out[...] = source.counts[local]
            y_out[...] = source.targets[local]
        except (OSError, KeyError, ValueError, IndexError, TypeError) as exc:
            self._sources.pop(position, None)
            source.close()
            raise DataError(f"{self.files[position]}: sample {local}: cannot be read "
                            f"({_short(exc)})") from None

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.empty((self.cube_size,) * 3 + (N_CHANNELS,), dtype=torch.int16)
        y = torch.empty(N_TARGETS, dtype=torch.float32)
        self._read(*self._position(index), x.numpy(), y.numpy())
        return x, y

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch: int16 ``(B, S, S, S, 4)`` and float32 ``(B, 4)``, one copy per sample.

        Raises:
            IndexError: an index is out of range. DataError: as `__getitem__`.
        """
        index = np.asarray(indices, dtype=np.int64).reshape(-1)
        index = np.where(index < 0, index + self._length, index)
        if index.size and not (0 <= index.min() and index.max() < self._length):
            bad = index[(index < 0) | (index >= self._length)][0]
            raise IndexError(f"sample {bad} out of range 0..{self._length - 1}")
        positions = np.searchsorted(self._starts, index, side="right") - 1
        locals_ = index - self._starts[positions]
        x = _empty((index.size,) + (self.cube_size,) * 3 + (N_CHANNELS,), torch.int16)
        y = _empty((index.size, N_TARGETS), torch.float32)
        xs, ys = x.numpy(), y.numpy()
        sources = self._open_sources()
        for row, (position, local) in enumerate(zip(positions.tolist(), locals_.tolist())):
            source = sources.get(position)
            if source is None:  # first use in this process, or evicted: opens (or names the error)
                self._read(position, local, xs[row], ys[row])
                continue
            try:
                xs[row] = source.counts[local]
            except Exception:  # the slow path closes the file and raises one clear DataError
                self._read(position, local, xs[row], ys[row])
        np.take(self._targets, index, axis=0, out=ys)  # every file of the batch is open by now
        return x, y

    def close(self) -> None:
        """Close this process's open files and maps (they reopen on the next access)."""
        for source in self._sources.values():
            source.close()
        self._sources.clear()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_sources"] = OrderedDict()  # h5py handles and maps do not pickle (spawned workers)
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
        Two `CosmoFlowDataset`; each item is ``x`` int16 ``(S, S, S, 4)`` counts, ``y`` float32
        ``(4,)``; their ``device_transform`` decodes a batch to the model's float32
        ``(B, 4, S, S, S)`` input (``log(counts + 1)``, standardised per channel with the training
        split's statistics when ``model.input_standardization`` is ``channel``).

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
