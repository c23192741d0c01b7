"""Protein chains from PDB mmCIF files, read through gemmi (``gemmi.cif`` and its structure
model), as the OpenFold reference's ``mmcif_parsing`` + ``data_pipeline.process_mmcif`` leave
them:

- the chain is found by its author chain id (the id in the alignment folder names of
  OpenProteinSet, ``<pdb_id>_<chain_id>``); the first model only;
- the sequence is the polymer entity's full sequence (``_entity_poly_seq``, residues that were
  never resolved included); a standard residue maps to its one-letter code, a modified one to its
  parent's (MSE -> M), anything else to X; residues are placed by their ``label_seq_id``;
- atoms go into the atom37 slots by name (hydrogens dropped, the first alternative location
  kept, MSE's SE read as MET's SD as AlphaFold does); an atom not in the file is masked;
- resolution (Angstrom): ``_refine.ls_d_res_high``, else ``_reflns.d_resolution_high``, else the
  EM reconstruction's; 0 when none is given (NMR), as the reference;
- release date: the first ``_pdbx_audit_revision_history.revision_date``, when given.

Every failure raises `DataError` naming the file: a syntax error or a truncated file, no such
chain, a chain without one resolved C-alpha atom, a coordinate that is not finite; a file read
through a symbolic link out of its data tree (``root``), or one that holds (or, gzipped,
inflates to) more than `MMCIF_BYTES`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlhpc.data.inputs import inflated_chunks, read_input
from mlhpc.errors import DataError

from .residue_constants import (
    ATOM_ORDER,
    ATOM_TYPE_NUM,
    RESTYPE_3TO1,
    sequence_to_aatype,
)

CA = ATOM_ORDER["CA"]
#: The most bytes of mmCIF text read and parsed, a ``.cif`` file's or what a ``.cif.gz`` inflates
#: to (counted while inflating). The PDB's largest entry, 3J3Q (HIV capsid, 2.44 million atoms:
#: Bradley et al. 2017, PLoS Comput Biol 13:e1005575, fig. 1), at about 95 bytes per
#: ``_atom_site`` row (1AKI's rows in tests/data/openfold measure 86 with 4-digit serials; 3J3Q's
#: serials and chain ids are longer) is about 232 MB of text: 384 MiB leaves 1.7 times that.
MMCIF_BYTES = 384 << 20
_PARENT = {"MSE": "MET"}


@dataclass(frozen=True)
class ProteinChain:
    """One chain of an mmCIF file.

    Attributes:
        sequence: one-letter full sequence (length N, ``X`` for unknown residues).
        aatype: ``[N]`` int64 residue types (0..20, `residue_constants.RESTYPES`, 20 = X).
        residue_index: ``[N]`` int64, 0-based positions in the full sequence.
        atom_positions: ``[N, 37, 3]`` float32 Angstrom (0 where masked).
        atom_mask: ``[N, 37]`` float32, 1 where the atom is resolved.
        resolution_A: Angstrom; 0 when the file gives none.
        release_date: ``YYYY-MM-DD`` or ``""``.
        source: the file and chain, for messages (``path:chain``).
    """

    sequence: str
    aatype: np.ndarray
    residue_index: np.ndarray
    atom_positions: np.ndarray
    atom_mask: np.ndarray
    resolution_A: float
    release_date: str
    source: str


def read_block(path: Path, root: Path | None = None):
    """The only data block of an mmCIF file (``.cif`` or ``.cif.gz``) as a gemmi block, read
    through `mlhpc.data.inputs` (a regular file, not reached through a link out of ``root``, the
    data tree it was found in): at most `MMCIF_BYTES` of text, a ``.cif.gz`` inflated once to
    count its bytes (stopped at the cap, nothing held) and once to parse them.

    Raises:
        DataError: the file cannot be read, is a link out of ``root``, holds or inflates to more
            than `MMCIF_BYTES`, is not text (a NUL byte), or is not well-formed CIF (a truncated
            file usually ends inside a loop row), naming it.
    """
    import gemmi

    if str(path).endswith(".gz"):
        for piece in inflated_chunks(path, MMCIF_BYTES, MMCIF_BYTES, root, "mmCIF file", DataError):
            _text_only(path, piece)
        raw = b"".join(inflated_chunks(path, MMCIF_BYTES, MMCIF_BYTES, root, "mmCIF file", DataError))
    else:
        raw = read_input(path, MMCIF_BYTES, root, "mmCIF file", DataError)
        _text_only(path, raw)
    try:
        return gemmi.cif.read_string(raw).sole_block()
    except (RuntimeError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"not a readable mmCIF file ({reason[:200]})", path=path) from None


def _text_only(path: Path, raw: bytes) -> None:
    if b"\0" in raw:
        raise DataError("not a readable mmCIF file (a NUL byte: not text)", path=path)


def chain_ids(path: Path, root: Path | None = None) -> list[str]:
    """Author ids of the polymer chains of the file's first model. Raises DataError (as
    `read_block`)."""
    structure = _structure(path, read_block(path, root))
    return [chain.name for chain in structure[0] if len(chain.get_polymer())]


def read_chain(path: Path, chain_id: str, root: Path | None = None) -> ProteinChain:
    """Chain ``chain_id`` (author id) of an mmCIF file (module docstring), read as `read_block`
    reads it (``root``: the data tree it was found in).

    Raises:
        DataError: naming the file and chain: as `read_block`, no such polymer chain, no
            resolved C-alpha atom, a non-finite coordinate.
    """
    block = read_block(path, root)
    structure = _structure(path, block)
    source = f"{path}:{chain_id}"
    chain = next((c for c in structure[0] if c.name == chain_id), None) if len(structure) else None
    if chain is None or not len(chain.get_polymer()):
        raise DataError(f"no polymer chain {chain_id!r} in the first model", path=path)
    residues = chain.get_polymer()
    names = _full_sequence(structure, residues)
    positions = np.zeros((len(names), ATOM_TYPE_NUM, 3), dtype=np.float32)
    mask = np.zeros((len(names), ATOM_TYPE_NUM), dtype=np.float32)
    for order, residue in enumerate(residues):
        slot = residue.label_seq - 1 if residue.label_seq is not None else order
        if not 0 <= slot < len(names):
            raise DataError(f"{source}: residue {residue.name} {residue.seqid} lies outside the "
                            f"entity sequence of {len(names)} residues")
        _fill_atoms(residue, positions[slot], mask[slot])
    if not np.isfinite(positions).all():
        raise DataError(f"{source}: a coordinate is not a finite number")
    if not mask[:, CA].any():
        raise DataError(f"{source}: the chain has no resolved C-alpha atom")
    sequence = "".join(_one_letter(n) for n in names)
    return ProteinChain(sequence=sequence, aatype=sequence_to_aatype(sequence),
                        residue_index=np.arange(len(names), dtype=np.int64),
                        atom_positions=positions, atom_mask=mask,
                        resolution_A=_resolution(block, structure), release_date=_release_date(block),
                        source=source)


def _structure(path: Path, block):
    import gemmi

    try:
        structure = gemmi.make_structure_from_block(block)
        structure.setup_entities()
    except (RuntimeError, ValueError) as exc:
        raise DataError(f"not a readable mmCIF structure ({exc})", path=path) from None
    if not len(structure) or not any(len(chain) for chain in structure[0]):
        raise DataError("no atoms (no _atom_site rows; a truncated file?)", path=path)
    return structure


def _full_sequence(structure, residues) -> list[str]:
    """Residue names of the chain's entity sequence (the first of a microheterogeneity)."""
    import gemmi

    entity = structure.get_entity_of(residues)
    if entity is not None and entity.full_sequence:
        return [gemmi.Entity.first_mon(name) for name in entity.full_sequence]
    return [residue.name for residue in residues]


