"""The data comparison of benchmarks/side_by_side.py: the training loader `mlhpc run` builds
against a raw read of the same files in the same order.

The mlhpc side iterates ``parts.train_loader`` (the run's sampler, batch size, workers and
collate function) for one epoch; the reference reads the same samples, in the order that
sampler gives, with the plain library a user would call: h5py for HDF5 (CosmoFlow's sharded
``full`` / ``unitPar`` files, DeepCAM's one file per sample), and for OC20 ``lmdb`` with the
project's restricted unpickler (`lmdb_io.load_record`, no validation, no batching), and for
OpenFold gemmi's mmCIF parser with each a3m file's text (no features). Workloads without a raw
reader here are skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
from side_by_side_core import LoadWatch, Measured, Skipped, calibrate, interleave


def loader_work(parts: Any) -> Callable[[], int]:
    """One epoch of the training loader; returns the samples it gave."""
    def work() -> int:
        return sum(parts.train_ds.batch_len(x) for x, _ in parts.train_loader.host)
    return work


def _h5_files(dataset: Any) -> None:
    for path in {Path(p) for p in dataset.files}:
        if path.suffix not in (".h5", ".hdf5"):
            raise Skipped(f"no raw reader for {path.suffix} files here (HDF5 only)")


def raw_cosmoflow(dataset: Any, order: list[int]) -> Callable[[], int]:
    """h5py: every file opened once, then ``full[k]`` and ``unitPar[k]`` of each sample in
    ``order`` (``dataset.locate``)."""
    _h5_files(dataset)
    where = [dataset.locate(i) for i in order]
    handles = {path: h5py.File(path, "r") for path in {p for p, _ in where}}

    def work() -> int:
        for path, k in where:
            handle = handles[path]
            handle["full"][k]
            handle["unitPar"][k]
        return len(where)
    return work


def raw_cosmoflow_whole_files(dataset: Any, order: list[int]) -> Callable[[], int]:
    """h5py: each file's ``full`` and ``unitPar`` read whole, files in sorted order (the same
    bytes as an epoch, sequential: the fastest raw read of them)."""
    del order
    _h5_files(dataset)
    files = sorted({Path(p) for p in dataset.files})

    def work() -> int:
        samples = 0
        for path in files:
            with h5py.File(path, "r") as handle:
                samples += len(handle["full"][...])
                handle["unitPar"][...]
        return min(samples, len(dataset))
    return work


def raw_deepcam(dataset: Any, order: list[int]) -> Callable[[], int]:
    """h5py: each sample's file opened, ``climate/data`` and ``climate/labels_0`` read whole."""
    _h5_files(dataset)
    files = [dataset.locate(i).file for i in order]

    def work() -> int:
        for path in files:
            with h5py.File(path, "r") as handle:
                handle["climate/data"][...]
                handle["climate/labels_0"][...]
        return len(files)
    return work


def raw_oc20(dataset: Any, order: list[int]) -> Callable[[], int]:
    """lmdb: each file's environment (opened once with the reference reader's flags; py-lmdb
    allows one per file and process, so the loader's own, from `lmdb_io.open_lmdb`), then per
    sample a read transaction, ``get`` of its key and the restricted unpickler
    (`lmdb_io.load_record`)."""
    from mlhpc_workloads.opencatalyst.lmdb_io import load_record, open_lmdb

    where = [dataset.locate(i) for i in order]
    envs = {path: open_lmdb(path) for path in {p for p, _ in where}}

    def work() -> int:
        for path, key in where:
            load_record(envs[path].begin().get(f"{key}".encode("ascii")), str(path))
        return len(where)
    return work


def raw_openfold(dataset: Any, order: list[int]) -> Callable[[], int]:
    """gemmi and plain text: per sample, its mmCIF file parsed into a structure
    (``gemmi.read_structure``) and each of its a3m files read and split into lines (through
    `mlhpc.data.inputs.read_text_input`, the project's one reader of a file's bytes)."""
    import gemmi

    from mlhpc.data.inputs import read_text_input

    entries = [dataset.entries[i] for i in order]

    def work() -> int:
        for entry in entries:
            gemmi.read_structure(str(entry.mmcif))
            for a3m in entry.a3m_files:
                read_text_input(a3m, 1 << 30, what="a3m alignment").splitlines()
        return len(entries)
    return work


RAW_READERS: dict[str, Callable[[Any, list[int]], Callable[[], int]]] = {
    "cosmoflow": raw_cosmoflow, "deepcam": raw_deepcam, "oc20": raw_oc20,
    "openfold": raw_openfold}
RAW_WORDS = {"cosmoflow": "h5py, files opened once, full[k] and unitPar[k] per sample",
             "deepcam": "h5py, each sample's file opened, data and labels read whole",
             "oc20": "lmdb get + the restricted unpickler (lmdb_io.load_record) per sample",
             "openfold": "gemmi.read_structure of the mmCIF file + each a3m file read and split "
                         "into lines, per sample (no features: no crop, MSA sampling or masks)"}


def data_comparisons(workload: str, parts: Any, repeats: int, min_s: float,
                     load: LoadWatch) -> list[Measured]:
    """``data`` (loader vs raw read in the loader's order, samples/s, goal 0.8) and, for
    CosmoFlow's sharded files, ``data-whole-files`` (context: the raw read of whole files).

    Raises:
        Skipped: no raw reader for this workload or its files.
    """
    if workload not in RAW_READERS:
        raise Skipped(f"no raw reader for workload {workload!r} in benchmarks/side_by_side_data.py")
    order = list(iter(parts.train_sampler))
    mlhpc = calibrate(loader_work(parts), min_s)
    results = []
    raw = calibrate(RAW_READERS[workload](parts.train_ds, order), min_s)
    main = interleave("data", "samples/s", (mlhpc, raw), repeats, load)
    main.goal = 0.8
    main.sides = {"mlhpc": f"the training loader (num_workers={parts.train_loader.host.num_workers}, "
                           f"batch {parts.local_batch_size}, the run's shuffled order), one epoch",
                  "reference": f"raw read of the same samples in the same order: {RAW_WORDS[workload]}"}
    main.extra.update(samples_per_epoch=len(order))
    results.append(main)
    if workload == "cosmoflow":
        whole = calibrate(raw_cosmoflow_whole_files(parts.train_ds, order), min_s)
        context = interleave("data-whole-files", "samples/s", (mlhpc, whole), repeats, load)
        context.sides = {"mlhpc": main.sides["mlhpc"],
                         "reference": "h5py reading each file's full and unitPar whole, files in "
                                      "sorted order (sequential; context, no goal)"}
        results.append(context)
    return results


def versus_training(data: Measured, harness: Measured) -> Measured:
    """The loader's samples/s against the samples/s the training step consumes (the harness
    comparison's mlhpc side); goal 2."""
    return Measured("data-vs-training", "samples/s", data.mlhpc_all, harness.mlhpc_all, goal=2.0,
                    sides={"mlhpc": data.sides["mlhpc"],
                           "reference": "samples/s the training step consumes (harness, mlhpc side)"})
