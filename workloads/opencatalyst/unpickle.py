"""Pickled OC20 graph records read without running their code, every size they declare bounded.

Records are pickles of torch_geometric ``Data`` objects (format: `lmdb_io`). Pickles made with
torch_geometric < 2.0 keep the attributes in the ``Data`` object's ``__dict__``; torch_geometric
>= 2.0 keeps them in ``_store`` (a ``GlobalStorage`` whose ``_mapping`` is the attribute dict).
Tensors are pickled by torch's reduce: ``torch._utils._rebuild_tensor_v2(storage, offset, size,
stride, requires_grad, hooks)`` with the storage as ``torch.storage._load_from_bytes(<legacy
torch.save bytes>)``.

`load_record` unpickles through a restricted unpickler that admits only the globals above (the
PyG classes mapped to an inert stand-in, torch's tensor rebuild functions, ``_load_from_bytes``
replaced by ``torch.load(..., weights_only=True)``, torch dtypes and ``torch.Size``, numpy's
array/scalar reconstruction, ``OrderedDict``, ``set``, ``frozenset``) and refuses any other with
a DataError naming the file, key and global.

Every size a record declares is checked before torch allocates anything (a 12 kB record may
declare terabytes):

- a storage (``_load_from_bytes``) is read only from the legacy ``torch.save`` stream the
  reference writes (never a zip archive, whose members may be compressed), and only when every
  storage it names declares at most the bytes the stream carries after it (torch allocates the
  declared size before it reads the data);
- a tensor (``_rebuild_tensor``, ``_v2``, ``_v3``) has at most `MAX_TENSOR_DIMS` dimensions,
  sizes of at least 0, at most `MAX_TENSOR_ELEMENTS` elements, a stride of at least 1 along
  every dimension longer than one (a zero stride repeats one stored value to any size, a
  negative one reads before its start), a dtype the model takes (`TENSOR_DTYPES`: float8,
  complex, quantized and wide unsigned types are refused), and fits its storage (its offset
  plus its elements, and the last element it reaches, lie within the stored elements). Its
  ``requires_grad``, backward hooks and metadata are dropped: a record is data.
"""

from __future__ import annotations

import _compat_pickle
import io
import math
import pickle
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from mlhpc.errors import DataError, Where
from mlhpc.text import clip, one_line

#: Atoms a structure may hold (catalyst slabs with adsorbates hold tens to a few hundred).
MAX_RECORD_ATOMS = 10_000
#: Stored edges per centre atom (``AtomsToGraphs(max_neigh=50)`` in ``preprocess_ef.py``).
MAX_EDGES_PER_ATOM = 50
#: Elements of one tensor: the largest a record holds is ``cell_offsets`` (E, 3), E <= 50 N.
MAX_TENSOR_ELEMENTS = MAX_RECORD_ATOMS * MAX_EDGES_PER_ATOM * 3
MAX_TENSOR_DIMS = 4
#: Tensor dtypes a record may hold (float8 and other exotic types cannot be read back).
TENSOR_DTYPES = frozenset({torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
                           torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool})
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch.serialization.MAGIC_NUMBER
LEGACY_PROTOCOL = 1001  # torch.serialization.PROTOCOL_VERSION


# ------------------------------------------------------------------------- stand-ins


class PygRecord:
    """Inert stand-in for a pickled torch_geometric ``Data`` (either layout): it only keeps the
    state the pickle gives it. `fields` returns the attribute dict."""

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (dict state, slot state)
            state = state[0]
        self.__dict__["_state"] = state

    def fields(self) -> dict[str, Any]:
        """The record's attributes: ``_store._mapping`` (PyG >= 2.0) or ``__dict__`` (older),
        without None values and dunder entries (``__num_nodes__``)."""
        state = self.__dict__.get("_state")
        if not isinstance(state, dict):
            return {}
        store = state.get("_store")
        if isinstance(store, PygStorage):
            mapping = store.__dict__.get("_state", {}).get("_mapping")
            return dict(mapping) if isinstance(mapping, dict) else {}
        return {k: v for k, v in state.items() if isinstance(k, str) and v is not None
                and not (k.startswith("__") and k.endswith("__")) and k not in _PYG2_CLASS_KEYS}


