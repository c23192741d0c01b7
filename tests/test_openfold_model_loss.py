"""The OpenFold loss against what it must give: (near) zero for a prediction equal to the
truth, the ambiguous atom naming chosen to match the prediction, terms that grow with the
error, and the reference's weights and sequence-length scaling."""

from __future__ import annotations

import pytest
import torch
from mlhpc_workloads.openfold import residue_constants as rc
from mlhpc_workloads.openfold.model import AlphaFoldConfig, geometry, loss, rigid
from mlhpc_workloads.openfold.model.structure import (
    frames_to_atom14,
    torsion_angles_to_frames,
)
from openfold_model_batch import make_batch, one_thread, with_sequence

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)

SEQUENCE = "ADEFYGKRWSLV"  # every ambiguous residue type (D, E, F, Y) and a glycine


def _perfect_outputs(batch: dict, iterations: int = 2) -> dict:
    """Structure-module outputs built from the true backbone frames and torsion angles."""
    aatype = batch["aatype"]
    gt = geometry.ground_truth(batch)
    torsions = geometry.torsion_angles(aatype, batch["all_atom_positions"],
                                       batch["all_atom_mask"])["torsion_angles_sin_cos"]
    groups = torsion_angles_to_frames(rigid.from_4x4(gt["backbone_rigid_tensor"]), torsions, aatype)
    def rep(t: torch.Tensor) -> torch.Tensor:
        return t.unsqueeze(1).expand(t.shape[0], iterations, *t.shape[1:])
    return {"sm_frames": rep(gt["backbone_rigid_tensor"]),
            "sm_sidechain_frames": rep(rigid.to_4x4(groups)),
            "sm_positions": rep(frames_to_atom14(groups, aatype)),
            "sm_angles": rep(torsions), "sm_unnormalized_angles": rep(2.0 * torsions)}


def _fape(outputs: dict, batch: dict, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    gt = geometry.ground_truth(batch)
    return (loss.backbone_fape(outputs, gt, torch.ones(1), cfg),
            loss.sidechain_fape(outputs, gt, cfg))


def test_a_prediction_equal_to_the_truth_has_no_fape_and_no_chi_error():
    cfg = AlphaFoldConfig.mini().loss
    batch = with_sequence(make_batch(n_res=len(SEQUENCE)), SEQUENCE, seed=1)
    outputs = _perfect_outputs(batch)
    backbone, sidechain = _fape(outputs, batch, cfg)
    # the floor is sqrt(eps) / length scale = 1e-3 (FAPE's eps 1e-4 A^2)
    assert backbone.item() < 2e-3 and sidechain.item() < 2e-3
    chi = loss.supervised_chi_loss(outputs, batch, geometry.ground_truth(batch), cfg)
    # unnormalised angles of norm 2: only the angle-norm penalty, 0.01 * |2 - 1|
    torch.testing.assert_close(chi, torch.tensor([0.01]), atol=1e-4, rtol=0)
    # moving every predicted atom 1 A raises the side-chain FAPE by about 1 A / 10 A
    shifted = dict(outputs, sm_positions=outputs["sm_positions"] + torch.tensor([1.0, 0.0, 0.0]))
    assert 0.05 < _fape(shifted, batch, cfg)[1].item() < 0.11


def test_the_ambiguous_naming_that_matches_the_prediction_is_chosen():
    batch = with_sequence(make_batch(n_res=len(SEQUENCE)), SEQUENCE, seed=2)
    outputs = _perfect_outputs(batch)
    aatype = batch["aatype"]
    swap = torch.as_tensor(rc.RESTYPE_ATOM14_SWAP_INDEX)[aatype]  # [1, N, 14]
    swapped_pos = torch.gather(outputs["sm_positions"], -2,
                               swap[:, None, :, :, None].expand_as(outputs["sm_positions"]))
    # the prediction names OD1/OD2, OE1/OE2, CD1/CD2 and CE1/CE2 the other way round
    gt = geometry.ground_truth(batch)
    renamed = loss.renamed_ground_truth(gt, swapped_pos[:, -1])
    ambiguous = torch.tensor([c in "DEFY" for c in SEQUENCE], dtype=torch.float32)
    torch.testing.assert_close(renamed["alt_naming_is_better"][0], ambiguous)
    # the renamed truth is the swapped prediction itself
    assert renamed["positions"].sub(swapped_pos[:, -1]).abs().max() < 1e-3
    straight = loss.renamed_ground_truth(gt, outputs["sm_positions"][:, -1])
    assert straight["alt_naming_is_better"].sum() == 0


def test_weights_and_scaling_follow_the_reference():
    cfg = AlphaFoldConfig.reference().loss
    assert (cfg.fape_weight, cfg.fape_backbone_weight, cfg.fape_sidechain_weight) == (1.0, 0.5, 0.5)
    assert (cfg.chi_weight, cfg.distogram_weight, cfg.masked_msa_weight, cfg.plddt_weight) == \
        (1.0, 0.3, 2.0, 0.01)
    assert cfg.experimentally_resolved_weight == 0.0  # initial training; 0.01 in fine-tuning
    assert (cfg.fape_clamp_distance, cfg.use_clamped_fape_probability) == (10.0, 0.9)
    heads = make_batch(n_res=6, seed=3)
    gt = geometry.ground_truth(heads)
    # distogram: logits that put all mass on the true bin give ~0 cross-entropy
    pb = gt["pseudo_beta"]
    d2 = ((pb.unsqueeze(-2) - pb.unsqueeze(-3)) ** 2).sum(-1, keepdim=True)
    edges = torch.linspace(cfg.distogram_min_bin, cfg.distogram_max_bin, 63) ** 2
    true_bin = (d2 > edges).sum(-1)
    logits = 50.0 * torch.nn.functional.one_hot(true_bin, 64).float()
    assert loss.distogram_loss(logits, gt, cfg).item() < 1e-6
    assert loss.distogram_loss(torch.zeros_like(logits), gt, cfg).item() == pytest.approx(
        torch.log(torch.tensor(64.0)).item(), rel=1e-5)
