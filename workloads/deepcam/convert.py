"""DeepCAM's data tools (`mlhpc.workload.DataTools`): check and convert its sample files.

Forms (see `data`): the official HDF5 (``data-<tag>.h5``: ``climate/data`` float32 (H, W, 16),
``climate/labels_0`` integer (H, W)) and NVIDIA's ``convert_hdf52npy.py`` layout
(``data-<tag>.npy``, ``label-<tag>.npy``). Conversion keeps dtypes and values bit for bit, one
output sample per source sample with the same tag; ``stats.h5`` is copied unchanged. DeepCAM's
files are distributed ready to train on, so there is no preparation step.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from mlhpc.data.files import atomic_output
from mlhpc.errors import DataError
from mlhpc.workload import DataTools, FileCheck

from . import data

NUM_CLASSES = len(data.CLASSES)


def read_sample(path: Path, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """``(data float32 (H, W, C), label integer (H, W))`` of one sample file, as stored.
    Raises DataError naming the file."""
    if fmt == "npy":
        arrays = []
        for file in (path, data.label_file(path)):
            if not file.is_file():
                raise DataError(f"{file}: missing" + (f" labels for {path.name}" if file != path else ""))
            try:
                arrays.append(np.load(file, allow_pickle=False))
            except (OSError, ValueError, EOFError) as exc:
                raise DataError(f"{file}: not a readable .npy file ({str(exc)[:120]})") from None
        values, label = arrays
    else:
        try:
            with h5py.File(path, "r") as f:
                for key in (data.DATA_KEY, data.LABEL_KEY):
                    if key not in f or not isinstance(f[key], h5py.Dataset):
                        raise DataError(f"{path}: dataset {key} missing")
                values, label = f[data.DATA_KEY][...], f[data.LABEL_KEY][...]
        except OSError as exc:
            raise DataError(f"{path}: not a readable HDF5 file ({str(exc)[:120]})") from None
    if values.ndim != 3 or values.dtype != np.float32:
        raise DataError(f"{path}: data of shape {values.shape} and dtype {values.dtype}; expected "
                        f"float32 (H, W, C)")
    if label.shape != values.shape[:2] or label.dtype.kind not in "iu":
        raise DataError(f"{path}: labels of shape {label.shape} and dtype {label.dtype}; expected "
                        f"an integer {values.shape[:2]}")
    return values, label


class DeepCamDataTools(DataTools):
    """`mlhpc.workload.DataTools` for DeepCAM."""

    formats = data.FORMATS
    convert_to = data.FORMATS
    root_files = (data.STATS_FILE,)

    def detect(self, split_dir: Path) -> str:
        return data.detect_format(split_dir)

    def list_files(self, split_dir: Path, fmt: str) -> list[Path]:
        return sorted(Path(split_dir).glob(data.SAMPLE_GLOB if fmt == "hdf5" else data.NPY_GLOB))

    def check_file(self, path: Path, fmt: str, full: bool) -> FileCheck:
        """Shapes and dtypes; ``full``: also finite inputs and labels in 0..2. Raises DataError."""
        values, label = read_sample(path, fmt)
        if full:
            if not np.isfinite(values).all():
                y, x, c = (int(v[0]) for v in np.nonzero(~np.isfinite(values)))
                raise DataError(f"{path}: sample 0: input at pixel ({y}, {x}) channel {c} is not finite")
            if label.size and (label.min() < 0 or label.max() >= NUM_CLASSES):
                raise DataError(f"{path}: labels outside 0..{NUM_CLASSES - 1}")
        size = path.stat().st_size + (data.label_file(path).stat().st_size if fmt == "npy" else 0)
        return FileCheck(1, tuple(values.shape), str(values.dtype), size)

    def convert_file(self, path: Path, fmt: str, out_dir: Path, to: str) -> list[tuple[Path, int]]:
        values, label = read_sample(path, fmt)
        tag = path.name[len("data-"):].rsplit(".", 1)[0]
        if to == "hdf5":
            final = Path(out_dir) / f"data-{tag}.h5"
            with atomic_output(final) as tmp, h5py.File(tmp, "w") as f:
                f.create_dataset(data.DATA_KEY, data=values)
                f.create_dataset(data.LABEL_KEY, data=label)
            return [(final, 1)]
        out = []
        for prefix, array, count in (("data", values, 1), ("label", label, 0)):
            final = Path(out_dir) / f"{prefix}-{tag}.npy"
            with atomic_output(final) as tmp:
                with open(tmp, "wb") as handle:
                    np.lib.format.write_array(handle, np.ascontiguousarray(array), allow_pickle=False)
            out.append((final, count))
        return out

    def list_raw(self, raw_dir: Path) -> list[Path]:
        raise DataError(f"{raw_dir}: DeepCAM has no preparation step; its HDF5 files are "
                        f"distributed ready to train on (mlhpc data convert deepcam changes their form)")

DATA_TOOLS = DeepCamDataTools()
