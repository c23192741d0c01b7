"""The AlphaFold 2 training loss as the MLPerf HPC v3.0 OpenFold reference weights it
(initial-training stage): FAPE (backbone 0.5 over all structure-module iterations, clamped at
10 A for the fraction ``use_clamped_fape`` of samples; side chain 0.5 on the last iteration)
x 1.0, supervised chi x 1.0, distogram x 0.3, masked MSA x 2.0, pLDDT x 0.01, experimentally
resolved x 0.0; the weighted sum of each sample is scaled by sqrt(number of residues in the
crop) and averaged over the batch.

Sources: supplement sections 1.9 (Algorithms 26-29 and 1.9.6-1.9.10) and the reference's
``loss.py``; targets are derived here from all_atom_positions/all_atom_mask
(``geometry.ground_truth``), with the ambiguous side-chain atoms renamed to the naming
closest to the prediction (supplement 1.8.5).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import residue_constants as rc
from . import geometry, rigid
from .config import AlphaFoldConfig, LossConfig


def compute_fape(pred: tuple[rigid.Frame, torch.Tensor], target: tuple[rigid.Frame, torch.Tensor],
                 frames_mask: torch.Tensor, positions_mask: torch.Tensor,
                 clamp: float | None, cfg: LossConfig) -> torch.Tensor:
    """Frame aligned point error (Algorithm 28). pred/target: (frames [*, F], points [*, P, 3]);
    masks [*, F] and [*, P] -> [*] in units of ``fape_length_scale``."""
    local_pred = rigid.invert_apply(rigid.unsqueeze(pred[0], -1), pred[1].unsqueeze(-3))
    local_true = rigid.invert_apply(rigid.unsqueeze(target[0], -1), target[1].unsqueeze(-3))
    err = torch.sqrt(((local_pred - local_true) ** 2).sum(-1) + cfg.fape_eps)
    if clamp is not None:
        err = torch.clamp(err, max=clamp)
    err = err / cfg.fape_length_scale * frames_mask.unsqueeze(-1) * positions_mask.unsqueeze(-2)
    err = err.sum(-1) / (cfg.fape_eps + frames_mask.sum(-1, keepdim=True))
    return err.sum(-1) / (cfg.fape_eps + positions_mask.sum(-1))


def backbone_fape(outputs: dict, gt: dict, use_clamped: torch.Tensor, cfg: LossConfig) -> torch.Tensor:
    """Backbone FAPE averaged over the structure-module iterations: [B]."""
    pred = rigid.from_4x4(outputs["sm_frames"])  # [B, L, N]
    true = rigid.from_4x4(gt["backbone_rigid_tensor"].unsqueeze(1))
    mask = gt["backbone_rigid_mask"].unsqueeze(1)
    args = ((pred, pred[1]), (true, true[1]), mask, mask)
    clamped = compute_fape(*args, clamp=cfg.fape_clamp_distance, cfg=cfg)
    unclamped = compute_fape(*args, clamp=None, cfg=cfg)
    u = use_clamped.unsqueeze(-1)
    return (clamped * u + unclamped * (1 - u)).mean(dim=1)


def renamed_ground_truth(gt: dict, pred14: torch.Tensor, eps: float = 1e-10) -> dict:
    """Pick, per residue, the naming of symmetric atoms whose distances to the non-ambiguous
    atoms best match the prediction (supplement Algorithm 26)."""
    def dists(x: torch.Tensor) -> torch.Tensor:
        flat = x.flatten(-3, -2)  # [B, N*14, 3]
        return torch.sqrt(eps + ((flat.unsqueeze(-2) - flat.unsqueeze(-3)) ** 2).sum(-1))

    exists = gt["atom14_gt_exists"].flatten(-2)
    ambiguous = gt["atom14_atom_is_ambiguous"].flatten(-2)
    mask = (exists * ambiguous).unsqueeze(-1) * (exists * (1 - ambiguous)).unsqueeze(-2)
    d_pred = dists(pred14)
    err = torch.sqrt(eps + (d_pred - dists(gt["atom14_gt_positions"])) ** 2)
    alt_err = torch.sqrt(eps + (d_pred - dists(gt["atom14_alt_gt_positions"])) ** 2)
    shape = pred14.shape[:-2] + (14,)
    per_res = (mask * err).sum(-1).view(shape).sum(-1)
    alt_per_res = (mask * alt_err).sum(-1).view(shape).sum(-1)
    alt_better = (alt_per_res < per_res).to(pred14.dtype)
    w = alt_better[..., None]
    return {
        "alt_naming_is_better": alt_better,
        "positions": (1 - w[..., None]) * gt["atom14_gt_positions"]
        + w[..., None] * gt["atom14_alt_gt_positions"],
        "exists": (1 - w) * gt["atom14_gt_exists"] + w * gt["atom14_alt_gt_exists"],
    }


def sidechain_fape(outputs: dict, gt: dict, cfg: LossConfig) -> torch.Tensor:
    """All-atom FAPE of the last iteration over the 8 rigid groups and 14 atoms: [B]."""
    renamed = renamed_ground_truth(gt, outputs["sm_positions"][:, -1])
    w = renamed["alt_naming_is_better"][..., None, None, None]
    true_frames = (1 - w) * gt["rigidgroups_gt_frames"] + w * gt["rigidgroups_alt_gt_frames"]
    pred = rigid.from_4x4(outputs["sm_sidechain_frames"][:, -1].flatten(1, 2))
    true = rigid.from_4x4(true_frames.flatten(1, 2))
    pred_pos = outputs["sm_positions"][:, -1].flatten(1, 2)
    true_pos = renamed["positions"].flatten(1, 2)
    return compute_fape((pred, pred_pos), (true, true_pos), gt["rigidgroups_gt_exists"].flatten(1),
                        renamed["exists"].flatten(1), cfg.fape_clamp_distance, cfg)


def _masked_mean(mask: torch.Tensor, value: torch.Tensor, dims: tuple[int, ...],
                 eps: float = 1e-4) -> torch.Tensor:
    mask = mask.expand_as(value)
    return (mask * value).sum(dims) / (eps + mask.sum(dims))


def supervised_chi_loss(outputs: dict, batch: dict, gt: dict, cfg: LossConfig) -> torch.Tensor:
    """Algorithm 27 over all iterations: squared chord error of chi (sin, cos), pi-periodic
    chis compared with both namings, plus the angle-norm penalty: [B]."""
    pred = outputs["sm_angles"][..., 3:, :]  # [B, L, N, 4, 2]
    periodic = torch.as_tensor(rc.CHI_PI_PERIODIC, dtype=pred.dtype,
                               device=pred.device)[batch["aatype"]]
    true = gt["chi_angles_sin_cos"].unsqueeze(1)
    shifted = (1 - 2 * periodic).unsqueeze(-1).unsqueeze(1) * true
    err = torch.minimum(((true - pred) ** 2).sum(-1), ((shifted - pred) ** 2).sum(-1))
    chi = _masked_mean(gt["chi_mask"].unsqueeze(1), err, (-1, -2, -3))
    raw = outputs["sm_unnormalized_angles"]
    norm_err = torch.abs(torch.sqrt((raw ** 2).sum(-1) + 1e-8) - 1.0)
    seq_mask = batch["seq_mask"].to(pred.dtype)[:, None, :, None]
    norm = _masked_mean(seq_mask, norm_err, (-1, -2, -3))
    return cfg.chi_angle_weight * chi + cfg.chi_angle_norm_weight * norm


def distogram_loss(logits: torch.Tensor, gt: dict, cfg: LossConfig) -> torch.Tensor:
    """Cross-entropy of pseudo-beta distance bins (2.3125..21.6875 A, 64 bins): [B]."""
    edges = torch.linspace(cfg.distogram_min_bin, cfg.distogram_max_bin,
                           cfg.distogram_num_bins - 1, device=logits.device) ** 2
    pb = gt["pseudo_beta"]
    d2 = ((pb.unsqueeze(-2) - pb.unsqueeze(-3)) ** 2).sum(-1, keepdim=True)
    true_bins = (d2 > edges).sum(-1)
    errors = -(F.one_hot(true_bins, cfg.distogram_num_bins) * torch.log_softmax(logits, -1)).sum(-1)
    mask = gt["pseudo_beta_mask"].unsqueeze(-1) * gt["pseudo_beta_mask"].unsqueeze(-2)
    return (errors * mask).sum((-1, -2)) / (1e-8 + mask.sum((-1, -2)))


def masked_msa_loss(logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """Cross-entropy of the masked MSA entries (23 classes): [B]."""
    errors = -(F.one_hot(batch["true_msa"].long(), 23) * torch.log_softmax(logits, -1)).sum(-1)
    mask = batch["bert_mask"].to(logits.dtype)
    return (errors * mask).sum((-1, -2)) / (1e-8 + mask.sum((-1, -2)))


def lddt_ca_per_residue(pred_ca: torch.Tensor, true_ca: torch.Tensor, mask: torch.Tensor,
                        cutoff: float = 15.0, eps: float = 1e-10) -> torch.Tensor:
    """lDDT-Ca of each residue (thresholds 0.5, 1, 2, 4 A; pairs within ``cutoff`` A in the
    true structure): [*, N, 3] x2, mask [*, N] -> [*, N] in 0..1."""
    d_true = torch.sqrt(eps + ((true_ca.unsqueeze(-2) - true_ca.unsqueeze(-3)) ** 2).sum(-1))
    d_pred = torch.sqrt(eps + ((pred_ca.unsqueeze(-2) - pred_ca.unsqueeze(-3)) ** 2).sum(-1))
    eye = torch.eye(mask.shape[-1], device=mask.device, dtype=mask.dtype)
    score_mask = (d_true < cutoff).to(mask.dtype) * mask.unsqueeze(-1) * mask.unsqueeze(-2) * (1 - eye)
    l1 = torch.abs(d_true - d_pred)
    score = sum((l1 < t).to(l1.dtype) for t in (0.5, 1.0, 2.0, 4.0)) * 0.25
    return (eps + (score_mask * score).sum(-1)) / (eps + score_mask.sum(-1))


def _resolution_ok(batch: dict, cfg: LossConfig, like: torch.Tensor) -> torch.Tensor:
    res = batch["resolution"].to(like.dtype)
    return ((res >= cfg.min_resolution) & (res <= cfg.max_resolution)).to(like.dtype)


def plddt_loss(outputs: dict, batch: dict, cfg: LossConfig) -> torch.Tensor:
    """Algorithm 29: cross-entropy of the binned true lDDT-Ca of the final structure: [B]."""
    ca = rc.ATOM_ORDER["CA"]
    mask = batch["all_atom_mask"][..., ca]
    score = lddt_ca_per_residue(outputs["final_atom_positions"][..., ca, :].detach(),
                                batch["all_atom_positions"][..., ca, :], mask, cfg.plddt_cutoff)
    bins = torch.clamp(torch.floor(score * cfg.plddt_num_bins).long(), max=cfg.plddt_num_bins - 1)
    logits = outputs["lddt_logits"]
    errors = -(F.one_hot(bins, cfg.plddt_num_bins) * torch.log_softmax(logits, -1)).sum(-1)
    loss = (errors * mask).sum(-1) / (1e-10 + mask.sum(-1))
    return loss * _resolution_ok(batch, cfg, loss)


def experimentally_resolved_loss(outputs: dict, batch: dict, gt: dict,
                                 cfg: LossConfig) -> torch.Tensor:
    """Sigmoid cross-entropy of each atom's resolved flag (supplement 1.9.10): [B]."""
    logits = outputs["experimentally_resolved_logits"]
    errors = F.binary_cross_entropy_with_logits(logits, batch["all_atom_mask"].to(logits.dtype),
                                                reduction="none")
    exists = gt["atom37_atom_exists"]
    loss = (errors * exists).sum((-1, -2)) / (1e-8 + exists.sum((-1, -2)))
    return loss * _resolution_ok(batch, cfg, loss)


