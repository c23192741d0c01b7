"""CosmoFlow datasets: map-style torch Datasets over every on-disk form of the dataset.

Layout: ``<data_dir>/train/`` and ``<data_dir>/validation/``, each holding samples in one of the
forms of `workloads.cosmoflow.formats` (detected from the file names, or ``data.format``): the
GZIP TFRecords MLCommons distributes, NVIDIA's per-sample ``.npy`` files, or HDF5 (``full`` /
``unitPar`` per sample or sharded, as `synthesize` and ``mlhpc data convert --to hdf5`` write it).
Samples are ordered by file stem, so one dataset in any form has one order.

Each item is ``(x, y)``: ``x`` the int16 particle counts as stored, ``(S, S, S, 4)``, and ``y``
float32 ``(4,)``. Decoding is left to the device (`CosmoFlowDataset.device_transform`: ``log(counts
+ 1)``, the reference's ``apply_log`` in mlcommons/hpc ``cosmoflow/data/cosmo.py``, optional
per-channel standardisation, channels first), so the loader moves half the bytes of float32 and
the decode runs vectorised where the model runs.

Reading: HDF5 files whose ``full`` is contiguous and unfiltered, and ``.npy`` files, are
memory-mapped, so a batch is one copy per sample out of the page cache; chunked or compressed HDF5
is read through h5py; a TFRecord file is read, inflated, CRC-checked and decoded once when first
used in a process. Start-up reads metadata (shapes, dtypes, offsets; the first file in full);
sample data are read on first access, a bounded number of files per process, reopened after a
fork (DataLoader workers).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import default_collate, get_worker_info

from mlhpc.workload import SampleLocation, WorkloadDataset
from mlhpc.errors import DataError
from mlhpc.data.loader import PerChannel, channels_first

from . import formats, readers
from .formats import FileInfo, Source, _short

if TYPE_CHECKING:  # pragma: no cover - typing only
    from mlhpc.config import Config
    from mlhpc.runtime import Runtime

N_CHANNELS = formats.N_CHANNELS
N_TARGETS = formats.N_TARGETS
MAX_OPEN_FILES = 64  # per process, HDF5 and npy; TFRecord readers keep fewer (decoded bytes)


def find_files(folder: Path, fmt: str = "hdf5") -> list[Path]:
    """The sample files of a split folder in format ``fmt`` (see `formats`), in sample order.

    Raises:
        DataError: the folder is missing, not a folder, or holds no sample file of that format.
    """
    folder = Path(folder)
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise DataError(f"{folder}: dataset folder {what}; expected CosmoFlow samples (run "
                        f"synthesis or fix data.path)")
    files = readers.reader(fmt).list_files(folder)
    if not files:
        if fmt == "hdf5":
            raise DataError(f"{folder}: no HDF5 files (*.h5, *.hdf5) in the dataset folder")
        raise DataError(f"{folder}: no {fmt} sample files in the dataset folder (an empty split)")
    return files


def _empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor to fill; in a DataLoader worker it lives in shared memory, so handing the batch
    to the main process copies nothing (as torch's default_collate does)."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    return torch.empty(shape, dtype=dtype).share_memory_()  # public API (no private storage calls)


def collate(batch: Any) -> Any:
    """DataLoader ``collate_fn`` of `CosmoFlowDataset`: batches from ``__getitems__`` are already
    ``(x, y)`` tensors; a list of single items is stacked by torch's default_collate."""
    return batch if isinstance(batch, tuple) else default_collate(batch)


