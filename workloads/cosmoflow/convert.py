"""CosmoFlow's data tools (`mlhpc.workload.DataTools`): check, convert and prepare its files.

- convert: any form `formats` reads -> ``hdf5`` (one file per source file, ``full`` int16
  ``(S, S, S, 4)`` or ``(n, S, S, S, 4)`` and ``unitPar`` float32, contiguous and unfiltered so
  the loader memory-maps it) or ``npy`` (NVIDIA's layout: ``<stem>_data.npy`` int16
  ``(S, S, S, 4)``, ``<stem>_label.npy`` float32 ``(4,)``, then ``files_data.lst`` /
  ``files_label.lst`` sorted, as hpc_results_v1.0 ``tools/init_datasets.sh`` lists them). Counts
  stay int16 and labels float32, bit for bit.
- prepare: mlcommons/hpc ``cosmoflow/prepare.py``: a raw universe (HDF5 ``full`` int16
  ``(512, 512, 512, 4)`` and ``unitPar`` ``(4,)``) split along each axis into sub-volumes of
  ``sample_size`` (64 of 128^3 per universe), in ``split_universe``'s order (axis 0 outermost),
  each with its universe's ``unitPar``, named ``<universe>_<iii>`` as prepare.py names them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import h5py
import numpy as np

from pydantic import BaseModel, ConfigDict, Field

from mlhpc.data.files import atomic_output
from mlhpc.errors import DataError
from mlhpc.workload import DataTools, FileCheck, last_files_to_validation

from . import formats, readers, tfrecord_io

CONVERT_TO = ("hdf5", "npy")


def write_hdf5(path: Path, counts: np.ndarray, targets: np.ndarray) -> Path:
    """One HDF5 file: ``full`` int16 and ``unitPar`` float32, contiguous (memory-mappable);
    written under a temporary name and renamed."""
    with atomic_output(path) as tmp, h5py.File(tmp, "w") as f:
        f.create_dataset("full", data=np.ascontiguousarray(counts, dtype="<i2"))
        f.create_dataset("unitPar", data=np.asarray(targets, dtype="<f4"))
    return path


def write_npy(out_dir: Path, name: str, counts: np.ndarray, target: np.ndarray) -> list[Path]:
    """``<name>_data.npy`` int16 ``(S, S, S, 4)`` and ``<name>_label.npy`` float32 ``(4,)``."""
    written = []
    for suffix, array in ((formats.NPY_DATA, np.ascontiguousarray(counts, dtype="<i2")),
                          (formats.NPY_LABEL, np.asarray(target, dtype="<f4"))):
        final = out_dir / f"{name}{suffix}"
        with atomic_output(final) as tmp, open(tmp, "wb") as handle:
            np.lib.format.write_array(handle, array, allow_pickle=False)
        written.append(final)
    return written


def copy_range(src: Path, src_offset: int, dst: Path, dst_offset: int, nbytes: int) -> None:
    """Copy ``nbytes`` of ``src`` from ``src_offset`` into ``dst`` at ``dst_offset`` inside the
    kernel (``copy_file_range``, as ``cp`` does; a read/write loop where the kernel refuses).
    Raises DataError when ``src`` is shorter than announced."""
    with open(src, "rb") as source, open(dst, "r+b") as dest:
        done = 0
        while done < nbytes:
            try:
                n = os.copy_file_range(source.fileno(), dest.fileno(), nbytes - done,
                                       src_offset + done, dst_offset + done)
            except OSError:  # another file system, an old kernel: copy through user space
                source.seek(src_offset + done)
                chunk = source.read(min(nbytes - done, 8 << 20))
                n = os.pwrite(dest.fileno(), chunk, dst_offset + done)
            if n == 0:
                raise DataError(f"{src}: ends before its counts do (truncated)")
            done += n


class Mapped(NamedTuple):
    """Where a source's int16 counts ``shape`` lie contiguous: file ``src`` from byte ``offset``."""

    src: Path
    offset: int
    shape: tuple[int, ...]


def _copy_mapped(mapped: Mapped, targets: np.ndarray, out_dir: Path, name: str, to: str
                 ) -> list[tuple[Path, int]]:
    """`_write` for a source whose counts lie contiguous (npy, contiguous HDF5): the headers
    are written here and the counts copied by the kernel."""
    if to == "hdf5":
        return _copy_mapped_hdf5(mapped, targets, out_dir / f"{name}.h5")
    return _copy_mapped_npy(mapped, targets, out_dir, name)


