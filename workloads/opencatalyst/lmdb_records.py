"""OC20 LMDB records read without running their pickles, and checked (`lmdb_io` describes the
format and reads the files): `load_record` unpickles through a restricted unpickler, and
`validate_record` checks every field a training record must hold, its dtype, shape and range;
`decode_record` is both.
"""

from __future__ import annotations

import _compat_pickle
import io
import pickle
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from mlhpc.errors import DataError
from mlhpc.text import clip, one_line

#: Keys a training record must hold (reference names).
REQUIRED_KEYS = ("pos", "cell", "atomic_numbers", "natoms", "tags", "fixed", "force", "y")
MAX_ATOMIC_NUMBER = 118
_INT32_MAX = 2**31 - 1


# ------------------------------------------------------------------------- restricted reading


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


def _why(exc: BaseException) -> str:
    """An exception's text for a one-line message: first line only, at most 200 characters."""
    return clip(one_line(str(exc).splitlines()[0] if str(exc) else type(exc).__name__), 200)


def _safe_load_from_bytes(blob: Any) -> Any:
    """``torch.storage._load_from_bytes`` with ``weights_only=True``: storages and tensors only."""
    if not isinstance(blob, (bytes, bytearray)):
        raise pickle.UnpicklingError("_load_from_bytes expects bytes")
    return torch.load(io.BytesIO(blob), weights_only=True)


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
    ("torch._utils", "_rebuild_tensor"): torch._utils._rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor_v3"): getattr(torch._utils, "_rebuild_tensor_v3", None),
    ("torch.storage", "_load_from_bytes"): _safe_load_from_bytes,
    ("torch", "Size"): torch.Size,
    ("collections", "OrderedDict"): OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    **_numpy_globals(),
}


class RefusedGlobal(pickle.UnpicklingError):
    """A pickle named a global outside the graph-record allow-list."""


class _RecordUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        # Python 2 names (protocol 2 writes __builtin__.set), mapped as pickle's own find_class does
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        found = _ALLOWED.get((module, name))
        if found is None and module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            found = getattr(torch, name)
        if found is None:
            raise RefusedGlobal(f"{module}.{name}")
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedGlobal(f"persistent id {str(pid)[:40]!r}")


def load_record(blob: bytes, where: str) -> dict[str, Any]:
    """The attribute dict of one pickled graph record, unpickled without running its code.

    Args:
        blob: the LMDB value (a pickled torch_geometric ``Data``, either layout).
        where: ``"FILE: key 'K'"``, put in front of every error.

    Returns:
        the record's attributes as stored (tensors, python numbers), not yet validated.

    Raises:
        DataError: ``WHERE: refused global MODULE.NAME`` for a global outside the allow-list, or
            ``WHERE: not a graph record (...)`` for a corrupt pickle or another object.
    """
    try:
        obj = _RecordUnpickler(io.BytesIO(blob)).load()
    except RefusedGlobal as exc:
        raise DataError(f"{where}: refused global {exc} (not a graph record; a pickle may only "
                        f"name torch_geometric Data, torch tensors, numpy arrays)") from None
    except Exception as exc:  # noqa: BLE001 - any corrupt stream: EOFError, UnpicklingError, ...
        raise DataError(f"{where}: not a graph record ({type(exc).__name__}: {_why(exc)})") from None
    if isinstance(obj, PygRecord) and not isinstance(obj, PygStorage):
        return obj.fields()
    if isinstance(obj, dict):
        return dict(obj)
    raise DataError(f"{where}: not a graph record (a pickled {type(obj).__name__})")


# ------------------------------------------------------------------------------- validation


#: Tensor dtypes a record may hold (float8 and other exotic types cannot be read back).
_TENSOR_DTYPES = frozenset({torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
                            torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool})
#: The smallest cell volume accepted (cubic angstroms): a near-zero cell would multiply the
#: periodic images a radius graph enumerates (OC20's slabs span hundreds of cubic angstroms).
MIN_CELL_VOLUME_A3 = 1.0


def _array(fields: dict[str, Any], key: str, where: str) -> np.ndarray:
    """``fields[key]`` as a numeric numpy array. Raises DataError (missing, non-numeric)."""
    if key not in fields:
        raise DataError(f"{where}: missing {key!r} (a training record holds {', '.join(REQUIRED_KEYS)})")
    value = fields[key]
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_quantized or value.is_complex() \
                or value.dtype not in _TENSOR_DTYPES:
            raise DataError(f"{where}: {key} is a {value.layout} {value.dtype} tensor, expected a dense real "
                            "one of float64/32/16, bfloat16, int64/32/16/8, uint8 or bool")
        value = value.detach().cpu()
        value = value.float().numpy() if value.dtype in (torch.bfloat16, torch.float16) else value.numpy()
    elif isinstance(value, (int, float, bool, np.number, np.ndarray, list, tuple)):
        try:
            value = np.asarray(value)
        except (ValueError, TypeError):
            raise DataError(f"{where}: {key} is a ragged or non-numeric sequence") from None
    else:
        raise DataError(f"{where}: {key} is a {type(value).__name__}, expected a tensor or number")
    if value.dtype.kind not in "biuf":
        raise DataError(f"{where}: {key} has dtype {value.dtype}, expected a numeric tensor")
    return value


def _shaped(fields: dict[str, Any], key: str, shape: tuple[int, ...], where: str) -> np.ndarray:
    value = _array(fields, key, where)
    if value.shape != shape:
        raise DataError(f"{where}: {key} has shape {tuple(value.shape)}, expected {shape}")
    return value


def _finite(value: np.ndarray, key: str, where: str) -> np.ndarray:
    if value.dtype.kind == "f" and not np.isfinite(value).all():
        raise DataError(f"{where}: {key} holds NaN or infinite values")
    return value


