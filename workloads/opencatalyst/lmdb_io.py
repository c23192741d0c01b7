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

Records are read through `unpickle.load_record` (a restricted unpickler that runs no code and
bounds every size a record declares before anything is allocated) and checked by
`records.validate_record`; both are re-exported here.
"""

from __future__ import annotations

import errno
import io
import os
import pickle
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import torch

from mlhpc.data.claims import remove_own_part
from mlhpc.data.files import disk_full, part_path
from mlhpc.errors import DataError, Where

from .encode import LAYOUTS, encode_record
from .lmdb_verify import MAX_FILE_BYTES, verify_pages
from .records import REQUIRED_KEYS, convert_checked, decode_record, validate_record
from .unpickle import RecordUnpickler, load_record, why

__all__ = ["LAYOUTS", "LENGTH_KEY", "REQUIRED_KEYS", "LmdbCheck", "LmdbFolder", "check_file", "close_all",
           "decode_record", "encode_record", "list_lmdb_files", "load_record", "open_lmdb", "read_blob",
           "record_count", "validate_record", "write_lmdb"]

LENGTH_KEY = b"length"
#: The writer's first map size; it doubles when full, up to `lmdb_verify.MAX_FILE_BYTES` (the
#: largest file the reader opens). preprocess_ef.py maps a fixed 2 TiB instead.
FIRST_MAP_BYTES = 1 << 24
#: Records the writer puts in one transaction (replayed into a larger map when it fills).
RECORDS_PER_TXN = 1024


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
        raise DataError(f"not a readable LMDB file ({why(exc)})", path=path) from None
    need = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    if size < need:
        env.close()
        raise DataError(f"truncated LMDB file ({size} bytes, its pages need {need})", path=path)
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
        raise DataError(f"cannot be read ({exc.strerror or exc})", path=path) from None
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
        raise DataError(f"corrupt LMDB ({why(exc)})", path=path, key="length") from None
    if raw is None:
        return entries
    try:
        length = RecordUnpickler(io.BytesIO(raw)).load()
    except Exception as exc:  # noqa: BLE001 - a corrupt value raises any kind
        raise DataError(f"not a pickled count ({type(exc).__name__}: {why(exc)})", path=path,
                        key="length") from None
    if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length < entries:
        shown = length if type(length) is int else f"a pickled {type(length).__name__}"  # never its repr:
        raise DataError(f"key 'length' is {shown}, the file holds {entries} entries", path=path)  # deep or huge
    return length


def read_blob(env: lmdb.Environment, path: Path, index: int) -> bytes:
    """The raw value of record ``index``. Raises DataError naming the file and key (missing key,
    corrupt page)."""
    key = f"{index}".encode("ascii")
    try:
        with env.begin(buffers=False) as txn:
            blob = txn.get(key)
    except lmdb.Error as exc:
        raise DataError(f"corrupt LMDB ({why(exc)})", path=path, key=index) from None
    if blob is None:
        raise DataError(f"key '{index}' missing (the file's length says it holds it)", path=path)
    return blob


def list_lmdb_files(folder: Path) -> list[Path]:
    """The ``*.lmdb`` files of a split folder in the reference's (sorted) order.

    A symbolic link is followed only when it stays inside ``folder``.

    Raises:
        DataError: the folder is missing, holds no ``*.lmdb`` file, or a link leads outside it.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError("dataset folder not found (expected *.lmdb files)", path=folder)
    root = folder.resolve()
    files = sorted(p for p in folder.glob("*.lmdb") if not p.name.startswith("."))
    for path in files:
        if path.is_symlink() and root not in path.resolve().parents:
            raise DataError(f"symbolic link leads outside {folder}; copy the file instead", path=path)
    files = [p for p in files if p.is_file()]
    if not files:
        raise DataError("no *.lmdb files in the dataset folder", path=folder)
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
        record = decode_record(read_blob(env, path, index), Where(path, key=index))
        shape = shape or tuple(record["pos"].shape)
    return LmdbCheck(count, shape, path.stat().st_size)


# ---------------------------------------------------------------------------------- writing


def _batches(records: Iterable[dict[str, Any]], layout: str) -> Iterator[list[tuple[bytes, bytes]]]:
    """``(key, pickled record)`` lists of at most `RECORDS_PER_TXN`, keys ``"0"``, ``"1"`` ...,
    the last list ending with the ``length`` key."""
    batch: list[tuple[bytes, bytes]] = []
    count = 0
    for count, record in enumerate(records, start=1):
        batch.append((f"{count - 1}".encode("ascii"), encode_record(record, layout)))
        if len(batch) == RECORDS_PER_TXN:
            yield batch
            batch = []
    yield batch + [(LENGTH_KEY, pickle.dumps(count, protocol=4))]


