"""OC20's data tools (`mlhpc.workload.DataTools`): the OCP LMDB format as ``mlhpc data check
| convert | prepare`` and staging see it.

- ``lmdb``: the folders the OCP preprocessing writes (``download_data.py --task s2ef --split 2M
  --get-edges --ref-energy``; ``scripts/preprocess_ef.py``): ``*.lmdb`` files of pickled graph
  records, read through `lmdb_io`'s restricted unpickler;
- ``convert`` rewrites a folder record by record in the current (torch_geometric 2.x) layout,
  every record validated: a dataset pickled by an old torch_geometric comes out readable by new
  ones;
- ``prepare`` makes the LMDB format from ASE-readable trajectories (extxyz with energies and
  forces, ``*.extxyz`` / ``*.xyz``), edges computed as ``AtomsToGraphs(radius=6, max_neigh=50)``
  does (`prepare.extxyz_to_lmdb`).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from mlhpc.data.files import atomic_output
from mlhpc.data.inputs import open_input
from mlhpc.errors import DataError
from mlhpc.workload import DataTools, FileCheck, last_files_to_validation

from . import lmdb_io
from .data import find_split_dirs
from .prepare import extxyz_to_lmdb

FORMAT = "lmdb"
RAW_SUFFIXES = (".extxyz", ".xyz")
#: The largest raw trajectory read by `data prepare` (bytes).
RAW_FILE_BYTES = 64 << 30


class PrepareOptions(BaseModel):
    """``mlhpc data prepare oc20 --option KEY=VALUE``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    validation_fraction: float = Field(0.1111, ge=0, lt=1, description=(
        "share of the trajectories (whole files, the last in name order) for validation/"))


class Oc20DataTools(DataTools):
    """The OCP LMDB format for the harness's data drivers (see the module docstring)."""

    formats = (FORMAT,)
    convert_to = (FORMAT,)
    splits = ("train", "validation")  # the folders prepare and the embedded data write
    prepare_options = PrepareOptions

    def find_splits(self, root: Path) -> tuple[str, str]:
        """The training and validation folder names of ``root`` (names holding ``train`` and
        ``val``, e.g. the reference's ``train`` and ``val_id``). Raises DataError."""
        train, val = find_split_dirs(Path(root))
        return train.name, val.name

    def detect(self, split_dir: Path) -> str:
        """``lmdb`` when the folder holds ``*.lmdb`` files. Raises DataError otherwise."""
        lmdb_io.list_lmdb_files(Path(split_dir))
        return FORMAT

    def list_files(self, split_dir: Path, fmt: str) -> list[Path]:
        """The ``*.lmdb`` files of a split folder, sorted (the order records are concatenated)."""
        return lmdb_io.list_lmdb_files(Path(split_dir))

    def check_file(self, path: Path, fmt: str, full: bool) -> FileCheck:
        """`lmdb_io.check_file`: quick reads the LMDB's framing (meta pages, entry count,
        ``length``) and decodes record 0; full decodes and validates every record. A sample's
        shape is reported as ``(3,)`` (one position per atom): structures differ in size."""
        found = lmdb_io.check_file(Path(path), full)
        return FileCheck(found.records, (3,), "float32", found.bytes)

    def convert_file(self, path: Path, fmt: str, out_dir: Path, to: str) -> list[tuple[Path, int]]:
        """Every record of one ``*.lmdb`` file, validated and rewritten to ``out_dir``."""
        path = Path(path)
        env = lmdb_io.open_lmdb(path)
        count = lmdb_io.record_count(env, path)
        records = (_reference_keys(lmdb_io.decode_record(lmdb_io.read_blob(env, path, i),
                                                         f"{path}: key '{i}'"))
                   for i in range(count))
        final = Path(out_dir) / path.name
        return [(final, lmdb_io.write_lmdb(final, records))]

    def list_raw(self, raw_dir: Path) -> list[Path]:
        """The ASE-readable trajectories (``*.extxyz``, ``*.xyz``) of ``raw_dir``, sorted.
        Raises DataError naming a link out of ``raw_dir``, a FIFO or device, or a file over
        `RAW_FILE_BYTES`."""
        raw_dir = Path(raw_dir)
        if not raw_dir.is_dir():
            raise DataError(f"{raw_dir}: folder of trajectories not found")
        found = sorted(p for p in raw_dir.iterdir() if p.suffix in RAW_SUFFIXES and not p.is_dir())
        for path in found:  # open_input refuses a link out of raw_dir, a FIFO, an oversized file
            os.close(open_input(path, RAW_FILE_BYTES, raw_dir, "raw trajectory", DataError))
        return found

    def prepare_splits(self, raw: list[Path], options: PrepareOptions) -> list[tuple[str, Path]]:
        """Whole trajectories to splits, the last ``validation_fraction`` to validation/."""
        return last_files_to_validation(raw, options.validation_fraction, self.splits)

    def prepare_file(self, path: Path, out_dir: Path, to: str, options: PrepareOptions
                     ) -> list[tuple[Path, int]]:
        """One trajectory as one ``*.lmdb`` file with its edges."""
        final = Path(out_dir) / (Path(path).stem + ".lmdb")
        try:
            with atomic_output(final) as tmp:
                written = extxyz_to_lmdb(Path(path), tmp.with_suffix(".lmdb"), get_edges=True)
                tmp.with_suffix(".lmdb").replace(tmp)
        except OSError as exc:  # named by the file asked for, not its temporary name
            raise OSError(exc.errno, exc.strerror, str(final)) from None
        return [(final, written)]


def _reference_keys(record: dict) -> dict:
    """A decoded record under the names the OCP preprocessing writes (``force``, ``y``)."""
    renamed = {"forces": "force", "energy": "y"}
    return {renamed.get(k, k): (int(v) if k == "natoms" else v) for k, v in record.items()}


DATA_TOOLS = Oc20DataTools()
