"""Protein backbone geometry for the embedded data and the baselines: chains built from their
backbone torsion angles, in numpy, many chains at once.

Ideal geometry (Engh and Huber 1991, the values AlphaFold's ``residue_constants`` uses): bonds
N-CA 1.458, CA-C 1.525, C-N 1.329, C=O 1.231 Angstrom; angles N-CA-C 111.2, CA-C-N 116.2,
C-N-CA 121.7, CA-C-O 120.5 degrees; trans peptides (omega 180). Atoms are placed one after
another by the natural extension reference frame (NeRF; Parsons et al. 2005, J. Comput. Chem.
26, 1063). C-beta follows from N, CA and C with the ideal tetrahedral construction.
"""

from __future__ import annotations

import numpy as np

BOND_N_CA, BOND_CA_C, BOND_C_N, BOND_C_O = 1.458, 1.525, 1.329, 1.231
ANGLE_N_CA_C, ANGLE_CA_C_N, ANGLE_C_N_CA, ANGLE_CA_C_O = 111.2, 116.2, 121.7, 120.5
#: Torsions (phi, psi) of an ideal right-handed alpha helix, degrees.
HELIX_PHI_PSI = (-57.0, -47.0)


def _cross(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Cross products of ``[K, 3]`` vectors (numpy's ``cross`` is slow on small arrays)."""
    return np.stack([u[:, 1] * v[:, 2] - u[:, 2] * v[:, 1], u[:, 2] * v[:, 0] - u[:, 0] * v[:, 2],
                     u[:, 0] * v[:, 1] - u[:, 1] * v[:, 0]], axis=-1)


def place(a: np.ndarray, b: np.ndarray, c: np.ndarray, bond: float, angle_deg: float,
          torsion_deg: np.ndarray) -> np.ndarray:
    """The atom D bonded to C with ``|CD| = bond``, angle B-C-D and torsion A-B-C-D (NeRF).

    ``a``, ``b``, ``c``: ``[K, 3]`` Angstrom; ``torsion_deg``: ``[K]``. Returns ``[K, 3]``.
    """
    bc = c - b
    bc /= np.sqrt((bc * bc).sum(-1, keepdims=True))
    n = _cross(b - a, bc)
    n /= np.sqrt((n * n).sum(-1, keepdims=True))
    m = _cross(n, bc)
    theta, phi = np.radians(angle_deg), np.radians(torsion_deg)[:, None]
    return (c - bond * np.cos(theta) * bc + bond * np.sin(theta) * np.cos(phi) * m
            + bond * np.sin(theta) * np.sin(phi) * n)


def backbone(phi_deg: np.ndarray, psi_deg: np.ndarray) -> np.ndarray:
    """Backbone atoms N, CA, C, O of K chains of N residues from their torsions.

    Args:
        phi_deg, psi_deg: ``[K, N]`` degrees (phi of the first and psi of the last residue
            place no atom and are ignored, except the last psi, which sets the last O).

    Returns:
        ``[K, N, 4, 3]`` float64 Angstrom (atoms N, CA, C, O), the first N at the origin.
    """
    k, n = phi_deg.shape
    atoms = np.zeros((k, n, 4, 3))
    atoms[:, 0, 1] = (BOND_N_CA, 0.0, 0.0)
    t = np.radians(180.0 - ANGLE_N_CA_C)
    atoms[:, 0, 2] = atoms[:, 0, 1] + BOND_CA_C * np.array([np.cos(t), np.sin(t), 0.0])
    for i in range(n - 1):
        n_i, ca_i, c_i = atoms[:, i, 0], atoms[:, i, 1], atoms[:, i, 2]
        atoms[:, i + 1, 0] = place(n_i, ca_i, c_i, BOND_C_N, ANGLE_CA_C_N, psi_deg[:, i])
        atoms[:, i + 1, 1] = place(ca_i, c_i, atoms[:, i + 1, 0], BOND_N_CA, ANGLE_C_N_CA,
                                   np.full(k, 180.0))
        atoms[:, i + 1, 2] = place(c_i, atoms[:, i + 1, 0], atoms[:, i + 1, 1], BOND_CA_C,
                                   ANGLE_N_CA_C, phi_deg[:, i + 1])
    flat = atoms.reshape(k * n, 4, 3)
    atoms[:, :, 3] = place(flat[:, 0], flat[:, 1], flat[:, 2], BOND_C_O, ANGLE_CA_C_O,
                           psi_deg.reshape(-1) + 180.0).reshape(k, n, 3)
    return atoms


def c_beta(n: np.ndarray, ca: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Ideal C-beta positions ``[..., 3]`` from N, CA, C ``[..., 3]`` (tetrahedral geometry)."""
    b, c_ = ca - n, c - ca
    a = np.cross(b, c_)
    return -0.58273431 * a + 0.56802827 * b - 0.54067466 * c_ + ca


def helix_ca(length: int) -> np.ndarray:
    """C-alpha positions ``[length, 3]`` of an ideal alpha helix (`HELIX_PHI_PSI`)."""
    phi = np.full((1, length), HELIX_PHI_PSI[0])
    psi = np.full((1, length), HELIX_PHI_PSI[1])
    return backbone(phi, psi)[0, :, 1]


def kabsch(mobile: np.ndarray, fixed: np.ndarray) -> np.ndarray:
    """``mobile`` ``[N, 3]`` rotated and translated onto ``fixed`` ``[N, 3]`` with the least
    root-mean-square deviation (Kabsch 1976; no reflection)."""
    mc, fc = mobile - mobile.mean(0), fixed - fixed.mean(0)
    u, _, vt = np.linalg.svd(mc.T @ fc)
    d = np.sign(np.linalg.det(u @ vt))
    rotation = u @ np.diag([1.0, 1.0, d]) @ vt
    return mc @ rotation + fixed.mean(0)


def mean_structure(structures: list[np.ndarray], rounds: int = 3) -> np.ndarray:
    """The mean of equally long structures ``[N, 3]`` after superposing them (each onto the
    running mean, starting from the first, ``rounds`` times)."""
    mean = structures[0]
    for _ in range(rounds):
        mean = np.mean([kabsch(s, mean) for s in structures], axis=0)
    return mean
