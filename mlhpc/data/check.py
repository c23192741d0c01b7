"""`mlhpc data check`: every file of a dataset folder read and verified, bad files collected.

What each depth verifies (the same words as ``mlhpc data check --help``):

quick (default)
    the folder is a complete dataset (no unfinished mlhpc output), every split folder exists and
    holds files of one form; per file what costs no more than reading its headers and its record
    framing: the file opens in its format, the sample count, each sample's stored shape and dtype
    agree with the rest of the split, record framing and stored checksums where the format has
    them (TFRecord length and CRC words, HDF5 dataset headers, LMDB entry counts); no file
    listed twice.
full (``--full``)
    additionally every sample decoded and its values checked (finite, in range, labels valid).

The per-file work is the workload's (`mlhpc.workload.DataTools.check_file`); the driver runs
files in parallel processes (`mlhpc.data.pool`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlhpc.data.formats import DataTools, detect, list_split, split_dirs, tools_of
from mlhpc.data.pool import run_all
from mlhpc.errors import DataError
from mlhpc.text import clip, one_line

ProgressFn = Any  # Callable[[dict[str, Any]], None]


@dataclass
class SplitReport:
    """One split of a checked dataset: files, samples, stored sample shape and dtype, bytes,
    and ``bad`` one message per bad file."""

    files: int = 0
    samples: int = 0
    sample_shape: tuple[int, ...] | None = None
    dtype: str | None = None
    bytes: int = 0
    bad: list[str] = field(default_factory=list)


@dataclass
class CheckReport:
    """`check`'s answer: the form found and a `SplitReport` per split; ``ok`` when no bad file."""

    path: str
    format: str
    full: bool
    splits: dict[str, SplitReport]

    @property
    def ok(self) -> bool:
        return not any(s.bad for s in self.splits.values())

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "format": self.format, "full": self.full, "ok": self.ok,
                "splits": {k: asdict(v) for k, v in self.splits.items()}}


def _check_one(tools: DataTools, path: Path, fmt: str, full: bool) -> tuple[Path, Any]:
    """``(path, FileCheck)``, or ``(path, message)`` for a bad file: a reader's failure of any
    kind (a truncated file can surface as OSError, ValueError or EOFError from the format's
    library) is the file's fault, reported with its name, never a traceback."""
    try:
        return path, tools.check_file(path, fmt, full)
    except DataError as exc:
        return path, str(exc)
    except (OSError, ValueError, EOFError, KeyError, IndexError, RuntimeError) as exc:
        return path, f"{path}: unreadable ({type(exc).__name__}: {clip(one_line(exc))})"


def _listed(tools: DataTools, root: Path, form: str, report: CheckReport) -> dict[Path, str]:
    """Each data file of every split -> its split, in listing order; a file listed twice (a file
    list naming it twice would train on it twice an epoch) is a bad file of its split.

    Raises:
        DataError: a split holds no file.
    """
    split_of: dict[Path, str] = {}
    for split in split_dirs(tools, root):
        files = list_split(tools, root, split, form)
        report.splits[split] = SplitReport()
        for path in files:
            if path in split_of:
                report.splits[split].bad.append(f"{path}: listed twice (each datum must appear "
                                                "exactly once per epoch)")
            split_of[path] = split
    return split_of


def _count(split: SplitReport, path: Path, found: Any) -> None:
    """Add one file's `FileCheck` (or its bad-file message) to its split's report."""
    split.files += 1
    if isinstance(found, str):
        split.bad.append(found)
        return
    split.samples += found.samples
    split.bytes += found.bytes
    if split.sample_shape is None:
        split.sample_shape, split.dtype = tuple(found.sample_shape), found.dtype
    elif (tuple(found.sample_shape), found.dtype) != (split.sample_shape, split.dtype):
        split.bad.append(f"{path}: samples of shape {tuple(found.sample_shape)} "
                         f"{found.dtype}; expected {split.sample_shape} {split.dtype} "
                         f"like the rest of the split")


def resembles(workload: Any, root: Path, others: list[Any] | None = None) -> str | None:
    """The name of the first workload among ``others`` (default: every registered one but
    ``workload``) whose data tools recognise ``root``: its split folders are there, their form
    is detected, and the first file of each passes its quick check. None when none does.
    Used to say "this folder holds another workload's data" instead of one error per file."""
    if others is None:
        from mlhpc.errors import ConfigError
        from mlhpc.workload import get, names

        others = []
        for name in names():
            try:
                others.append(get(name))
            except ConfigError:  # a broken entry point recognises nothing
                continue
    for other in others:
        tools = other.data_tools
        if tools is None or other.name == workload.name:
            continue
        try:
            form = detect(tools, root)
            firsts = [list_split(tools, root, split, form)[0] for split in split_dirs(tools, root)]
        except (DataError, OSError, ValueError):
            continue
        if not any(isinstance(_check_one(tools, path, form, False)[1], str) for path in firsts):
            return other.name
    return None


def _not_theirs(workload: Any, root: Path) -> None:
    """Raises DataError (one line) when ``root`` holds another workload's data (`resembles`)."""
    found = resembles(workload, root)
    if found is not None:
        raise DataError(f"{root} looks like {found} data, not {workload.name}: try mlhpc data "
                        f"check {found} {root}")


def check(workload: Any, root: Path, *, full: bool = False, fmt: str = "auto", workers: int = 1,
          on_progress: ProgressFn | None = None) -> CheckReport:
    """Verify every file under the split folders of ``root`` at the depth ``full`` asks (see the
    module docstring); bad files are collected in the report, not raised.

    A folder that ``workload``'s tools cannot read (no split or form found, the first file of
    every split bad, or most files bad) but another registered workload's can (`resembles`) is
    one error naming that workload.

    Raises:
        DataError: the folder or a split is missing, its form cannot be told, a split is empty,
            or it holds another workload's data.
    """
    tools = tools_of(workload)
    root = Path(root)
    progress = on_progress or (lambda event: None)
    try:
        form = detect(tools, root, fmt)
        report = CheckReport(str(root), form, full, {})
        split_of = _listed(tools, root, form, report)
    except DataError:
        _not_theirs(workload, root)
        raise
    firsts = {split: path for path, split in reversed(split_of.items())}
    asked = all(isinstance(_check_one(tools, p, form, False)[1], str) for p in firsts.values())
    if asked:  # every split's first file bad: another workload's data? (asked once per check)
        _not_theirs(workload, root)
    jobs = [(tools, path, form, full) for path in split_of]
    progress({"kind": "start", "what": "check", "files": len(jobs)})
    for done, (path, found) in enumerate(run_all(_check_one, jobs, workers), 1):
        _count(report.splits[split_of[path]], path, found)
        progress({"kind": "file", "done": done, "files": len(jobs), "path": str(path)})
    if not asked and 2 * sum(len(split.bad) for split in report.splits.values()) > len(jobs):
        _not_theirs(workload, root)
    for split in report.splits.values():
        split.bad.sort()
    return report


