"""Staging, the convert strategy (``data.staging.to``): the data files of each split converted
on the way to the node by the workload's ``convert_file`` (e.g. GZIP TFRecord -> npy, as NVIDIA's
staging inflates the GZIP files: mlcommons hpc_results_v3.0 cosmoflow ``data/dali_tfr_gzip.py``),
other files copied; each source journalled with its outputs, the manifest written last.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from mlhpc.data.files import common_mode, copy_mode, dest_error, output_mode, reason
from mlhpc.data.manifest import (
    MANIFEST_NAME,
    Conversion,
    Journal,
    conversion_reusable,
    describe_output,
    drop_journals,
    finish_files_recorded,
    identity,
    read_convert_state,
    source_records,
    write,
)
from mlhpc.data.stage.copy import copy_file, run_all
from mlhpc.data.stage.dest import make_parents, prune_to
from mlhpc.data.stage.job import Copy, Counts
from mlhpc.data.stage.plan import Planned
from mlhpc.data.trees import resolved
from mlhpc.errors import StagingError


def _describe_output(dest: Path, path: Path, samples: int, src: Path, mode: int) -> dict[str, Any]:
    """``{path (relative to dest), bytes, xxh3_128, samples}`` of a file just written, its
    permission bits narrowed to ``mode`` (`mlhpc.data.files.narrow_mode`)."""
    try:
        return describe_output(dest, Path(path), samples, mode)
    except ValueError:
        raise StagingError(f"{path}: the converter of {src} wrote outside the staging "
                           f"destination {dest}") from None
    except OSError as exc:
        raise StagingError(f"{path}: cannot read back converted file ({reason(exc)}; "
                           f"converting {src})") from None


def convert_share(job: Copy, share: list[Planned], known: dict[str, dict[str, Any]],
                   counts: Counts) -> None:
    """Convert (or copy, or verify and skip) every source of ``share`` with ``job.workers``
    threads; each finished source is journalled with its outputs. Adds to ``counts``."""
    conv = job.convert
    assert conv is not None
    if not share:
        return
    make_parents(job.dest, share)
    journal = Journal(job.dest, job.host)
    lock = threading.Lock()

    def one(item: Planned) -> None:
        if conversion_reusable(job.dest, known.get(item.rel), item.size_bytes, identity(item), job.verify):
            with lock:
                counts.skipped_files += 1
            return
        src = job.source / item.rel
        if item.convert:
            out_dir = (job.dest / item.rel).parent
            try:
                mode = copy_mode(os.stat(src).st_mode)  # outputs never wider than their source
                with output_mode(mode):
                    written = conv.tools.convert_file(src, conv.fmt, out_dir, conv.to)
            except OSError as exc:
                raise dest_error(out_dir, exc, src) from None
            outputs = [_describe_output(job.dest, Path(path), int(n), src, mode) for path, n in written]
            if not outputs:
                raise StagingError(f"{src}: converting to {conv.to} wrote no file")
        else:
            size, digest = copy_file(src, job.dest / item.rel, job.host, job.verify, job.dest)
            outputs = [{"path": item.rel, "bytes": size, "xxh3_128": digest, "samples": 0}]
        journal.add(Conversion(job.source, "stage", conv.to).entry(item.rel, item.size_bytes, identity(item),
                                                                   outputs, item.convert))
        with lock:
            counts.copied_files += 1
            counts.copied_bytes += sum(o["bytes"] for o in outputs)

    try:
        run_all(one, share, job.workers)
    finally:
        journal.close()


def record_converted(job: Copy, plan: list[Planned], counts: Counts) -> None:
    """Every planned source's outputs checked on disk, ``dest`` pruned to them, ``finish_split``
    run on each converted folder, the manifest written atomically, the journals dropped. Sets
    this node's ``staged_files`` / ``staged_bytes`` and ``pruned_files``."""
    conv = job.convert
    assert conv is not None
    known = read_convert_state(job.dest, job.source, conv.to)
    outputs = []
    for item in plan:
        entry = known.get(item.rel)
        if entry is None or entry["bytes"] != item.size_bytes \
                or any(entry[k] != v for k, v in identity(item).items()):
            raise StagingError(f"{job.dest / item.rel}: staged conversion of {item.rel} missing "
                               "from every journal")
        for out in entry["outputs"]:
            try:
                on_disk = os.stat(job.dest / out["path"]).st_size
            except OSError as exc:
                raise StagingError(f"{job.dest / out['path']}: converted file vanished "
                                   f"({reason(exc)})") from None
            if on_disk != out["bytes"]:
                raise StagingError(f"{job.dest / out['path']}: converted file has {on_disk} bytes, "
                                   f"expected {out['bytes']}")
            outputs.append({**out, "from": item.rel})
    sources = source_records(known, [item.rel for item in plan])
    keep = {o["path"] for o in outputs}
    old_lists = finish_files_recorded(job)
    counts.pruned_files = prune_to(job.dest, keep | old_lists)
    finished = []
    for folder in sorted({(job.dest / p.rel).parent for p in plan if p.convert}):
        try:  # a split's file list: the bits its converted files share (their sources' at most)
            mode = common_mode([job.dest / o["path"] for o in outputs
                                if (job.dest / o["path"]).parent == folder])
            with output_mode(mode):
                written = conv.tools.finish_split(folder, conv.to)
        except OSError as exc:
            raise dest_error(folder, exc) from None
        finished += [{**_describe_output(job.dest, Path(path), 0, job.source, mode), "from": None}
                     for path in written]
    keep |= {f["path"] for f in finished}
    counts.pruned_files += prune_to(job.dest, keep)  # file lists of a split that left the plan
    try:
        doc = write(job.dest, "stage", outputs + finished, {
            "source": str(resolved(job.source)), "shard": job.shard_doc, "to": conv.to, "sources": sources,
            "from": conv.fmt})
    except OSError as exc:
        raise dest_error(job.dest / MANIFEST_NAME, exc) from None
    drop_journals(job.dest)
    files = doc["files"]
    counts.staged_files, counts.staged_bytes = len(files), doc["total_bytes"]