class PygStorage(PygRecord):
    """Inert stand-in for torch_geometric's ``GlobalStorage``."""


class _Inert:
    """Stand-in for classes a PyG pickle names but never instantiates (``DataEdgeAttr``)."""


_PYG2_CLASS_KEYS = frozenset({"_edge_attr_cls", "_tensor_attr_cls", "_store"})


def why(exc: BaseException) -> str:
    """An exception's text for a one-line message: first line only, at most 200 characters."""
    return clip(one_line(str(exc).splitlines()[0] if str(exc) else type(exc).__name__), 200)


class RefusedGlobal(pickle.UnpicklingError):
    """A pickle named a global outside the graph-record allow-list."""


class RefusedSize(pickle.UnpicklingError):
    """A storage or tensor declares a size, stride or dtype outside the bounds (module doc)."""


def _shown(value: Any) -> str:
    """``value`` for a message, at most 80 characters: a container's repr is never built whole
    (a pickle may nest a list in itself thousands of levels deep, or share one list millions of
    times: its repr is a RecursionError or gigabytes), only `mlhpc.text.clip`'s bounded view."""
    if isinstance(value, (str, bytes, int, float, bool, type(None), torch.dtype)):
        return clip(one_line(repr(value)), 80)
    return clip(one_line(clip(value, 80)), 80)


# ------------------------------------------------------------------------- storages


#: The legacy storage classes (``torch.FloatStorage`` ...) of the dtypes a record may hold.
_STORAGE_DTYPES = {"DoubleStorage": torch.float64, "FloatStorage": torch.float32, "HalfStorage": torch.float16,
                   "BFloat16Storage": torch.bfloat16, "LongStorage": torch.int64, "IntStorage": torch.int32,
                   "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8,
                   "BoolStorage": torch.bool}


class _StorageType:
    """What a legacy stream's storage class (``torch.FloatStorage`` ...) is read as: its dtype."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype


def _mapped(module: str, name: str) -> tuple[str, str]:
    """Python 2 names (protocol 2 writes ``__builtin__.set``), mapped as pickle's own
    find_class does."""
    module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
    return _compat_pickle.IMPORT_MAPPING.get(module, module), name


def _no_buffers(unpickler: pickle._Unpickler) -> None:
    raise RefusedSize("a protocol 5 out-of-band buffer or bytearray, which no record holds")


class _Unpickler(pickle._Unpickler):
    """pickle's own Python unpickler without protocol 5's bytearray and out-of-band buffer
    opcodes: every length it reads is then bounded by the bytes present (the C unpickler
    allocates a declared length before reading it, and a bytearray cut short is freed with
    its buffer still exported)."""

    dispatch = {**pickle._Unpickler.dispatch,
                **{op[0]: _no_buffers for op in (pickle.BYTEARRAY8, pickle.NEXT_BUFFER, pickle.READONLY_BUFFER)}}


class _NoGlobals(_Unpickler):
    """Reads plain data only (the legacy stream's header and key list)."""

    def find_class(self, module: str, name: str) -> Any:
        raise RefusedGlobal(".".join(_mapped(module, name)))

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedGlobal(f"persistent id {_shown(pid)}")


class _StorageScan(_NoGlobals):
    """Reads a legacy stream's main pickle building nothing: storage classes become
    `_StorageType`, each persistent id ``("storage", type, key, location, numel, view)`` is
    collected in ``declared`` (key -> (dtype, numel))."""

    def __init__(self, handle: io.BytesIO) -> None:
        super().__init__(handle)
        self.declared: dict[Any, tuple[torch.dtype, int]] = {}

    def find_class(self, module: str, name: str) -> Any:
        module, name = _mapped(module, name)
        dtype = _STORAGE_DTYPES.get(name) if module == "torch" else None
        if dtype is None:
            raise RefusedGlobal(f"{module}.{name}")
        return _StorageType(dtype)

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 6 and pid[0] in ("storage", b"storage")
                and isinstance(pid[1], _StorageType) and type(pid[4]) is int and pid[4] >= 0):
            raise RefusedSize(f"a storage reference {_shown(pid)}, not a legacy torch storage")
        if pid[5] is not None:
            raise RefusedSize("a storage view, which no record holds")
        found = (pid[1].dtype, pid[4])
        if self.declared.setdefault(pid[2], found) != found:
            raise RefusedSize(f"storage {_shown(pid[2])} declared twice with different sizes")
        return found