def _copy_mapped_hdf5(mapped: Mapped, targets: np.ndarray, final: Path) -> list[tuple[Path, int]]:
    """One HDF5 file ``final``: ``full`` allocated contiguous and unfilled, the counts copied
    into it by the kernel, ``unitPar`` written."""
    src, offset, shape = mapped
    n = shape[0]
    sample_bytes = int(np.prod(shape[1:])) * 2
    with atomic_output(final) as tmp:
        with h5py.File(tmp, "w") as f:
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)  # contiguous space now, unfilled
            dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
            space = h5py.h5s.create_simple(shape[1:] if n == 1 else shape)
            full = h5py.h5d.create(f.id, b"full", h5py.h5t.STD_I16LE, space, dcpl=dcpl)
            dst_offset = full.get_offset()
            f.create_dataset("unitPar", data=np.asarray(targets[0] if n == 1 else targets, "<f4"))
        copy_range(src, offset, tmp, dst_offset, n * sample_bytes)
    return [(final, n)]


def _copy_mapped_npy(mapped: Mapped, targets: np.ndarray, out_dir: Path, name: str
                     ) -> list[tuple[Path, int]]:
    """One ``.npy`` pair per sample: the data header written, the counts copied by the kernel,
    the label written."""
    src, offset, shape = mapped
    n = shape[0]
    sample_bytes = int(np.prod(shape[1:])) * 2
    out: list[tuple[Path, int]] = []
    for i in range(n):
        stem_i = name if n == 1 else f"{name}_{i:03d}"
        data = out_dir / f"{stem_i}{formats.NPY_DATA}"
        with atomic_output(data) as tmp:
            with open(tmp, "wb") as handle:
                header = {"descr": "<i2", "fortran_order": False, "shape": tuple(shape[1:])}
                np.lib.format.write_array_header_1_0(handle, header)
                dst_offset = handle.tell()
            copy_range(src, offset + i * sample_bytes, tmp, dst_offset, sample_bytes)
        label = out_dir / f"{stem_i}{formats.NPY_LABEL}"
        with atomic_output(label) as tmp:
            with open(tmp, "wb") as handle:
                np.lib.format.write_array(handle, np.asarray(targets[i], "<f4"), allow_pickle=False)
        out += [(data, 1), (label, 0)]
    return out


def _write(out_dir: Path, name: str, counts: np.ndarray, targets: np.ndarray, to: str
           ) -> list[tuple[Path, int]]:
    """Write samples ``counts`` ``(n, S, S, S, 4)`` / ``targets`` ``(n, 4)`` named after ``name``."""
    n = counts.shape[0]
    if to == "hdf5":
        single = n == 1
        path = write_hdf5(out_dir / f"{name}.h5", counts[0] if single else counts,
                          targets[0] if single else targets)
        return [(path, n)]
    out: list[tuple[Path, int]] = []
    for i in range(n):
        data, label = write_npy(out_dir, name if n == 1 else f"{name}_{i:03d}", counts[i], targets[i])
        out += [(data, 1), (label, 0)]
    return out


