"""Graph work of DimeNet++ in plain PyTorch: the periodic radius graph, edge vectors, triplets and
a scatter-sum (no torch-scatter, torch-sparse or torch-cluster).

Conventions follow the OCP reference (mlcommons/hpc ``open_catalyst/ocpmodels/common/utils.py``
``radius_graph_pbc`` and ``get_pbc_distances``; ``ocpmodels/preprocessing`` ``AtomsToGraphs``):

- ``edge_index`` (2, E) int64, row 0 the neighbour (source) j, row 1 the centre (target) i, atom
  indices over the whole batch;
- ``cell_offsets`` (E, 3), integer image of j: the edge vector is
  ``pos[j] + cell_offsets @ cell - pos[i]``, Angstrom, where the cell's rows are the lattice
  vectors (ASE/OCP);
- ``neighbors`` (B,) int64, edges per structure, edges grouped by structure in batch order.
"""

from __future__ import annotations

import itertools
import math

import torch

SAME_ATOM_SQ_ANGSTROM = 1e-4  # the reference drops pairs closer than this (squared distance)


def scatter_sum(src: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    """Sum rows of ``src`` (M, ...) into ``size`` rows by ``index`` int64 (M,) (torch-scatter's
    ``scatter(..., reduce="sum")``); differentiable twice. Returns (size, ...), dtype of ``src``."""
    out = src.new_zeros((size, *src.shape[1:]))
    return out.index_add(0, index, src)


def _image_shifts(cell: torch.Tensor, cutoff: float, pbc: tuple[bool, bool, bool]) -> torch.Tensor:
    """Integer images (M, 3) int64 that can hold a neighbour within ``cutoff`` of any atom of the
    cell: ceil(cutoff / h_a) repetitions along each periodic axis a, h_a the distance between the
    lattice planes spanned by the other two vectors (the reference's rep_a1..rep_a3)."""
    volume = torch.linalg.det(cell.double()).abs()
    ranges = []
    for axis in range(3):
        if not pbc[axis]:
            ranges.append(range(1))
            continue
        other = cell.double()[[(axis + 1) % 3, (axis + 2) % 3]]
        height = volume / torch.linalg.cross(other[0], other[1]).norm()
        reps = math.ceil(cutoff / float(height))
        ranges.append(range(-reps, reps + 1))
    return torch.tensor(list(itertools.product(*ranges)), dtype=torch.int64)


def _radius_graph_one(pos: torch.Tensor, cell: torch.Tensor, cutoff: float, max_neighbors: int,
                      pbc: tuple[bool, bool, bool]) -> tuple[torch.Tensor, torch.Tensor]:
    """Edges of one structure (local atom indices), see `radius_graph_pbc`."""
    images = _image_shifts(cell, cutoff, pbc)
    shifts = images.to(pos.dtype) @ cell.to(pos.dtype)  # (M, 3)
    n, m = pos.shape[0], images.shape[0]
    # vec[i, j, k] = pos[j] + shift[k] - pos[i]
    vec = pos.view(1, n, 1, 3) + shifts.view(1, 1, m, 3) - pos.view(n, 1, 1, 3)
    dist_sq = (vec * vec).sum(-1).reshape(n, n * m)
    valid = (dist_sq <= cutoff * cutoff) & (dist_sq > SAME_ATOM_SQ_ANGSTROM)
    dist_sq = torch.where(valid, dist_sq, torch.full_like(dist_sq, math.inf))
    keep = min(max_neighbors, n * m)
    nearest, order = torch.sort(dist_sq, dim=1, stable=True)
    nearest, order = nearest[:, :keep], order[:, :keep]
    found = torch.isfinite(nearest)
    centre = torch.arange(n).view(n, 1).expand(n, keep)[found]
    flat = order[found]
    neighbour, image = flat // m, flat % m
    return torch.stack([neighbour, centre]), images[image]


def radius_graph_pbc(pos: torch.Tensor, cell: torch.Tensor, natoms: torch.Tensor, cutoff: float,
                     max_neighbors: int, pbc: tuple[bool, bool, bool] = (True, True, True),
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The radius graph with periodic images (OCP's ``radius_graph_pbc(data, cutoff, 50)``).

    For each centre atom i, every image of every atom j (j == i allowed for other images) with
    0.01 Angstrom < |pos_j + offset - pos_i| <= ``cutoff``, of which the ``max_neighbors``
    nearest are kept (ties by a stable sort: the first in (j, image) order). Edges are grouped by
    structure, then by centre, nearest first. Not differentiable (indices); distances come from
    `edge_vectors`. No gradient is recorded.

    Args:
        pos: (N, 3) Angstrom, float32 or float64.
        cell: (B, 3, 3) Angstrom, rows the lattice vectors.
        natoms: (B,) int64, atoms per structure, in the order of ``pos``.
        cutoff: Angstrom, > 0.
        max_neighbors: >= 1, neighbours kept per centre.
        pbc: periodic along each lattice vector; the reference's OC20 graphs are periodic in all
            three (the preprocessing's pymatgen neighbour list).

    Returns:
        ``edge_index`` int64 (2, E) (row 0 j, row 1 i, batch atom indices), ``cell_offsets``
        int64 (E, 3), ``neighbors`` int64 (B,) edges per structure.

    Raises:
        ValueError: ``natoms`` does not add up to N, or a periodic cell is singular.
    """
    if int(natoms.sum()) != pos.shape[0]:
        raise ValueError(f"radius_graph_pbc: natoms adds up to {int(natoms.sum())}, pos has {pos.shape[0]} atoms")
    edges, offsets, counts = [], [], []
    start = 0
    with torch.no_grad():
        for b, count in enumerate(natoms.tolist()):
            if any(pbc) and abs(float(torch.linalg.det(cell[b].double()))) < 1e-9:
                raise ValueError(f"radius_graph_pbc: cell of structure {b} is singular; give a "
                                 "3-D cell or turn use_pbc off")
            edge, offset = _radius_graph_one(pos[start:start + count].detach(), cell[b].detach(),
                                             cutoff, max_neighbors, pbc)
            edges.append(edge + start)
            offsets.append(offset)
            counts.append(edge.shape[1])
            start += count
    edge_index = torch.cat(edges, dim=1) if edges else torch.zeros((2, 0), dtype=torch.int64)
    cell_offsets = torch.cat(offsets) if offsets else torch.zeros((0, 3), dtype=torch.int64)
    return edge_index.to(pos.device), cell_offsets.to(pos.device), torch.tensor(counts, device=pos.device)


def edge_vectors(pos: torch.Tensor, cell: torch.Tensor, batch: torch.Tensor,
                 edge_index: torch.Tensor, cell_offsets: torch.Tensor) -> torch.Tensor:
    """Edge vectors ``pos[j] + cell_offsets @ cell[structure] - pos[i]`` (``get_pbc_distances``),
    differentiable in ``pos``.

    The reference finds each edge's cell with ``repeat_interleave(cell, neighbors)``; here it is
    the centre atom's structure ``batch[i]``, the same whenever edges are grouped by structure in
    batch order (as the OCP collater and `radius_graph_pbc` group them).

    Args:
        pos: (N, 3) Angstrom. cell: (B, 3, 3). batch: (N,) int64 structure of each atom.
        edge_index: (2, E) int64. cell_offsets: (E, 3), integer valued (int64 or float).

    Returns:
        (E, 3), dtype of ``pos``, Angstrom.
    """
    j, i = edge_index[0], edge_index[1]
    edge_cell = cell.to(pos.dtype)[batch[i]]  # (E, 3, 3)
    offsets = torch.bmm(cell_offsets.to(pos.dtype).unsqueeze(1), edge_cell).squeeze(1)
    return pos[j] - pos[i] + offsets


def triplets(edge_index: torch.Tensor, num_nodes: int) -> dict[str, torch.Tensor]:
    """Triplets k -> j -> i: every pair of edges (kj, ji) where kj ends where ji starts, minus those
    with k == i by atom index (torch-geometric's ``DimeNet.triplets``, which the reference uses;
    in a periodic cell this also drops k = another image of i, a quirk kept).

    Args:
        edge_index: (2, E) int64, row 0 j (source), row 1 i (target).
        num_nodes: N.

    Returns:
        int64 (T,) tensors ``idx_i``, ``idx_j``, ``idx_k`` (atoms) and ``idx_kj``, ``idx_ji``
        (edges), triplets ordered by edge ji, then by the kj edges in target-sorted order.
    """
    j, i = edge_index[0], edge_index[1]
    device = edge_index.device
    by_target = torch.argsort(i, stable=True)
    degree = torch.bincount(i, minlength=num_nodes)
    first = torch.cumsum(degree, 0) - degree
    count = degree[j]  # edges into j, candidates kj for each edge ji
    idx_ji = torch.repeat_interleave(torch.arange(j.numel(), device=device), count)
    group_start = torch.cumsum(count, 0) - count
    within = torch.arange(idx_ji.numel(), device=device) - torch.repeat_interleave(group_start, count)
    idx_kj = by_target[torch.repeat_interleave(first[j], count) + within]
    keep = j[idx_kj] != i[idx_ji]
    idx_ji, idx_kj = idx_ji[keep], idx_kj[keep]
    return {"idx_i": i[idx_ji], "idx_j": j[idx_ji], "idx_k": j[idx_kj],
            "idx_kj": idx_kj, "idx_ji": idx_ji}


def triplet_angles(vectors: torch.Tensor, idx_kj: torch.Tensor, idx_ji: torch.Tensor) -> torch.Tensor:
    """The reference's angle of each triplet: between v_ji = pos_j - pos_i (+ offset) and
    v_kj = pos_k - pos_j (+ offset), i.e. pi minus the bond angle k-j-i, as ``atan2(|v_ji x v_kj|,
    v_ji . v_kj)`` in [0, pi] (torch-geometric 1.x DimeNet; 2.x writes the same angle with both
    vectors negated).

    Args:
        vectors: (E, 3) from `edge_vectors` (pass ``vectors.detach()`` for the reference).
        idx_kj, idx_ji: (T,) int64 from `triplets`.

    Returns:
        (T,) radians, dtype of ``vectors``.
    """
    v_ji, v_kj = vectors[idx_ji], vectors[idx_kj]
    dot = (v_ji * v_kj).sum(-1)
    cross = torch.linalg.cross(v_ji, v_kj).norm(dim=-1)
    return torch.atan2(cross, dot)
