"""The error family of mlhpc.

Every error a user can cause by bad input is one of these. The CLI prints ``str(error)`` as one
line on stderr and exits with status 2; anything else escaping is a bug.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable


class MlhpcError(Exception):
    """Base class: a user-facing problem with one clear message naming the file, key or sample."""


class ConfigError(MlhpcError):
    """A config file, key or value is wrong (names the file and the key path)."""


class DataError(MlhpcError):
    """A dataset folder, file or sample is missing or malformed (names the file and sample)."""


class StagingError(MlhpcError):
    """Copying a dataset to node-local storage failed (names the source or destination file)."""


class LogFormatError(MlhpcError):
    """A result log cannot be read (names the file and line)."""


class OutputError(MlhpcError):
    """A results folder or file cannot be written: a file in the way, permissions, a read-only
    or full file system (names the folder or file and the config key)."""


def one_line_errors(os_errors: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator for CLI commands: an `MlhpcError` (and, with ``os_errors``, an `OSError`)
    becomes one line ``mlhpc: error: ...`` on stderr (`mlhpc.text.echo`: control characters
    shown, never sent; credentials masked) and the exit status the error carries
    (``exit_status``, else 2); anything else keeps its traceback (a bug)."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            from mlhpc.text import echo, one_line

            try:
                return fn(*args, **kwargs)
            except MlhpcError as exc:
                echo("mlhpc: error: " + one_line(exc), err=True)
                sys.exit(getattr(exc, "exit_status", 2))
            except OSError as exc:
                if not os_errors:
                    raise
                echo(f"mlhpc: error: {one_line(exc.filename or '')}: {one_line(exc.strerror or exc)}", err=True)
                sys.exit(2)

        return wrapper

    return decorate
