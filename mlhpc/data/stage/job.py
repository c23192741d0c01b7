"""Staging, the settings every rank works from: `StageOptions` (what the caller asks), `Copy`
(the resolved job), `Convert` (a conversion while staging) and `Counts`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:  # pragma: no cover - typing only
    from mlhpc.data.stage.plan import Shard
    from mlhpc.workload import DataTools


@dataclass(frozen=True)
class Copy:
    """What every rank's copy needs: from where to where, with how many threads, whether chunks
    are read back, this host's name (journal and temporary names) and the manifest's shard."""

    source: Path
    dest: Path
    workers: int
    verify: bool
    host: str
    shard_doc: Optional[dict[str, Any]] = None
    convert: Optional["Convert"] = None  # data.staging.to: convert the data files on the way
    follow_links: bool = False  # read links to files inside the source as their targets


@dataclass
class Convert:
    """A conversion while staging: the workload's `mlhpc.data.formats.DataTools`, the form ``to``
    to write, and ``fmt`` the source's form (``auto`` until planning detects it, or reads it
    from the manifest when the source is gone)."""

    tools: DataTools
    to: str
    fmt: str = "auto"


@dataclass
class Counts:
    staged_files: int = 0
    staged_bytes: int = 0
    copied_files: int = 0
    copied_bytes: int = 0
    skipped_files: int = 0
    pruned_files: int = 0


@dataclass(frozen=True)
class StageOptions:
    """How `mlhpc.data.stage.stage` stages.

    Attributes:
        workers: copy threads per rank (>= 1).
        files: paths relative to the source (absolute paths under it are accepted) to stage
            instead of the whole tree; a path listed twice is refused.
        verify: read every copied chunk back and compare it with the source's bytes; on resume,
            re-hash files already present against the manifest. ``False``: sizes only (the
            manifest still records each source file's XXH3-128 checksum).
        shard: this node's share of a sharded stage (`mlhpc.data.stage.Shard`); ``None``: every
            node stages everything.
        to: ``"none"``: copy; else convert the data files of ``train/`` and ``validation/``
            into this form with ``tools`` instead of copying them.
        tools: the workload's data tools (`mlhpc.data.formats.DataTools`; needed when ``to`` is
            not ``none``).
        follow_links: read a symbolic link to a file inside the source as that file; without it
            every link in the source is refused (a link out of the source always is).
    """

    workers: int = 4
    files: Optional[list[Path]] = None
    verify: bool = True
    shard: Shard | None = None
    to: str = "none"
    tools: DataTools | None = None
    follow_links: bool = False
