"""Amino-acid and atom constants of AlphaFold 2, shared by the OpenFold model and its data.

Facts (orders, idealised coordinates, chi-angle definitions) follow the AlphaFold 2
supplement (Jumper et al. 2021, section 1.2 and Table 2) and the MLPerf HPC v3.0 OpenFold
reference (mlcommons/hpc ``openfold/openfold/data/residue_constants.py``); the tables are
written here in a compact text form and expanded into numpy arrays at import.

Conventions:
- residue types: ``RESTYPES`` = "ARNDCQEGHILKMFPSTWYV" (index 0..19), unknown "X" = 20.
- atom37: the 37 heavy-atom names of ``ATOM_TYPES``; a residue's atoms sit in those slots.
- atom14: a per-residue dense layout of at most 14 heavy atoms (``ATOM14_NAMES``).
- rigid groups (8 per residue): 0 backbone, 1 pre-omega, 2 phi, 3 psi, 4..7 chi1..chi4.
- lengths are in Angstrom, frames are 4x4 homogeneous matrices (rotation, translation).
"""

from __future__ import annotations

import numpy as np

RESTYPES = tuple("ARNDCQEGHILKMFPSTWYV")
RESTYPE_NUM = 20
UNK_RESTYPE_INDEX = 20
RESTYPES_WITH_X = RESTYPES + ("X",)
RESTYPE_ORDER = {r: i for i, r in enumerate(RESTYPES)}
RESTYPE_ORDER_WITH_X = {r: i for i, r in enumerate(RESTYPES_WITH_X)}
_THREE = "ALA ARG ASN ASP CYS GLN GLU GLY HIS ILE LEU LYS MET PHE PRO SER THR TRP TYR VAL"
RESTYPE_1TO3 = dict(zip(RESTYPES, _THREE.split()))
RESTYPE_3TO1 = {three: one for one, three in RESTYPE_1TO3.items()}
UNK_RESNAME = "UNK"
RESNAMES = tuple(_THREE.split()) + (UNK_RESNAME,)

#: MSA alphabet: 20 residues, X = 20, gap "-" = 21 (the mask token of masked MSA is 22).
MSA_GAP_INDEX = 21
MSA_MASK_INDEX = 22
# a3m / HHblits letters to the alphabet above (B->D, Z->E, U->C, J and O -> X).
_HHBLITS_EXTRA = {"B": "D", "Z": "E", "U": "C", "J": "X", "O": "X"}
MSA_LETTER_TO_INDEX = {**RESTYPE_ORDER_WITH_X, "-": MSA_GAP_INDEX}
MSA_LETTER_TO_INDEX.update({k: RESTYPE_ORDER_WITH_X[v] for k, v in _HHBLITS_EXTRA.items()})

ATOM_TYPES = (
    "N", "CA", "C", "CB", "O", "CG", "CG1", "CG2", "OG", "OG1", "SG", "CD", "CD1", "CD2",
    "ND1", "ND2", "OD1", "OD2", "SD", "CE", "CE1", "CE2", "CE3", "NE", "NE1", "NE2", "OE1",
    "OE2", "CH2", "NH1", "NH2", "OH", "CZ", "CZ2", "CZ3", "NZ", "OXT",
)
ATOM_ORDER = {name: i for i, name in enumerate(ATOM_TYPES)}
ATOM_TYPE_NUM = 37

# atom14 layout per residue: backbone N CA C O first, then side chain.
_ATOM14 = """
ALA N CA C O CB
ARG N CA C O CB CG CD NE CZ NH1 NH2
ASN N CA C O CB CG OD1 ND2
ASP N CA C O CB CG OD1 OD2
CYS N CA C O CB SG
GLN N CA C O CB CG CD OE1 NE2
GLU N CA C O CB CG CD OE1 OE2
GLY N CA C O
HIS N CA C O CB CG ND1 CD2 CE1 NE2
ILE N CA C O CB CG1 CG2 CD1
LEU N CA C O CB CG CD1 CD2
LYS N CA C O CB CG CD CE NZ
MET N CA C O CB CG SD CE
PHE N CA C O CB CG CD1 CD2 CE1 CE2 CZ
PRO N CA C O CB CG CD
SER N CA C O CB OG
THR N CA C O CB OG1 CG2
TRP N CA C O CB CG CD1 CD2 NE1 CE2 CE3 CZ2 CZ3 CH2
TYR N CA C O CB CG CD1 CD2 CE1 CE2 CZ OH
VAL N CA C O CB CG1 CG2
"""


