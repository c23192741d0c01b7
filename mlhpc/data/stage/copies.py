"""Staged copies on this node: find them, size them, remove them.

A staged copy is a folder that staging claimed: its claim record (`mlhpc.data.claims`, kind
`mlhpc.data.stage.dest.COPY_KIND`) names this user and this folder. `find_copies` looks at each
folder given and at its immediate subfolders (the default folder is ``$TMPDIR``, else ``/tmp``,
where `mlhpc.data.stage.plan.default_dest` puts copies) and keeps only those whose claim holds; a
link is never followed, neither to a copy nor inside one. `remove_copy` removes one through the
remover in mlhpc/data/claims.py (`remove_claimed`): only the files staging recorded
writing, and only when nothing else is there (a copy holding a run's results or a user's file is
refused, whole, with one line).

`release` is the end of a run: the copy a run made (it copied at least one file) is removed unless
``data.staging.keep`` is true; a copy that was already complete before the run (kept by an
earlier run or made by ``mlhpc stage``) is left as it was. A copy is never removed while another
run reads it: a run holds a shared ``flock`` on the copy's ``READERS_NAME`` file (`hold`) from the
end of its staging to its end, and removal takes that lock exclusively, waiting for the readers;
the kernel releases a reader's lock when its process ends, however it ends (no process id is
read, so a reader in another PID namespace is no different).
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from mlhpc.data.claims import RemovalRefused, is_state_file, read_claim, remove_claimed
from mlhpc.data.inputs import read_text_input
from mlhpc.data.manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES
from mlhpc.data.stage.dest import COPY_KIND, recorded_files
from mlhpc.data.statefiles import open_state_file
from mlhpc.errors import DataError, StagingError


#: The file at a copy's top whose shared ``flock`` each run reading the copy holds (one of
#: mlhpc's own state files: never staged, never pruned).
READERS_NAME = ".mlhpc-readers"
_held: dict[str, int] = {}  # dest -> this process's descriptor holding the shared lock
#: How long a run's end waits for the other readers of the copy it made (its own node's ranks).
RELEASE_WAIT_S = 10.0


@dataclass(frozen=True)
class StagedCopy:
    """One staged copy: its folder, total bytes of its regular files (links not followed, not
    counted), file count, and the source its manifest names (None without a manifest)."""

    path: Path
    size_bytes: int
    files: int
    source: Optional[str]

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "size_bytes": self.size_bytes, "files": self.files, "source": self.source}


def default_root() -> Path:
    """Where copies go when ``data.staging.dest`` is not set: ``$TMPDIR``, else ``/tmp``."""
    return Path(os.environ.get("TMPDIR") or "/tmp")


def is_own_copy(path: Path) -> bool:
    """Whether ``path`` is a real folder of this user's that staging claimed (its claim record
    valid for this user and this folder, `mlhpc.data.claims.read_claim`)."""
    return read_claim(Path(path), COPY_KIND) is not None


def tree_size(path: Path) -> tuple[int, int]:
    """``(bytes, files)`` of the regular files under ``path`` (staging's own records at its top
    not counted); links are neither followed nor counted."""
    total = count = 0
    for root, _dirs, names in os.walk(path, followlinks=False):
        for name in names:
            if root == str(path) and is_state_file(name):
                continue  # the claim, manifest, journals, locks: staging's own records
            try:
                info = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                total, count = total + info.st_size, count + 1
    return total, count


def _source(path: Path) -> Optional[str]:
    manifest = path / MANIFEST_NAME
    try:  # read_text_input: no link, no FIFO, size capped
        doc = json.loads(read_text_input(manifest, MAX_MANIFEST_BYTES, path, "manifest"))
    except (DataError, ValueError, RecursionError):
        return None
    return doc.get("source") if isinstance(doc, dict) and isinstance(doc.get("source"), str) else None


def describe(path: Path) -> StagedCopy:
    """The `StagedCopy` of ``path`` (size measured now)."""
    size, files = tree_size(path)
    return StagedCopy(Path(path), size, files, _source(Path(path)))


def find_copies(roots: Optional[list[Path]] = None) -> list[StagedCopy]:
    """This user's staged copies in ``roots`` (default: `default_root`) and their immediate
    subfolders, sorted by path. A root that cannot be listed yields nothing."""
    found: dict[str, StagedCopy] = {}
    for root in roots or [default_root()]:
        candidates = [Path(root)]
        try:
            with os.scandir(root) as entries:
                candidates += [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
        except OSError:
            pass
        for path in candidates:
            if str(path) not in found and is_own_copy(path):
                found[str(path)] = describe(path)
    return [found[k] for k in sorted(found)]


def _open_readers(dest: Path) -> int:
    """``dest``'s `READERS_NAME` file (`mlhpc.data.statefiles.open_state_file`: created ``0600``,
    never through a link, a FIFO refused rather than waited on).

    Raises:
        StagingError: it is not a regular file (naming it).
        OSError: it cannot be opened or created.
    """
    return open_state_file(Path(dest) / READERS_NAME, os.O_RDONLY, "readers' lock of the staged copy",
                           StagingError)


def hold(dest: Path) -> None:
    """Hold a shared ``flock`` on ``dest``'s `READERS_NAME` file until `unhold` or the end of
    this process (the file created ``0600`` without following a link). A copy that cannot take
    the lock is left unmarked (staging has already checked the folder).

    Raises:
        StagingError: the readers' lock is not a regular file (a FIFO there is never waited on).
    """
    if str(dest) in _held:
        return
    try:
        fd = _open_readers(dest)
    except OSError:
        return
    fcntl.flock(fd, fcntl.LOCK_SH)
    _held[str(dest)] = fd


def unhold(dest: Path) -> None:
    """Release this process's shared lock on ``dest`` (`hold`), if it holds one."""
    fd = _held.pop(str(dest), None)
    if fd is not None:
        os.close(fd)