def _check_storage_stream(blob: bytes) -> None:
    """Raise RefusedSize unless ``blob`` is a legacy ``torch.save`` stream (magic, protocol,
    system info, the main pickle, its storage keys, then per key an int64 element count and
    the data) whose every storage declares what the stream carries."""
    handle = io.BytesIO(blob)
    try:
        magic, protocol, _ = (_NoGlobals(handle).load() for _ in range(3))
        scan = _StorageScan(handle)
        scan.load()
        keys = _NoGlobals(handle).load()
    except (RefusedSize, RefusedGlobal):
        raise
    except Exception as exc:  # noqa: BLE001 - any malformed stream
        raise RefusedSize(f"a storage that is not a legacy torch.save stream ({type(exc).__name__})") from None
    if magic != LEGACY_MAGIC or protocol != LEGACY_PROTOCOL:
        raise RefusedSize("a storage that is not a legacy torch.save stream (magic number, protocol)")
    if not isinstance(keys, list) or len(keys) != len(scan.declared) or set(keys) != set(scan.declared):
        raise RefusedSize("a storage stream whose key list does not match its storages")
    for key in keys:
        dtype, numel = scan.declared[key]
        count = int.from_bytes(handle.read(8), "little", signed=True)
        carried = len(blob) - handle.tell()
        if count != numel or numel * dtype.itemsize > carried:
            raise RefusedSize(f"a {dtype} storage declaring {numel} elements ({count} in its header): "
                              f"its stream carries {carried} bytes")
        handle.seek(numel * dtype.itemsize, io.SEEK_CUR)


def _safe_load_from_bytes(blob: Any) -> Any:
    """``torch.storage._load_from_bytes`` with ``weights_only=True``, after
    `_check_storage_stream`: storages only, none larger than the bytes that carry it."""
    if not isinstance(blob, (bytes, bytearray)):
        raise pickle.UnpicklingError("_load_from_bytes expects bytes")
    _check_storage_stream(bytes(blob))
    return torch.load(io.BytesIO(blob), weights_only=True)


# ------------------------------------------------------------------------- tensors


def _check_tensor(storage: Any, offset: Any, size: Any, stride: Any, dtype: Any) -> None:
    """Raise RefusedSize unless a tensor of ``size``, ``stride`` and ``dtype`` (None: the
    storage's) at ``offset`` is within the bounds of the module doc."""
    if not isinstance(storage, torch.storage.TypedStorage):
        raise RefusedSize(f"a tensor over a {type(storage).__name__}, not a storage")
    dtype = storage.dtype if dtype is None else dtype
    if dtype not in TENSOR_DTYPES:
        raise RefusedSize(f"a {_shown(dtype)} tensor; the model takes float64/32/16, bfloat16, "
                          "int64/32/16/8, uint8 or bool")
    if not (isinstance(size, (tuple, list)) and isinstance(stride, (tuple, list))
            and len(size) == len(stride) <= MAX_TENSOR_DIMS
            and all(type(v) is int for v in (offset, *size, *stride)) and min(size, default=0) >= 0):
        raise RefusedSize(f"a tensor of shape {_shown(size)}, strides {_shown(stride)}, offset {_shown(offset)}")
    shape, numel = tuple(size), math.prod(size)
    if numel > MAX_TENSOR_ELEMENTS:
        raise RefusedSize(f"a tensor of shape {shape}: {numel} elements, over the bound of "
                          f"{MAX_TENSOR_ELEMENTS}")
    if any(s < 1 for n, s in zip(size, stride) if n > 1):
        raise RefusedSize(f"a tensor of shape {shape} with strides {tuple(stride)} (zero or negative)")
    stored = storage._untyped_storage.nbytes() // dtype.itemsize  # (no deprecation warning)
    reach = offset + sum((n - 1) * s for n, s in zip(size, stride)) + 1 if numel else offset
    if offset < 0 or offset + numel > stored or reach > stored:
        raise RefusedSize(f"a tensor of shape {shape} at offset {offset}: it reaches element "
                          f"{max(offset + numel, reach)}, its storage holds {stored}")


