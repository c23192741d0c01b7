"""Staged copies on this node: find them, size them, remove them.

A staged copy is a folder that staging claimed (`mlhpc.data.stage.dest.MARKER_NAME` at its top).
`find_copies` looks at each folder given and at its immediate subfolders (the default folder is
``$TMPDIR``, else ``/tmp``, where `mlhpc.data.stage.plan.default_dest` puts copies) and keeps only
those that are real folders (not links), owned by the invoking user and marked by staging; a link
is never followed, neither to a copy nor inside one. `remove_copy` checks the same again and
removes the tree with `shutil.rmtree`, which on Linux works through file descriptors and never
follows a link inside the tree (``shutil.rmtree.avoids_symlink_attacks``).

`release` is the end of a run: the copy a run made (it copied at least one file) is removed unless
``data.staging.keep`` is true; a copy that was already complete before the run (kept by an
earlier run or made by ``mlhpc stage``) is left as it was. A copy is never removed while another
run reads it: a run marks the copy (`hold`: ``READERS_NAME-<pid>`` at its top) from the end of its
staging to its end, and removal waits while a mark names another live process (two runs of one
data set on one node share the default folder).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from mlhpc.data.inputs import read_text_input
from mlhpc.data.manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES
from mlhpc.data.stage.dest import MARKER_NAME
from mlhpc.errors import DataError, StagingError


#: The mark each run reading a copy leaves at its top, ``READERS_NAME-<pid>`` (one of mlhpc's own
#: ``.mlhpc*`` files: never staged, never pruned).
READERS_NAME = ".mlhpc-readers"
_held: dict[str, int] = {}  # dest -> this process's pid, for the marks it left
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
    """Whether ``path`` is a real folder owned by this user with staging's marker (a regular
    file, not a link) at its top."""
    try:
        info, marker = os.lstat(path), os.lstat(Path(path) / MARKER_NAME)
    except OSError:
        return False
    return (stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and stat.S_ISREG(marker.st_mode))


def tree_size(path: Path) -> tuple[int, int]:
    """``(bytes, files)`` of the regular files under ``path``; links are neither followed nor
    counted."""
    total = count = 0
    for root, _dirs, names in os.walk(path, followlinks=False):
        for name in names:
            try:
                info = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                total, count = total + info.st_size, count + 1
    return total, count


def _source(path: Path) -> Optional[str]:
    manifest = path / MANIFEST_NAME
    try:  # the one reader: no link, no FIFO, size capped
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


def _marks(path: Path) -> list[Path]:
    try:
        return [p for p in Path(path).iterdir() if p.name.startswith(READERS_NAME + "-")]
    except OSError:
        return []


def hold(dest: Path) -> None:
    """Mark ``dest`` as read by this process until `unhold`: an empty file
    ``READERS_NAME-<pid>`` at its top (created ``0600`` without following a link; a process that
    ends without `unhold` leaves a mark that names a dead process, which counts for nothing). A
    copy that cannot take the mark is left unmarked (staging has already checked the folder)."""
    try:
        os.close(os.open(Path(dest) / f"{READERS_NAME}-{os.getpid()}",
                         os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    except OSError:
        return
    _held[str(dest)] = os.getpid()


def unhold(dest: Path) -> None:
    """Drop this process's mark on ``dest`` (`hold`), if it has one."""
    if _held.pop(str(dest), None) is not None:
        try:
            os.unlink(Path(dest) / f"{READERS_NAME}-{os.getpid()}")
        except OSError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def _readers(path: Path) -> list[int]:
    """Live processes other than this one that mark ``path`` as read."""
    pids = []
    for mark in _marks(path):
        pid = mark.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and _alive(int(pid)):
            pids.append(int(pid))
    return pids


def _exclusive(path: Path, wait_s: float) -> bool:
    """Whether no other live process reads ``path``, waiting up to ``wait_s`` seconds for them."""
    deadline = time.monotonic() + wait_s
    while _readers(path):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True


def remove_copy(path: Path, wait_s: float = 0.0) -> StagedCopy:
    """Remove one staged copy (checked again with `is_own_copy` first, and not while a run reads
    it, waiting up to ``wait_s`` seconds for the readers to finish); returns what it held.

    Raises:
        StagingError: ``path`` is not a staged copy of this user (a link, someone else's, not
            marked by staging), a run still reads it, or it cannot be removed (naming the cause).
    """
    path = Path(path)
    if not is_own_copy(path):
        raise StagingError(f"{path}: not a staged copy of yours (a real folder with {MARKER_NAME}); "
                           "not removed")
    if not _exclusive(path, wait_s):
        raise StagingError(f"{path}: staged copy in use by another run on this node; not removed")
    try:
        held = describe(path)
        shutil.rmtree(path)
    except OSError as exc:
        raise StagingError(f"{exc.filename or path}: staged copy not removed ({exc.strerror or exc})") from None
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
