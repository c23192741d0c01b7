"""`mlhpc data convert | prepare`: the conversion driver over a workload's data tools.

The harness knows no dataset: the workload's `mlhpc.data.formats.DataTools` converts or prepares
one source file at a time. This driver does what every dataset needs around that: walk the
split folders, run files in parallel (`mlhpc.data.pool`, processes), resume (a finished source
is journalled, in the same conversion journal staging keeps, and skipped on the next run
while it is the same file and its outputs are intact), write every output
atomically (`mlhpc.data.files.atomic_output`) and close the folder with its manifest, written
last (`mlhpc.data.manifest`): a folder without one is unfinished, and `data check`, `stage` and
`run` refuse it.

Converting the distributed GZIP TFRecords once to an uncompressed form the loader memory-maps is
what a site does before a campaign: NVIDIA's staging inflates the GZIP files on their way to the
node (mlcommons hpc_results_v3.0 cosmoflow ``data/dali_tfr_gzip.py``), since GZIP decoding on a
node's CPUs cannot feed accelerators that consume int16 counts at GB/s.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlhpc.data import manifest
from mlhpc.data.files import (
    atomic_output,
    common_mode,
    copy_mode,
    disk_full,
    output_mode,
    reason,
)
from mlhpc.data.formats import (
    DataTools,
    detect,
    list_split,
    split_dirs,
    tools_of,
)
from mlhpc.data.pool import run_all
from mlhpc.data.trees import check_no_links, make_private_dir, refuse_overlap, resolved
from mlhpc.errors import DataError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from pydantic import BaseModel

ProgressFn = Callable[[dict[str, Any]], None]
#: The workload's prepare options as given: ``KEY=VALUE`` strings, or a mapping of key to value.
PrepareValues = Sequence[str] | Mapping[str, object]


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


@dataclass(frozen=True)
class _Writing:
    """What a convert or prepare writes: from form ``fmt`` (``"raw"`` for prepare) to form ``to``
    under ``dest``; ``prepare`` (the workload's prepare options) makes samples of raw files."""

    tools: DataTools
    fmt: str
    to: str
    dest: Path
    what: str  # "convert" or "prepare": the manifest's kind and the progress events' name
    source: Path  # the folder read (the dataset, or the raw files' folder)
    prepare: BaseModel | None = None


def _describe(path: Path, root: Path, samples: int, source: str | None, mode: int) -> dict[str, Any]:
    """The manifest entry of an output just written (`mlhpc.data.manifest.describe_output`:
    its bits narrowed to ``mode``). Raises DataError when it lies outside ``root``; OSError."""
    try:
        return {**manifest.describe_output(root, path, samples, mode), "from": source}
    except ValueError:
        raise DataError(f"{path}: the converter of {source} wrote outside the output folder {root}") from None


def _convert_one(writing: _Writing, rel: str, source: Path, out_dir: Path) -> dict[str, Any]:
    """Convert one source file; its journal entry. Its outputs get the source's permission bits
    at most (`mlhpc.data.files.output_mode`). OSErrors become DataError naming the file."""
    try:
        check_no_links(writing.dest, out_dir)
        st = source.stat()  # before it is read: a source rewritten since is converted again
        mode = copy_mode(st.st_mode)
        with output_mode(mode):
            if writing.prepare is not None:
                outputs = writing.tools.prepare_file(source, out_dir, writing.to, writing.prepare)
            else:
                outputs = writing.tools.convert_file(source, writing.fmt, out_dir, writing.to)
        described = [_describe(p, writing.dest, n, rel, mode) for p, n in outputs]
        conversion = manifest.Conversion(writing.source, writing.what, writing.to)
        return conversion.entry(rel, st.st_size, manifest.stat_identity(st), described)
    except OSError as exc:
        where = exc.filename or out_dir
        short = exc.errno in (None, errno.EIO) and disk_full(out_dir)  # a short write, no errno
        raise DataError(f"{where}: cannot write output ({'no space left on device' if short else reason(exc)}; "
                        f"converting {source}); fix the cause and run the command again to resume") from None


def _finished(writing: _Writing, jobs: list[tuple[str, Path, Path]]) -> dict[str, dict[str, Any]]:
    """The sources of ``jobs`` an earlier run finished (the conversion journal,
    `mlhpc.data.manifest.read_convert_state`) and that may be reused by its rule
    (`mlhpc.data.manifest.conversion_reusable`: the same source file, its outputs intact)."""
    known = manifest.read_convert_state(writing.dest, writing.source, writing.to, writing.what)
    done: dict[str, dict[str, Any]] = {}
    for rel, src, _out in jobs:
        try:
            st = os.stat(src)
        except OSError:
            continue  # converting it names the cause
        if manifest.conversion_reusable(writing.dest, known.get(rel), st.st_size,
                                        manifest.stat_identity(st)):
            done[rel] = known[rel]
    return done


def _drive(writing: _Writing, jobs: list[tuple[str, Path, Path]], workers: int,
           progress: ProgressFn) -> ConvertResult:
    """Run ``jobs`` (relative source name, source path, output folder), resumably, then close
    the folder with its manifest."""
    dest = writing.dest
    start = time.perf_counter()
    done = _finished(writing, jobs)
    todo = [(writing, rel, src, out) for rel, src, out in jobs if rel not in done]
    progress({"kind": "start", "what": writing.what, "files": len(jobs), "skipped": len(jobs) - len(todo)})
    bytes_read = bytes_written = 0
    journal = manifest.Journal(dest, socket.gethostname(), DataError)
    try:
        for count, entry in enumerate(run_all(_convert_one, todo, workers), 1):
            journal.add(entry)
            done[entry["path"]] = entry
            bytes_read += entry["bytes"]
            bytes_written += sum(o["bytes"] for o in entry["outputs"])
            progress({"kind": "file", "done": count + len(jobs) - len(todo), "files": len(jobs),
                      "bytes_read": bytes_read, "bytes_written": bytes_written, "path": entry["path"]})
    finally:
        journal.close()
    doc = _close(writing, jobs, done)
    result = ConvertResult(str(dest), writing.to, len(jobs), len(jobs) - len(todo), len(doc["files"]),
                           doc["samples"], bytes_read, bytes_written, time.perf_counter() - start)
    progress({"kind": "done", **result.to_dict()})
    return result


def _close(writing: _Writing, jobs: list[tuple[str, Path, Path]],
           done: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The split files (``finish_split``) and the manifest, written last; the journals dropped.
    Each gets the permission bits all the sources it speaks for share (`common_mode`)."""
    dest = writing.dest
    try:
        files = [o for entry in done.values() for o in entry["outputs"]]
        for split in sorted({out for _, _, out in jobs}):
            mode = common_mode([src for _, src, out in jobs if out == split])
            with output_mode(mode):
                extra = writing.tools.finish_split(split, writing.to)
            files += [_describe(p, dest, 0, None, mode) for p in extra]
        with output_mode(common_mode([src for _, src, _ in jobs])):
            doc = manifest.write(dest, writing.what, files, {
                "to": writing.to, "source_files": len(jobs), "source": str(resolved(writing.source)),
                "sources": manifest.source_records(done, [rel for rel, _, _ in jobs]), "from": writing.fmt})
    except OSError as exc:
        raise DataError(f"{exc.filename or dest}: cannot finish the output folder ({reason(exc)}); "
                        "the folder stays unfinished: run the command again to resume") from None
    manifest.drop_journals(dest)
    return doc


def _output_root(src: Path, dst: Path, what: str) -> None:
    """Check ``dst`` for a convert or prepare from ``src`` and create it (``0700``), with the
    destination check every command shares (`mlhpc.data.trees.make_private_dir`).

    Raises:
        DataError: ``dst`` and ``src`` contain each other; ``dst`` is a link, a file, owned by
            another user or writable by group or others (naming owner and mode); it cannot be
            created.
    """
    refuse_overlap(src, dst, what, DataError)
    make_private_dir(dst, DataError, f"{what} output")


def _make_split(dst: Path, split: str) -> Path:
    """``dst/split``, created (never through a link). Raises DataError."""
    try:
        (dst / split).mkdir(exist_ok=True)
        check_no_links(dst, dst / split)
    except OSError as exc:
        raise DataError(f"{dst / split}: cannot create output folder ({reason(exc)})") from None
    return dst / split


@dataclass(frozen=True)
class ConvertOptions:
    """How `convert` and `prepare` run.

    Attributes:
        fmt: the source's form (``auto``: detected; convert only).
        workers: processes converting files in parallel (1: here).
        on_progress: called with progress events (library code never prints).
        prepare_options: the workload's prepare options (prepare only): ``KEY=VALUE`` strings or
            a mapping, validated by its `mlhpc.workload.DataTools.prepare_options` model.
    """

    fmt: str = "auto"
    workers: int = 1
    on_progress: ProgressFn | None = None
    prepare_options: PrepareValues = ()

    def progress(self) -> ProgressFn:
        return self.on_progress or (lambda event: None)


def convert(workload: Any, src: Path, dst: Path, to: str,
            options: ConvertOptions = ConvertOptions()) -> ConvertResult:
    """Convert the dataset at ``src`` (its split folders) into form ``to`` under ``dst``.

    Lossless: the readers give bit-identical samples from ``src`` and ``dst``. Root files the
    workload names (``root_files``) are copied. A second run skips the source files finished by
    the first (resumable); the manifest is written last. ``options``: how it runs (the source's
    form, workers, progress).

    Raises:
        DataError: bad source (named file and record), an unknown form, ``src`` and ``dst``
            containing each other, an unfinished source, or an output that cannot be written
            (named, with the cause: a file in the way, read-only, full).
    """
    fmt, workers = options.fmt, options.workers
    tools = tools_of(workload)
    src, dst = Path(src), Path(dst)
    if to not in tools.convert_to:
        raise DataError(f"--to {to!r}: expected one of {', '.join(tools.convert_to)}")
    form = detect(tools, src, fmt)
    _output_root(src, dst, "data convert")
    jobs = []
    for split in split_dirs(tools, src):
        files = list_split(tools, src, split, form)
        out = _make_split(dst, split)
        jobs += [(f"{split}/{p.name}", p, out) for p in files]
    for name in tools.root_files:
        if (src / name).is_file() and not (src / name).is_symlink():
            try:
                with atomic_output(dst / name, copy_mode((src / name).stat().st_mode)) as tmp:
                    shutil.copyfile(src / name, tmp)
            except OSError as exc:
                raise DataError(f"{dst / name}: cannot write ({reason(exc)})") from None
    writing = _Writing(tools, form, to, dst, "convert", src)
    return _drive(writing, jobs, workers, options.progress())


def prepare(workload: Any, raw_dir: Path, dst: Path, to: str | None,
            options: ConvertOptions = ConvertOptions()) -> ConvertResult:
    """The reference's preparation step: each raw file under ``raw_dir`` made into samples by
    the workload's data tools, written in form ``to`` (None: the workload's first
    ``convert_to``); which split a raw file's samples go to is the tools' choice
    (`mlhpc.workload.DataTools.prepare_splits`). ``options``: how it runs (workers, progress)
    and the workload's prepare options.

    Raises:
        ConfigError: an option the workload does not declare, or a bad value (named).
        DataError: no raw files, a malformed one (named), ``raw_dir`` and ``dst`` containing
            each other, an output that cannot be written.
    """
    tools = tools_of(workload)
    settings = prepare_settings(tools, options.prepare_options)
    raw_dir, dst = Path(raw_dir), Path(dst)
    to = to or tools.convert_to[0]
    if to not in tools.convert_to:
        raise DataError(f"--to {to!r}: expected one of {', '.join(tools.convert_to)}")
    refuse_overlap(raw_dir, dst, "data prepare", DataError)
    raw = tools.list_raw(raw_dir)
    if not raw:
        raise DataError(f"{raw_dir}: no raw files to prepare")
    _output_root(raw_dir, dst, "data prepare")
    jobs = [(f"{split}/{path.name}", path, _make_split(dst, split))
            for split, path in tools.prepare_splits(raw, settings)]
    writing = _Writing(tools, "raw", to, dst, "prepare", raw_dir, prepare=settings)
    return _drive(writing, jobs, options.workers, options.progress())


def prepare_settings(tools: DataTools, given: PrepareValues) -> BaseModel:
    """The workload's prepare options (`mlhpc.workload.DataTools.prepare_options`) from
    ``given``: ``KEY=VALUE`` strings (values read as YAML scalars) or a mapping.

    Raises:
        ConfigError: a key the workload does not declare, or a value its model refuses.
    """
    import pydantic
    import yaml

    from mlhpc.errors import ConfigError
    from mlhpc.hints import did_you_mean

    model = tools.prepare_options
    values = dict(given) if isinstance(given, dict) else {}
    for item in () if isinstance(given, dict) else given:
        key, sep, text = str(item).partition("=")
        if not sep:
            raise ConfigError(f"--option {item!r}: expected KEY=VALUE")
        values[key.strip()] = yaml.safe_load(text) if text.strip() else text
    known = tuple(model.model_fields)
    for key in values:
        if key not in known:
            listed = ", ".join(known) or "none"
            raise ConfigError(f"--option {key}: not an option of this workload's data prepare "
                              f"(its options: {listed}){did_you_mean(key, known)}")
    try:
        return model(**values)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"--option {where}: {first['msg']}") from None
