"""Staging, destination safety: claiming a node-local folder, creating its subfolders without
following links, and pruning it to the plan.

A destination is created ``0700``; an existing one must belong to the invoking user and be
writable by nobody else (`mlhpc.data.trees.check_private_dir`), and be empty or a folder staging
claimed (`mlhpc.data.claims`) holding nothing staging did not record, since staging prunes it
to the plan and a run's end may remove it.
"""

from __future__ import annotations

import os
from pathlib import Path

from mlhpc.data.claims import (
    CLAIM_NAME,
    RemovalRefused,
    claim_problem,
    foreign,
    prune_claimed,
    read_claim,
    write_claim,
)
from mlhpc.data.files import dest_error, is_part_file, open_dir, open_root, reason
from mlhpc.data.locks import LOCK_NAME, node_lock
from mlhpc.data.manifest import journal_entries, load
from mlhpc.data.stage.plan import Planned
from mlhpc.data.trees import make_private_dir
from mlhpc.errors import StagingError

#: The claim kind of a staging destination (`mlhpc.data.claims`).
COPY_KIND = "staged-copy"


def recorded_files(dest: Path) -> set[str]:
    """The files the staging records of ``dest`` list as written there: its manifest's files and
    every journal entry's file and converted outputs. Only read inside a folder whose claim
    holds (`claim_dest`, `mlhpc.data.stage.copies.remove_copy`)."""
    found: set[str] = set()
    doc = load(dest)
    for entry in (doc or {}).get("files") or []:
        if isinstance(entry, dict) and isinstance(entry.get("path"), str):
            found.add(entry["path"])
    for entry in journal_entries(dest):
        if isinstance(entry.get("path"), str):
            found.add(entry["path"])
        for out in entry.get("outputs") or []:
            if isinstance(out, dict) and isinstance(out.get("path"), str):
                found.add(out["path"])
    return found


def _is_empty(dest: Path) -> bool:
    """Nothing in ``dest`` but the node lock and temporary files of mlhpc writers (another rank
    claiming it at the same moment)."""
    with os.scandir(dest) as entries:
        return all(e.name == LOCK_NAME or is_part_file(e.name) for e in entries)


def claim_dest(dest: Path) -> None:
    """Create ``dest`` (``0700``) and make sure it is ours to write and prune: a real folder (not
    a link) owned by the invoking user and writable by nobody else (`check_private_dir`: a
    predictable name in shared scratch may have been made beforehand by another user), and
    either empty (then claimed: `mlhpc.data.claims.write_claim`, kind `COPY_KIND`) or a folder
    staging claimed before, holding nothing its claim and records (`recorded_files`) do not list.
    A folder that only looks like mlhpc's (a dataset with a manifest, a run's results) is refused
    before anything in it is touched.

    Raises:
        StagingError: any of the above does not hold (naming the folder or the first file that
            is not staging's), or ``dest`` cannot be created.
    """
    if dest.exists() and not dest.is_symlink() and not dest.is_dir():
        raise StagingError(f"{dest}: staging destination is a file, not a folder")
    make_private_dir(dest, StagingError, "staging destination",
                     failure="cannot write staged file: cannot create the staging destination folder")
    if not os.access(dest, os.W_OK | os.X_OK):
        read_only = os.statvfs(dest).f_flag & os.ST_RDONLY
        raise StagingError(f"{dest}: staging destination not writable "
                           f"({'read-only file system' if read_only else 'permission denied'})")
    try:
        _claim(dest, write=False)  # refused before anything (even the lock file) is made there
        with node_lock(dest):  # the ranks of a node claim one at a time
            _claim(dest, write=True)
    except OSError as exc:
        raise dest_error(dest / CLAIM_NAME, exc) from None


def _claim(dest: Path, write: bool) -> None:
    if _is_empty(dest):
        if write:
            write_claim(dest, COPY_KIND)
        return
    claim = read_claim(dest, COPY_KIND)
    if claim is None:
        first = min((e.name for e in os.scandir(dest) if e.name != LOCK_NAME and not is_part_file(e.name)),
                    default=".")
        raise StagingError(
            f"{dest / first}: the staging destination {dest} holds files mlhpc did not stage and is "
            f"no staged copy of yours ({claim_problem(dest, COPY_KIND)}); staging prunes its "
            "destination to the plan, so give it an empty folder (data.staging.dest, e.g. "
            "/dev/shm/mlhpc-{node_rank})")
    recorded = recorded_files(dest)
    strays = foreign(claim, recorded)
    if strays:
        more = f" and {len(strays) - 1} more" if len(strays) > 1 else ""
        raise StagingError(f"{dest / strays[0]}{more}: in the staging destination {dest} but not "
                           "staged by mlhpc; nothing was changed (move it out, or give staging an "
                           "empty folder)")
    if write:
        write_claim(dest, COPY_KIND, claim.files | recorded)  # journals are dropped once recorded


def record_claim(dest: Path) -> None:
    """After staging: ``dest``'s claim lists exactly the files its manifest holds."""
    try:
        write_claim(dest, COPY_KIND, recorded_files(dest))
    except OSError as exc:
        raise dest_error(dest / CLAIM_NAME, exc) from None


def prune(dest: Path, plan: list[Planned]) -> int:
    """Remove every file under ``dest`` that staging recorded writing and the plan does not
    hold, and folders left empty (`mlhpc.data.claims.prune_claimed`); returns the count."""
    return prune_to(dest, {p.rel for p in plan})


def prune_to(dest: Path, keep: set[str]) -> int:
    """Remove every file under claimed ``dest`` that its claim or records list and ``keep`` does
    not (mlhpc's own state at the top stays); returns the number of files removed. A file
    staging did not record is never removed.

    Raises:
        StagingError: ``dest`` holds no valid staging claim, or a file cannot be removed.
    """
    try:
        return prune_claimed(dest, COPY_KIND, keep, recorded_files(dest))
    except RemovalRefused as exc:
        raise StagingError(str(exc)) from None
    except OSError as exc:
        raise StagingError(f"{exc.filename or dest}: cannot remove a file the staging plan does "
                           f"not hold ({reason(exc)})") from None


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
