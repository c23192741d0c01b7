"""The error family of mlhpc.

Every error a user can cause by bad input is one of these. The CLI prints ``str(error)`` as one
line on stderr and exits with status 2 (`error_line`: every error becomes its line there);
anything else escaping is a bug. No message grows with its input: ``str(error)`` is at most
`mlhpc.text.MAX_LINE_CHARS` characters (`mlhpc.text.clip_line`), whatever value it was built
from, and every value the line shows is escaped for a terminal and its credentials masked.

An error that names its subject keeps it as fields (``path``: the file or folder; ``key``: an entry
in it; ``sample``: a sample's index in it; `Where`) and renders its message from them, so that a
caller may re-point the subject (`MlhpcError.repoint`: a file read from a staged copy named by its
source file, `mlhpc.run.assemble.name_source`) without searching the text.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Where:
    """The subject an error names: ``path`` (a file or folder, as given), ``key`` (an entry in
    it) and ``sample`` (a sample's index in it), each None where it has none. ``str``:
    ``PATH[ sample N][: key 'K']``, the head of the error's message."""

    path: Any
    key: Any = None
    sample: Any = None

    def __str__(self) -> str:
        text = f"{self.path}" if self.sample is None else f"{self.path} sample {self.sample}"
        return text if self.key is None else f"{text}: key '{self.key}'"


class MlhpcError(Exception):
    """Base class: a user-facing problem with one clear message naming the file, key or sample.
    Its text (``str``) is one line of at most `mlhpc.text.MAX_LINE_CHARS` characters.

    ``MlhpcError(message)``: the message as given. With ``path`` (and ``key``, ``sample``): the
    message is rendered from the subject (`Where`) and ``message``, the detail after it:
    ``PATH[ sample N][: key 'K']: DETAIL`` (`render`); ``copy``, once `repoint` has set it, is
    the file actually read, shown in brackets after the message."""

    def __init__(self, message: str = "", *, path: Any = None, key: Any = None, sample: Any = None) -> None:
        self.detail = message
        self.where = Where(path, key, sample) if path is not None else None
        self.copy: Any = None
        super().__init__(self.render())

    @classmethod
    def at(cls, where: "Where | str", detail: str) -> "MlhpcError":
        """The error ``WHERE: DETAIL`` of class ``cls``: its subject's fields kept when ``where``
        is a `Where`, the text alone when it is a plain text."""
        if isinstance(where, Where):
            return cls(detail, path=where.path, key=where.key, sample=where.sample)
        return cls(f"{where}: {detail}")

    @property
    def path(self) -> Any:
        """The file or folder the error names (None: it names none as a field)."""
        return self.where.path if self.where is not None else None

    @property
    def key(self) -> Any:
        """The entry of `path` the error names, or None."""
        return self.where.key if self.where is not None else None

    @property
    def sample(self) -> Any:
        """The index of the sample in `path` the error names, or None."""
        return self.where.sample if self.where is not None else None

    def render(self) -> str:
        """The message: the detail alone without a subject, else ``WHERE: DETAIL`` (``WHERE``
        alone for an empty detail), then `` [read from the staged copy COPY]`` once re-pointed."""
        if self.where is None:
            return self.detail
        text = f"{self.where}: {self.detail}" if self.detail else f"{self.where}"
        return text if self.copy is None else f"{text} [read from the staged copy {self.copy}]"

    def repoint(self, path: Any, copy: Any) -> None:
        """Name ``path`` as the subject's file instead (the file ``copy`` was made from), the
        file read (``copy``) in brackets after the message; re-rendered, nothing else changed.

        Raises:
            ValueError: the error names no subject (``path`` None).
        """
        if self.where is None:
            raise ValueError("repoint: the error names no path")
        self.where = Where(path, self.where.key, self.where.sample)
        self.copy = copy
        self.args = (self.render(), *self.args[1:])

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
    """``mlhpc: error: MESSAGE``: ``exc`` as the single line the CLI prints for it: an `OSError` as
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
