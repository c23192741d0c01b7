"""A run's files: the results folder checked before the log is opened, and the side files
written once.

The log is the only source of a run's result (docs/architecture.md, "How a run flows"); the run
writes it and, once at its end, ``measured_N.json``: what a log cannot hold (FLOPs per sample
and the device peak, data-path switches, the staging detail per node, the departures from the
reference, where a resumed run came from). ``summary_N.json`` is the two read back through the
log reader (`mlhpc.log`) as ``mlhpc report`` reads them, by the command once the run has returned
(`mlhpc.run.command.summary_of`).

The files of run N in an output folder are one set (`mlhpc.log.writer.RUN_FILES`), claimed together
through ``result_N.txt`` (created with O_EXCL, `mlhpc.log.writer.open_next_result`, only when no file of
set N exists) and never overwritten (each side file is written once, exclusively, through
`write_text_atomic`): ``result_N.txt`` (the MLLOG), ``measured_N.json``,
``summary_N.json``, ``config_N.yaml`` (the resolved config), ``env_N.json`` (software, hardware,
launcher), ``checkpoint_N.pt`` when the run stopped early or checkpoints periodically, and
``resumed_N.json`` once ``mlhpc run --resume`` has continued that checkpoint.

A resumed run's summary carries ``earlier_attempts_s`` (the timed seconds of the attempts before
it, from its ``resume`` record) and ``time_to_train_total_s`` (its own time to train plus those):
the honest total, never only the time after the resume (see `mlhpc.run.checkpoint` for the rules).

The results folder (``output.dir``) is checked before ``result_N.txt`` is opened
(`check_output_dir`): a folder that is a file, lies under a file, is read-only (permissions or a
read-only mount) or on a full file system is reported as one line (`OutputError`, exit status 2)
with nothing created. `write_text_atomic` writes a side file (summary, config, environment)
through a temporary sibling that is removed when the write fails, so a full disk leaves no 0-byte
temporary file behind.
"""

from __future__ import annotations

import errno
import json
import os
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mlhpc.data.claims import remove_own_part
from mlhpc.data.files import part_path
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
    probe = part_path(path / "mlhpc-probe")  # a killed probe is then known as a temporary file
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
            remove_own_part(probe)
        stats = os.statvfs(path)
        free = stats.f_bavail * stats.f_frsize
        if free < min_free_bytes:
            raise OSError(errno.ENOSPC, f"only {free} bytes free")
    except OSError as exc:
        for folder in reversed(created):  # made empty here, and empty again: rmdir removes nothing else
            with suppress(OSError):
                folder.rmdir()
        detail = exc.strerror if exc.errno == errno.ENOSPC and exc.strerror.startswith("only") else ""
        reason = _reason(exc) + (f" ({detail})" if detail else "")
        raise OutputError(f"{key} {path}: cannot write results ({reason})") from None
    return path


def write_text_atomic(path: Path | str, text: str, exclusive: bool = False) -> None:
    """Write ``text`` (UTF-8) to ``path`` through the project's atomic writer
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


@dataclass(frozen=True)
class RunFiles:
    """The paths of run ``index`` in ``out_dir``."""

    out_dir: Path
    index: str

    @classmethod
    def of_log(cls, log: Path) -> "RunFiles":
        """The set ``result_N.txt`` belongs to."""
        return cls(log.parent, log.name[len("result_"):-len(".txt")])

    def path(self, stem: str, suffix: str) -> Path:
        return self.out_dir / f"{stem}_{self.index}{suffix}"

    @property
    def log(self) -> Path:
        return self.path("result", ".txt")

    @property
    def measured(self) -> Path:
        return self.path("measured", ".json")

    @property
    def summary(self) -> Path:
        return self.path("summary", ".json")

    @property
    def checkpoint(self) -> Path:
        return self.path("checkpoint", ".pt")

    @property
    def config(self) -> Path:
        return self.path("config", ".yaml")

    @property
    def env(self) -> Path:
        return self.path("env", ".json")


@dataclass
class RunResult:
    """What `mlhpc.run.command.run` returns on every rank.

    Attributes:
        status / reason: ``"success"`` or ``"aborted"`` and why (the values logged in
            ``run_stop``; the same on every rank of an instance).
        result_file: the log this rank wrote (None on ranks that write none).
        summary: on the writing rank, `mlhpc.run.command.summary_of` the log and its side
            file (what ``summary_N.json`` holds); empty elsewhere.
        signal: the signal that stopped the run (``"SIGTERM"``; a checkpoint was saved), else
            None; the CLI exits with 128 + its number.
        exit_status: the status every rank of the job exits with, agreed among them
            (`mlhpc.run.outcome.agree`): 0 target reached, 1 not reached (by this or another
            instance), 128 + N stopped by signal N.
        complete: a storage-mode run ran every epoch (`mlhpc.run.outcome.Outcome.complete`).
    """

    status: str
    reason: str | None
    result_file: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    signal: str | None = None
    exit_status: int = 1
    complete: bool = False


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically and exclusively (a side file of a run is
    written once and never replaces a file).

    Raises:
        OutputError: the file exists or cannot be written (nothing half-written is left).
    """
    write_text_atomic(path, json.dumps(obj, indent=2, default=str) + "\n", exclusive=True)


def write_yaml(path: Path, obj: Any) -> None:
    """As `write_json`, as YAML (``config_N.yaml``)."""
    write_text_atomic(path, yaml.safe_dump(obj, sort_keys=False), exclusive=True)
