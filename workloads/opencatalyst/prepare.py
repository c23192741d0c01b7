"""`mlhpc data prepare` for OC20: ASE-readable trajectories (extxyz) to OCP LMDB files.

Follows the OCP preprocessing (``scripts/preprocess_ef.py`` with
``ocpmodels/preprocessing/atoms_to_graphs.py`` ``AtomsToGraphs(max_neigh=50, radius=6,
r_energy=True, r_forces=True, r_fixed=True, r_distances=False, r_edges=--get-edges)``): one
record per frame with positions, cell, atomic numbers, natoms, tags, fixed flags (from ASE
``FixAtoms``), energy and forces read with ``apply_constraint=False``, and with ``get_edges`` the
periodic neighbour list. The reference finds neighbours with pymatgen's
``Structure.get_neighbor_list(r=6, numerical_tol=0, exclude_self=True)``; `radius_graph_pbc`
here is a numpy search over the periodic images with the same result set (ties in distance may be
ordered differently). What is not done: ``--ref-energy`` (the per-system reference energies come
from OC20's ``*.txt`` logs, which are not read here), so ``y`` is the frame's energy as stored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mlhpc.errors import DataError

from . import lmdb_io

RADIUS_A = 6.0  # AtomsToGraphs radius in preprocess_ef.py
MAX_NEIGHBORS = 50  # AtomsToGraphs max_neigh in preprocess_ef.py


def radius_graph_pbc(pos: np.ndarray, cell: np.ndarray, pbc: np.ndarray,
                     radius: float = RADIUS_A, max_neighbors: int = MAX_NEIGHBORS
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Neighbours of every atom within ``radius`` over the periodic images, at most
    ``max_neighbors`` nearest per centre (``AtomsToGraphs._get_neighbors_pymatgen``).

    Args:
        pos: float (N, 3) Angstrom. cell: float (3, 3) Angstrom, rows the lattice vectors.
        pbc: bool (3,) periodic directions (images are searched only along these).

    Returns:
        ``edge_index`` int64 (2, E) with row 0 the neighbour j and row 1 the centre i (the
        reference's ``vstack((n_index, c_index))``), ``cell_offsets`` int64 (E, 3) the image of
        j, and ``distances`` float64 (E,) = |pos[j] + offsets @ cell - pos[i]|, edges grouped
        by centre and sorted by distance; self pairs (distance < 1e-8) are left out.
    """
    pos, cell = np.asarray(pos, dtype=np.float64), np.asarray(cell, dtype=np.float64)
    reach = np.zeros(3, dtype=np.int64)
    if np.any(pbc):
        recip_norm = np.linalg.norm(np.linalg.inv(cell).T, axis=1)  # 1 / interplanar spacing
        reach = np.where(pbc, np.ceil(radius * recip_norm), 0).astype(np.int64)
    grid = np.stack(np.meshgrid(*[np.arange(-r, r + 1) for r in reach], indexing="ij"), -1).reshape(-1, 3)
    shifted = pos[None, :, :] + (grid @ cell)[:, None, :]  # (images, N, 3): pos[j] + offset
    delta = shifted[:, None, :, :] - pos[None, :, None, :]  # (images, i, j, 3)
    dist = np.linalg.norm(delta, axis=-1)
    image, centre, neighbour = np.nonzero((dist <= radius) & (dist >= 1e-8))
    d = dist[image, centre, neighbour]
    order = np.lexsort((d, centre))
    image, centre, neighbour, d = image[order], centre[order], neighbour[order], d[order]
    rank = np.arange(len(centre)) - np.searchsorted(centre, centre, side="left")
    keep = rank < max_neighbors
    edge_index = np.stack([neighbour[keep], centre[keep]]).astype(np.int64)
    return edge_index, grid[image[keep]].astype(np.int64), d[keep]


def atoms_to_record(atoms: Any, get_edges: bool) -> dict[str, Any]:
    """One ``ase.Atoms`` with energy and forces as a record in the reference's names
    (`lmdb_io.encode_record`): pos, cell, atomic_numbers, natoms, tags, fixed, force (eV/A),
    y (eV), and with ``get_edges`` edge_index and cell_offsets (`radius_graph_pbc`).

    Raises:
        RuntimeError (from ASE): the atoms carry no energy or forces.
    """
    from ase.constraints import FixAtoms

    n = len(atoms)
    fixed = np.zeros(n, dtype=np.float32)
    for constraint in atoms.constraints:
        if isinstance(constraint, FixAtoms):
            fixed[constraint.index] = 1.0
    record: dict[str, Any] = {
        "pos": atoms.get_positions(), "cell": np.asarray(atoms.get_cell()).reshape(1, 3, 3),
        "atomic_numbers": atoms.get_atomic_numbers(), "natoms": n,
        "y": float(atoms.get_potential_energy(apply_constraint=False)),
        "force": atoms.get_forces(apply_constraint=False), "fixed": fixed,
        "tags": atoms.get_tags().astype(np.int64)}
    if get_edges:
        edge_index, offsets, _ = radius_graph_pbc(atoms.get_positions(), np.asarray(atoms.get_cell()),
                                                  atoms.get_pbc())
        record["edge_index"], record["cell_offsets"] = edge_index, offsets
    return record


def _frames(src: Path) -> list[Any]:
    import ase.io

    try:
        return ase.io.read(str(src), index=":")
    except Exception as exc:  # noqa: BLE001 - ASE raises many kinds for a malformed file
        raise DataError(f"{src}: not a trajectory ASE can read ({type(exc).__name__}: {exc})") from None


def _record_of(src: Path, number: int, atoms: Any, get_edges: bool) -> dict[str, Any]:
    where = f"{src}: frame {number}"
    try:
        record = atoms_to_record(atoms, get_edges)
    except Exception as exc:  # noqa: BLE001 - no calculator results in the frame
        raise DataError(f"{where}: no energy and forces ({type(exc).__name__}: {exc})") from None
    record["sid"] = int(atoms.info.get("sid", 0))
    record["fid"] = int(atoms.info.get("fid", number))
    lmdb_io.validate_record(record, where)
    return record


def extxyz_to_lmdb(src: Path, dst_lmdb: Path, get_edges: bool) -> int:
    """Write every frame of ``src`` (extxyz or any ASE-readable file with energies and forces)
    as one OCP LMDB file ``dst_lmdb`` (written atomically, `lmdb_io.write_lmdb`).

    ``sid`` and ``fid`` come from each frame's ``info`` when present, else 0 and the frame
    number.

    Returns:
        records written.

    Raises:
        DataError: ``src`` unreadable or empty, a frame without energy or forces, or one that
            fails `lmdb_io.validate_record` (names the file and frame); ``dst_lmdb`` unwritable.
    """
    src, dst_lmdb = Path(src), Path(dst_lmdb)
    frames = _frames(src)
    if not frames:
        raise DataError(f"{src}: no frames")
    records = (_record_of(src, k, atoms, get_edges) for k, atoms in enumerate(frames))
    try:
        return lmdb_io.write_lmdb(dst_lmdb, records)
    except OSError as exc:
        raise DataError(f"{dst_lmdb}: cannot write ({exc.strerror or exc})") from None