def openfold_loss(outputs: dict[str, torch.Tensor], batch: dict[str, torch.Tensor],
                  config: AlphaFoldConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The weighted training loss (scalar) and each term's batch mean, unweighted, by name
    (fape, supervised_chi, distogram, masked_msa, plddt, experimentally_resolved) plus
    weighted_total. ``use_clamped_fape`` [B] is read from the batch, else from the outputs
    (the model draws it in training), else 1 (clamped)."""
    cfg = config.loss
    gt = geometry.ground_truth(batch)
    b = batch["aatype"].shape[0]
    clamp_flag = batch.get("use_clamped_fape", outputs.get("use_clamped_fape"))
    if clamp_flag is None:
        clamp_flag = outputs["single"].new_ones(b)
    terms = {
        "fape": cfg.fape_backbone_weight * backbone_fape(outputs, gt, clamp_flag, cfg)
        + cfg.fape_sidechain_weight * sidechain_fape(outputs, gt, cfg),
        "supervised_chi": supervised_chi_loss(outputs, batch, gt, cfg),
        "distogram": distogram_loss(outputs["distogram_logits"], gt, cfg),
        "masked_msa": masked_msa_loss(outputs["masked_msa_logits"], batch),
        "plddt": plddt_loss(outputs, batch, cfg),
        "experimentally_resolved": experimentally_resolved_loss(outputs, batch, gt, cfg),
    }
    weights = {"fape": cfg.fape_weight, "supervised_chi": cfg.chi_weight,
               "distogram": cfg.distogram_weight, "masked_msa": cfg.masked_msa_weight,
               "plddt": cfg.plddt_weight, "experimentally_resolved": cfg.experimentally_resolved_weight}
    total = sum(terms[k] * w for k, w in weights.items())
    report = {k: v.detach().mean() for k, v in terms.items()}
    report["weighted_total"] = total.detach().mean()
    if cfg.scale_by_sequence_length:
        total = total * torch.sqrt(batch["seq_mask"].to(total.dtype).sum(-1))
    return total.mean(), report
