"""Staging, destination safety: claiming a node-local folder, creating its subfolders without
following links, and pruning it to the plan.

A destination is created ``0700``; an existing one must belong to the invoking user and be
writable by nobody else (`mlhpc.data.files.check_private_dir`), and be empty or an mlhpc staging
folder, since staging prunes it to the plan.
"""

from __future__ import annotations

import os
from pathlib import Path

from mlhpc.data.files import (
    LOCK_NAME,
    PART_SUFFIX,
    dest_error,
    make_private_dir,
    open_dir,
    open_root,
    reason,
)
from mlhpc.data.manifest import MANIFEST_NAME
from mlhpc.data.stage.plan import Planned
from mlhpc.errors import StagingError

MARKER_NAME = ".mlhpc-staging"  # written into every folder staging has claimed


def claim_dest(dest: Path) -> None:
    """Create ``dest`` (``0700``) and make sure it is ours to write and prune: a real folder (not
    a link) owned by the invoking user and writable by nobody else (`check_private_dir`: a
    predictable name in shared scratch may have been made beforehand by another user), and
    empty or already an mlhpc staging folder (its marker, manifest, lock or journals at the top;
    ``*.mlhpc-part`` leftovers).

    Raises:
        StagingError: any of the above does not hold (naming owner and mode), or ``dest`` cannot
            be created.
    """
    if dest.exists() and not dest.is_symlink() and not dest.is_dir():
        raise StagingError(f"{dest}: staging destination is a file, not a folder")
    make_private_dir(dest, StagingError, "staging destination",
                     failure="cannot write staged file: cannot create the staging destination folder")
    if not os.access(dest, os.W_OK | os.X_OK):
        read_only = os.statvfs(dest).f_flag & os.ST_RDONLY
        raise StagingError(f"{dest}: staging destination not writable "
                           f"({'read-only file system' if read_only else 'permission denied'})")
    if not any((dest / name).exists() for name in (MARKER_NAME, MANIFEST_NAME, LOCK_NAME)):
        for root, dirs, names in os.walk(dest):
            for name in names:
                top = Path(root) == dest and name.startswith(".mlhpc")
                if not top and not name.endswith(PART_SUFFIX):
                    raise StagingError(
                        f"{Path(root) / name}: the staging destination {dest} holds files mlhpc did "
                        "not stage; staging prunes its destination to the plan, so give it an empty "
                        "folder (data.staging.dest, e.g. /dev/shm/mlhpc-{node_rank})")
    try:
        os.close(os.open(dest / MARKER_NAME, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
    except OSError as exc:
        raise dest_error(dest / MARKER_NAME, exc) from None


def prune(dest: Path, plan: list[Planned]) -> int:
    """Remove every file and empty folder under ``dest`` that the plan does not hold (the
    staging state files at the top stay); returns the number of files removed."""
    return prune_to(dest, {p.rel for p in plan})


def prune_to(dest: Path, keep: set[str]) -> int:
    """Remove every file and empty folder under ``dest`` whose relative path is not in ``keep``
    (the staging state files at the top stay); returns the number of files removed."""
    removed = 0
    for root, dirs, names in os.walk(dest, topdown=False):
        folder = Path(root)
        rel_root = folder.relative_to(dest).as_posix()
        for name in names + [d for d in dirs if (folder / d).is_symlink()]:
            rel = name if rel_root == "." else f"{rel_root}/{name}"
            if rel in keep or (folder == dest and name.startswith(".mlhpc")):
                continue
            try:
                os.unlink(folder / name)
                removed += 1
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise StagingError(f"{folder / name}: cannot remove a file the staging plan does "
                                   f"not hold ({reason(exc)})") from None
        if folder != dest:
            try:
                os.rmdir(folder)  # only succeeds when empty
            except OSError:
                pass
    return removed


def make_parents(dest: Path, share: list[Planned]) -> None:
    """Create the destination folders of ``share`` under ``dest``, component by component with
    ``O_NOFOLLOW`` (`mlhpc.data.files.open_dir`): a link planted in the destination is never
    written through. Raises StagingError naming the folder that cannot be made or is a link."""
    root_fd = open_root(dest)
    try:
        for parent in sorted({(dest / p.rel).parent for p in share}):
            try:
                os.close(open_dir(root_fd, parent.relative_to(dest).parts, create=True))
            except OSError as exc:
                raise dest_error(parent, exc) from None
    finally:
        os.close(root_fd)


def open_parents(dest: Path, share: list[Planned]) -> dict[Path, int]:
    """Descriptors of the destination folders of ``share``, created where missing, each opened
    once component by component with ``O_NOFOLLOW`` (a link planted in the destination fails
    here). The caller closes them. Raises StagingError naming the folder."""
    folders: dict[Path, int] = {}
    root_fd = open_root(dest)
    try:
        for parent in sorted({(dest / p.rel).parent for p in share}):
            try:
                folders[parent] = open_dir(root_fd, parent.relative_to(dest).parts, create=True)
            except OSError as exc:
                for fd in folders.values():
                    os.close(fd)
                raise dest_error(parent, exc) from None
    finally:
        os.close(root_fd)
    return folders