def _parse_atom14(text: str) -> dict[str, tuple[str, ...]]:
    table = {}
    for line in text.strip().splitlines():
        resname, *names = line.split()
        table[resname] = tuple(names) + ("",) * (14 - len(names))
    table[UNK_RESNAME] = ("",) * 14
    return table


#: resname -> 14 atom names ("" for an empty slot).
ATOM14_NAMES = _parse_atom14(_ATOM14)
#: resname -> heavy atoms present in a complete residue (no OXT).
RESIDUE_ATOMS = {r: tuple(n for n in names if n) for r, names in ATOM14_NAMES.items()}

# Chi angles: the four atoms defining each dihedral, "|" between angles (ARG chi5 ignored).
_CHI = """
ALA
ARG N CA CB CG | CA CB CG CD | CB CG CD NE | CG CD NE CZ
ASN N CA CB CG | CA CB CG OD1
ASP N CA CB CG | CA CB CG OD1
CYS N CA CB SG
GLN N CA CB CG | CA CB CG CD | CB CG CD OE1
GLU N CA CB CG | CA CB CG CD | CB CG CD OE1
GLY
HIS N CA CB CG | CA CB CG ND1
ILE N CA CB CG1 | CA CB CG1 CD1
LEU N CA CB CG | CA CB CG CD1
LYS N CA CB CG | CA CB CG CD | CB CG CD CE | CG CD CE NZ
MET N CA CB CG | CA CB CG SD | CB CG SD CE
PHE N CA CB CG | CA CB CG CD1
PRO N CA CB CG | CA CB CG CD
SER N CA CB OG
THR N CA CB OG1
TRP N CA CB CG | CA CB CG CD1
TYR N CA CB CG | CA CB CG CD1
VAL N CA CB CG1
"""


def _parse_chi(text: str) -> dict[str, tuple[tuple[str, ...], ...]]:
    table = {}
    for line in text.strip().splitlines():
        resname, _, rest = line.partition(" ")
        table[resname] = tuple(tuple(a.split()) for a in rest.split("|") if a.strip())
    return table


#: resname -> chi angles, each a 4-tuple of atom names.
CHI_ANGLES_ATOMS = _parse_chi(_CHI)
#: [21, 4] 1 where a residue type has that chi angle (row 20, unknown, is all zero).
CHI_ANGLES_MASK = np.zeros((21, 4), dtype=np.float32)
for _i, _r in enumerate(RESTYPES):
    CHI_ANGLES_MASK[_i, : len(CHI_ANGLES_ATOMS[RESTYPE_1TO3[_r]])] = 1.0
#: [21, 4] 1 where the chi angle is pi-periodic (symmetric side chains).
CHI_PI_PERIODIC = np.zeros((21, 4), dtype=np.float32)
for _r, _k in (("D", 1), ("E", 2), ("F", 1), ("Y", 1)):
    CHI_PI_PERIODIC[RESTYPE_ORDER[_r], _k] = 1.0
#: [21, 4, 4] atom37 indices of each chi angle's four atoms (0 where absent).
CHI_ANGLES_ATOM_INDICES = np.zeros((21, 4, 4), dtype=np.int64)
for _i, _r in enumerate(RESTYPES):
    for _k, _atoms in enumerate(CHI_ANGLES_ATOMS[RESTYPE_1TO3[_r]]):
        CHI_ANGLES_ATOM_INDICES[_i, _k] = [ATOM_ORDER[a] for a in _atoms]

