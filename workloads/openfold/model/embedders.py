"""Input embedders of AlphaFold 2: target/MSA features with relative positions (Algorithms 3
and 4), recycled MSA row, pair and CA/CB distances (Algorithm 32), extra-MSA features.

Shapes: target_feat [B, N, 22], residue_index [B, N] int, msa_feat [B, S, N, 49];
extra MSA [B, E, N] int (0..22) with deletion features [B, E, N]; positions in Angstrom.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import AlphaFoldConfig
from .primitives import Linear


class InputEmbedder(nn.Module):
    """Algorithm 3 with relative positions of Algorithm 4 (clipped at +-relpos_k).

    forward -> (m [B, S, N, c_m], z [B, N, N, c_z]).
    """

    def __init__(self, cfg: AlphaFoldConfig):
        super().__init__()
        self.relpos_k = cfg.relpos_k
        tf, c_z, c_m = cfg.target_feat_dim, cfg.c_z, cfg.c_m
        self.linear_tf_z_i = Linear(tf, c_z)
        self.linear_tf_z_j = Linear(tf, c_z)
        self.linear_tf_m = Linear(tf, c_m)
        self.linear_msa_m = Linear(cfg.msa_feat_dim, c_m)
        self.linear_relpos = Linear(2 * cfg.relpos_k + 1, c_z)

    def forward(self, target_feat: torch.Tensor, residue_index: torch.Tensor,
                msa_feat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        offset = residue_index.unsqueeze(-1) - residue_index.unsqueeze(-2)
        bins = torch.clamp(offset, -self.relpos_k, self.relpos_k) + self.relpos_k
        relpos = F.one_hot(bins.long(), 2 * self.relpos_k + 1).to(target_feat.dtype)
        z = self.linear_relpos(relpos)
        z = z + self.linear_tf_z_i(target_feat).unsqueeze(-2)
        z = z + self.linear_tf_z_j(target_feat).unsqueeze(-3)
        m = self.linear_msa_m(msa_feat) + self.linear_tf_m(target_feat).unsqueeze(-3)
        return m, z


def distance_bins(points: torch.Tensor, min_bin: float, max_bin: float, num_bins: int,
                  inf: float) -> torch.Tensor:
    """One-hot of pairwise distances [*, N, 3] -> [*, N, N, num_bins]; bins are equal
    intervals from min_bin to max_bin (Angstrom), the last one open-ended."""
    lower = torch.linspace(min_bin, max_bin, num_bins, device=points.device,
                           dtype=points.dtype) ** 2
    upper = torch.cat([lower[1:], lower.new_tensor([inf])])
    d2 = ((points.unsqueeze(-2) - points.unsqueeze(-3)) ** 2).sum(-1, keepdim=True)
    return ((d2 > lower) & (d2 < upper)).to(points.dtype)


class RecyclingEmbedder(nn.Module):
    """Algorithm 32: embed the previous iteration's first MSA row, pair and pseudo-beta
    distances. forward(m0 [B, N, c_m], z [B, N, N, c_z], x [B, N, 3]) -> (m0 update, z update).
    """

    def __init__(self, cfg: AlphaFoldConfig):
        super().__init__()
        self.bins = (cfg.recycle_min_bin, cfg.recycle_max_bin, cfg.recycle_num_bins)
        self.linear = Linear(cfg.recycle_num_bins, cfg.c_z)
        self.layer_norm_m = nn.LayerNorm(cfg.c_m)
        self.layer_norm_z = nn.LayerNorm(cfg.c_z)

    def forward(self, m0_prev: torch.Tensor, z_prev: torch.Tensor,
                x_prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d = distance_bins(x_prev, *self.bins, inf=1e8)
        return self.layer_norm_m(m0_prev), self.linear(d) + self.layer_norm_z(z_prev)


class ExtraMSAEmbedder(nn.Module):
    """Extra-MSA features (one-hot of 23 classes, has-deletion, deletion value) -> c_e."""

    def __init__(self, cfg: AlphaFoldConfig):
        super().__init__()
        self.linear = Linear(cfg.extra_msa_feat_dim, cfg.c_e)

    def forward(self, extra_msa: torch.Tensor, has_deletion: torch.Tensor,
                deletion_value: torch.Tensor) -> torch.Tensor:
        one_hot = F.one_hot(extra_msa.long(), 23).to(has_deletion.dtype)
        feat = torch.cat([one_hot, has_deletion.unsqueeze(-1), deletion_value.unsqueeze(-1)], -1)
        return self.linear(feat)
