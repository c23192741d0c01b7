"""Writing files: temporary names, atomic output, modes, and the wording of a write's failure.

One rule for each thing a data command does when it writes (checksums are
`mlhpc.data.checksums`, locks `mlhpc.data.locks`, a destination's ownership, overlap and links
`mlhpc.data.trees`, removal `mlhpc.data.claims`):

- **Temporary names and atomic output**, for the whole project: a file is written under
  `part_path` (``.NAME.HOST-PID.mlhpc-part`` beside its final name) and renamed into place
  (`atomic_output`, `write_text_atomic`, `write_under`), so a file under its final name is always
  whole; `is_part_file` tells leftovers of an interrupted writer.
- **Links.** Reading (a source walked, any file opened) is `mlhpc.data.inputs`: no link out of
  its tree, nothing but regular files, sizes capped. A destination is written through folder
  descriptors opened with ``O_NOFOLLOW`` (`open_dir`), never through a planted link.
- **Modes.** A copied or converted file never gets more permission bits than its source
  (`copy_mode`, `output_mode`), and a file with no one source is created ``0600``.

See docs/architecture.md, "The data layer".
"""

from __future__ import annotations

import errno
import os
import pwd
import socket
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from pathlib import Path

from mlhpc.data.statefiles import record_made, safe_name  # safe_name: re-exported
from mlhpc.errors import StagingError

PART_SUFFIX = ".mlhpc-part"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
PRIVATE_FILE_MODE = 0o600
# The permission bits `atomic_output` gives a new file (before the umask) where its caller names
# none: set by a driver around a workload's writer (`output_mode`), private otherwise.
_OUTPUT_MODE: ContextVar[int] = ContextVar("mlhpc_output_mode", default=PRIVATE_FILE_MODE)


def part_path(final: Path) -> Path:
    """The temporary name every writer of the project uses for a file being written to ``final``:
    ``.NAME.HOST-PID.mlhpc-part`` in the same folder (so the rename is atomic, and writers on
    several hosts or processes never share a temporary file)."""
    final = Path(final)
    return final.with_name(f".{final.name}.{safe_name(socket.gethostname())}-{os.getpid()}{PART_SUFFIX}")


def is_part_file(name: str) -> bool:
    """Whether a file name is a temporary file of an unfinished writer (`part_path`)."""
    return name.startswith(".") and name.endswith(PART_SUFFIX)


@contextmanager
def output_mode(mode: int) -> Iterator[None]:
    """Within the block (this thread or process), `atomic_output` creates files with permission
    bits ``mode & 0o666`` (before the umask) instead of ``0600``: a driver wraps a workload's
    writer in it with `copy_mode` of the source being converted."""
    token = _OUTPUT_MODE.set(stat.S_IMODE(mode) & 0o666)
    try:
        yield
    finally:
        _OUTPUT_MODE.reset(token)


class UnsafeFolder(PermissionError):
    """An output folder is owned by another user or writable by others (`check_output_folder`)."""


def check_output_folder(fd: int, path: Path) -> None:
    """Raise `UnsafeFolder` unless the folder open as ``fd`` belongs to the invoking user (or
    root) and is writable by no other user (no ``o+w``): whoever can write a folder can swap a
    file in it for a link between its creation and a writer's reopening by path. A sticky
    folder (``/tmp``, a fresh tmpfs) is accepted: there no one removes or renames another's file."""
    st = os.fstat(fd)
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (os.geteuid(), 0) or (mode & 0o002 and not mode & stat.S_ISVTX):
        raise UnsafeFolder(errno.EPERM, f"folder owned by {owner_name(st.st_uid)} with mode {mode:04o}: "
                           "an output folder must be yours and writable by no other user", str(path))