@contextmanager
def _exclusive(path: Path, wait_s: float) -> Iterator[bool]:
    """Yields whether no other process reads ``path`` (its readers' lock taken exclusively,
    waiting up to ``wait_s`` seconds for the readers to let go); the lock is held for the block."""
    try:
        fd = _open_readers(path)
    except OSError:
        yield True  # no lock file can be made: nobody can hold it either
        return
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(0.2)
        yield True
    finally:
        os.close(fd)


def remove_copy(path: Path, wait_s: float = 0.0) -> StagedCopy:
    """Remove one staged copy through `mlhpc.data.claims.remove_claimed` (its
    claim checked, and nothing there that staging did not record), not while a run reads it
    (waiting up to ``wait_s`` seconds for the readers to finish); returns what it held.

    Raises:
        StagingError: ``path`` is not a staged copy of this user (a link, someone else's, not
            claimed by staging for this folder), holds anything staging did not write (naming
            it; nothing is removed), its readers' lock is not a regular file (a FIFO, never
            waited on), a run still reads it, or it cannot be removed.
    """
    path = Path(path)
    if not is_own_copy(path):
        raise StagingError(f"{path}: not a staged copy of yours (no staging claim for this "
                           "folder); not removed")
    unhold(path)  # this process removes it, so it no longer reads it
    with _exclusive(path, wait_s) as alone:
        if not alone:
            raise StagingError(f"{path}: staged copy in use by another run on this node; not removed")
        try:
            held = describe(path)
            remove_claimed(path, COPY_KIND, "staged copy", recorded_files(path))
        except RemovalRefused as exc:
            raise StagingError(str(exc)) from None
        except OSError as exc:
            raise StagingError(f"{exc.filename or path}: staged copy not removed "
                               f"({exc.strerror or exc})") from None
    return held


def clean(copies: list[StagedCopy]) -> tuple[list[StagedCopy], list[str]]:
    """`remove_copy` of each copy: ``(removed, one line per copy left and why)``."""
    removed, left = [], []
    for copy in copies:
        try:
            removed.append(remove_copy(copy.path))
        except StagingError as exc:
            left.append(str(exc))
    return removed, left


def release(staged: Any, keep: bool, local_rank: int, node_rank: int = 0) -> Optional[str]:
    """At the end of a run, on each node's local rank 0: remove the copy this run made unless
    ``keep``. ``staged``: the run's `mlhpc.data.stage.StagingResult` (None: not staged).

    Returns one line for the user (what was removed or kept, where, how big), or None (nothing
    staged, or not local rank 0). Never raises: a copy that cannot be removed is said.
    """
    if staged is None:
        return None
    dest = Path(staged.dest)
    unhold(dest)  # every rank: this run no longer reads the copy
    if local_rank != 0:
        return None
    node = next((n for n in staged.per_node if n.get("node_rank") == node_rank), None)
    made = (node["copied_files"] if node is not None else staged.copied_files) > 0
    if keep or not made:
        why = "data.staging.keep: true" if keep else "it was in place before this run"
        size, _ = tree_size(dest)
        return f"staged copy kept: {dest} ({size / 1e6:.1f} MB; {why}; mlhpc stage --clean removes it)"
    try:  # the node's other ranks let go at the same moment: wait a little for them
        held = remove_copy(dest, wait_s=RELEASE_WAIT_S)
    except StagingError as exc:
        return f"staged copy left in place: {exc}"
    return f"staged copy removed: {dest} ({held.size_bytes / 1e6:.1f} MB; data.staging.keep: true keeps it)"


def render(copies: list[StagedCopy], removed: bool = False) -> str:
    """One line per copy (path, size, files, source), then the count and total size."""
    verb = "removed" if removed else "staged copy"
    lines = [f"{verb}: {c.path}  {c.size_bytes / 1e6:.1f} MB, {c.files} files, from {c.source or '?'}"
             for c in copies]
    total_mb = sum(c.size_bytes for c in copies) / 1e6
    lines.append(f"{len(copies)} staged cop{'y' if len(copies) == 1 else 'ies'}, {total_mb:.1f} MB"
                 + (" removed" if removed else ""))
    return "\n".join(lines)
