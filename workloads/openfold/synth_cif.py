"""mmCIF text of one synthetic chain: the categories the PDB's files give and the OpenFold
reader uses (``_entity_poly_seq`` for the full sequence, ``_atom_site`` for the atoms,
``_refine`` for the resolution, ``_pdbx_audit_revision_history`` for the release date), in the
PDBx/mmCIF dictionary's item names. Written by hand, not by gemmi, so that the reader is checked
against text it did not write itself.
"""

from __future__ import annotations

import numpy as np

from .residue_constants import RESTYPE_1TO3

#: Synthetic atoms: N, CA, C, O and (not for glycine) CB.
ATOM_NAMES = ("N", "CA", "C", "O", "CB")
RESOLUTION_A = 2.0
RELEASE_DATE = "2021-01-01"

_ATOM_SITE = ("group_PDB", "id", "type_symbol", "label_atom_id", "label_alt_id", "label_comp_id",
              "label_asym_id", "label_entity_id", "label_seq_id", "pdbx_PDB_ins_code",
              "Cartn_x", "Cartn_y", "Cartn_z", "occupancy", "B_iso_or_equiv", "auth_seq_id",
              "auth_asym_id", "pdbx_PDB_model_num")


def _loop(category: str, items: tuple[str, ...], rows: list[str]) -> str:
    head = "".join(f"_{category}.{item}\n" for item in items)
    return "loop_\n" + head + "".join(row + "\n" for row in rows) + "#\n"


def format_mmcif(entry_id: str, sequence: str, atoms: np.ndarray) -> str:
    """An mmCIF file of one protein chain ``A``.

    Args:
        entry_id: the data block and ``_entry.id``.
        sequence: one-letter sequence, N residues of the 20 standard ones.
        atoms: ``[N, 5, 3]`` Angstrom in the order of `ATOM_NAMES` (CB ignored for glycine).
    """
    names = [RESTYPE_1TO3[c] for c in sequence]
    seq_rows = [f"1 {i + 1} {name} n" for i, name in enumerate(names)]
    atom_rows = []
    for i, name in enumerate(names):
        for k, atom in enumerate(ATOM_NAMES):
            if atom == "CB" and name == "GLY":
                continue
            x, y, z = atoms[i, k]
            atom_rows.append(f"ATOM {len(atom_rows) + 1} {atom[0]} {atom} . {name} A 1 {i + 1} ? "
                             f"{x:.3f} {y:.3f} {z:.3f} 1.00 20.00 {i + 1} A 1")
    return (f"data_{entry_id}\n#\n_entry.id {entry_id}\n#\n"
            f"_refine.entry_id {entry_id}\n_refine.ls_d_res_high {RESOLUTION_A:.2f}\n#\n"
            f"_pdbx_audit_revision_history.ordinal 1\n"
            f"_pdbx_audit_revision_history.revision_date {RELEASE_DATE}\n#\n"
            "_entity.id 1\n_entity.type polymer\n#\n"
            "_entity_poly.entity_id 1\n_entity_poly.type 'polypeptide(L)'\n#\n"
            + _loop("entity_poly_seq", ("entity_id", "num", "mon_id", "hetero"), seq_rows)
            + "_struct_asym.id A\n_struct_asym.entity_id 1\n#\n"
            + _loop("atom_site", _ATOM_SITE, atom_rows))
