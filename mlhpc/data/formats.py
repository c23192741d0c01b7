"""A workload's data formats, as the harness sees them: the `DataTools` protocol and detection.

The harness names no format: a workload declares a `DataTools` object (``Workload.data_tools``)
that recognises, lists, checks, converts and prepares its own files, one file at a time, and the
drivers (`mlhpc.data.check`, `mlhpc.data.convert`, `mlhpc.data.stage`) do what every dataset
needs around that. A dataset folder holds one folder per split; the split names come from the
tools (``splits``, default ``("train", "validation")``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from mlhpc.errors import DataError

SPLITS = ("train", "validation")


def splits_of(tools: Any) -> tuple[str, ...]:
    """The split folder names of a workload's data tools (``tools.splits``, default `SPLITS`;
    ``tools`` may be None)."""
    return tuple(getattr(tools, "splits", SPLITS) or SPLITS)


@dataclass(frozen=True)
class FileCheck:
    """What `DataTools.check_file` found in one file: sample count, one sample's shape and
    dtype (as stored), and the file's size in bytes."""

    samples: int
    sample_shape: tuple[int, ...]
    dtype: str
    bytes: int


class DataTools(Protocol):
    """A workload's data tools (``Workload.data_tools``). Every method raises DataError naming
    the file (and record or sample) on bad input. `convert_file` and `prepare_file` write their
    outputs through `atomic_output` and return ``(path, samples)`` for each; `finish_split` writes
    what a split needs once all its files are done (e.g. file lists) and returns the paths.

    Attributes:
        formats: the forms its reader accepts (``data.format`` values besides ``auto``).
        convert_to: the forms `convert_file` writes.
        root_files: names of files at the dataset root that are copied unchanged (e.g. a
            normalisation statistics file).
        splits: (optional) the split folder names it writes, default ``("train", "validation")``.
        find_splits: (optional) ``root -> split folder names`` of a dataset that names its
            folders its own way (the real OC20 data: ``train``, ``val_id``); default ``splits``.
    """

    formats: tuple[str, ...]
    convert_to: tuple[str, ...]
    root_files: tuple[str, ...]

    def detect(self, split_dir: Path) -> str: ...

    def list_files(self, split_dir: Path, fmt: str) -> list[Path]: ...

    def check_file(self, path: Path, fmt: str, full: bool) -> FileCheck: ...

    def convert_file(self, path: Path, fmt: str, out_dir: Path, to: str
                     ) -> list[tuple[Path, int]]: ...

    def finish_split(self, out_dir: Path, to: str) -> list[Path]: ...

    def list_raw(self, raw_dir: Path) -> list[Path]: ...

    def prepare_file(self, path: Path, out_dir: Path, to: str, sample_size: int
                     ) -> list[tuple[Path, int]]: ...


def tools_of(workload: Any) -> DataTools:
    """The workload's data tools. Raises DataError when it declares none."""
    tools = getattr(workload, "data_tools", None)
    if tools is None:
        raise DataError(f"workload {workload.name!r} declares no data tools (Workload.data_tools); "
                        f"mlhpc data convert/prepare/check cannot read its files")
    return tools


def split_dirs(tools: Any, root: Path) -> list[str]:
    """The split folders of the dataset at ``root`` (`splits_of`), each checked to exist.

    Raises:
        DataError: ``root`` or one of its split folders is missing, or ``root`` is an unfinished
            output of mlhpc (`mlhpc.data.manifest.require_complete`).
    """
    from mlhpc.data.manifest import require_complete

    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{root}: dataset folder does not exist")
    require_complete(root)
    finder = getattr(tools, "find_splits", None)
    names = tuple(finder(root)) if callable(finder) else splits_of(tools)
    missing = [s for s in names if not (root / s).is_dir()]
    if missing:
        raise DataError(f"{root}: no {missing[0]}/ folder; a dataset folder holds "
                        f"{' and '.join(n + '/' for n in names)}")
    return list(names)


def detect(tools: DataTools, root: Path, fmt: str = "auto") -> str:
    """The form of a dataset folder (every split must agree).

    Raises:
        DataError: ``fmt`` is not one of the workload's forms, the splits disagree, or as
            `split_dirs`.
    """
    if fmt != "auto":
        if fmt not in tools.formats:
            raise DataError(f"--format {fmt!r}: expected one of {', '.join(tools.formats)}")
        return fmt
    found = {split: tools.detect(Path(root) / split) for split in split_dirs(tools, root)}
    if len(set(found.values())) > 1:
        described = ", ".join(f"{k}/ holds {v} files" for k, v in found.items())
        raise DataError(f"{root}: {described}; convert one of them")
    return next(iter(found.values()))


def list_split(tools: Any, root: Path, split: str, form: str) -> list[Path]:
    """The data files of ``root/split`` as the workload lists them, none of them reached through
    a symbolic link (a link in a dataset could point at any file on the node, which a convert
    would copy into its output).

    Raises:
        DataError: the split holds no file of ``form``, or a listed file is a link or lies
            below one (named).
    """
    from mlhpc.data.files import is_under, resolved

    folder = Path(root) / split
    files = tools.list_files(folder, form)
    if not files:
        raise DataError(f"{folder}: no {form} files (an empty split)")
    top = resolved(root)
    for path in files:
        if Path(path).is_symlink() or not is_under(resolved(path), top):
            raise DataError(f"{path}: a symbolic link in the dataset (to {resolved(path)}); data "
                            "files are never read through links")
    return files
