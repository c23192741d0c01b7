"""The Evoformer stack (Algorithm 6), the extra-MSA stack (Algorithm 18) and the template pair
stack (Algorithm 16) of AlphaFold 2, built from the layers of ``pair.py``.

Shapes: m [B, S, N, c_m] (extra MSA: [B, E, N, c_e]), z [B, N, N, c_z], msa mask [B, S, N],
pair mask [B, N, N], templates t [B, T, N, N, c_t]. Dropout: row-wise on the MSA row attention,
the outgoing/incoming updates and the starting-node attention, column-wise on the
ending-node attention (supplement 1.11.6). Blocks are checkpointed when the config says so.
"""

from __future__ import annotations

import torch
from torch import nn

from .config import AlphaFoldConfig
from .pair import (
    MSAColumnAttention,
    MSAColumnGlobalAttention,
    MSARowAttentionWithPairBias,
    OuterProductMean,
    Transition,
    TriangleAttention,
    TriangleMultiplication,
)
from .primitives import Linear, SharedDropout, run_blocks


class PairCore(nn.Module):
    """The part shared by Evoformer and extra-MSA blocks: MSA transition, outer product mean,
    triangle updates (outgoing, incoming), triangle attention (starting, ending), pair transition.
    """

    def __init__(self, cfg: AlphaFoldConfig, c_msa: int):
        super().__init__()
        c_z, chunk = cfg.c_z, cfg.chunk_size
        self.msa_transition = Transition(c_msa, cfg.transition_n)
        self.outer_product_mean = OuterProductMean(c_msa, c_z, cfg.opm_hidden, 1e-3, chunk)
        self.tri_mul_out = TriangleMultiplication(c_z, cfg.tri_mul_hidden, outgoing=True)
        self.tri_mul_in = TriangleMultiplication(c_z, cfg.tri_mul_hidden, outgoing=False)
        self.tri_att_start = TriangleAttention(c_z, cfg.tri_att_hidden, cfg.tri_heads, True,
                                               cfg.inf, chunk)
        self.tri_att_end = TriangleAttention(c_z, cfg.tri_att_hidden, cfg.tri_heads, False,
                                             cfg.inf, chunk)
        self.pair_transition = Transition(c_z, cfg.transition_n)
        self.row_dropout = SharedDropout(cfg.pair_dropout, -3)
        self.col_dropout = SharedDropout(cfg.pair_dropout, -2)

    def forward(self, m: torch.Tensor, z: torch.Tensor, msa_mask: torch.Tensor,
                pair_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m = m + self.msa_transition(m)
        z = z + self.outer_product_mean(m, msa_mask)
        z = z + self.row_dropout(self.tri_mul_out(z, pair_mask))
        z = z + self.row_dropout(self.tri_mul_in(z, pair_mask))
        z = z + self.row_dropout(self.tri_att_start(z, pair_mask))
        z = z + self.col_dropout(self.tri_att_end(z, pair_mask))
        z = z + self.pair_transition(z)
        return m, z


class EvoformerBlock(nn.Module):
    """Algorithm 6 block (``extra`` False) or Algorithm 18 block (``extra`` True: extra-MSA
    widths and global column attention)."""

    def __init__(self, cfg: AlphaFoldConfig, extra: bool = False):
        super().__init__()
        c_msa = cfg.c_e if extra else cfg.c_m
        hidden = cfg.extra_msa_att_hidden if extra else cfg.msa_att_hidden
        self.msa_att_row = MSARowAttentionWithPairBias(c_msa, cfg.c_z, hidden, cfg.msa_heads,
                                                       cfg.inf, cfg.chunk_size)
        if extra:
            self.msa_att_col = MSAColumnGlobalAttention(c_msa, hidden, cfg.msa_heads, cfg.inf,
                                                        cfg.eps, cfg.chunk_size)
        else:
            self.msa_att_col = MSAColumnAttention(c_msa, hidden, cfg.msa_heads, cfg.inf,
                                                  cfg.chunk_size)
        self.msa_dropout = SharedDropout(cfg.msa_dropout, -3)
        self.core = PairCore(cfg, c_msa)

    def forward(self, m: torch.Tensor, z: torch.Tensor, msa_mask: torch.Tensor,
                pair_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m = m + self.msa_dropout(self.msa_att_row(m, z, msa_mask))
        m = m + self.msa_att_col(m, msa_mask)
        return self.core(m, z, msa_mask, pair_mask)


class EvoformerStack(nn.Module):
    """Algorithm 6: ``evoformer_blocks`` blocks, then the single representation
    s = Linear(m[:, 0]) [B, N, c_s]. forward -> (m, z, s)."""

    def __init__(self, cfg: AlphaFoldConfig):
        super().__init__()
        self.blocks = nn.ModuleList(EvoformerBlock(cfg) for _ in range(cfg.evoformer_blocks))
        self.linear = Linear(cfg.c_m, cfg.c_s)
        self.checkpoint = cfg.checkpoint_blocks

    def forward(self, m: torch.Tensor, z: torch.Tensor, msa_mask: torch.Tensor,
                pair_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        use = self.checkpoint and self.training
        m, z = run_blocks(self.blocks, (m, z), (msa_mask, pair_mask), use)
        return m, z, self.linear(m[:, 0])


class ExtraMSAStack(nn.Module):
    """Algorithm 18: ``extra_msa_blocks`` blocks over the extra MSA; returns the updated pair."""

    def __init__(self, cfg: AlphaFoldConfig):
        super().__init__()
        self.blocks = nn.ModuleList(EvoformerBlock(cfg, extra=True)
                                    for _ in range(cfg.extra_msa_blocks))
        self.checkpoint = cfg.checkpoint_blocks

    def forward(self, a: torch.Tensor, z: torch.Tensor, msa_mask: torch.Tensor,
                pair_mask: torch.Tensor) -> torch.Tensor:
        use = self.checkpoint and self.training
        return run_blocks(self.blocks, (a, z), (msa_mask, pair_mask), use)[1]


class TemplatePairBlock(nn.Module):
    """Algorithm 16 block on one template's pair: triangle attention (starting, ending),
    triangle updates (outgoing, incoming), transition. Input [B*T, N, N, c_t]."""

    def __init__(self, cfg: AlphaFoldConfig):
        super().__init__()
        c_t, hidden, heads = cfg.c_t, cfg.template_tri_att_hidden, cfg.tri_heads
        self.tri_att_start = TriangleAttention(c_t, hidden, heads, True, cfg.inf, cfg.chunk_size)
        self.tri_att_end = TriangleAttention(c_t, hidden, heads, False, cfg.inf, cfg.chunk_size)
        self.tri_mul_out = TriangleMultiplication(c_t, cfg.template_tri_mul_hidden, True)
        self.tri_mul_in = TriangleMultiplication(c_t, cfg.template_tri_mul_hidden, False)
        self.pair_transition = Transition(c_t, cfg.template_transition_n)
        self.row_dropout = SharedDropout(cfg.template_dropout, -3)
        self.col_dropout = SharedDropout(cfg.template_dropout, -2)

    def forward(self, t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        t = t + self.row_dropout(self.tri_att_start(t, mask))
        t = t + self.col_dropout(self.tri_att_end(t, mask))
        t = t + self.row_dropout(self.tri_mul_out(t, mask))
        t = t + self.row_dropout(self.tri_mul_in(t, mask))
        return t + self.pair_transition(t)


class TemplatePairStack(nn.Module):
    """Algorithm 16: template pair blocks and a final LayerNorm.

    forward(t [B, T, N, N, c_t], pair_mask [B, N, N]) -> [B, T, N, N, c_t]; the templates
    are independent and run folded into the batch dim.
    """

    def __init__(self, cfg: AlphaFoldConfig):
        super().__init__()
        self.blocks = nn.ModuleList(TemplatePairBlock(cfg) for _ in range(cfg.template_blocks))
        self.layer_norm = nn.LayerNorm(cfg.c_t)
        self.checkpoint = cfg.checkpoint_blocks

    def forward(self, t: torch.Tensor, pair_mask: torch.Tensor) -> torch.Tensor:
        b, n_templ = t.shape[:2]
        flat = t.reshape((b * n_templ,) + t.shape[2:])
        mask = pair_mask.unsqueeze(1).expand(b, n_templ, *pair_mask.shape[1:])
        mask = mask.reshape((b * n_templ,) + pair_mask.shape[1:])
        use = self.checkpoint and self.training
        (flat,) = run_blocks(self.blocks, (flat,), (mask,), use)
        return self.layer_norm(flat).view(t.shape)
