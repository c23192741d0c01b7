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

from . import images, lmdb_io
from .unpickle import why

RADIUS_A = 6.0  # AtomsToGraphs radius in preprocess_ef.py
MAX_NEIGHBORS = 50  # AtomsToGraphs max_neigh in preprocess_ef.py


def radius_graph_pbc(pos: np.ndarray, cell: np.ndarray, pbc: np.ndarray,
                     radius: float = RADIUS_A, max_neighbors: int = MAX_NEIGHBORS,
                     where: str = "structure") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Neighbours of every atom within ``radius`` over the periodic images, at most
    ``max_neighbors`` nearest per centre (``AtomsToGraphs._get_neighbors_pymatgen``).

    The images are counted from the cell and bounded (`images.check_images`) before any is
    built; distances are then computed in blocks of about `images.BLOCK_PAIRS`, keeping the
    ``max_neighbors`` nearest of each centre after each block, so memory stays bounded however
    many atoms share a neighbourhood.

    Args:
        pos: float (N, 3) Angstrom. cell: float (3, 3) Angstrom, rows the lattice vectors.
        pbc: bool (3,) periodic directions (images are searched only along these).
        where: names the structure in errors.

    Returns:
        ``edge_index`` int64 (2, E) with row 0 the neighbour j and row 1 the centre i (the
        reference's ``vstack((n_index, c_index))``), ``cell_offsets`` int64 (E, 3) the image of
        j, and ``distances`` float64 (E,) = |pos[j] + offsets @ cell - pos[i]|, edges grouped
        by centre and sorted by distance; self pairs (distance < 1e-8) are left out.

    Raises:
        DataError: the images or distances of the search exceed `images.check_images`'s bounds.
    """
    pos, cell = np.asarray(pos, dtype=np.float64), np.asarray(cell, dtype=np.float64)
    n = len(pos)
    grid = images.image_grid(images.check_images(cell, pbc, n, radius, where))
    shifts = grid @ cell
    per_block = max(1, images.BLOCK_PAIRS // max(1, n * n))
    centres = max(1, images.BLOCK_PAIRS // max(1, n * per_block))
    empty = tuple(np.zeros(0, dtype=t) for t in (np.int64, np.int64, np.int64, np.float64))
    found = [empty]
    for c0 in range(0, n, centres):
        kept = empty
        for g0 in range(0, len(grid), per_block):
            shifted = pos[None, :, :] + shifts[g0:g0 + per_block, None, :]  # (images, j, 3)
            dist = np.linalg.norm(shifted[:, None, :, :] - pos[None, c0:c0 + centres, None, :], axis=-1)
            image, centre, neighbour = np.nonzero((dist <= radius) & (dist >= 1e-8))
            block = (image + g0, centre + c0, neighbour, dist[image, centre, neighbour])
            kept = _nearest(tuple(np.concatenate(pair) for pair in zip(kept, block)), max_neighbors)
        found.append(kept)
    image, centre, neighbour, d = (np.concatenate(parts) for parts in zip(*found))
    edge_index = np.stack([neighbour, centre]).astype(np.int64)
    return edge_index, grid[image].astype(np.int64), d


def _nearest(edges: tuple[np.ndarray, ...], max_neighbors: int) -> tuple[np.ndarray, ...]:
    """``(image, centre, neighbour, distance)`` ordered by centre then distance (stable), at
    most ``max_neighbors`` per centre."""
    image, centre, neighbour, d = edges
    order = np.lexsort((d, centre))
    image, centre, neighbour, d = image[order], centre[order], neighbour[order], d[order]
    keep = np.arange(len(centre)) - np.searchsorted(centre, centre, side="left") < max_neighbors
    return image[keep], centre[keep], neighbour[keep], d[keep]


def atoms_to_record(atoms: Any, get_edges: bool, where: str = "structure") -> dict[str, Any]:
    """One ``ase.Atoms`` with energy and forces as a record in the reference's names
    (`lmdb_io.encode_record`): pos, cell, atomic_numbers, natoms, tags, fixed, force (eV/A),
    y (eV), and with ``get_edges`` edge_index and cell_offsets (`radius_graph_pbc`).

    Raises:
        RuntimeError (from ASE): the atoms carry no energy or forces. DataError: with
            ``get_edges``, a cell whose periodic images exceed `images.check_images`'s bounds.
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
                                                  atoms.get_pbc(), where=where)
        record["edge_index"], record["cell_offsets"] = edge_index, offsets
    return record


def _frames(src: Path) -> list[Any]:
    import ase.io

    try:
        return ase.io.read(str(src), index=":")
    except Exception as exc:  # noqa: BLE001 - ASE raises many kinds for a malformed file
        raise DataError(f"{src}: not a trajectory ASE can read ({type(exc).__name__}: {why(exc)})") from None


def _record_of(src: Path, number: int, atoms: Any, get_edges: bool) -> dict[str, Any]:
    where = f"{src}: frame {number}"
    try:
        record = atoms_to_record(atoms, get_edges, where)
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - no calculator results in the frame
        raise DataError(f"{where}: no energy and forces ({type(exc).__name__}: {why(exc)})") from None
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
        DataError: ``src`` unreadable or empty, a frame without energy or forces, one whose
            periodic images exceed the bounds of `images` (counted before any is built), or one
            that fails `lmdb_io.validate_record` (names the file and frame). OSError:
            ``dst_lmdb`` cannot be written (a full disk: ``errno.ENOSPC``).
    """
    src, dst_lmdb = Path(src), Path(dst_lmdb)
    frames = _frames(src)
    if not frames:
        raise DataError(f"{src}: no frames")
    records = (_record_of(src, k, atoms, get_edges) for k, atoms in enumerate(frames))
    return lmdb_io.write_lmdb(dst_lmdb, records)