class PrepareOptions(BaseModel):
    """``mlhpc data prepare cosmoflow --option KEY=VALUE``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    sample_size: int = Field(128, ge=1, description=(
        "cells per side of a sample (the reference splits 512^3 universes into 128^3)"))
    validation_fraction: float = Field(0.1111, ge=0, lt=1, description=(
        "share of the raw universes (whole files, the last in name order) for validation/"))


class CosmoFlowDataTools(DataTools):
    """`mlhpc.workload.DataTools` for CosmoFlow."""

    formats = formats.FORMATS
    convert_to = CONVERT_TO
    prepare_options = PrepareOptions

    def detect(self, split_dir: Path) -> str:
        return formats.detect_format(split_dir)

    def list_files(self, split_dir: Path, fmt: str) -> list[Path]:
        return readers.reader(fmt).list_files(Path(split_dir))

    def check_file(self, path: Path, fmt: str, full: bool) -> FileCheck:
        """Metadata and labels (TFRecord: headers only, unless ``full``; a GZIP TFRecord's
        stream inflated once, its GZIP CRC, every record header and every record's data CRC
        checked in that one pass, `tfrecord_io.count_gzip_frames`); ``full`` reads every sample and checks counts >= 0
        and finite labels. Raises DataError."""
        reader = readers.reader(fmt)
        info = reader.inspect(path, full=full or fmt != "tfrecord")
        if fmt == "tfrecord" and not full and tfrecord_io.is_gzip(path):
            records = tfrecord_io.count_gzip_frames(path)
            if records != info.n_samples:
                raise DataError(f"{path}: {records} records in the GZIP stream, {info.n_samples} "
                                "from its first record's size and its size trailer")
        size = path.stat().st_size + (formats.label_path(path).stat().st_size if fmt == "npy" else 0)
        if full:
            source = reader.open(path, info)
            try:
                for i in range(info.n_samples):
                    formats.check_counts(path, np.asarray(source.counts[i])[None], i)
            finally:
                source.close()
        return FileCheck(info.n_samples, (info.cube,) * 3 + (formats.N_CHANNELS,), "int16", size)

    def convert_file(self, path: Path, fmt: str, out_dir: Path, to: str) -> list[tuple[Path, int]]:
        """Every sample of one source file, written in form ``to``. Counts stored contiguous
        (npy, contiguous HDF5) are copied by the kernel as they are, without passing through
        Python; TFRecord and chunked HDF5 are decoded (counts checked >= 0) and written.
        Raises DataError."""
        reader = readers.reader(fmt)
        info = reader.inspect(path, full=False)  # TFRecord: headers only, decoded once by open
        if info.offset is not None and fmt in ("npy", "hdf5"):  # counts lie contiguous on disk
            targets = info.targets if info.targets is not None else reader.inspect(path, True).targets
            shape = (info.n_samples,) + (info.cube,) * 3 + (formats.N_CHANNELS,)
            return _copy_mapped(Mapped(path, info.offset, shape), targets, Path(out_dir),
                                formats.stem(path.name), to)
        source = reader.open(path, info)
        try:
            stored = source.counts
            counts = (stored if isinstance(stored, np.ndarray)
                      else np.stack([np.asarray(stored[i]) for i in range(info.n_samples)]))
            formats.check_counts(path, counts)
            return _write(Path(out_dir), formats.stem(path.name), counts, source.targets, to)
        finally:
            source.close()

    def finish_split(self, out_dir: Path, to: str) -> list[Path]:
        """For ``npy``: ``files_data.lst`` and ``files_label.lst``, sorted names."""
        if to != "npy":
            return []
        written = []
        for listing, suffix in ((formats.DATA_LIST, formats.NPY_DATA),
                                (formats.LABEL_LIST, formats.NPY_LABEL)):
            names = sorted(p.name for p in Path(out_dir).iterdir() if p.name.endswith(suffix))
            with atomic_output(Path(out_dir) / listing) as tmp:
                tmp.write_text("".join(f"{name}\n" for name in names))
            written.append(Path(out_dir) / listing)
        return written

    def list_raw(self, raw_dir: Path) -> list[Path]:
        """Raw universes: ``*.hdf5`` / ``*.h5`` under ``raw_dir`` (recursively, as prepare.py's
        ``find_files`` walks), sorted."""
        raw_dir = Path(raw_dir)
        if not raw_dir.is_dir():
            raise DataError(f"{raw_dir}: raw data folder does not exist")
        return sorted(p for p in raw_dir.rglob("*") if p.name.endswith(formats.HDF5_SUFFIXES)
                      and p.is_file())

    def prepare_splits(self, raw: list[Path], options: PrepareOptions) -> list[tuple[str, Path]]:
        """Whole universes to splits, the last ``validation_fraction`` to validation/."""
        return last_files_to_validation(raw, options.validation_fraction, self.splits)

    def prepare_file(self, path: Path, out_dir: Path, to: str, options: PrepareOptions
                     ) -> list[tuple[Path, int]]:
        """Split one raw universe into ``(universe / sample_size)**3`` samples. Raises DataError
        naming the file: not HDF5, no ``full``/``unitPar``, a shape not divisible."""
        sample_size = options.sample_size
        try:
            handle = h5py.File(path, "r")
        except OSError as exc:
            raise DataError(f"{path}: cannot be opened as HDF5 ({formats._short(exc)})") from None
        with handle:
            for key in ("full", "unitPar"):
                if key not in handle:
                    raise DataError(f"{path}: missing dataset {key!r}; a raw universe holds 'full' "
                                    f"(int16 (512, 512, 512, 4)) and 'unitPar' (4,)")
            full, unit = handle["full"], handle["unitPar"]
            shape = full.shape
            if (len(shape) != 4 or shape[3] != formats.N_CHANNELS or len(set(shape[:3])) != 1
                    or shape[0] % sample_size or full.dtype != np.int16):
                raise DataError(f"{path}: 'full' {shape} {full.dtype}; expected int16 (N, N, N, 4) "
                                f"with N divisible by the sample size {sample_size}")
            if unit.shape != (formats.N_TARGETS,):
                raise DataError(f"{path}: 'unitPar' has shape {unit.shape}; expected (4,)")
            target = np.asarray(unit[()], np.float32)
            formats.check_targets(path, target[None])
            n = shape[0] // sample_size
            out: list[tuple[Path, int]] = []
            name = formats.stem(path.name)
            index = 0
            for i in range(n):  # one slab of the universe in memory at a time
                slab = full[i * sample_size:(i + 1) * sample_size]
                for j in range(n):
                    for k in range(n):
                        sub = slab[:, j * sample_size:(j + 1) * sample_size,
                                   k * sample_size:(k + 1) * sample_size]
                        if sub.min() < 0:
                            raise DataError(f"{path}: sub-volume {index}: negative particle count")
                        out += _write(Path(out_dir), f"{name}_{index:03d}", sub[None], target[None], to)
                        index += 1
        return out


DATA_TOOLS = CosmoFlowDataTools()
