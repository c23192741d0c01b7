"""Locks of the processes of one node that share a folder without a process group."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mlhpc.data.files import dest_error
from mlhpc.data.statefiles import open_state_file
from mlhpc.errors import StagingError

LOCK_NAME = ".mlhpc-lock"


@contextmanager
def node_lock(folder: Path) -> Iterator[None]:
    """Exclusive ``flock`` on ``folder/.mlhpc-lock`` (`open_state_file`: never through a link,
    never a FIFO) for processes of a node that share a folder without a process group.

    Raises:
        StagingError: the lock file cannot be created, or is not a regular file.
    """
    try:
        fd = open_state_file(Path(folder) / LOCK_NAME, error=StagingError)
    except OSError as exc:
        raise dest_error(Path(folder) / LOCK_NAME, exc) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