@contextmanager
def atomic_output(final: Path, mode: int | None = None, exclusive: bool = False) -> Iterator[Path]:
    """The project's atomic writer: a temporary path beside ``final`` to write
    (`part_path`), renamed to ``final`` when the block succeeds, removed when it fails, so a
    half-written file never carries the final name. With ``exclusive`` an existing ``final`` is
    never replaced (the rename is a hard link, which fails with FileExistsError).

    ``final``'s folder is opened ``O_NOFOLLOW`` (a link there fails with ELOOP) and must pass
    `check_output_folder`; the temporary file is created relative to that descriptor with
    ``O_EXCL | O_NOFOLLOW`` and bits ``mode`` (default: the enclosing `output_mode`, else
    ``0600``; the umask may take more away), owner read/write until the rename so a writer that
    reopens it by path (h5py, numpy) is not locked out; the rename is relative to it too.

    Raises:
        OSError: the folder is missing, a link, unsafe (`UnsafeFolder`) or not writable.
    """
    final = Path(final)
    bits = _OUTPUT_MODE.get() if mode is None else mode & 0o666
    dir_fd = open_root(final.parent)
    try:
        check_output_folder(dir_fd, final.parent)
        with _new_file(dir_fd, final.name, bits, exclusive) as name:
            yield final.parent / name
    finally:
        os.close(dir_fd)
    record_made(final)  # in place: a removal of its claimed folder counts it as mlhpc's


