"""lDDT-Ca of the OpenFold workload against an independent implementation (biotite's
``biotite.structure.lddt``) on real protein structures: the NMR models of PDB 1GYA (CD2 adhesion
domain, 105 residues; tests/data/openfold/README.md), one model scored against another."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from mlhpc_workloads.openfold.lddt import lddt, lddt_ca, lddt_ca_stats

structure = pytest.importorskip("biotite.structure")
pdb = pytest.importorskip("biotite.structure.io.pdb")

DATA = Path(__file__).parent / "data" / "openfold"


@pytest.fixture(scope="module")
def models():
    """The four C-alpha models of 1GYA as a biotite AtomArrayStack (4 x 105 atoms)."""
    return pdb.PDBFile.read(str(DATA / "1gya_ca_models1-4.pdb")).get_structure()


def _ours(true: np.ndarray, predicted: np.ndarray, **kwargs) -> torch.Tensor:
    mask = torch.ones(true.shape[0])
    return lddt(torch.from_numpy(predicted), torch.from_numpy(true), mask, **kwargs)


@pytest.mark.parametrize("ref,sub", [(0, 1), (0, 2), (1, 3), (3, 0)])
def test_chain_score_matches_biotite(models, ref, sub):
    expected = structure.lddt(models[ref], models[sub])
    got = float(_ours(models[ref].coord.astype(np.float64), models[sub].coord.astype(np.float64)))
    assert 0.5 < expected < 0.98  # a real comparison, neither trivial nor perfect
    assert got == pytest.approx(expected, abs=1e-9)


def test_per_residue_scores_match_biotite(models):
    expected = structure.lddt(models[0], models[2], aggregation="residue")
    got = _ours(models[0].coord.astype(np.float64), models[2].coord.astype(np.float64),
                per_residue=True).numpy()
    assert np.allclose(got, expected, atol=1e-9)
    assert got.std() > 0.05  # residues differ: a per-chain value broadcast would fail


def test_a_wrong_radius_or_threshold_would_fail(models):
    """The benchmark's radius (15 A) and thresholds (0.5, 1, 2, 4 A) are the ones used: the
    default score agrees with biotite's default and differs from what a 10 A or 20 A radius, or
    thresholds of 1, 2, 4, 8 A, give (by more than the agreement's tolerance)."""
    true, pred = models[0].coord.astype(np.float64), models[1].coord.astype(np.float64)
    ours = float(_ours(true, pred))
    assert ours == pytest.approx(structure.lddt(models[0], models[1]), abs=1e-9)
    for radius in (10.0, 20.0):
        other = structure.lddt(models[0], models[1], inclusion_radius=radius)
        assert abs(other - ours) > 1e-3
        assert float(_ours(true, pred, cutoff_A=radius)) == pytest.approx(other, abs=1e-9)
    bins = (1.0, 2.0, 4.0, 8.0)
    other = structure.lddt(models[0], models[1], distance_bins=bins)
    assert abs(other - ours) > 1e-2
    assert float(_ours(true, pred, thresholds_A=bins)) == pytest.approx(other, abs=1e-9)


def test_pairs_come_from_the_true_structure_only(models):
    """Swapping true and predicted changes the pairs scored (radius taken on the true one)."""
    a, b = models[0].coord.astype(np.float64), models[3].coord.astype(np.float64)
    forward, backward = float(_ours(a, b)), float(_ours(b, a))
    assert forward == pytest.approx(structure.lddt(models[0], models[3]), abs=1e-9)
    assert backward == pytest.approx(structure.lddt(models[3], models[0]), abs=1e-9)
    assert forward != pytest.approx(backward, abs=1e-6)


def test_masked_residues_are_left_out(models):
    """An unresolved residue (mask 0) is neither scored nor a partner: the score equals biotite's
    on the structure without it, however wrong its predicted position."""
    true, pred = models[0].coord.astype(np.float64), models[2].coord.astype(np.float64).copy()
    mask = torch.ones(len(true))
    mask[10:20] = 0
    pred[10:20] += 50.0
    keep = np.ones(len(true), dtype=bool)
    keep[10:20] = False
    expected = structure.lddt(models[0][keep], models[2][keep])
    got = float(lddt(torch.from_numpy(pred), torch.from_numpy(true), mask))
    assert got == pytest.approx(expected, abs=1e-9)


def test_atom37_and_batch_stats(models):
    """lddt_ca reads the CA slot of atom37; the metric sums per-chain scores and counts chains,
    padded residues (seq_mask 0) ignored."""
    n = models.array_length()
    true = torch.zeros(2, n + 7, 37, 3, dtype=torch.float64)
    pred = torch.zeros_like(true)
    true[:, :n, 1] = torch.from_numpy(models[0].coord.astype(np.float64))
    pred[0, :n, 1] = torch.from_numpy(models[1].coord.astype(np.float64))
    pred[1, :n, 1] = torch.from_numpy(models[2].coord.astype(np.float64))
    pred[:, n:, 1] = 99.0  # padding, wrong on purpose
    mask = torch.zeros(2, n + 7, 37)
    mask[:, :, 1] = 1.0
    seq_mask = torch.zeros(2, n + 7)
    seq_mask[:, :n] = 1.0
    total, count = lddt_ca_stats({"final_atom_positions": pred},
                                 {"all_atom_positions": true, "all_atom_mask": mask,
                                  "seq_mask": seq_mask})
    expected = structure.lddt(models[0], models[1]) + structure.lddt(models[0], models[2])
    assert float(count) == 2.0
    assert float(total) == pytest.approx(expected, abs=1e-9)
    assert lddt_ca(pred, true, mask * seq_mask[..., None]).shape == (2,)
