"""The reader of each CosmoFlow on-disk form, by name: HDF5 and NVIDIA's npy (`formats`) and
TFRecord (`tfrecord_format`, which builds on `formats`). Kept apart from both so that neither
module imports the other back."""

from __future__ import annotations

from typing import Any

from .formats import Hdf5Format, NpyFormat
from .tfrecord_format import TFRecordFormat


def reader(name: str) -> Any:
    """A new reader object for format ``name`` (one of `formats.FORMATS`).

    Raises:
        KeyError: ``name`` is not one of them (callers check ``data.format`` first).
    """
    return {"hdf5": Hdf5Format, "tfrecord": TFRecordFormat, "npy": NpyFormat}[name]()