@contextmanager
def _new_file(dir_fd: int, final: str, bits: int, exclusive: bool) -> Iterator[str]:
    """The temporary name (`part_path`) of ``final`` in the folder ``dir_fd``, created new
    (``O_EXCL | O_NOFOLLOW``), renamed (``exclusive``: linked) to ``final`` or removed."""
    tmp = part_path(Path(final)).name
    with suppress(OSError):  # a leftover of this very process id (a recycled pid)
        os.unlink(tmp, dir_fd=dir_fd)
    os.close(os.open(tmp, _NEW_FILE_FLAGS, bits | PRIVATE_FILE_MODE, dir_fd=dir_fd))
    try:
        yield tmp
        narrow_mode(tmp, bits, dir_fd)
        if exclusive:
            os.link(tmp, final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            os.unlink(tmp, dir_fd=dir_fd)
        else:
            os.replace(tmp, final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def write_text_atomic(final: Path, text: str, exclusive: bool = False) -> None:
    """``text`` (UTF-8) written to ``final`` through `atomic_output` (complete or absent), fsynced.

    Raises:
        OSError: as `atomic_output`, or the write fails (full disk, read-only file system).
    """
    with atomic_output(final, exclusive=exclusive) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())


def owner_name(uid: int) -> str:
    """``"name (uid N)"``, or ``"uid N"`` for a uid with no account."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def reason(exc: OSError) -> str:
    """A short cause for an OSError: "not found", "permission denied", "no space left on
    device", "read-only file system", or the system's own text."""
    causes = {errno.ENOENT: "not found", errno.EACCES: "permission denied",
              errno.EPERM: "permission denied", errno.ENOSPC: "no space left on device",
              errno.EDQUOT: "disk quota exceeded", errno.EROFS: "read-only file system",
              errno.ENOTDIR: "not a folder", errno.EISDIR: "is a folder",
              errno.ELOOP: "a symbolic link where none may be"}
    if isinstance(exc, UnsafeFolder):
        return exc.strerror
    return causes.get(exc.errno, exc.strerror or str(exc))


def disk_full(folder: Path | str, margin_bytes: int = 1 << 20) -> bool:
    """Whether the file system holding ``folder`` has less than ``margin_bytes`` left for this
    user: after a write that came up short without an errno, or with ``EIO`` (as some writers
    report a full disk), the cause then is a full disk."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < margin_bytes


def dest_error(path: Path, exc: OSError, src: Path | None = None) -> StagingError:
    """A StagingError naming ``path`` and the cause of ``exc`` (and the source being copied)."""
    what = f" (copying {src})" if src is not None else ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StagingError(f"staging destination full (no space left on device){what}", path=path)
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return StagingError(f"staging destination not writable ({reason(exc)}){what}", path=path)
    return StagingError(f"cannot write staged file ({reason(exc)}){what}", path=path)


def unlink_quietly(path: Path) -> None:
    """Remove a file if it is there; errors are ignored."""
    try:
        os.unlink(path)
    except OSError:
        pass


# ---- modes ---------------------------------------------------------------------------------------


def copy_mode(source_mode: int) -> int:
    """Permission bits for a new copy of a file of mode ``source_mode``: its own read/write bits,
    never more (the process umask may take more away)."""
    return stat.S_IMODE(source_mode) & 0o666


def common_mode(paths: list[Path]) -> int:
    """The read/write bits every file of ``paths`` has (`copy_mode` of each, and-ed): the most
    a file made from all of them (a file list, a manifest) may get; ``0600`` for none.

    Raises:
        OSError: a file cannot be inspected.
    """
    mode = 0o666 if paths else PRIVATE_FILE_MODE
    for path in paths:
        mode &= copy_mode(os.stat(path).st_mode)
    return mode


def narrow_mode(path: Path | str, allowed: int, dir_fd: int | None = None) -> None:
    """Take from the file ``path`` (relative to ``dir_fd`` if given) every permission bit outside
    ``allowed`` (a writer that makes its own files, e.g. LMDB, ignores `output_mode`); never adds
    one, never follows a link. Raises OSError (ELOOP for a link)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & ~allowed:
            os.fchmod(fd, mode & allowed)
    finally:
        os.close(fd)


def write_under(root: Path, rel: Path, data: bytes, mode: int = PRIVATE_FILE_MODE) -> Path:
    """Write ``data`` to ``root/rel`` atomically and never through a link: each folder below
    ``root`` opened with ``O_NOFOLLOW`` and created ``0700`` where missing (`open_dir`), the
    file created under its temporary name with ``O_EXCL | O_NOFOLLOW`` and permission bits
    ``mode`` (before the umask), then renamed within that folder. Returns ``root/rel``.

    Raises:
        OSError: ``root`` or a folder below it is a link (ELOOP) or not a folder; the file cannot
            be written (full disk, read-only file system), with ``filename`` set to the path.
    """
    rel = Path(rel)
    final = Path(root) / rel
    try:
        root_fd = open_root(root)
        try:
            dir_fd = open_dir(root_fd, rel.parts[:-1], create=True)
        finally:
            os.close(root_fd)
    except OSError as exc:
        raise _blocker(Path(root), rel.parts[:-1], exc) from None
    try:
        with _new_file(dir_fd, rel.name, mode & 0o666, False) as tmp:
            fd = os.open(tmp, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(final)) from None
    finally:
        os.close(dir_fd)
    record_made(final)
    return final


def _blocker(root: Path, parts: tuple[str, ...], exc: OSError) -> OSError:
    """``exc`` naming the first folder from ``root`` down ``parts`` that is a link or no folder."""
    path = Path(root)
    for part in ("",) + tuple(parts):
        path = path / part if part else path
        try:
            st = os.lstat(path)
        except OSError:
            break
        if not stat.S_ISDIR(st.st_mode):  # a link (lstat) or a file
            return OSError(errno.ELOOP if stat.S_ISLNK(st.st_mode) else errno.ENOTDIR, "", str(path))
    return OSError(exc.errno, exc.strerror, str(path))


# ---- walking a source, opening under a destination ------------------------------------------------


def open_dir(root_fd: int, rel_parts: tuple[str, ...], create: bool) -> int:
    """A descriptor of the folder ``rel_parts`` below the folder open as ``root_fd``, each
    component opened with ``O_NOFOLLOW`` (a link anywhere on the way fails with ``ELOOP``) and,
    with ``create``, made ``0700`` when missing. The caller closes it.

    Raises:
        OSError: a component is a link (ELOOP), not a folder, or cannot be made.
    """
    fd = os.dup(root_fd)
    try:
        for part in rel_parts:
            if part in ("", ".", ".."):
                raise OSError(errno.EINVAL, "bad path component", part)
            if create:
                try:
                    os.mkdir(part, 0o700, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:  # Linux says ENOTDIR for a link opened O_DIRECTORY|O_NOFOLLOW
                if exc.errno in (errno.ENOTDIR, errno.ELOOP) and \
                        stat.S_ISLNK(os.lstat(part, dir_fd=fd).st_mode):
                    raise OSError(errno.ELOOP, "a symbolic link where none may be", part) from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_root(path: Path) -> int:
    """A descriptor of the folder ``path`` itself, refusing a link as its last component.

    Raises:
        OSError: missing, not a folder, or a link (ELOOP).
    """
    return os.open(path, _DIR_FLAGS)


