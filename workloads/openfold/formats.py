"""OpenFold's data tools (`mlhpc.data.formats.DataTools`): PDB mmCIF files with OpenProteinSet
a3m alignments (layout: `data`), as ``mlhpc data check`` and staging see them.

A data file is an mmCIF file; its samples are the chains of it that have an alignment folder.
Checking a file reads it (gemmi) and, for each of those chains, its alignments: quick reads the
first a3m of each chain and compares its query with the chain's sequence; full reads every a3m,
the ``.hhr`` templates and their structures (`data.read_raw`, the alignment's first
`features.FeatureSizes.msa_rows_read` rows at the reference's sizes, as a run reads them). Both
read through the run's own functions (`data`): a link out of the split is refused, and a
validation chain longer than the reference's bound (`features.VAL_MAX_SEQUENCE_LENGTH`) is a
bad file, as a run with the reference's ``model.val_max_sequence_length`` refuses it. Nothing is
converted: the reader takes the files as the reference's preprocessing leaves them (``convert``
and ``prepare`` say so).
"""

from __future__ import annotations

from pathlib import Path

from mlhpc.errors import DataError
from mlhpc.workload import DataTools, FileCheck

from . import a3m, mmcif
from .data import (
    ALIGNMENT_DIR,
    MMCIF_DIR,
    MMCIF_SUFFIXES,
    ChainEntry,
    a3m_files,
    check_length,
    inside,
    read_raw,
)
from .training import ModelConfig, feature_sizes

FORMAT = "mmcif"
FULL_CHECK_TEMPLATES = 4  # templates (.hhr hits) a full check reads per chain, as the reference
#: The reference's feature sizes: the rows a check reads, the validation chains' bound.
REFERENCE_SIZES = feature_sizes(ModelConfig())


def _pdb_id(path: Path) -> str:
    name = path.name
    for suffix in MMCIF_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


class OpenFoldDataTools(DataTools):
    """mmCIF + a3m for the harness's data drivers (module docstring)."""

    formats = (FORMAT,)
    splits = ("train", "validation")

    def detect(self, split_dir: Path) -> str:
        """``mmcif`` when the split holds ``mmcif_files/`` and ``alignments/``. Raises DataError."""
        for name in (MMCIF_DIR, ALIGNMENT_DIR):
            if not (Path(split_dir) / name).is_dir():
                raise DataError(f"no {name}/ folder (an OpenFold split holds "
                                f"{MMCIF_DIR}/ and {ALIGNMENT_DIR}/)", path=split_dir)
        return FORMAT

    def file_group(self, path: str) -> str:
        """A chain's structure and its alignments stay on one node: ``mmcif_files/<pdb_id>.cif``
        and every file under ``alignments/<pdb_id>_<chain_id>/`` are of group ``<pdb_id>`` (the
        chains of one entry read one mmCIF file); any other file stands alone. Templates a
        chain's ``.hhr`` hits name in other entries are not kept with it."""
        top, _, rest = path.partition("/")
        if top == MMCIF_DIR and "/" not in rest:
            return f"pdb:{_pdb_id(Path(rest))}"
        if top == ALIGNMENT_DIR and "/" in rest:
            pdb_id, sep, _chain = rest.split("/", 1)[0].rpartition("_")
            if sep and pdb_id:
                return f"pdb:{pdb_id}"
        return path

    def list_files(self, split_dir: Path, fmt: str) -> list[Path]:
        """The mmCIF files of a split, sorted."""
        folder = Path(split_dir) / MMCIF_DIR
        if not folder.is_dir():
            return []
        return sorted(p for p in folder.iterdir()
                      if p.name.endswith(MMCIF_SUFFIXES) and not p.name.startswith("."))

    def _chains(self, path: Path) -> list[ChainEntry]:
        """The chains of the mmCIF file ``path`` that have an alignment folder beside it."""
        split_dir, pdb_id = Path(path).parent.parent, _pdb_id(Path(path))
        alignments = split_dir / ALIGNMENT_DIR
        if not alignments.is_dir():
            return []
        inside(alignments, split_dir, f"{ALIGNMENT_DIR}/ folder")
        entries = []
        for chain_dir in sorted(alignments.iterdir()):
            stem, _, chain_id = chain_dir.name.rpartition("_")
            if stem != pdb_id or not chain_id or not chain_dir.is_dir():
                continue
            files = a3m_files(inside(chain_dir, split_dir, "alignment folder"), split_dir)
            if not files:
                raise DataError("no *.a3m alignment", path=chain_dir)
            entries.append(ChainEntry(Path(path), chain_id, files, split_dir))
        return entries

    def check_file(self, path: Path, fmt: str, full: bool) -> FileCheck:
        """One mmCIF file and the alignments of its chains (module docstring). A sample's shape
        is reported as ``(37, 3)`` (atom37 coordinates of one residue): chains differ in length.

        Raises:
            DataError: naming the mmCIF or a3m file at fault.
        """
        path = Path(path)
        split_dir = path.parent.parent
        inside(path, split_dir, "mmCIF file")
        entries = self._chains(path)
        bound = REFERENCE_SIZES.val_max_sequence_length if split_dir.name == "validation" else None
        size = path.stat().st_size
        for entry in entries:
            size += sum(p.stat().st_size for p in entry.a3m_files)
            if full:
                raw = read_raw(entry, FULL_CHECK_TEMPLATES, REFERENCE_SIZES.msa_rows_read)
                check_length(entry, len(raw.aatype), bound)
                continue
            chain = mmcif.read_chain(path, entry.chain_id, split_dir)
            query = a3m.read_msa([entry.a3m_files[0]], 1, split_dir).sequences[0]
            if query != chain.sequence:
                raise DataError("the query is not the sequence of "
                                f"{chain.source}", path=entry.a3m_files[0])
            check_length(entry, len(chain.sequence), bound)
        if not entries:
            mmcif.read_block(path, split_dir)
        return FileCheck(len(entries), (37, 3), "float32", size)

    def convert_file(self, path: Path, fmt: str, out_dir: Path, to: str) -> list[tuple[Path, int]]:
        """No conversion: the reader takes mmCIF and a3m as they are. Raises DataError."""
        raise DataError("OpenFold data are read as mmCIF + a3m; there is nothing to convert to", path=path)

    def list_raw(self, raw_dir: Path) -> list[Path]:
        """No raw form to prepare from. Raises DataError."""
        raise DataError("OpenFold data are prepared by the reference's scripts "
                        "(mmCIF files and OpenProteinSet alignments); put them in the layout of "
                        "docs/openfold.md", path=raw_dir)


DATA_TOOLS = OpenFoldDataTools()
