"""A workload's data formats, as the harness sees them: detection and listing through the
workload's `mlhpc.workload.DataTools`.

The harness names no format: a workload declares a `DataTools` object (``Workload.data_tools``)
that recognises, lists, checks, converts and prepares its own files, one file at a time, and the
drivers (`mlhpc.data.check`, `mlhpc.data.convert`, `mlhpc.data.stage`) do what every dataset
needs around that. A dataset folder holds one folder per split; the split names come from the
tools (``splits``, ``find_splits``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mlhpc.errors import DataError
from mlhpc.workload import DataTools, FileCheck

if TYPE_CHECKING:  # pragma: no cover - typing only
    from mlhpc.workload import Workload

__all__ = ["DataTools", "FileCheck", "SPLITS", "detect", "list_split", "split_dirs", "splits_of",
           "tools_of"]

SPLITS = DataTools.splits


def splits_of(tools: DataTools | None) -> tuple[str, ...]:
    """The split folder names of a workload's data tools (`SPLITS` when it declares none)."""
    return SPLITS if tools is None else tools.splits


def tools_of(workload: "Workload") -> DataTools:
    """The workload's data tools. Raises DataError when it declares none."""
    return workload.tools()


def split_dirs(tools: DataTools, root: Path) -> list[str]:
    """The split folders of the dataset at ``root`` (`splits_of`), each checked to exist.

    Raises:
        DataError: ``root`` or one of its split folders is missing, or ``root`` is an unfinished
            output of mlhpc (`mlhpc.data.manifest.require_complete`).
    """
    from mlhpc.data.manifest import require_complete

    root = Path(root)
    if not root.is_dir():
        raise DataError("dataset folder does not exist", path=root)
    require_complete(root)
    names = tuple(tools.find_splits(root))
    missing = [s for s in names if not (root / s).is_dir()]
    if missing:
        raise DataError(f"no {missing[0]}/ folder; a dataset folder holds "
                        f"{' and '.join(n + '/' for n in names)}", path=root)
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
        raise DataError(f"{described}; convert one of them", path=root)
    return next(iter(found.values()))


def list_split(tools: DataTools, root: Path, split: str, form: str) -> list[Path]:
    """The data files of ``root/split`` as the workload lists them, none of them reached through
    a symbolic link (a link in a dataset could point at any file on the node, which a convert
    would copy into its output).

    Raises:
        DataError: the split holds no file of ``form``, or a listed file is a link or lies
            below one (named).
    """
    from mlhpc.data.trees import is_under, resolved

    folder = Path(root) / split
    files = tools.list_files(folder, form)
    if not files:
        raise DataError(f"no {form} files (an empty split)", path=folder)
    top = resolved(root)
    for path in files:
        if Path(path).is_symlink() or not is_under(resolved(path), top):
            raise DataError(f"a symbolic link in the dataset (to {resolved(path)}); data "
                            "files are never read through links", path=path)
    return files
