"""Folders a data command reads from and writes to: overlap, ownership, links.

- **Overlap.** A source and a destination may not contain each other (`refuse_overlap`).
- **Ownership.** A destination folder must belong to the invoking user and be writable by nobody
  else (`check_private_dir`); new destinations are created ``0700`` (`make_private_dir`).
- **Links.** A destination is checked to hold no link on the way down (`check_no_links`); it is
  written through folder descriptors opened with ``O_NOFOLLOW`` (`mlhpc.data.files.open_dir`).

See docs/architecture.md, "The data layer".
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from mlhpc.data.files import open_dir, open_root, owner_name, reason
from mlhpc.errors import MlhpcError


def resolved(path: Path) -> Path:
    """``path.resolve()``, or the absolute path when it cannot be resolved."""
    try:
        return Path(path).resolve()
    except OSError:
        return Path(path).absolute()


def descriptor_path(fd: int, fallback: Path) -> Path:
    """The real path of the file open as ``fd`` (Linux's ``/proc/self/fd``), else ``fallback``
    resolved (`resolved`): where a file opened through links really is."""
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return resolved(fallback)


def is_under(path: Path, root: Path) -> bool:
    """Whether ``path`` equals ``root`` or lies below it (lexically)."""
    try:
        Path(path).relative_to(root)
    except ValueError:
        return False
    return True


def refuse_overlap(source: Path, dest: Path, what: str, error: type[MlhpcError]) -> None:
    """Raise ``error`` when ``dest`` and ``source`` are one folder or one contains the other
    (after resolving links): an output inside its input is read back as input, an input inside
    its output is pruned or overwritten.

    Args:
        what: the command, for the message (``"staging"``, ``"data convert"``, ...).
    """
    src, dst = resolved(source), resolved(dest)
    if src == dst:
        raise error(f"{what} destination is its source folder; choose another folder", path=dest)
    if is_under(dst, src):
        raise error(f"{what} destination lies inside its source {source}; choose a folder "
                    "outside it", path=dest)
    if is_under(src, dst):
        raise error(f"{what} destination contains its source {source}; choose a folder "
                    "outside it", path=dest)


def check_private_dir(path: Path, error: type[MlhpcError], what: str) -> None:
    """Raise ``error`` unless ``path`` is a real folder (not a link) owned by the invoking user
    and writable by nobody else (no group or other write bit).

    A folder of a predictable name in shared scratch (``$TMPDIR``, ``/tmp``) may have been made
    by another user beforehand, who could then read or replace what is written into it.
    """
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise error(f"{what} folder cannot be inspected ({reason(exc)})", path=path) from None
    if stat.S_ISLNK(st.st_mode):
        raise error(f"{what} folder is a symbolic link; give the real folder", path=path)
    if not stat.S_ISDIR(st.st_mode):
        raise error(f"{what} folder is not a folder", path=path)
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != os.geteuid() or mode & 0o022:
        raise error(f"{what} folder is owned by {owner_name(st.st_uid)} with mode {mode:04o}; "
                    f"it must be owned by you, {owner_name(os.geteuid())}, and writable by nobody else "
                    "(remove it, or choose another folder)", path=path)


def make_private_dir(path: Path, error: type[MlhpcError], what: str,
                     failure: str | None = None) -> None:
    """Create ``path`` (and missing parents) with the last component ``0700``, or check an
    existing one with `check_private_dir`: the destination check of every command that
    writes a folder (stage, data convert and prepare, report --package).

    Args:
        what: the folder's role, for messages (``"staging destination"``, ...).
        failure: the message's words when it cannot be created (default
            ``"cannot create the WHAT folder"``).

    Raises:
        error: ``path`` is a link or a file, exists and is not private (naming its owner and
            mode), or cannot be created (named, with the cause).
    """
    path = Path(path)
    failure = failure or f"cannot create the {what} folder"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        cause = "a file is in the way" if isinstance(exc, FileExistsError) else reason(exc)
        raise error(f"{failure} ({cause})", path=path) from None
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if not path.is_symlink() and not path.is_dir():
            raise error(f"{failure} (a file is in the way)", path=path) from None
    except OSError as exc:
        raise error(f"{failure} ({reason(exc)})", path=path) from None
    check_private_dir(path, error, what)


def check_no_links(root: Path, folder: Path) -> None:
    """Raise OSError(ELOOP) when any component of ``folder`` below ``root`` is a link, so that a
    writer that takes paths (h5py, numpy) is never pointed through one."""
    rel = Path(folder).relative_to(root)
    fd = open_root(root)
    try:
        os.close(open_dir(fd, rel.parts, create=False))
    finally:
        os.close(fd)
