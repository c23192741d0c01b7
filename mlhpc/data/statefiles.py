"""mlhpc's own state files in the folders it writes: how they are opened, and the record of
what its writers made.

- **Opening.** A lock file or a journal is opened by `open_state_file`: created ``0600`` where
  missing, never through a link, never waiting on a FIFO (``O_NONBLOCK``), and refused with one
  line unless it is a regular file. (A file a user supplies is read by
  `mlhpc.data.inputs.open_input`, which refuses the same kinds.)
- **What was made.** Within `recording`, each file the project's writers put in place below a
  claimed folder is appended to that folder's journal (`MADE_JOURNAL`) as it lands: the names
  `mlhpc.data.claims.remove_claimed` may delete there. A file nothing records (one a user put
  in the folder) is never counted as mlhpc's.

See docs/data.md, "What mlhpc deletes".
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from mlhpc.errors import DataError, MlhpcError


def safe_name(text: str) -> str:
    """``text`` with every character but letters, digits, ``.`` and ``_`` replaced by ``_``."""
    return "".join(c if c.isalnum() or c in "._" else "_" for c in text) or "_"


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` that is not a regular file is, for messages
    (``"a FIFO"``, ``"a folder"``, ...)."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def open_state_file(path: Path, flags: int = os.O_RDWR, what: str = "lock file",
                    error: type[MlhpcError] = DataError) -> int:
    """A descriptor of ``path``, a file mlhpc keeps its state in (a lock, a journal), created
    ``0600`` where missing: opened ``flags | O_CREAT | O_NOFOLLOW | O_NONBLOCK`` (never through
    a link, and a FIFO never waited on), then refused unless it is a regular file. Reading a
    file a user supplies is `mlhpc.data.inputs.open_input`; this is its sibling for files
    opened for locking or appending.

    Raises:
        error: ``path`` is a FIFO, a device, a socket or a folder (one line naming it; the
            caller's error class, `DataError` by default).
        OSError: it cannot be opened or created (ELOOP for a link).
    """
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno not in (errno.ENXIO, errno.EISDIR):  # a FIFO without a reader, a folder
            raise
        raise error(f"{what} is {file_kind(os.lstat(path).st_mode)}, not a regular file; refused "
                    "(remove it, and run again)", path=path) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise error(f"{what} is {file_kind(info.st_mode)}, not a regular file; refused (remove "
                    "it, and run again)", path=path)
    return fd


# The claimed folder whose files this process records making (`recording`), or None.
_RECORDING: ContextVar[str | None] = ContextVar("mlhpc_recording", default=None)
#: The journal at a claimed folder's top in which its writers record each file put in place
#: (`recording`): ``.mlhpc-journal-made-HOST-PID.jsonl``, one ``{"path": REL}`` per line.
MADE_JOURNAL = ".mlhpc-journal-made-"


@contextmanager
def recording(folder: Path | str | None) -> Iterator[None]:
    """Within the block (this thread, and the workers `mlhpc.data.pool.map_in_order` starts in
    it), each file the project's writers put in place below ``folder``
    (`mlhpc.data.files.atomic_output`, `mlhpc.data.files.write_under`, a tree by `record_tree`) is recorded in ``folder``'s journal
    (`MADE_JOURNAL`): the names a later removal counts as mlhpc's
    (`mlhpc.data.claims.remove_claimed`). None: nothing is recorded."""
    token = _RECORDING.set(None if folder is None else os.path.abspath(folder))
    try:
        yield
    finally:
        _RECORDING.reset(token)


def recording_folder() -> str | None:
    """The folder `recording` records into here, or None (for a pool handing it to workers)."""
    return _RECORDING.get()


def record_into(folder: str | None) -> None:
    """`recording` into ``folder`` for the rest of this thread: a pool worker's start, given its
    parent's `recording_folder`."""
    _RECORDING.set(folder)


def record_tree(path: Path | str) -> None:
    """Record (`recording`) ``path`` and every file below it, links listed and never followed."""
    if _RECORDING.get() is None:
        return
    names = [path]
    if os.path.isdir(path) and not os.path.islink(path):
        names = [os.path.join(top, name) for top, dirs, files, _fd in os.fwalk(path, follow_symlinks=False)
                 for name in files + [d for d in dirs if os.path.islink(os.path.join(top, d))]]
    for name in names:
        record_made(Path(name))


def record_made(final: Path) -> None:
    """Append ``final``'s path relative to the folder being recorded into (`recording`) to that
    folder's journal; nothing for a file outside it or when nothing is recorded.

    Raises:
        DataError: the journal is not a regular file (a FIFO is never waited on).
        OSError: the journal cannot be written.
    """
    folder = _RECORDING.get()
    if folder is None:
        return
    rel = os.path.relpath(os.path.abspath(final), folder)
    if rel == "." or rel.startswith(".." + os.sep) or rel == "..":
        return
    journal = Path(folder) / f"{MADE_JOURNAL}{safe_name(socket.gethostname())}-{os.getpid()}.jsonl"
    fd = open_state_file(journal, os.O_WRONLY | os.O_APPEND, "journal")
    try:
        os.write(fd, (json.dumps({"path": Path(rel).as_posix()}) + "\n").encode())
    finally:
        os.close(fd)