def _put_all(env: lmdb.Environment, items: list[tuple[bytes, bytes]], path: Path) -> None:
    """Put ``items`` in one transaction, doubling the map and replaying them while it is full.
    Raises DataError beyond `MAX_FILE_BYTES`."""
    while True:
        try:
            with env.begin(write=True) as txn:
                for key, value in items:
                    txn.put(key, value)
            return
        except lmdb.MapFullError:
            size = 2 * env.info()["map_size"]
            if size > MAX_FILE_BYTES:
                raise DataError(f"the records need an LMDB file over {MAX_FILE_BYTES} bytes, "
                                "the largest the reader opens; write fewer records per file", path=path) from None
            env.set_mapsize(size)


def write_lmdb(path: Path, records: Iterable[dict[str, Any]], layout: str = "pyg2") -> int:
    """Write one ``*.lmdb`` file as ``preprocess_ef.py`` does (keys ``"0"``, ``"1"`` ... and
    ``length``), atomically: into `mlhpc.data.files.part_path` beside ``path``, renamed when
    complete.

    Written with ``subdir=False, lock=False`` (one writer, no ``-lock`` file) and
    ``meminit=True`` so the same records give the same bytes, `RECORDS_PER_TXN` records a
    transaction; the map starts at `FIRST_MAP_BYTES` and doubles when a transaction fills it
    (the transaction is replayed), up to `lmdb_verify.MAX_FILE_BYTES`, so the address space
    reserved follows the data (the reference reserves a fixed 2 TiB, which a limit on virtual
    memory refuses).

    Returns:
        the number of records written.

    Raises:
        OSError: the file cannot be written (a full disk: ``errno.ENOSPC``). DataError: the
        records need a file over `lmdb_verify.MAX_FILE_BYTES`. ValueError: a record with an
        unknown key.
    """
    path = Path(path)
    tmp = part_path(path)  # the project's temporary name, renamed into place when complete
    count = 0
    try:
        env = _open_for_writing(tmp, path)
        try:
            for batch in _batches(records, layout):
                _put_all(env, batch, path)
                count += sum(1 for key, _ in batch if key != LENGTH_KEY)
            env.sync(True)
        except lmdb.Error as exc:
            raise _os_error(exc, path) from None
        finally:
            env.close()
        os.replace(tmp, path)
    finally:
        remove_own_part(tmp)
    return count


def _open_for_writing(tmp: Path, path: Path) -> lmdb.Environment:
    try:
        return lmdb.open(str(tmp), map_size=FIRST_MAP_BYTES, subdir=False, lock=False,
                         meminit=True, sync=False)
    except lmdb.Error as exc:
        raise _os_error(exc, path) from None


def _os_error(exc: lmdb.Error, path: Path) -> OSError:
    """liblmdb's failure to write ``path`` as the OSError it stands for (its text ends with the
    system's ``strerror``; a short write, which is how a full disk often shows, is ``EIO`` to
    liblmdb and ``ENOSPC`` here when the file system is full, `mlhpc.data.files.disk_full`)."""
    reason = str(exc).rsplit(": ", 1)[-1].strip()
    code = next((num for num in errno.errorcode if os.strerror(num) == reason), errno.EIO)
    if code == errno.EIO and disk_full(path.parent):
        code = errno.ENOSPC
    return OSError(code, os.strerror(code), str(path))


# ----------------------------------------------------------------------------------- reading


class LmdbFolder:
    """The records of a folder of ``*.lmdb`` files, concatenated in sorted name order as
    ``LmdbDataset`` does. Record counts are read once, in the constructor; environments come
    from `open_lmdb` (one per file and process, so DataLoader workers each open their own).

    ``folder[i]`` -> `validate_record`'s dict. Every read goes through the restricted unpickler
    (`load_record`, every declared size bounded); the values are checked (`validate_record`)
    the first time a record is read from an environment, and a record read again from the same
    environment is converted without repeating them (`records.convert_checked`). A changed file
    (`open_lmdb` reopens it) and a forked process (its own environments) check afresh.
    Raises DataError naming the file and key.
    """

    def __init__(self, folder: Path) -> None:
        self.files = list_lmdb_files(folder)
        self.counts = [record_count(open_lmdb(path), path) for path in self.files]
        self.offsets = np.cumsum([0] + self.counts).tolist()
        #: per file: the environment its records were checked from, and which records
        self._checked: dict[int, tuple[lmdb.Environment, set[int]]] = {}

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
        env = open_lmdb(path)
        where = Where(path, key=local)
        fields = load_record(read_blob(env, path, local), where)
        checked_env, checked = self._checked.get(file_no, (None, set()))
        if checked_env is not env:
            checked = set()
            self._checked[file_no] = (env, checked)
        if local in checked:
            return convert_checked(fields)
        record = validate_record(fields, where)
        checked.add(local)
        return record

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return (self[i] for i in range(len(self)))
