"""The error family of mlhpc.

Every error a user can cause by bad input is one of these. The CLI prints ``str(error)`` as one
line on stderr and exits with status 2 (`error_line`, the one place where errors become lines);
anything else escaping is a bug. No message grows with its input: ``str(error)`` is at most
`mlhpc.text.MAX_LINE_CHARS` characters (`mlhpc.text.clip_line`), whatever value it was built
from, and every value the line shows is escaped for a terminal and its credentials masked.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable


class MlhpcError(Exception):
    """Base class: a user-facing problem with one clear message naming the file, key or sample.
    Its text (``str``) is one line of at most `mlhpc.text.MAX_LINE_CHARS` characters."""

    def __str__(self) -> str:
        from mlhpc.text import clip_line

        return clip_line(super().__str__())


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


def error_line(exc: BaseException) -> str:
    """``mlhpc: error: MESSAGE``: ``exc`` as the one line the CLI prints for it: an `OSError` as
    its file name and reason, anything else as its text, each clipped (`mlhpc.text.clip` for a
    file name, `mlhpc.text.clip_line` for the whole) and escaped for a terminal."""
    from mlhpc.text import clip, clip_line, one_line

    if isinstance(exc, OSError) and not isinstance(exc, MlhpcError):
        return f"mlhpc: error: {clip(one_line(exc.filename or ''))}: {clip_line(exc.strerror or exc)}"
    return "mlhpc: error: " + clip_line(exc)


def one_line_errors(os_errors: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator for CLI commands: an `MlhpcError` (and, with ``os_errors``, an `OSError`)
    becomes one line ``mlhpc: error: ...`` on stderr (`error_line`, printed by `mlhpc.text.echo`:
    control characters shown, never sent; credentials masked; no longer than
    `mlhpc.text.MAX_LINE_CHARS`) and the exit status the error carries (``exit_status``, else
    2); anything else keeps its traceback (a bug), an `EOFError` too (click would print
    "Aborted!" for it, the answer to a user's Ctrl-D, with exit status 1)."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            from mlhpc.text import echo

            try:
                return fn(*args, **kwargs)
            except MlhpcError as exc:
                echo(error_line(exc), err=True)
                sys.exit(getattr(exc, "exit_status", 2))
            except OSError as exc:
                if not os_errors:
                    raise
                echo(error_line(exc), err=True)
                sys.exit(2)
            except EOFError as exc:  # a reader's bug, not the user's Ctrl-D: keep its traceback
                raise RuntimeError(f"unexpected end of input ({type(exc).__name__}: {exc})") from exc

        return wrapper

    return decorate
