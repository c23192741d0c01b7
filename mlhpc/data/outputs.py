"""The name of an output file the user asks for (``--roofline``, ``--trace``, ``--plot``,
``--out``): used exactly as given or refused in one line, never rewritten. A rewritten name (a
space made ``_``) replaced another of the user's files, and the path printed did not exist. The
file is then written by `mlhpc.data.files.atomic_output`, which replaces the name and never
writes through an existing file or link.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from mlhpc.errors import OutputError


def output_file(path: Path | str, key: str) -> Path:
    """``path`` as given, once it can be written under that very name: checked before anything
    is made (a step run, a figure drawn).

    Args:
        path: the file name from the command line.
        key: the option that named it (``"--roofline"``), said in the message.

    Raises:
        OutputError: one line naming ``key`` and the path: no file name (``.``, ``..``, empty), a
            control character in it (it could not be shown as it is), an existing folder or an
            existing file that is not a regular file (a FIFO, a device).
    """
    path = Path(path)
    shown = ascii(str(path))[1:-1]  # the name in one line, its control characters escaped
    if path.name in ("", ".", ".."):
        raise OutputError(f"{key} {shown}: names no file; give a file name")
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in str(path)):
        raise OutputError(f"{key} {shown}: the name holds a control character; give a name without one")
    try:
        st = os.lstat(path)
    except OSError:
        return path  # absent (or unreachable: the writer names why)
    if stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{key} {path}: is a folder; give a file name")
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise OutputError(f"{key} {path}: is not a regular file; give a file name")
    return path
