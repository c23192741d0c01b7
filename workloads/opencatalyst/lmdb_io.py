"""OC20 S2EF data in the OCP LMDB format, read safely without torch_geometric, and written.

Format (mlcommons/hpc ``open_catalyst``, from the OCP repository: ``scripts/preprocess_ef.py``
writes, ``ocpmodels/datasets/lmdb_dataset.py`` ``LmdbDataset`` reads):

- a split is a folder of ``*.lmdb`` files (``data.0000.lmdb`` ... one per preprocessing worker),
  each a single-file LMDB (``subdir=False``); the folder's records are the files' records
  concatenated in sorted file-name order (``sorted(path.glob("*.lmdb"))``);
- per file, keys ``f"{i}".encode("ascii")`` for ``i = 0 .. length-1``, each holding
  ``pickle.dumps(data_object, protocol=-1)`` of a torch_geometric ``Data``, and the key
  ``b"length"`` holding ``pickle.dumps(length)``; the reader takes ``length`` from that key (a
  lone-file dataset without it takes ``env.stat()["entries"]``, as ``LmdbDataset`` does);
- the writer opens ``map_size=2 TiB, subdir=False, meminit=False, map_async=True``; the reader
  ``subdir=False, readonly=True, lock=False, readahead=False, meminit=False, max_readers=1``.

A record (``AtomsToGraphs.convert`` with ``r_energy, r_forces, r_fixed``, plus ``tags, sid,
fid`` from ``preprocess_ef.py``), N atoms, E edges, as the reference stores them:

    pos              float32 (N, 3)  Angstrom
    cell             float32 (1, 3, 3)  Angstrom, rows are the lattice vectors
    atomic_numbers   float32 (N,)    (``torch.Tensor(atoms.get_atomic_numbers())``)
    natoms           int
    tags             int64 (N,)      0 subsurface slab, 1 surface, 2 adsorbate (OC20)
    fixed            float32 (N,)    1 fixed (ASE FixAtoms), 0 free
    force            float32 (N, 3)  eV/Angstrom
    y                float           eV (``--ref-energy``: minus the reference energy)
    sid, fid         int             system and frame ids
    edge_index       int64 (2, E)    with ``--get-edges``: row 0 neighbour j, row 1 centre i,
    cell_offsets     int64 (E, 3)    radius 6 A, at most 50 neighbours; j's image offset in cells
    distances        float32 (E,)    (optional, ``r_distances``)

Pickles made with torch_geometric < 2.0 keep the attributes in the ``Data`` object's
``__dict__``; torch_geometric >= 2.0 keeps them in ``_store`` (a ``GlobalStorage`` whose
``_mapping`` is the attribute dict). Tensors are pickled by torch's reduce:
``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks)`` with
the storage as ``torch.storage._load_from_bytes(<legacy torch.save bytes>)``.

Reading never runs the pickle's code: `load_record` unpickles through a restricted unpickler
that admits only the globals above (the PyG classes mapped to an inert stand-in, torch's tensor
rebuild functions, ``_load_from_bytes`` replaced by ``torch.load(..., weights_only=True)``,
torch dtypes and ``torch.Size``, numpy's array/scalar reconstruction, ``OrderedDict``, ``set``,
``frozenset``) and refuses any other with a DataError naming the file, key and global.
"""

from __future__ import annotations

import _compat_pickle
import copyreg
import io
import os
import pickle
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import torch

from mlhpc.data.files import part_path
from mlhpc.errors import DataError
from mlhpc.text import clip, one_line

from .lmdb_verify import verify_pages

LENGTH_KEY = b"length"
#: Keys a training record must hold (reference names).
REQUIRED_KEYS = ("pos", "cell", "atomic_numbers", "natoms", "tags", "fixed", "force", "y")
MAP_SIZE_BYTES = 1099511627776 * 2  # preprocess_ef.py: 2 TiB of address space, not of disk
MAX_ATOMIC_NUMBER = 118
_INT32_MAX = 2**31 - 1
LAYOUTS = ("pyg2", "pyg1")


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


# ------------------------------------------------------------------------------ LMDB files


_ENVS: dict[str, tuple[tuple[int, ...], lmdb.Environment]] = {}
_ENVS_PID = os.getpid()