class CosmoFlowDataset(WorkloadDataset):
    """The first ``n_samples`` samples of a list of CosmoFlow sample files, in file order.

    Items are ``(x, y)``: ``x`` int16 ``(S, S, S, 4)`` particle counts as stored, ``y`` float32
    ``(4,)``. ``__getitems__`` (used by DataLoader for a batch) returns ``(x, y)`` stacked,
    ``(B, S, S, S, 4)`` and ``(B, 4)``, filled in place (shared memory in a worker); pass
    ``collate_fn=dataset.collate_fn``. ``device_transform`` decodes a batch on its device.

    Args:
        files: sample files of one format, read in the given order.
        n_samples: how many samples to use (None: all of them).
        folder: named in messages (default: the first file's folder).
        fmt: the files' format, one of `formats.FORMATS` (default ``hdf5``).

    Attributes:
        files: the files actually used.
        cube_size: S, cells per side.
        sample_shape: ``(4, S, S, S)``, the shape of a decoded sample (model input).
        memory_mapped: True when every file's counts can be memory-mapped.
        format: the format name.

    Values are checked where it is cheap: targets (NaN or infinite) when a file's targets are
    first learnt (construction for HDF5, first read for TFRecord and npy), particle counts
    (negative) the first time each sample is read in a process.

    Raises:
        DataError: (at construction) a file is unreadable, truncated or corrupt, lacks its counts
            or targets, has a wrong shape or dtype, a cube size other than the first file's, or
            non-finite targets; fewer samples exist than asked for. (On access) a sample cannot
            be read or holds bad values; the message names the file and the sample's index in it.
    """

    collate_fn = staticmethod(collate)

    def __init__(self, files: Sequence[Path], n_samples: Optional[int] = None,
                 folder: Optional[Path] = None, fmt: str = "hdf5") -> None:
        files = [Path(f) for f in files]
        folder = Path(folder) if folder is not None else (files[0].parent if files else Path("."))
        if not files:
            raise DataError(f"{folder}: no {fmt} sample files in the dataset folder (an empty split)")
        self.format = fmt
        self._reader = readers.reader(fmt)
        used: list[Path] = []
        starts: list[int] = []
        infos: list[FileInfo] = []
        total, cube_size = 0, None
        for path in files:
            if n_samples is not None and total >= n_samples:
                break
            info = self._reader.inspect(path, full=not used)  # the first file read in full
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
        self._targets = np.concatenate([
            info.targets if info.targets is not None
            else np.full((info.n_samples, N_TARGETS), np.nan, np.float32) for info in infos
        ])[:self._length]
        self.memory_mapped = all(info.offset is not None for info in infos)
        self._checked = np.zeros(self._length, dtype=bool)  # counts' values seen in this process
        self._sources: OrderedDict[int, Source] = OrderedDict()
        self._pid = os.getpid()
        self._standardization: Optional[PerChannel] = None
        self.origin: Optional[tuple[Path, Path]] = None  # (staged folder, source folder)

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

    def locate(self, index: int) -> SampleLocation:
        """``(file, index within that file)`` of sample ``index``."""
        position, local = self._position(index)
        return SampleLocation(self.files[position], local)

    def _position(self, index: int) -> tuple[int, int]:
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError(f"sample {index} out of range 0..{self._length - 1}")
        position = int(np.searchsorted(self._starts, index, side="right")) - 1
        return position, index - int(self._starts[position])

    def _open_sources(self) -> OrderedDict[int, Source]:
        """This process's open files; empty after a fork (a DataLoader worker never shares
        handles or maps with its parent)."""
        if self._pid != os.getpid():
            self._sources = OrderedDict()
            self._checked = np.zeros(self._length, dtype=bool)
            self._pid = os.getpid()
        return self._sources

    def _source(self, position: int) -> Source:
        sources = self._open_sources()
        source = sources.get(position)
        if source is not None:
            sources.move_to_end(position)
            return source
        source = self._reader.open(self.files[position], self._infos[position])
        start = int(self._starts[position])
        used = min(self._infos[position].n_samples, self._length - start)
        self._targets[start:start + used] = source.targets[:used]
        if source.checked:
            self._checked[start:start + used] = True
        self._sources[position] = source
        if len(self._sources) > min(MAX_OPEN_FILES, self._reader.max_open):
            _, oldest = self._sources.popitem(last=False)
            oldest.close()
        return source

    def _read(self, position: int, local: int, x_out: np.ndarray, y_out: np.ndarray) -> None:
        try:
            source = self._source(position)
        except (DataError, OSError, KeyError, ValueError) as exc:
            path = self.files[position]
            reason = str(exc).removeprefix(f"{path}: ")
            if isinstance(exc, DataError) and (": sample " in str(exc) or ": record " in str(exc)):
                raise  # already names the file and the record or sample
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
        try:
            return self._getitem(index)
        except DataError as exc:
            raise _renamed(exc, self.origin) from None

    def _getitem(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.empty((self.cube_size,) * 3 + (N_CHANNELS,), dtype=torch.int16)
        y = torch.empty(N_TARGETS, dtype=torch.float32)
        self._read(*self._position(index), x.numpy(), y.numpy())
        self._check_values(np.asarray([index % max(1, self._length)]), x.numpy()[None])
        return x, y

    def _check_values(self, index: np.ndarray, xs: np.ndarray) -> None:
        """Check the counts of samples read for the first time in this process (>= 0).
        Raises DataError naming the file and the sample."""
        rows = np.flatnonzero(~self._checked[index])
        if not rows.size:
            return
        mins = xs[rows].reshape(rows.size, -1).min(axis=1)
        if (mins < 0).any():
            row = int(rows[np.flatnonzero(mins < 0)[0]])
            path, local = self.locate(int(index[row]))
            raise DataError(f"{path}: sample {local}: negative particle count "
                            f"{int(mins[mins < 0][0])} (counts are >= 0)")
        self._checked[index[rows]] = True

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch: int16 ``(B, S, S, S, 4)`` and float32 ``(B, 4)``, one copy per sample.

        Raises:
            IndexError: an index is out of range. DataError: as `__getitem__`.
        """
        try:
            return self._getitems(indices)
        except DataError as exc:
            raise _renamed(exc, self.origin) from None

    def _getitems(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
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
        self._check_values(index, xs)
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

    The form is ``config.data.format`` (``auto``: detected from the training folder's file names
    by `formats.detect_format`; both splits must have the same). Uses the first
    ``config.data.train_samples`` / ``config.data.eval_samples`` samples in stem order (all when
    None). Every rank sees the whole folder it is given (after a node-sharded stage, its node's
    share) and the harness's sampler shards it; ``runtime`` makes the standardisation statistics
    the same on every rank (`job_channel_stats`).

    Returns:
        Two `CosmoFlowDataset`; each item is ``x`` int16 ``(S, S, S, 4)`` counts, ``y`` float32
        ``(4,)``; their ``device_transform`` decodes a batch to the model's float32
        ``(B, 4, S, S, S)`` input (``log(counts + 1)``, standardised per channel with the training
        split's statistics when ``model.input_standardization`` is ``channel``).

    Raises:
        DataError: a folder is missing or empty, holds raw 512^3 universes (the message names
            ``mlhpc data prepare``), a file is malformed (named, with the record or sample and
            what was expected), fewer samples exist than asked for, or the two splits' forms or
            cube sizes differ.
    """
    data_dir = Path(data_dir)
    source = Path(getattr(config.data, "path", data_dir))
    # read from a staged copy of data.path: messages name the source file
    origin = None if _same(source, data_dir) or not source.is_dir() else (data_dir, source)
    try:
        train, valid = _build(config, data_dir)
    except DataError as exc:
        raise _renamed(exc, origin) from None
    train.origin = valid.origin = origin
    if getattr(getattr(config, "model", None), "input_standardization", "none") == "channel":
        mean, std = job_channel_stats(train, runtime)
        train.standardize(mean, std)
        valid.standardize(mean, std)
    return train, valid


def job_channel_stats(train: CosmoFlowDataset, runtime: "Runtime",
                      n_samples: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """`CosmoFlowDataset.channel_stats` made the same on every rank of ``runtime.group``.

    After a node-sharded stage (``data.staging.shard: node``) each node's training split is its
    own share, so its first ``n_samples`` differ from another node's and the nodes would
    standardise their inputs differently. The ranks gather ``(samples used, mean, std)``; when
    they all agree (every node holds the whole set, or one process) the statistics are returned
    as computed, bit for bit; otherwise they are pooled: the sample-weighted mean of the means
    and of ``std**2 + mean**2``, so every rank standardises with one float32 ``(4,)`` pair.
    """
    mean, std = train.channel_stats(n_samples)
    if not getattr(runtime, "distributed", False) or not torch.distributed.is_initialized():
        return mean, std
    rows: list[Any] = [None] * torch.distributed.get_world_size(group=runtime.group)
    torch.distributed.all_gather_object(rows, (min(n_samples, len(train)), mean.tolist(), std.tolist()),
                                        group=runtime.group)
    if all(row == rows[0] for row in rows):
        return mean, std
    weight = np.array([row[0] for row in rows], np.float64)[:, None]
    means, stds = np.array([row[1] for row in rows]), np.array([row[2] for row in rows])
    pooled = (weight * means).sum(0) / weight.sum()
    second = (weight * (stds ** 2 + means ** 2)).sum(0) / weight.sum()
    return (pooled.astype(np.float32),
            np.sqrt(np.maximum(second - pooled ** 2, 1e-12)).astype(np.float32))


def _build(config: "Config", data_dir: Path) -> tuple[CosmoFlowDataset, CosmoFlowDataset]:
    train_dir, eval_dir = data_dir / "train", data_dir / "validation"
    if not train_dir.is_dir() and data_dir.is_dir():
        raw_universes(data_dir)  # a folder of raw universes given as data.path: name the fix
    fmt = dataset_format(config, data_dir)
    train = CosmoFlowDataset(find_files(train_dir, fmt), config.data.train_samples,
                             folder=train_dir, fmt=fmt)
    valid = CosmoFlowDataset(find_files(eval_dir, fmt), config.data.eval_samples,
                             folder=eval_dir, fmt=fmt)
    if train.cube_size != valid.cube_size:
        raise DataError(f"{eval_dir}: cube size {valid.cube_size}; expected {train.cube_size} "
                        f"like {train_dir}")
    return train, valid


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def _renamed(exc: DataError, origin: Optional[tuple[Path, Path]]) -> DataError:
    """``exc`` naming the source file when the dataset reads a staged copy (one line: the source
    path, then where the copy was read)."""
    text = str(exc)
    if origin is None or str(origin[0]) not in text:
        return exc
    staged, source = origin
    return DataError(text.replace(str(staged), str(source)) + f" [read from the staged copy {staged}]")


def dataset_format(config: Any, data_dir: Path) -> str:
    """``config.data.format`` if set, else the form detected in ``train/`` (and the same found in
    ``validation/``). Raises DataError."""
    chosen = getattr(getattr(config, "data", None), "format", "auto") or "auto"
    if chosen != "auto":
        if chosen not in formats.FORMATS:
            raise DataError(f"data.format: {chosen!r} is not a CosmoFlow form; expected one of "
                            f"{', '.join(formats.FORMATS)}")
        return chosen
    fmt = formats.detect_format(Path(data_dir) / "train")
    other = formats.detect_format(Path(data_dir) / "validation")
    if other != fmt:
        raise DataError(f"{Path(data_dir) / 'validation'}: {other} files; expected {fmt} like "
                        f"{Path(data_dir) / 'train'}")
    return fmt


def raw_universes(folder: Path) -> None:
    """Raise DataError naming ``mlhpc data prepare`` when ``folder`` holds raw universes (HDF5
    ``full`` of 512^3 cells) instead of train/ and validation/ sample folders."""
    candidates = sorted(p for p in Path(folder).iterdir() if p.name.endswith(formats.HDF5_SUFFIXES))
    if candidates:
        readers.reader("hdf5").inspect(candidates[0])  # raises the message naming the command