# Idealised atom positions relative to their rigid group's frame (Angstrom):
# "resname atom group x y z". Group 0 is the backbone frame (CA at the origin, C on +x,
# N in the xy plane); others are placed at the axis-end atom of their rotation axis.
_RIGID = """
ALA N 0 -0.525 1.363 0.000; CA 0 0 0 0; C 0 1.526 0 0; CB 0 -0.529 -0.774 -1.205; O 3 0.627 1.062 0
ARG N 0 -0.524 1.362 0; CA 0 0 0 0; C 0 1.525 0 0; CB 0 -0.524 -0.778 -1.209; O 3 0.626 1.062 0; CG 4 0.616 1.390 0; CD 5 0.564 1.414 0; NE 6 0.539 1.357 0; NH1 7 0.206 2.301 0; NH2 7 2.078 0.978 0; CZ 7 0.758 1.093 0
ASN N 0 -0.536 1.357 0; CA 0 0 0 0; C 0 1.526 0 0; CB 0 -0.531 -0.787 -1.200; O 3 0.625 1.062 0; CG 4 0.584 1.399 0; ND2 5 0.593 -1.188 0.001; OD1 5 0.633 1.059 0
ASP N 0 -0.525 1.362 0; CA 0 0 0 0; C 0 1.527 0 0; CB 0 -0.526 -0.778 -1.208; O 3 0.626 1.062 0; CG 4 0.593 1.398 0; OD1 5 0.610 1.091 0; OD2 5 0.592 -1.101 -0.003
CYS N 0 -0.522 1.362 0; CA 0 0 0 0; C 0 1.524 0 0; CB 0 -0.519 -0.773 -1.212; O 3 0.625 1.062 0; SG 4 0.728 1.653 0
GLN N 0 -0.526 1.361 0; CA 0 0 0 0; C 0 1.526 0 0; CB 0 -0.525 -0.779 -1.207; O 3 0.626 1.062 0; CG 4 0.615 1.393 0; CD 5 0.587 1.399 0; NE2 6 0.593 -1.189 -0.001; OE1 6 0.634 1.060 0
GLU N 0 -0.528 1.361 0; CA 0 0 0 0; C 0 1.526 0 0; CB 0 -0.526 -0.781 -1.207; O 3 0.626 1.062 0; CG 4 0.615 1.392 0; CD 5 0.600 1.397 0; OE1 6 0.607 1.095 0; OE2 6 0.589 -1.104 -0.001
GLY N 0 -0.572 1.337 0; CA 0 0 0 0; C 0 1.517 0 0; O 3 0.626 1.062 0
HIS N 0 -0.527 1.360 0; CA 0 0 0 0; C 0 1.525 0 0; CB 0 -0.525 -0.778 -1.208; O 3 0.625 1.063 0; CG 4 0.600 1.370 0; CD2 5 0.889 -1.021 0.003; ND1 5 0.744 1.160 0; CE1 5 2.030 0.851 0.002; NE2 5 2.145 -0.466 0.004
ILE N 0 -0.493 1.373 0; CA 0 0 0 0; C 0 1.527 0 0; CB 0 -0.536 -0.793 -1.213; O 3 0.627 1.062 0; CG1 4 0.534 1.437 0; CG2 4 0.540 -0.785 -1.199; CD1 5 0.619 1.391 0
LEU N 0 -0.520 1.363 0; CA 0 0 0 0; C 0 1.525 0 0; CB 0 -0.522 -0.773 -1.214; O 3 0.625 1.063 0; CG 4 0.678 1.371 0; CD1 5 0.530 1.430 0; CD2 5 0.535 -0.774 1.200
LYS N 0 -0.526 1.362 0; CA 0 0 0 0; C 0 1.526 0 0; CB 0 -0.524 -0.778 -1.208; O 3 0.626 1.062 0; CG 4 0.619 1.390 0; CD 5 0.559 1.417 0; CE 6 0.560 1.416 0; NZ 7 0.554 1.387 0
MET N 0 -0.521 1.364 0; CA 0 0 0 0; C 0 1.525 0 0; CB 0 -0.523 -0.776 -1.210; O 3 0.625 1.062 0; CG 4 0.613 1.391 0; SD 5 0.703 1.695 0; CE 6 0.320 1.786 0
PHE N 0 -0.518 1.363 0; CA 0 0 0 0; C 0 1.524 0 0; CB 0 -0.525 -0.776 -1.212; O 3 0.626 1.062 0; CG 4 0.607 1.377 0; CD1 5 0.709 1.195 0; CD2 5 0.706 -1.196 0; CE1 5 2.102 1.198 0; CE2 5 2.098 -1.201 0; CZ 5 2.794 -0.003 -0.001
PRO N 0 -0.566 1.351 0; CA 0 0 0 0; C 0 1.527 0 0; CB 0 -0.546 -0.611 -1.293; O 3 0.621 1.066 0; CG 4 0.382 1.445 0; CD 5 0.477 1.424 0
SER N 0 -0.529 1.360 0; CA 0 0 0 0; C 0 1.525 0 0; CB 0 -0.518 -0.777 -1.211; O 3 0.626 1.062 0; OG 4 0.503 1.325 0
THR N 0 -0.517 1.364 0; CA 0 0 0 0; C 0 1.526 0 0; CB 0 -0.516 -0.793 -1.215; O 3 0.626 1.062 0; CG2 4 0.550 -0.718 -1.228; OG1 4 0.472 1.353 0
TRP N 0 -0.521 1.363 0; CA 0 0 0 0; C 0 1.525 0 0; CB 0 -0.523 -0.776 -1.212; O 3 0.627 1.062 0; CG 4 0.609 1.370 0; CD1 5 0.824 1.091 0; CD2 5 0.854 -1.148 -0.005; CE2 5 2.186 -0.678 -0.007; CE3 5 0.622 -2.530 -0.007; NE1 5 2.140 0.690 -0.004; CH2 5 3.028 -2.890 -0.013; CZ2 5 3.283 -1.543 -0.011; CZ3 5 1.715 -3.389 -0.011
TYR N 0 -0.522 1.362 0; CA 0 0 0 0; C 0 1.524 0 0; CB 0 -0.522 -0.776 -1.213; O 3 0.627 1.062 0; CG 4 0.607 1.382 0; CD1 5 0.716 1.195 0; CD2 5 0.713 -1.194 -0.001; CE1 5 2.107 1.200 -0.002; CE2 5 2.104 -1.201 -0.003; OH 5 4.168 -0.002 -0.005; CZ 5 2.791 -0.001 -0.003
VAL N 0 -0.494 1.373 0; CA 0 0 0 0; C 0 1.527 0 0; CB 0 -0.533 -0.795 -1.213; O 3 0.627 1.062 0; CG1 4 0.540 1.429 0; CG2 4 0.533 -0.776 1.203
"""


