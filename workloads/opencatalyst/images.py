"""The periodic images a radius search over a cell enumerates, counted before any is built.

A periodic radius graph (OCP's ``radius_graph_pbc``, pymatgen's ``get_neighbor_list``) looks
for neighbours among the images of the cell within ``ceil(radius / d)`` cells along each
periodic direction, d the interplanar spacing there (``1 / |row of inv(cell).T|``). A cell thin
along one direction (a needle or a sheet of a few hundredths of an Angstrom, which a damaged or
crafted structure can hold while its volume looks sane) multiplies the images by thousands and
the distances computed by thousands more: one structure would take gigabytes. The bounds below
are checked on the count, from the cell alone, before anything is allocated.

Bounds (a catalyst slab is several Angstrom wide in plane and carries vacuum along its normal,
so a 6 Angstrom search over it meets tens of images, not thousands):

- `MAX_PERIODIC_IMAGES` images: 13 ** 3, every interplanar spacing at least ``radius / 6``;
- `MAX_IMAGE_PAIRS` (images x atoms x atoms) distances per structure: the model's on-the-fly
  graph holds them at once (three float64 offsets and a distance each, 32 bytes: 256 MiB at the
  bound), the preparation in blocks of `BLOCK_PAIRS` (32 MiB).
"""

from __future__ import annotations

import numpy as np

from mlhpc.errors import DataError, Where

MAX_PERIODIC_IMAGES = 13**3
MAX_IMAGE_PAIRS = 1 << 23
#: Distances a blocked search (`prepare.radius_graph_pbc`) holds at once (32 MiB of offsets and distances).
BLOCK_PAIRS = 1 << 20


def image_reach(cell: np.ndarray, pbc: np.ndarray, radius: float) -> np.ndarray:
    """Cells to search on each side along each direction: ``ceil(radius / spacing)`` where
    periodic, 0 elsewhere.

    Args:
        cell: float (3, 3) Angstrom, rows the lattice vectors. pbc: bool (3,). radius: Angstrom.

    Returns:
        float64 (3,), whole numbers (inf for a singular cell: float, so that no count overflows).
    """
    pbc = np.asarray(pbc, dtype=bool).reshape(3)
    if not pbc.any():
        return np.zeros(3)
    try:
        recip_norm = np.linalg.norm(np.linalg.inv(np.asarray(cell, dtype=np.float64).reshape(3, 3)).T, axis=1)
    except np.linalg.LinAlgError:
        recip_norm = np.full(3, np.inf)
    with np.errstate(invalid="ignore", over="ignore"):
        reach = np.ceil(float(radius) * recip_norm)
    return np.where(pbc, np.nan_to_num(reach, nan=np.inf), 0.0)


def image_count(reach: np.ndarray) -> float:
    """Images of a search of ``reach`` (`image_reach`): the product of ``2 r + 1`` (float)."""
    return float(np.prod(2.0 * np.asarray(reach, dtype=np.float64) + 1.0))


def check_images(cell: np.ndarray, pbc: np.ndarray, atoms: int, radius: float, where: Where | str) -> np.ndarray:
    """The reach of a search (`image_reach`) after checking its images and distances against
    `MAX_PERIODIC_IMAGES` and `MAX_IMAGE_PAIRS`, from the cell alone.

    Returns:
        int64 (3,): cells to search on each side along each direction.

    Raises:
        DataError: ``WHERE: ...`` naming the count, the bound and the cell's reach.
    """
    reach = image_reach(cell, pbc, radius)
    images = image_count(reach)
    shown = " x ".join("inf" if not np.isfinite(r) else str(int(2 * r + 1)) for r in reach)
    if not images <= MAX_PERIODIC_IMAGES:
        raise DataError.at(where, f"the cell's periodic images within {radius:g} A number {images:.3g} "
                        f"({shown}), over the bound of {MAX_PERIODIC_IMAGES}: a cell this thin is no "
                        "catalyst structure")
    pairs = images * atoms * atoms
    if pairs > MAX_IMAGE_PAIRS:
        raise DataError.at(where, f"a {radius:g} A search over {shown} images of {atoms} atoms computes "
                        f"{pairs:.3g} distances, over the bound of {MAX_IMAGE_PAIRS}")
    return reach.astype(np.int64)


def image_grid(reach: np.ndarray) -> np.ndarray:
    """int64 (images, 3): every image offset of a search of ``reach``, the last axis fastest."""
    axes = [np.arange(-r, r + 1) for r in np.asarray(reach, dtype=np.int64)]
    return np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 3)
