"""OC20 graph records pickled as the OCP preprocessing stores them (format: `lmdb_io`), without
torch_geometric installed: a torch_geometric ``Data`` (either layout) whose tensors are pickled
by torch's reduce over legacy ``torch.save`` storage streams, deterministically (the same
records give the same bytes).
"""

from __future__ import annotations

import copyreg
import io
import pickle
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

LAYOUTS = ("pyg2", "pyg1")


class _DataOut:
    """A record being written; pickled as a ``torch_geometric.data.data.Data`` object."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state


class _StoreOut(_DataOut):
    """Pickled as a ``torch_geometric.data.storage.GlobalStorage`` object."""


class _StorageOut:
    def __init__(self, array: np.ndarray) -> None:
        self.array = array


class _TensorOut:
    def __init__(self, array: np.ndarray) -> None:
        self.array = np.ascontiguousarray(array)


_PYG_NAMES: dict[type, tuple[str, str]] = {
    _DataOut: ("torch_geometric.data.data", "Data"),
    _StoreOut: ("torch_geometric.data.storage", "GlobalStorage")}
_STORAGE_TYPES = {np.dtype(np.float32): torch.FloatStorage, np.dtype(np.int64): torch.LongStorage,
                  np.dtype(np.float64): torch.DoubleStorage, np.dtype(np.bool_): torch.BoolStorage}
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_SYS_INFO = {"protocol_version": 1001, "little_endian": True,
                    "type_sizes": {"short": 2, "int": 4, "long": 4}}


class _LegacyStoragePickler(pickle.Pickler):
    def __init__(self, handle: io.BytesIO, pid: tuple[Any, ...]) -> None:
        super().__init__(handle, protocol=2)
        self._pid = pid

    def persistent_id(self, obj: Any) -> Any:
        return self._pid if obj is _LegacyStoragePickler else None


def _legacy_storage_bytes(array: np.ndarray) -> bytes:
    """``torch.save(storage, _use_new_zipfile_serialization=False)`` bytes for the storage of a
    contiguous little-endian array, with the storage key ``"0"`` (torch writes the storage's
    memory address there, which would make files differ between runs)."""
    out = io.BytesIO()
    for header in (_LEGACY_MAGIC, 1001, _LEGACY_SYS_INFO):
        pickle.dump(header, out, protocol=2)
    pid = ("storage", _STORAGE_TYPES[array.dtype], "0", "cpu", int(array.size), None)
    _LegacyStoragePickler(out, pid).dump(_LegacyStoragePickler)
    pickle.dump(["0"], out, protocol=2)
    out.write(int(array.size).to_bytes(8, "little"))
    out.write(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes())
    return out.getvalue()


class _RecordPickler(pickle._Pickler):  # the Python pickler: its save_global can be extended
    """Pickles `_DataOut` records as torch_geometric ``Data`` objects (either layout) and numpy
    arrays as torch tensors, deterministically, without torch_geometric installed."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) in _PYG_NAMES:
            return (copyreg.__newobj__, (type(obj),), obj.state)
        if isinstance(obj, _TensorOut):
            a = obj.array
            stride = tuple(s // a.itemsize for s in a.strides)
            return (torch._utils._rebuild_tensor_v2,
                    (_StorageOut(a), 0, tuple(a.shape), stride, False, OrderedDict()))
        if isinstance(obj, _StorageOut):
            return (torch.storage._load_from_bytes, (_legacy_storage_bytes(obj.array),))
        return NotImplemented

    def save_global(self, obj: Any, name: str | None = None) -> None:
        where = _PYG_NAMES.get(obj)
        if where is None:
            super().save_global(obj, name)
            return
        self.write(pickle.GLOBAL + f"{where[0]}\n{where[1]}\n".encode("ascii"))
        self.memoize(obj)


def _record_values(record: dict[str, Any]) -> dict[str, Any]:
    """The reference's attribute order and dtypes (``AtomsToGraphs.convert``)."""
    dtypes = {"pos": np.float32, "cell": np.float32, "atomic_numbers": np.float32,
              "edge_index": np.int64, "cell_offsets": np.int64, "force": np.float32,
              "distances": np.float32, "fixed": np.float32, "tags": np.int64}
    order = ("cell", "pos", "atomic_numbers", "natoms", "edge_index", "cell_offsets", "y",
             "force", "distances", "fixed", "tags", "sid", "fid")
    unknown = set(record) - set(order)
    if unknown:
        raise ValueError(f"unknown record keys {sorted(unknown)}")
    out: dict[str, Any] = {}
    for key in (k for k in order if k in record):
        value = record[key]
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().numpy()
        if key in dtypes:
            value = np.asarray(value, dtype=dtypes[key])
            out[key] = _TensorOut(value.reshape(1, 3, 3) if key == "cell" else value)
        elif key == "y":
            out[key] = float(value)
        else:
            out[key] = int(value)
    return out


def encode_record(record: dict[str, Any], layout: str = "pyg2") -> bytes:
    """Pickle one structure as the reference stores it: a torch_geometric ``Data`` holding the
    `_record_values` dtypes (atomic_numbers and fixed float32, natoms/sid/fid int, y float).

    Args:
        record: reference names (`REQUIRED_KEYS`, optionally sid, fid, edge_index,
            cell_offsets, distances) -> arrays, tensors or numbers.
        layout: ``pyg2`` (``_store`` GlobalStorage, torch_geometric >= 2.0) or ``pyg1``
            (attributes in the ``Data``'s ``__dict__``, as the 2020 OC20 files).

    Returns:
        pickle bytes (protocol 4), identical for identical records.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: expected one of {LAYOUTS}")
    values = _record_values(record)
    data = _DataOut({})
    if layout == "pyg2":
        data.state["_store"] = _StoreOut({"_mapping": values, "_parent": data})
    else:
        data.state.update(values)
    out = io.BytesIO()
    _RecordPickler(out, protocol=4).dump(data)
    return out.getvalue()
