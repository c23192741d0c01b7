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

The per-file work is the workload's (`mlhpc.data.formats.DataTools.check_file`); the driver runs
files in parallel processes (`mlhpc.data.pool`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlhpc.data.formats import DataTools, detect, list_split, split_dirs, tools_of
from mlhpc.data.pool import run_all
from mlhpc.errors import DataError

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
        return path, f"{path}: unreadable ({type(exc).__name__}: {exc})"


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


def check(workload: Any, root: Path, *, full: bool = False, fmt: str = "auto", workers: int = 1,
          on_progress: ProgressFn | None = None) -> CheckReport:
    """Verify every file under the split folders of ``root`` at the depth ``full`` asks (see the
    module docstring); bad files are collected in the report, not raised.

    Raises:
        DataError: the folder or a split is missing, its form cannot be told, or a split is empty.
    """
    tools = tools_of(workload)
    root = Path(root)
    form = detect(tools, root, fmt)
    progress = on_progress or (lambda event: None)
    report = CheckReport(str(root), form, full, {})
    split_of = _listed(tools, root, form, report)
    jobs = [(tools, path, form, full) for path in split_of]
    progress({"kind": "start", "what": "check", "files": len(jobs)})
    for done, (path, found) in enumerate(run_all(_check_one, jobs, workers), 1):
        split = report.splits[split_of[path]]
        split.files += 1
        if isinstance(found, str):
            split.bad.append(found)
        else:
            split.samples += found.samples
            split.bytes += found.bytes
            if split.sample_shape is None:
                split.sample_shape, split.dtype = tuple(found.sample_shape), found.dtype
            elif (tuple(found.sample_shape), found.dtype) != (split.sample_shape, split.dtype):
                split.bad.append(f"{path}: samples of shape {tuple(found.sample_shape)} "
                                 f"{found.dtype}; expected {split.sample_shape} {split.dtype} "
                                 f"like the rest of the split")
        progress({"kind": "file", "done": done, "files": len(jobs), "path": str(path)})
    for split in report.splits.values():
        split.bad.sort()
    return report


