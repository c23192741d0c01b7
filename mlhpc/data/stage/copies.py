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
earlier run or made by ``mlhpc stage``) is left as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from mlhpc.data.inputs import read_text_input
from mlhpc.data.manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES
from mlhpc.data.stage.dest import MARKER_NAME
from mlhpc.errors import DataError, StagingError


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


def remove_copy(path: Path) -> StagedCopy:
    """Remove one staged copy (checked again with `is_own_copy` first); returns what it held.

    Raises:
        StagingError: ``path`` is not a staged copy of this user (a link, someone else's, not
            marked by staging), or cannot be removed (naming the cause).
    """
    path = Path(path)
    if not is_own_copy(path):
        raise StagingError(f"{path}: not a staged copy of yours (a real folder with {MARKER_NAME}); "
                           "not removed")
    held = describe(path)
    try:
        shutil.rmtree(path)
    except OSError as exc:
        raise StagingError(f"{exc.filename or path}: staged copy not removed ({exc.strerror or exc})") from None
    return held


def release(staged: Any, keep: bool, local_rank: int, node_rank: int = 0) -> Optional[str]:
    """At the end of a run, on each node's local rank 0: remove the copy this run made unless
    ``keep``. ``staged``: the run's `mlhpc.data.stage.StagingResult` (None: not staged).

    Returns one line for the user (what was removed or kept, where, how big), or None (nothing
    staged, or not local rank 0). Never raises: a copy that cannot be removed is said.
    """
    if staged is None or local_rank != 0:
        return None
    dest = Path(staged.dest)
    node = next((n for n in staged.per_node if n.get("node_rank") == node_rank), None)
    made = (node["copied_files"] if node is not None else staged.copied_files) > 0
    if keep or not made:
        why = "data.staging.keep: true" if keep else "it was in place before this run"
        size, _ = tree_size(dest)
        return f"staged copy kept: {dest} ({size / 1e6:.1f} MB; {why}; mlhpc stage --clean removes it)"
    try:
        held = remove_copy(dest)
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
