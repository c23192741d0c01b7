"""Pair- and MSA-representation layers of the Evoformer family.

MSA row attention with pair bias (Algorithm 7), MSA column attention (Algorithm 8), MSA column
global attention (Algorithm 19), transitions (Algorithms 9 and 15), outer product mean
(Algorithm 10), triangle multiplicative updates (Algorithms 11 and 12), triangle attention
(Algorithms 13 and 14), as in the AlphaFold 2 supplement; layer layout as the MLPerf HPC v3.0
OpenFold reference. Shapes: m [B, S, N, c_m], z [B, N, N, c_z], msa mask [B, S, N],
pair mask [B, N, N]; masks are 1 for real entries.
"""

from __future__ import annotations

import torch
from torch import nn

from .primitives import GatedSelfAttention, GlobalAttention, Linear, chunked


class MSARowAttentionWithPairBias(nn.Module):
    """Algorithm 7: attention along each MSA row, biased by a projection of the pair."""

    def __init__(self, c_m: int, c_z: int, c_hidden: int, num_heads: int, inf: float,
                 chunk_size: int | None = None):
        super().__init__()
        self.layer_norm_m = nn.LayerNorm(c_m)
        self.layer_norm_z = nn.LayerNorm(c_z)
        self.linear_z = Linear(c_z, num_heads, bias=False, init="normal")
        self.mha = GatedSelfAttention(c_m, c_hidden, num_heads, inf, chunk_size)

    def forward(self, m: torch.Tensor, z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        bias = self.linear_z(self.layer_norm_z(z)).permute(0, 3, 1, 2).unsqueeze(1)
        return self.mha(self.layer_norm_m(m), mask[:, :, None, None, :], bias)


class MSAColumnAttention(nn.Module):
    """Algorithm 8: attention along each MSA column (over sequences)."""

    def __init__(self, c_m: int, c_hidden: int, num_heads: int, inf: float,
                 chunk_size: int | None = None):
        super().__init__()
        self.layer_norm_m = nn.LayerNorm(c_m)
        self.mha = GatedSelfAttention(c_m, c_hidden, num_heads, inf, chunk_size)

    def forward(self, m: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m_t, mask_t = m.transpose(1, 2), mask.transpose(1, 2)
        out = self.mha(self.layer_norm_m(m_t), mask_t[:, :, None, None, :])
        return out.transpose(1, 2)


class MSAColumnGlobalAttention(nn.Module):
    """Algorithm 19: global column attention of the extra-MSA stack."""

    def __init__(self, c_e: int, c_hidden: int, num_heads: int, inf: float, eps: float,
                 chunk_size: int | None = None):
        super().__init__()
        self.layer_norm_m = nn.LayerNorm(c_e)
        self.global_attention = GlobalAttention(c_e, c_hidden, num_heads, inf, eps, chunk_size)

    def forward(self, m: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = self.global_attention(self.layer_norm_m(m.transpose(1, 2)), mask.transpose(1, 2))
        return out.transpose(1, 2)


class Transition(nn.Module):
    """Algorithms 9/15: LayerNorm, Linear to n*c, ReLU, Linear back (the residual is outside)."""

    def __init__(self, c: int, n: int):
        super().__init__()
        self.layer_norm = nn.LayerNorm(c)
        self.linear_1 = Linear(c, n * c, init="relu")
        self.linear_2 = Linear(n * c, c, init="final")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(torch.relu(self.linear_1(self.layer_norm(x))))


class OuterProductMean(nn.Module):
    """Algorithm 10: MSA -> pair update, the mean over sequences of outer products.

    Chunked over the first residue index when ``chunk_size`` is set.
    """

    def __init__(self, c_m: int, c_z: int, c_hidden: int, eps: float = 1e-3,
                 chunk_size: int | None = None):
        super().__init__()
        self.c_hidden, self.eps, self.chunk_size = c_hidden, eps, chunk_size
        self.layer_norm = nn.LayerNorm(c_m)
        self.linear_1 = Linear(c_m, c_hidden)
        self.linear_2 = Linear(c_m, c_hidden)
        self.linear_out = Linear(c_hidden * c_hidden, c_z, init="final")

    def _outer(self, a_t: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        # a_t [B, I, S, c], b [B, S, J, c] -> [B, I, J, c*c]
        outer = torch.einsum("bisc,bsjd->bijcd", a_t, b)
        return self.linear_out(outer.reshape(outer.shape[:3] + (-1,)))

    def forward(self, m: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = self.layer_norm(m)
        mask3 = mask.unsqueeze(-1)
        a, b = self.linear_1(m) * mask3, self.linear_2(m) * mask3
        outer = chunked(self._outer, (a.transpose(1, 2),), (b,), self.chunk_size)
        norm = torch.einsum("bsi,bsj->bij", mask, mask).unsqueeze(-1)
        return outer / (norm + self.eps)


class TriangleMultiplication(nn.Module):
    """Algorithms 11 (outgoing: z_ij from a_ik b_jk) and 12 (incoming: z_ij from a_ki b_kj)."""

    def __init__(self, c_z: int, c_hidden: int, outgoing: bool):
        super().__init__()
        self.outgoing = outgoing
        self.linear_a_p = Linear(c_z, c_hidden)
        self.linear_a_g = Linear(c_z, c_hidden, init="gating")
        self.linear_b_p = Linear(c_z, c_hidden)
        self.linear_b_g = Linear(c_z, c_hidden, init="gating")
        self.linear_g = Linear(c_z, c_z, init="gating")
        self.linear_z = Linear(c_hidden, c_z, init="final")
        self.layer_norm_in = nn.LayerNorm(c_z)
        self.layer_norm_out = nn.LayerNorm(c_hidden)

    def forward(self, z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        z = self.layer_norm_in(z)
        mask = mask.unsqueeze(-1)
        a = torch.sigmoid(self.linear_a_g(z)) * mask * self.linear_a_p(z)
        b = torch.sigmoid(self.linear_b_g(z)) * mask * self.linear_b_p(z)
        if self.outgoing:
            x = torch.einsum("bikc,bjkc->bijc", a, b)
        else:
            x = torch.einsum("bkic,bkjc->bijc", a, b)
        x = self.linear_z(self.layer_norm_out(x))
        return x * torch.sigmoid(self.linear_g(z))


class TriangleAttention(nn.Module):
    """Algorithms 13 (around the starting node: row-wise) and 14 (ending node: column-wise)."""

    def __init__(self, c_z: int, c_hidden: int, num_heads: int, starting: bool, inf: float,
                 chunk_size: int | None = None):
        super().__init__()
        self.starting = starting
        self.layer_norm = nn.LayerNorm(c_z)
        self.linear = Linear(c_z, num_heads, bias=False, init="normal")
        self.mha = GatedSelfAttention(c_z, c_hidden, num_heads, inf, chunk_size)

    def forward(self, z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if not self.starting:
            z, mask = z.transpose(1, 2), mask.transpose(1, 2)
        z = self.layer_norm(z)
        bias = self.linear(z).permute(0, 3, 1, 2).unsqueeze(1)
        out = self.mha(z, mask[:, :, None, None, :], bias)
        return out if self.starting else out.transpose(1, 2)
