"""`mlhpc data convert | prepare | check`: generic drivers over a workload's data tools.

The harness knows no dataset: a workload declares a `DataTools` object (``Workload.data_tools``)
that lists, inspects, converts and prepares its own files, one source file at a time. The drivers
here do what every dataset needs around that: walk ``train/`` and ``validation/``, run files in
parallel (``workers`` processes), resume (a finished source file is recorded in a journal and
skipped on the next run while its outputs are intact; outputs are written under a temporary name
and renamed, so a half-written file never carries its final name), write a manifest (samples,
bytes and XXH3-128 checksum per output file, the checksum `mlhpc.staging` uses) and report
progress through a callback (library code never prints).

Converting the distributed GZIP TFRecords once to an uncompressed form the loader memory-maps is
what a site does before a campaign: NVIDIA's staging inflates the GZIP files on their way to the
node (mlcommons hpc_results_v3.0 cosmoflow ``data/dali_tfr_gzip.py``), since GZIP decoding on a
node's CPUs cannot feed accelerators that consume int16 counts at GB/s.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import xxhash

from mlhpc.errors import DataError

SPLITS = ("train", "validation")
MANIFEST = "manifest.json"
JOURNAL = ".mlhpc-data-journal.jsonl"
ProgressFn = Callable[[dict[str, Any]], None]


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
        root_files: names of files at the dataset root that are copied unchanged (e.g. DeepCAM's
            ``stats.h5``).
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


@contextmanager
def atomic_output(final: Path) -> Iterator[Path]:
    """A temporary path beside ``final`` to write; renamed to ``final`` when the block succeeds,
    removed when it fails, so a half-written file never carries the final name."""
    final = Path(final)
    tmp = final.with_name(f".{final.name}.part{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, final)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def checksum(path: Path) -> str:
    """XXH3-128 hex digest of a file (the checksum `mlhpc.staging` records)."""
    digest = xxhash.xxh3_128()
    with open(path, "rb") as handle:
        while chunk := handle.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# ------------------------------------------------------------------------------------ check


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
    try:
        return path, tools.check_file(path, fmt, full)
    except DataError as exc:
        return path, str(exc)


def _pool(workers: int) -> ProcessPoolExecutor | None:
    if workers <= 1:
        return None
    import multiprocessing

    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork"))


def _run_all(fn: Callable[..., Any], jobs: list[tuple[Any, ...]], workers: int) -> Iterator[Any]:
    """``fn(*job)`` for every job, in completion order, in ``workers`` processes (1: here)."""
    pool = _pool(workers)
    if pool is None:
        for job in jobs:
            yield fn(*job)
        return
    with pool:
        futures = [pool.submit(fn, *job) for job in jobs]
        try:
            for future in as_completed(futures):
                yield future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def _splits(root: Path) -> list[str]:
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{root}: dataset folder does not exist")
    missing = [s for s in SPLITS if not (root / s).is_dir()]
    if missing:
        raise DataError(f"{root}: no {missing[0]}/ folder; a dataset folder holds train/ and "
                        f"validation/")
    return list(SPLITS)


def detect(tools: DataTools, root: Path, fmt: str = "auto") -> str:
    """The form of a dataset folder (both splits must agree). Raises DataError."""
    if fmt != "auto":
        if fmt not in tools.formats:
            raise DataError(f"--format {fmt!r}: expected one of {', '.join(tools.formats)}")
        return fmt
    found = {split: tools.detect(Path(root) / split) for split in _splits(root)}
    if len(set(found.values())) > 1:
        raise DataError(f"{root}: train/ holds {found['train']} files, validation/ "
                        f"{found['validation']}; convert one of them")
    return found["train"]


def check(workload: Any, root: Path, *, full: bool = False, fmt: str = "auto", workers: int = 1,
          on_progress: ProgressFn | None = None) -> CheckReport:
    """Read every file's metadata (``full``: every sample, values checked) under ``root/train``
    and ``root/validation``; bad files are collected, not raised.

    Raises:
        DataError: the folder or a split is missing, its form cannot be told, or a split is empty.
    """
    tools = tools_of(workload)
    root = Path(root)
    form = detect(tools, root, fmt)
    progress = on_progress or (lambda event: None)
    report = CheckReport(str(root), form, full, {})
    jobs = []
    for split in SPLITS:
        files = tools.list_files(root / split, form)
        if not files:
            raise DataError(f"{root / split}: no {form} files (an empty split)")
        report.splits[split] = SplitReport()
        jobs += [(tools, path, form, full) for path in files]
    progress({"kind": "start", "what": "check", "files": len(jobs)})
    for done, (path, found) in enumerate(_run_all(_check_one, jobs, workers), 1):
        split = report.splits[path.parent.name if path.parent.name in SPLITS else "train"]
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


# ---------------------------------------------------------------------------------- convert


@dataclass
class ConvertResult:
    """What `convert` / `prepare` did. Bytes are the sizes of the files read and written."""

    dest: str
    to: str
    source_files: int
    skipped_files: int
    output_files: int
    samples: int
    bytes_read: int
    bytes_written: int
    seconds: float

    @property
    def gb_per_s(self) -> float:
        """Bytes read per second, in GB (1e9)."""
        return self.bytes_read / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "gb_per_s": self.gb_per_s}


def _describe(path: Path, root: Path, samples: int) -> dict[str, Any]:
    return {"path": str(path.relative_to(root)), "bytes": path.stat().st_size,
            "xxh3_128": checksum(path), "samples": samples}


@dataclass(frozen=True)
class _Writing:
    """What a convert or prepare writes: from form ``fmt`` (``"raw"`` for prepare) to form ``to``
    under ``dest``; ``prepare_size`` > 0 cuts raw files into samples of that size per side."""

    tools: DataTools
    fmt: str
    to: str
    dest: Path
    what: str  # "convert" or "prepare", for progress events
    prepare_size: int = 0


def _convert_one(writing: _Writing, rel: str, source: Path, out_dir: Path) -> dict[str, Any]:
    if writing.prepare_size:
        outputs = writing.tools.prepare_file(source, out_dir, writing.to, writing.prepare_size)
    else:
        outputs = writing.tools.convert_file(source, writing.fmt, out_dir, writing.to)
    described = [_describe(p, writing.dest, n) for p, n in outputs]
    return {"source": rel, "source_bytes": source.stat().st_size, "outputs": described}


def _journal(dest: Path) -> dict[str, dict[str, Any]]:
    """Finished sources recorded by earlier runs whose outputs are still intact (same size)."""
    path = dest / JOURNAL
    done: dict[str, dict[str, Any]] = {}
    if not path.is_file():
        return done
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill: that source is redone
        if all((dest / o["path"]).is_file() and (dest / o["path"]).stat().st_size == o["bytes"]
               for o in entry.get("outputs", [])):
            done[entry["source"]] = entry
    return done


def _drive(writing: _Writing, jobs: list[tuple[str, Path, Path]], workers: int,
           progress: ProgressFn) -> ConvertResult:
    """Run ``jobs`` (relative source name, source path, output folder), resumably."""
    tools, fmt, dest, to = writing.tools, writing.fmt, writing.dest, writing.to
    start = time.perf_counter()
    dest.mkdir(parents=True, exist_ok=True)
    done = _journal(dest)
    todo = [(rel, src, out) for rel, src, out in jobs if rel not in done]
    progress({"kind": "start", "what": writing.what, "files": len(jobs), "skipped": len(jobs) - len(todo)})
    bytes_read = bytes_written = 0
    with open(dest / JOURNAL, "a") as journal:
        work = [(writing, rel, src, out) for rel, src, out in todo]
        for count, entry in enumerate(_run_all(_convert_one, work, workers), 1):
            journal.write(json.dumps(entry) + "\n")
            journal.flush()
            done[entry["source"]] = entry
            bytes_read += entry["source_bytes"]
            bytes_written += sum(o["bytes"] for o in entry["outputs"])
            progress({"kind": "file", "done": count + len(jobs) - len(todo), "files": len(jobs),
                      "bytes_read": bytes_read, "bytes_written": bytes_written,
                      "path": entry["source"]})
    extra = []
    for split in sorted({out for _, _, out in jobs}):
        extra += tools.finish_split(split, to)
    outputs = [o for entry in done.values() for o in entry["outputs"]]
    outputs += [_describe(p, dest, 0) for p in extra]
    manifest = {"to": to, "from": fmt, "source_files": len(jobs),
                "samples": sum(o["samples"] for o in outputs),
                "bytes": sum(o["bytes"] for o in outputs),
                "files": {o["path"]: {k: o[k] for k in ("bytes", "xxh3_128", "samples")}
                          for o in sorted(outputs, key=lambda o: o["path"])}}
    with atomic_output(dest / MANIFEST) as tmp:
        tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    seconds = time.perf_counter() - start
    result = ConvertResult(str(dest), to, len(jobs), len(jobs) - len(todo), len(outputs),
                           manifest["samples"], bytes_read, bytes_written, seconds)
    progress({"kind": "done", **result.to_dict()})
    return result


def convert(workload: Any, src: Path, dst: Path, to: str, *, fmt: str = "auto",  # `data convert`'s options
            workers: int = 1, on_progress: ProgressFn | None = None) -> ConvertResult:
    """Convert the dataset at ``src`` (train/ and validation/) into form ``to`` under ``dst``.

    Lossless: the readers give bit-identical samples from ``src`` and ``dst``. Root files the
    workload names (``root_files``) are copied. A second run skips the source files finished by
    the first (resumable).

    Raises:
        DataError: bad source (named file and record), an unknown form, or ``dst`` inside ``src``.
    """
    tools = tools_of(workload)
    src, dst = Path(src), Path(dst)
    if to not in tools.convert_to:
        raise DataError(f"--to {to!r}: expected one of {', '.join(tools.convert_to)}")
    if dst.resolve() == src.resolve() or src.resolve() in dst.resolve().parents:
        raise DataError(f"{dst}: destination inside the source folder {src}; choose another")
    form = detect(tools, src, fmt)
    jobs = []
    for split in SPLITS:
        files = tools.list_files(src / split, form)
        if not files:
            raise DataError(f"{src / split}: no {form} files (an empty split)")
        (dst / split).mkdir(parents=True, exist_ok=True)
        jobs += [(f"{split}/{p.name}", p, dst / split) for p in files]
    for name in tools.root_files:
        if (src / name).is_file():
            dst.mkdir(parents=True, exist_ok=True)
            with atomic_output(dst / name) as tmp:
                shutil.copyfile(src / name, tmp)
    return _drive(_Writing(tools, form, to, dst, "convert"), jobs, workers, on_progress or (lambda e: None))


def prepare(workload: Any, raw_dir: Path, dst: Path, to: str, *, workers: int = 1,  # `data prepare`'s options
            sample_size: int = 128, validation_fraction: float = 0.1111,
            on_progress: ProgressFn | None = None) -> ConvertResult:
    """The reference's preparation step (mlcommons/hpc ``cosmoflow/prepare.py``): each raw file
    under ``raw_dir`` split into samples of ``sample_size`` per side, written in form ``to``.

    Whole raw files go to one split: the last ``ceil(n * validation_fraction)`` (at least one
    when there are two or more) in name order to ``validation/``, the rest to ``train/``.

    Raises:
        DataError: no raw files, a malformed one (named), a size that does not divide it.
    """
    tools = tools_of(workload)
    raw_dir, dst = Path(raw_dir), Path(dst)
    if to not in tools.convert_to:
        raise DataError(f"--to {to!r}: expected one of {', '.join(tools.convert_to)}")
    if not 0 <= validation_fraction < 1:
        raise DataError(f"--validation-fraction {validation_fraction}: expected 0 <= f < 1")
    raw = tools.list_raw(raw_dir)
    if not raw:
        raise DataError(f"{raw_dir}: no raw files to prepare")
    import math

    n_valid = math.ceil(len(raw) * validation_fraction) if len(raw) > 1 else 0
    n_valid = min(max(n_valid, 1 if len(raw) > 1 and validation_fraction > 0 else 0), len(raw) - 1)
    jobs = []
    for i, path in enumerate(raw):
        split = "validation" if i >= len(raw) - n_valid else "train"
        (dst / split).mkdir(parents=True, exist_ok=True)
        jobs.append((f"{split}/{path.name}", path, dst / split))
    return _drive(_Writing(tools, "raw", to, dst, "prepare", prepare_size=sample_size), jobs, workers,
                  on_progress or (lambda e: None))