def _rebuild_v1(storage: Any, offset: Any, size: Any, stride: Any) -> torch.Tensor:
    _check_tensor(storage, offset, size, stride, None)
    return torch._utils._rebuild_tensor(storage, offset, tuple(size), tuple(stride))


def _rebuild_v2(storage: Any, offset: Any, size: Any, stride: Any, *_grad_hooks_metadata: Any) -> torch.Tensor:
    _check_tensor(storage, offset, size, stride, None)
    return torch._utils._rebuild_tensor(storage, offset, tuple(size), tuple(stride))


def _rebuild_v3(storage: Any, offset: Any, size: Any, stride: Any, *rest: Any) -> torch.Tensor:
    """``_rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks, dtype, ...)``."""
    dtype = rest[2] if len(rest) > 2 else None
    if not isinstance(dtype, torch.dtype):
        raise RefusedSize(f"a tensor without a dtype ({_shown(dtype)})")
    _check_tensor(storage, offset, size, stride, dtype)
    return torch._utils._rebuild_tensor_v3(storage, offset, tuple(size), tuple(stride), False,
                                           OrderedDict(), dtype)


# ------------------------------------------------------------------------- records


def _numpy_globals() -> dict[tuple[str, str], Any]:
    from numpy.lib import format as _np_format  # noqa: F401 - numpy's own modules are loaded

    allowed: dict[tuple[str, str], Any] = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype}
    core = getattr(np, "_core", None) or np.core
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(module, "_reconstruct")] = core.multiarray._reconstruct
        allowed[(module, "scalar")] = core.multiarray.scalar
    return allowed

_ALLOWED: dict[tuple[str, str], Any] = {
    ("torch_geometric.data.data", "Data"): PygRecord,
    ("torch_geometric.data.storage", "GlobalStorage"): PygStorage,
    ("torch_geometric.data.data", "DataEdgeAttr"): _Inert,
    ("torch_geometric.data.data", "DataTensorAttr"): _Inert,
    ("torch._utils", "_rebuild_tensor"): _rebuild_v1,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_v2,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_v3,
    ("torch.storage", "_load_from_bytes"): _safe_load_from_bytes,
    ("torch", "Size"): torch.Size,
    ("collections", "OrderedDict"): OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    **_numpy_globals(),
}


class RecordUnpickler(_Unpickler):
    """The allow-list unpickler of graph records (module doc)."""

    def find_class(self, module: str, name: str) -> Any:
        module, name = _mapped(module, name)
        found = _ALLOWED.get((module, name))
        if found is None and module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            found = getattr(torch, name)
        if found is None:
            raise RefusedGlobal(f"{module}.{name}")
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedGlobal(f"persistent id {_shown(pid)}")


def load_record(blob: bytes, where: Where | str) -> dict[str, Any]:
    """The attribute dict of one pickled graph record, unpickled without running its code and
    without allocating more than its sizes allow (module doc).

    Args:
        blob: the LMDB value (a pickled torch_geometric ``Data``, either layout).
        where: the record, ``FILE: key 'K'`` (a `mlhpc.errors.Where`, kept as the error's fields), put
            in front of every error.

    Returns:
        the record's attributes as stored (tensors, python numbers), not yet validated.

    Raises:
        DataError: ``WHERE: refused global MODULE.NAME`` for a global outside the allow-list,
            ``WHERE: refused ...`` for a storage or tensor outside the bounds (naming its
            shape, strides, dtype or declared size), or ``WHERE: not a graph record (...)`` for
            a corrupt pickle or another object.
    """
    try:
        obj = RecordUnpickler(io.BytesIO(blob)).load()
    except RefusedGlobal as exc:
        raise DataError.at(where, f"refused global {exc} (not a graph record; a pickle may only "
                        f"name torch_geometric Data, torch tensors, numpy arrays)") from None
    except RefusedSize as exc:
        raise DataError.at(where, f"refused {exc}") from None
    except Exception as exc:  # noqa: BLE001 - any corrupt stream: EOFError, UnpicklingError, ...
        raise DataError.at(where, f"not a graph record ({type(exc).__name__}: {why(exc)})") from None
    if isinstance(obj, PygRecord) and not isinstance(obj, PygStorage):
        return obj.fields()
    if isinstance(obj, dict):
        return dict(obj)
    raise DataError.at(where, f"not a graph record (a pickled {type(obj).__name__})")
