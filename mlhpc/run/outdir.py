"""The results folder (``output.dir``) is usable before a run writes anything to it.

`check_output_dir` is called before ``result_N.txt`` is opened: a folder that is a file, lies under
a file, is read-only (permissions or a read-only mount) or on a full file system is reported as
one line (`OutputError`, exit status 2) with nothing created. `write_text_atomic` writes a side
file (summary, config, environment) through a temporary sibling that is removed when the write
fails, so a full disk leaves no 0-byte temporary file behind.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from mlhpc.errors import OutputError

#: A run writes a log, a summary, a config and an environment record (tens of kB) and maybe a
#: checkpoint; less free space than this is refused before the run starts.
MIN_FREE_BYTES = 1 << 20
PROBE_BYTES = 4096


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return "no space left on the file system"
    if exc.errno == errno.EDQUOT:
        return "disk quota exceeded"
    if exc.errno == errno.EROFS:
        return "read-only file system"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if exc.errno == errno.ENOTDIR:
        return "a part of the path is a file, not a folder"
    return exc.strerror or str(exc)


def check_output_dir(path: Path | str, key: str = "output.dir",
                     min_free_bytes: int = MIN_FREE_BYTES) -> Path:
    """Create the results folder ``path`` if needed and prove it writable: a probe file of
    ``PROBE_BYTES`` is written, fsynced and removed, and the file system must have at least
    ``min_free_bytes`` free (``os.statvfs``).

    Returns:
        ``path`` as a `Path`.

    Raises:
        OutputError: ``path`` is a file, lies under a file, cannot be created or written
            (permissions, read-only file system) or its file system is full; the message names
            ``key`` and the folder. Folders this call created are removed again.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError(f"{key} {path}: is a file, not a folder")
    created: list[Path] = []
    probe = path / f".mlhpc-probe-{os.getpid()}"
    try:
        missing = [p for p in (path, *path.parents) if not p.exists()]
        for folder in reversed(missing):
            folder.mkdir()
            created.append(folder)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            view = memoryview(b"\0" * PROBE_BYTES)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
            probe.unlink(missing_ok=True)
        stats = os.statvfs(path)
        free = stats.f_bavail * stats.f_frsize
        if free < min_free_bytes:
            raise OSError(errno.ENOSPC, f"only {free} bytes free")
    except OSError as exc:
        for folder in reversed(created):
            shutil.rmtree(folder, ignore_errors=True)
        detail = exc.strerror if exc.errno == errno.ENOSPC and exc.strerror.startswith("only") else ""
        reason = _reason(exc) + (f" ({detail})" if detail else "")
        raise OutputError(f"{key} {path}: cannot write results ({reason})") from None
    return path


def write_text_atomic(path: Path | str, text: str, exclusive: bool = False) -> None:
    """Write ``text`` (UTF-8) to ``path`` through the project's one atomic writer
    (`mlhpc.data.files.write_text_atomic`); with ``exclusive`` an existing ``path`` is never
    replaced. On any failure the temporary file is removed.

    Raises:
        OutputError: the file cannot be written (full file system, permissions, ...) or, with
            ``exclusive``, already exists; the message names the file.
    """
    from mlhpc.data.files import UnsafeFolder
    from mlhpc.data.files import write_text_atomic as write_atomic

    path = Path(path)
    try:
        write_atomic(path, text, exclusive=exclusive)
    except FileExistsError:
        raise OutputError(f"{path}: already exists; results are never overwritten") from None
    except UnsafeFolder as exc:
        raise OutputError(f"{path}: cannot write ({exc.strerror})") from None
    except OSError as exc:
        raise OutputError(f"{path}: cannot write ({_reason(exc)})") from None