def _integral(value: np.ndarray, key: str, where: str, allowed: tuple[int, int]) -> np.ndarray:
    """``value`` as int64 after checking every entry is a whole number within ``allowed``."""
    if value.dtype.kind == "f" and not (np.isfinite(value).all() and (value == np.round(value)).all()):
        raise DataError(f"{where}: {key} holds non-integer values")
    out = value.astype(np.int64)
    if out.size and (out.min() < allowed[0] or out.max() > allowed[1]):
        bad = out[(out < allowed[0]) | (out > allowed[1])][0]
        raise DataError(f"{where}: {key} holds {int(bad)}, expected {allowed[0]} .. {allowed[1]}")
    return out


def _atoms(fields: dict[str, Any], where: str) -> dict[str, torch.Tensor]:
    pos = _finite(_array(fields, "pos", where), "pos", where)
    if pos.ndim != 2 or pos.shape[1] != 3 or pos.shape[0] < 1 or pos.dtype.kind != "f":
        raise DataError(f"{where}: pos has shape {tuple(pos.shape)} dtype {pos.dtype}, expected float (N, 3)")
    n = pos.shape[0]
    natoms = _array(fields, "natoms", where)
    if natoms.size != 1 or int(natoms.reshape(-1)[0]) != n:
        raise DataError(f"{where}: natoms is {natoms.reshape(-1)[:3].tolist()}, pos holds {n} atoms")
    cell = _finite(_array(fields, "cell", where), "cell", where)
    if cell.shape not in ((1, 3, 3), (3, 3)):
        raise DataError(f"{where}: cell has shape {tuple(cell.shape)}, expected (1, 3, 3)")
    volume = abs(float(np.linalg.det(cell.reshape(3, 3).astype(np.float64))))
    if not volume >= MIN_CELL_VOLUME_A3:
        raise DataError(f"{where}: cell volume {volume:.3g} A^3, under the {MIN_CELL_VOLUME_A3} A^3 of any "
                        "real structure (a zero or degenerate cell)")
    numbers = _shaped(fields, "atomic_numbers", (n,), where)
    return {
        "atomic_numbers": torch.from_numpy(_integral(numbers, "atomic_numbers", where, (1, MAX_ATOMIC_NUMBER))),
        "pos": torch.from_numpy(pos.astype(np.float32)),
        "cell": torch.from_numpy(cell.astype(np.float32).reshape(1, 3, 3)),
        "natoms": torch.tensor(n, dtype=torch.int64),
        "tags": torch.from_numpy(_integral(_shaped(fields, "tags", (n,), where), "tags", where, (0, _INT32_MAX))),
        "fixed": torch.from_numpy(_integral(_shaped(fields, "fixed", (n,), where), "fixed", where, (0, 1)) == 1),
    }


def _labels(fields: dict[str, Any], n: int, where: str) -> dict[str, torch.Tensor]:
    force = _finite(_shaped(fields, "force", (n, 3), where), "force", where)
    energy = _finite(_array(fields, "y", where), "y", where)
    if energy.size != 1:
        raise DataError(f"{where}: y has shape {tuple(energy.shape)}, expected one energy")
    return {"forces": torch.from_numpy(force.astype(np.float32)),
            "energy": torch.tensor(float(energy.reshape(-1)[0]), dtype=torch.float32)}


def _edges(fields: dict[str, Any], n: int, where: str) -> dict[str, torch.Tensor]:
    has = [k for k in ("edge_index", "cell_offsets") if k in fields]
    if not has:
        return {}
    if len(has) == 1:
        other = "cell_offsets" if has[0] == "edge_index" else "edge_index"
        raise DataError(f"{where}: {has[0]} stored without {other}")
    index = _array(fields, "edge_index", where)
    if index.ndim != 2 or index.shape[0] != 2:
        raise DataError(f"{where}: edge_index has shape {tuple(index.shape)}, expected (2, E)")
    offsets = _shaped(fields, "cell_offsets", (index.shape[1], 3), where)
    return {"edge_index": torch.from_numpy(_integral(index, "edge_index", where, (0, n - 1))),
            "cell_offsets": torch.from_numpy(_integral(offsets, "cell_offsets", where, (-_INT32_MAX, _INT32_MAX)))}


def validate_record(fields: dict[str, Any], where: str) -> dict[str, torch.Tensor]:
    """One record's attributes checked and converted to the tensors the model reads.

    Returns (N atoms, E stored edges):
        ``atomic_numbers`` int64 (N,), ``pos`` float32 (N, 3) Angstrom, ``cell`` float32
        (1, 3, 3) Angstrom, ``natoms`` int64 (), ``tags`` int64 (N,), ``fixed`` bool (N,),
        ``forces`` float32 (N, 3) eV/Angstrom, ``energy`` float32 () eV, and when stored
        ``edge_index`` int64 (2, E) (row 0 neighbour, row 1 centre) and ``cell_offsets`` int64
        (E, 3).

    Raises:
        DataError: ``WHERE: ...`` for a missing key of `REQUIRED_KEYS`, a shape other than the
            above (``cell`` (3, 3) is accepted), natoms != N, NaN or inf in pos, cell, force or
            y, an atomic number outside 1..118, negative tags (OC20's are 0, 1, 2; other
            non-negative tags, such as ASE's layer numbers, are kept), fixed outside {0, 1}, or
            edges pointing outside the structure.
    """
    out = _atoms(fields, where)
    n = int(out["natoms"])
    out.update(_labels(fields, n, where))
    out.update(_edges(fields, n, where))
    return out


def decode_record(blob: bytes, where: str) -> dict[str, torch.Tensor]:
    """`load_record` then `validate_record`. Raises DataError naming ``where``."""
    return validate_record(load_record(blob, where), where)