def _parse_rigid(text: str) -> dict[str, dict[str, tuple[int, tuple[float, float, float]]]]:
    table: dict[str, dict[str, tuple[int, tuple[float, float, float]]]] = {}
    for line in text.strip().splitlines():
        resname, _, rest = line.partition(" ")
        atoms = {}
        for entry in rest.split(";"):
            name, group, x, y, z = entry.split()
            atoms[name] = (int(group), (float(x), float(y), float(z)))
        table[resname] = atoms
    return table


#: resname -> atom -> (rigid group index, position in that group's frame, Angstrom).
RIGID_GROUP_ATOM_POSITIONS = _parse_rigid(_RIGID)

#: Atom pairs whose names are interchangeable by symmetry (renamed for the loss).
RESIDUE_ATOM_RENAMING_SWAPS = {
    "ASP": {"OD1": "OD2"},
    "GLU": {"OE1": "OE2"},
    "PHE": {"CD1": "CD2", "CE1": "CE2"},
    "TYR": {"CD1": "CD2", "CE1": "CE2"},
}


def _index_tables() -> dict[str, np.ndarray]:
    """atom37 mask and atom14 <-> atom37 index maps, per residue type (row 20 unknown)."""
    atom37_mask = np.zeros((21, 37), dtype=np.float32)
    atom14_mask = np.zeros((21, 14), dtype=np.float32)
    atom14_to_37 = np.zeros((21, 14), dtype=np.int64)
    atom37_to_14 = np.zeros((21, 37), dtype=np.int64)
    for i, resname in enumerate(RESNAMES):
        for slot, name in enumerate(ATOM14_NAMES[resname]):
            if name:
                atom14_mask[i, slot] = 1.0
                atom37_mask[i, ATOM_ORDER[name]] = 1.0
                atom14_to_37[i, slot] = ATOM_ORDER[name]
                atom37_to_14[i, ATOM_ORDER[name]] = slot
    return {"atom37_mask": atom37_mask, "atom14_mask": atom14_mask,
            "atom14_to_37": atom14_to_37, "atom37_to_14": atom37_to_14}


_TABLES = _index_tables()
#: [21, 37] 1 where a residue type has that atom37 atom (unknown: none).
STANDARD_ATOM_MASK = _TABLES["atom37_mask"]
#: [21, 14] 1 where the atom14 slot holds an atom.
RESTYPE_ATOM14_MASK = _TABLES["atom14_mask"]
#: [21, 14] atom37 index of each atom14 slot (0 for empty slots).
RESTYPE_ATOM14_TO_ATOM37 = _TABLES["atom14_to_37"]
#: [21, 37] atom14 slot of each atom37 atom (0 for absent atoms).
RESTYPE_ATOM37_TO_ATOM14 = _TABLES["atom37_to_14"]


def _frame_from_axes(ex: np.ndarray, ey: np.ndarray, origin: np.ndarray) -> np.ndarray:
    """4x4 frame whose x axis is along ``ex`` and whose xy plane holds ``ey`` (Gram-Schmidt)."""
    x = ex / np.linalg.norm(ex)
    y = ey - np.dot(ey, x) * x
    y = y / np.linalg.norm(y)
    frame = np.eye(4)
    frame[:3, :3] = np.stack([x, y, np.cross(x, y)], axis=1)
    frame[:3, 3] = origin
    return frame


