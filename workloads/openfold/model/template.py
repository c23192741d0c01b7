"""Template embedding of AlphaFold 2: template pair features (supplement 1.7.1, Table 1),
torsion-angle features computed from the template coordinates (Algorithm 2 lines 7-8),
the template pair stack (Algorithm 16) and point-wise attention (Algorithm 17).

Inputs (agreed batch interface): template_aatype [B, T, N] int (0..20, 21 gap),
template_all_atom_positions [B, T, N, 37, 3] (Angstrom), template_all_atom_mask [B, T, N, 37],
template_mask [B, T], template_pseudo_beta [B, T, N, 3], template_pseudo_beta_mask [B, T, N].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import residue_constants as rc
from . import geometry, rigid
from .config import AlphaFoldConfig
from .embedders import distance_bins
from .evoformer import TemplatePairStack
from .primitives import CrossAttention, Linear

_POINTWISE_INF = 1e5  # the reference's template point-wise attention mask value


def template_pair_feat(batch: dict[str, torch.Tensor], cfg: AlphaFoldConfig) -> torch.Tensor:
    """[B, T, N, N, 88]: pseudo-beta distogram (39 bins 3.25..50.75 A), its pair mask,
    aatype one-hots of residue j and i (22 each), unit vectors in the backbone frame (zero
    unless ``template_use_unit_vector``), backbone pair mask; zero where a backbone is missing."""
    pb_mask = batch["template_pseudo_beta_mask"]
    dgram = distance_bins(batch["template_pseudo_beta"], cfg.template_min_bin,
                          cfg.template_max_bin, cfg.template_num_bins, inf=1e5)
    n_res = pb_mask.shape[-1]
    one_hot = F.one_hot(batch["template_aatype"].long(), rc.RESTYPE_NUM + 2).to(dgram.dtype)
    pos, atom_mask = batch["template_all_atom_positions"], batch["template_all_atom_mask"]
    n, ca, c = (rc.ATOM_ORDER[a] for a in ("N", "CA", "C"))
    frame = rigid.backbone_frame(pos[..., n, :], pos[..., ca, :], pos[..., c, :], eps=1e-6)
    local = rigid.invert_apply(rigid.unsqueeze(frame, -1), pos[..., ca, :].unsqueeze(-3))
    bb_mask = atom_mask[..., n] * atom_mask[..., ca] * atom_mask[..., c]
    bb_2d = bb_mask.unsqueeze(-1) * bb_mask.unsqueeze(-2)
    unit = local * torch.rsqrt(1e-6 + (local ** 2).sum(-1, keepdim=True)) * bb_2d.unsqueeze(-1)
    if not cfg.template_use_unit_vector:
        unit = unit * 0.0
    feats = [dgram, (pb_mask.unsqueeze(-1) * pb_mask.unsqueeze(-2)).unsqueeze(-1),
             one_hot.unsqueeze(-3).expand(*one_hot.shape[:-2], n_res, -1, -1),
             one_hot.unsqueeze(-2).expand(*one_hot.shape[:-2], -1, n_res, -1),
             unit, bb_2d.unsqueeze(-1)]
    return torch.cat(feats, -1) * bb_2d.unsqueeze(-1)


def template_angle_feat(batch: dict[str, torch.Tensor],
                        zero_missing: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, T, N, 57] aatype one-hot, torsion sin/cos, alternative sin/cos, torsion mask;
    [B, T, N, 7] torsion mask) from the template coordinates. ``zero_missing`` zeroes the
    sin/cos of angles whose atoms are missing (see the config's zero_missing_template_angles)."""
    aatype = batch["template_aatype"].long()
    torsions = geometry.torsion_angles(aatype, batch["template_all_atom_positions"],
                                       batch["template_all_atom_mask"])
    mask = torsions["torsion_angles_mask"]
    keep = mask.unsqueeze(-1) if zero_missing else torch.ones_like(mask).unsqueeze(-1)
    sin_cos = torsions["torsion_angles_sin_cos"] * keep
    alt = torsions["alt_torsion_angles_sin_cos"] * keep
    feat = torch.cat([F.one_hot(aatype, 22).to(sin_cos.dtype), sin_cos.flatten(-2),
                      alt.flatten(-2), mask], -1)
    return feat, mask


class TemplatePointwiseAttention(nn.Module):
    """Algorithm 17: each pair entry attends over the templates' pair entries.

    forward(t [B, T, N, N, c_t], z [B, N, N, c_z], template_mask [B, T]) -> [B, N, N, c_z].
    """

    def __init__(self, cfg: AlphaFoldConfig):
        super().__init__()
        self.mha = CrossAttention(cfg.c_z, cfg.c_t, cfg.template_pointwise_hidden,
                                  cfg.template_pointwise_heads, _POINTWISE_INF)

    def forward(self, t: torch.Tensor, z: torch.Tensor, template_mask: torch.Tensor) -> torch.Tensor:
        kv = t.permute(0, 2, 3, 1, 4)
        mask = template_mask[:, None, None, None, None, :]
        return self.mha(z.unsqueeze(-2), kv, mask).squeeze(-2)


class TemplateEmbedder(nn.Module):
    """Templates -> a pair update [B, N, N, c_z] and, with torsion angles enabled, extra MSA
    rows [B, T, N, c_m] with their mask [B, T, N] (the psi-angle mask, as the reference)."""

    def __init__(self, cfg: AlphaFoldConfig):
        super().__init__()
        self.cfg = cfg
        self.template_pair_embedder = Linear(cfg.template_pair_feat_dim, cfg.c_t, init="relu")
        self.template_pair_stack = TemplatePairStack(cfg)
        self.template_pointwise_attention = TemplatePointwiseAttention(cfg)
        if cfg.embed_template_torsion_angles:
            self.template_angle_embedder = nn.Sequential(
                Linear(cfg.template_angle_feat_dim, cfg.c_m, init="relu"), nn.ReLU(),
                Linear(cfg.c_m, cfg.c_m, init="relu"))

    def forward(self, batch: dict[str, torch.Tensor], z: torch.Tensor,
                pair_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        feat = template_pair_feat(batch, self.cfg).to(z.dtype)
        t = self.template_pair_stack(self.template_pair_embedder(feat), pair_mask)
        template_mask = batch["template_mask"].to(z.dtype)
        update = self.template_pointwise_attention(t, z, template_mask)
        any_template = (template_mask.sum(-1) > 0).to(z.dtype)
        out = {"pair_update": update * any_template[:, None, None, None]}
        if self.cfg.embed_template_torsion_angles:
            angle_feat, angle_mask = template_angle_feat(batch, self.cfg.zero_missing_template_angles)
            out["msa_rows"] = self.template_angle_embedder(angle_feat.to(z.dtype))
            out["msa_rows_mask"] = angle_mask[..., 2]
        return out