def _drop_inherited() -> None:
    """In a forked child, close the environments inherited from the parent (the child's copies
    of the memory maps and descriptors only) so that each process opens its own."""
    global _ENVS_PID
    if _ENVS_PID != os.getpid():
        for _, env in _ENVS.values():
            env.close()
        _ENVS.clear()
        _ENVS_PID = os.getpid()


def _open_checked(path: Path, size: int) -> lmdb.Environment:
    verify_pages(path)  # liblmdb trusts on-disk pointers: one bad byte would be SIGBUS, not an error
    try:
        env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, readahead=False,
                        meminit=False, max_readers=1)
    except lmdb.Error as exc:
        raise DataError(f"{path}: not a readable LMDB file ({_why(exc)})") from None
    need = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    if size < need:
        env.close()
        raise DataError(f"{path}: truncated LMDB file ({size} bytes, its pages need {need})")
    return env


def open_lmdb(path: Path) -> lmdb.Environment:
    """The read-only environment of one ``*.lmdb`` file, opened with the reference reader's
    flags after checking the file holds every page its newest meta page names (a truncated
    LMDB would otherwise crash the process with SIGBUS when a missing page is touched through
    the memory map).

    One environment per file and process is kept and shared (py-lmdb refuses to open a file
    twice in a process); it is reopened (and checked again) when the file's inode, size or
    modification time changed, and a forked child never uses its parent's. Do not close it;
    `close_all` does.

    Raises:
        DataError: the file cannot be read, is not an LMDB file, or is truncated (names it).
    """
    path = Path(path)
    _drop_inherited()
    try:
        st = path.stat()
    except OSError as exc:
        raise DataError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    key = os.path.realpath(path)
    cached = _ENVS.pop(key, None)
    if cached is not None:
        if cached[0] == ident:
            _ENVS[key] = cached
            return cached[1]
        cached[1].close()
    env = _open_checked(path, st.st_size)
    _ENVS[key] = (ident, env)
    return env


def close_all() -> None:
    """Close every environment this process opened through `open_lmdb`."""
    _drop_inherited()
    for _, env in _ENVS.values():
        env.close()
    _ENVS.clear()


def record_count(env: lmdb.Environment, path: Path) -> int:
    """Records in an open file: its ``length`` key (``preprocess_ef.py``), else its entry count.

    Raises:
        DataError: ``length`` is not a pickled non-negative int, or exceeds the entries.
    """
    entries = env.stat()["entries"]
    try:
        with env.begin() as txn:
            raw = txn.get(LENGTH_KEY)
    except lmdb.Error as exc:
        raise DataError(f"{path}: key 'length': corrupt LMDB ({_why(exc)})") from None
    if raw is None:
        return entries
    try:
        length = _RecordUnpickler(io.BytesIO(raw)).load()
    except Exception as exc:  # noqa: BLE001 - a corrupt value raises any kind
        raise DataError(f"{path}: key 'length': not a pickled count ({type(exc).__name__}: {_why(exc)})") from None
    if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length < entries:
        raise DataError(f"{path}: key 'length' is {length!r}, the file holds {entries} entries")
    return length


def read_blob(env: lmdb.Environment, path: Path, index: int) -> bytes:
    """The raw value of record ``index``. Raises DataError naming the file and key (missing key,
    corrupt page)."""
    key = f"{index}".encode("ascii")
    try:
        with env.begin(buffers=False) as txn:
            blob = txn.get(key)
    except lmdb.Error as exc:
        raise DataError(f"{path}: key '{index}': corrupt LMDB ({_why(exc)})") from None
    if blob is None:
        raise DataError(f"{path}: key '{index}' missing (the file's length says it holds it)")
    return blob