def _default_frames(resname: str) -> np.ndarray:
    """[8, 4, 4] each rigid group's frame in its parent's frame before the torsion rotation.

    Parents: groups 1..4 hang off the backbone frame, chi2..chi4 off the previous chi group.
    Groups 0 and 1 are the identity; chi groups the residue lacks stay all zero.
    """
    frames = np.zeros((8, 4, 4))
    frames[0] = frames[1] = np.eye(4)
    pos = {a: np.array(p) for a, (_, p) in RIGID_GROUP_ATOM_POSITIONS[resname].items()}
    frames[2] = _frame_from_axes(pos["N"] - pos["CA"], np.array([1.0, 0.0, 0.0]), pos["N"])
    frames[3] = _frame_from_axes(pos["C"] - pos["CA"], pos["CA"] - pos["N"], pos["C"])
    chis = CHI_ANGLES_ATOMS[resname]
    if chis:
        a, b, c = (pos[n] for n in chis[0][:3])
        frames[4] = _frame_from_axes(c - b, a - b, c)
    for k in range(1, len(chis)):
        end = pos[chis[k][2]]
        frames[4 + k] = _frame_from_axes(end, np.array([-1.0, 0.0, 0.0]), end)
    return frames


def _group_tables() -> dict[str, np.ndarray]:
    default_frame = np.zeros((21, 8, 4, 4), dtype=np.float32)
    atom14_group = np.zeros((21, 14), dtype=np.int64)
    atom14_pos = np.zeros((21, 14, 3), dtype=np.float32)
    atom37_group = np.zeros((21, 37), dtype=np.int64)
    atom37_pos = np.zeros((21, 37, 3), dtype=np.float32)
    for i, resname in enumerate(RESNAMES[:20]):
        default_frame[i] = _default_frames(resname)
        for name, (group, position) in RIGID_GROUP_ATOM_POSITIONS[resname].items():
            slot = ATOM14_NAMES[resname].index(name)
            atom14_group[i, slot] = group
            atom14_pos[i, slot] = position
            atom37_group[i, ATOM_ORDER[name]] = group
            atom37_pos[i, ATOM_ORDER[name]] = position
    return {"frame": default_frame, "g14": atom14_group, "p14": atom14_pos,
            "g37": atom37_group, "p37": atom37_pos}


_GROUPS = _group_tables()
#: [21, 8, 4, 4] default frame of each rigid group relative to its parent (zero if absent).
RESTYPE_RIGID_GROUP_DEFAULT_FRAME = _GROUPS["frame"]
#: [21, 14] rigid group of each atom14 atom; [21, 14, 3] its position in that group.
RESTYPE_ATOM14_TO_RIGID_GROUP = _GROUPS["g14"]
RESTYPE_ATOM14_RIGID_GROUP_POSITIONS = _GROUPS["p14"]
#: [21, 37] rigid group of each atom37 atom; [21, 37, 3] its position in that group.
RESTYPE_ATOM37_TO_RIGID_GROUP = _GROUPS["g37"]
RESTYPE_ATOM37_RIGID_GROUP_POSITIONS = _GROUPS["p37"]


def _ambiguity_tables() -> tuple[np.ndarray, np.ndarray]:
    ambiguous = np.zeros((21, 14), dtype=np.float32)
    swap = np.tile(np.arange(14, dtype=np.int64), (21, 1))
    for resname, pairs in RESIDUE_ATOM_RENAMING_SWAPS.items():
        i = RESNAMES.index(resname)
        for a, b in pairs.items():
            ia, ib = ATOM14_NAMES[resname].index(a), ATOM14_NAMES[resname].index(b)
            ambiguous[i, [ia, ib]] = 1.0
            swap[i, ia], swap[i, ib] = ib, ia
    return ambiguous, swap


#: [21, 14] 1 for atoms with a symmetric partner; [21, 14] the partner's atom14 slot.
RESTYPE_ATOM14_IS_AMBIGUOUS, RESTYPE_ATOM14_SWAP_INDEX = _ambiguity_tables()


def sequence_to_aatype(sequence: str) -> np.ndarray:
    """One-letter sequence -> [N] int64 residue indices; letters outside RESTYPES map to X (20).

    Raises ValueError for a character that is not an upper-case letter.
    """
    bad = [c for c in sequence if not (c.isascii() and c.isalpha() and c.isupper())]
    if bad:
        raise ValueError(f"sequence holds a character that is not a residue letter: {bad[0]!r}")
    return np.array([RESTYPE_ORDER.get(c, UNK_RESTYPE_INDEX) for c in sequence], dtype=np.int64)