def _one_letter(name: str) -> str:
    import gemmi

    name = _PARENT.get(name, name)
    if name in RESTYPE_3TO1:
        return RESTYPE_3TO1[name]
    info = gemmi.find_tabulated_residue(name)
    if info is not None and info.is_amino_acid():
        letter = info.one_letter_code.upper()
        return letter if letter in "ARNDCQEGHILKMFPSTWYV" else "X"
    return "X"


def _fill_atoms(residue, positions: np.ndarray, mask: np.ndarray) -> None:
    """The residue's heavy atoms into their atom37 slots (first alternative location)."""
    for atom in residue:
        name = "SD" if (residue.name == "MSE" and atom.name == "SE") else atom.name
        slot = ATOM_ORDER.get(name)
        if slot is None or mask[slot] or atom.is_hydrogen():
            continue
        positions[slot] = (atom.pos.x, atom.pos.y, atom.pos.z)
        mask[slot] = 1.0


def _resolution(block, structure) -> float:
    for tag in ("_refine.ls_d_res_high", "_reflns.d_resolution_high",
                "_em_3d_reconstruction.resolution"):
        value = block.find_value(tag)
        try:
            resolution = float(value) if value not in (None, "?", ".") else 0.0
        except ValueError:
            continue
        if resolution > 0:
            return resolution
    return float(structure.resolution or 0.0)


def _release_date(block) -> str:
    dates = [d for d in block.find_values("_pdbx_audit_revision_history.revision_date")
             if d not in ("?", ".")]
    return min(dates) if dates else ""