def list_lmdb_files(folder: Path) -> list[Path]:
    """The ``*.lmdb`` files of a split folder in the reference's (sorted) order.

    A symbolic link is followed only when it stays inside ``folder``.

    Raises:
        DataError: the folder is missing, holds no ``*.lmdb`` file, or a link leads outside it.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"{folder}: dataset folder not found (expected *.lmdb files)")
    root = folder.resolve()
    files = sorted(p for p in folder.glob("*.lmdb") if not p.name.startswith("."))
    for path in files:
        if path.is_symlink() and root not in path.resolve().parents:
            raise DataError(f"{path}: symbolic link leads outside {folder}; copy the file instead")
    files = [p for p in files if p.is_file()]
    if not files:
        raise DataError(f"{folder}: no *.lmdb files in the dataset folder")
    return files


@dataclass(frozen=True)
class LmdbCheck:
    """What `check_file` found: ``records`` in the file, the first record's ``pos`` shape
    ``(N, 3)`` (``()`` for an empty file), and the file's size in ``bytes``."""

    records: int
    pos_shape: tuple[int, ...]
    bytes: int


def check_file(path: Path, full: bool) -> LmdbCheck:
    """Verify one ``*.lmdb`` file.

    Quick (``full`` False): the file opens as an LMDB, is not truncated (every page its newest
    meta page names is in the file), its ``length`` key (or entry count) is read and agrees with
    the entries, and record 0 is unpickled through the restricted unpickler and validated
    (`validate_record`). Full: every record ``0 .. length-1`` is decoded and validated the same
    way, so no value in the file is left unread.

    Returns:
        LmdbCheck: records, the first record's ``pos`` shape (N, 3), file bytes.

    Raises:
        DataError: naming the file, and the key for a bad record.
    """
    path = Path(path)
    env = open_lmdb(path)
    count = record_count(env, path)
    shape: tuple[int, ...] = ()
    for index in range(count if full else min(count, 1)):
        record = decode_record(read_blob(env, path, index), f"{path}: key '{index}'")
        shape = shape or tuple(record["pos"].shape)
    return LmdbCheck(count, shape, path.stat().st_size)


# ---------------------------------------------------------------------------------- writing


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


def write_lmdb(path: Path, records: Iterable[dict[str, Any]], layout: str = "pyg2") -> int:
    """Write one ``*.lmdb`` file as ``preprocess_ef.py`` does (keys ``"0"``, ``"1"`` ... and
    ``length``), atomically: into `mlhpc.data.files.part_path` beside ``path``, renamed when
    complete.

    Written with ``subdir=False, lock=False`` (one writer, no ``-lock`` file) and
    ``meminit=True`` so the same records give the same bytes.

    Returns:
        the number of records written.

    Raises:
        OSError: the file cannot be written. ValueError: a record with an unknown key.
    """
    path = Path(path)
    tmp = part_path(path)  # the project's one temporary-name rule
    count = 0
    try:
        env = lmdb.open(str(tmp), map_size=MAP_SIZE_BYTES, subdir=False, lock=False,
                        meminit=True, sync=False)
        try:
            with env.begin(write=True) as txn:
                for count, record in enumerate(records, start=1):
                    txn.put(f"{count - 1}".encode("ascii"), encode_record(record, layout))
                txn.put(LENGTH_KEY, pickle.dumps(count, protocol=4))
            env.sync(True)
        finally:
            env.close()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return count


# ----------------------------------------------------------------------------------- reading


class LmdbFolder:
    """The records of a folder of ``*.lmdb`` files, concatenated in sorted name order as
    ``LmdbDataset`` does. Record counts are read once, in the constructor; environments come
    from `open_lmdb` (one per file and process, so DataLoader workers each open their own).

    ``folder[i]`` -> `validate_record`'s dict. Raises DataError naming the file and key.
    """

    def __init__(self, folder: Path) -> None:
        self.files = list_lmdb_files(folder)
        self.counts = [record_count(open_lmdb(path), path) for path in self.files]
        self.offsets = np.cumsum([0] + self.counts).tolist()

    def __len__(self) -> int:
        return self.offsets[-1]

    def position(self, index: int) -> tuple[int, int]:
        """(file number, record within the file) of record ``index``. Raises IndexError."""
        if not 0 <= index < len(self):
            raise IndexError(f"record {index} of {len(self)}")
        file_no = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return file_no, index - self.offsets[file_no]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        file_no, local = self.position(index)
        path = self.files[file_no]
        return decode_record(read_blob(open_lmdb(path), path, local), f"{path}: key '{local}'")

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return (self[i] for i in range(len(self)))
