"""Building blocks of the OpenFold network: initialised linear layers, gated multi-head
attention (optionally chunked), global attention, shared-mask dropout, activation checkpointing.

Source followed: AlphaFold 2 supplement (Jumper et al. 2021) section 1.11.4 (initialisation),
Algorithm 7/19 (gated attention, global attention), 1.11.6 (shared dropout), 1.11.8 (chunking,
checkpointing); the MLPerf HPC v3.0 OpenFold reference (mlcommons/hpc ``openfold/``) for the
layer layout (which projections carry a bias) that fixes the parameter count.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

_TRUNC_STD_FACTOR = 0.87962566103423978  # std of a unit normal truncated to [-2, 2]


class Linear(nn.Linear):
    """``nn.Linear`` with the AlphaFold initialisations (supplement 1.11.4).

    init: "default" (LeCun truncated normal), "relu" (He truncated normal), "glorot"
    (Xavier uniform), "gating" (weights 0, bias 1), "normal" (fan-in normal),
    "final" (weights 0, bias 0). Raises ValueError for another name.
    """

    def __init__(self, in_dim: int, out_dim: int, bias: bool = True, init: str = "default"):
        super().__init__(in_dim, out_dim, bias=bias)
        with torch.no_grad():
            _init_weight(self.weight, init)
            if self.bias is not None:
                self.bias.fill_(1.0 if init == "gating" else 0.0)


def _init_weight(weight: torch.Tensor, init: str) -> None:
    if weight.is_meta:
        return
    fan_in = max(1, weight.shape[1])
    if init in ("default", "relu"):
        scale = (1.0 if init == "default" else 2.0) / fan_in
        std = math.sqrt(scale) / _TRUNC_STD_FACTOR
        nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)
    elif init == "glorot":
        nn.init.xavier_uniform_(weight)
    elif init == "normal":
        nn.init.normal_(weight, std=1.0 / math.sqrt(fan_in))
    elif init in ("gating", "final"):
        weight.zero_()
    else:
        raise ValueError(f"unknown linear init {init!r}")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              logit_bias: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T + bias) v over the last two dims; q [*, H, Q, C], k/v [*, H, K, C]."""
    logits = torch.matmul(q, k.transpose(-1, -2)) + logit_bias
    return torch.matmul(torch.softmax(logits, dim=-1), v)


def chunked(fn: Callable[..., torch.Tensor], sliced: tuple[torch.Tensor, ...],
            shared: tuple[torch.Tensor, ...], chunk_size: int | None, dim: int = 1) -> torch.Tensor:
    """``fn(*sliced, *shared)`` computed in slices of ``chunk_size`` along ``dim`` of the
    ``sliced`` tensors (all the same size there), the ``shared`` ones passed whole; results
    concatenated along ``dim``. The slices are independent (a batch-like dim), so the result
    equals the unchunked call (supplement 1.11.8); None runs it whole.
    """
    size = sliced[0].shape[dim]
    if chunk_size is None or chunk_size >= size:
        return fn(*sliced, *shared)
    outs = []
    for start in range(0, size, chunk_size):
        length = min(chunk_size, size - start)
        outs.append(fn(*(a.narrow(dim, start, length) for a in sliced), *shared))
    return torch.cat(outs, dim=dim)


class CrossAttention(nn.Module):
    """Ungated multi-head attention of queries over keys/values (template point-wise attention,
    Algorithm 17). forward(q_in [*, Q, c_q], kv_in [*, K, c_kv], mask [*, 1, 1, K]) -> [*, Q, c_q].
    """

    def __init__(self, c_q: int, c_kv: int, c_hidden: int, num_heads: int, inf: float):
        super().__init__()
        self.c_hidden, self.num_heads, self.inf = c_hidden, num_heads, inf
        hc = c_hidden * num_heads
        self.linear_q = Linear(c_q, hc, bias=False, init="glorot")
        self.linear_k = Linear(c_kv, hc, bias=False, init="glorot")
        self.linear_v = Linear(c_kv, hc, bias=False, init="glorot")
        self.linear_o = Linear(hc, c_q, init="final")

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        return t.view(t.shape[:-1] + (self.num_heads, self.c_hidden)).transpose(-2, -3)

    def _attention(self, q_in: torch.Tensor, kv_in: torch.Tensor,
                   logit_bias: torch.Tensor) -> torch.Tensor:
        """Per-head outputs [*, Q, H, c_hidden] before the output projection."""
        q = self._heads(self.linear_q(q_in)) / math.sqrt(self.c_hidden)
        k, v = self._heads(self.linear_k(kv_in)), self._heads(self.linear_v(kv_in))
        return attention(q, k, v, logit_bias).transpose(-2, -3)

    def forward(self, q_in: torch.Tensor, kv_in: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        o = self._attention(q_in, kv_in, (mask - 1.0) * self.inf)
        return self.linear_o(o.reshape(o.shape[:-2] + (-1,)))


class GatedSelfAttention(CrossAttention):
    """Multi-head self-attention with a sigmoid gate (Algorithm 7 and its row/column uses).

    forward(x [B, S, Q, c_in], mask [B, S or 1, 1, 1, Q] (1 keep), bias [B, 1, H, Q, Q] or
    None) -> [B, S, Q, c_in]. Chunked along S (dim 1) when ``chunk_size`` is set.
    """

    def __init__(self, c_in: int, c_hidden: int, num_heads: int, inf: float,
                 chunk_size: int | None = None):
        super().__init__(c_in, c_in, c_hidden, num_heads, inf)
        self.chunk_size = chunk_size
        self.linear_g = Linear(c_in, c_hidden * num_heads, init="gating")

    def _attend(self, x: torch.Tensor, mask: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        o = self._attention(x, x, (mask - 1.0) * self.inf + bias)
        g = torch.sigmoid(self.linear_g(x)).view(o.shape)
        return self.linear_o((o * g).reshape(o.shape[:-2] + (-1,)))

    def forward(self, x: torch.Tensor, mask: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        if bias is None:
            bias = x.new_zeros(())
        mask = mask.expand((x.shape[0], x.shape[1]) + mask.shape[2:])
        return chunked(self._attend, (x, mask), (bias,), self.chunk_size)


class GlobalAttention(nn.Module):
    """Global gated attention over the sequences of a column (Algorithm 19).

    forward(m [B, R, S, c] (R residues, S sequences), mask [B, R, S]) -> [B, R, S, c].
    The query is the masked mean over S; keys and values are single-headed.
    """

    def __init__(self, c_in: int, c_hidden: int, num_heads: int, inf: float, eps: float,
                 chunk_size: int | None = None):
        super().__init__()
        self.c_hidden, self.num_heads = c_hidden, num_heads
        self.inf, self.eps, self.chunk_size = inf, eps, chunk_size
        self.linear_q = Linear(c_in, c_hidden * num_heads, bias=False, init="glorot")
        self.linear_k = Linear(c_in, c_hidden, bias=False, init="glorot")
        self.linear_v = Linear(c_in, c_hidden, bias=False, init="glorot")
        self.linear_g = Linear(c_in, c_hidden * num_heads, init="gating")
        self.linear_o = Linear(c_hidden * num_heads, c_in, init="final")

    def _attend(self, m: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q = (m * mask.unsqueeze(-1)).sum(-2) / (mask.sum(-1, keepdim=True) + self.eps)
        q = self.linear_q(q).view(q.shape[:-1] + (self.num_heads, self.c_hidden))
        q = q / math.sqrt(self.c_hidden)
        k, v = self.linear_k(m), self.linear_v(m)
        o = attention(q, k, v, ((mask - 1.0) * self.inf).unsqueeze(-2))
        g = torch.sigmoid(self.linear_g(m)).view(m.shape[:-1] + (self.num_heads, self.c_hidden))
        o = (o.unsqueeze(-3) * g).reshape(m.shape[:-1] + (-1,))
        return self.linear_o(o)

    def forward(self, m: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return chunked(self._attend, (m, mask), (), self.chunk_size)


class SharedDropout(nn.Module):
    """Dropout whose mask is shared along one dim (supplement 1.11.6): ``shared_dim`` -3 gives
    the "row-wise" dropout of the pair/MSA stacks, -2 the "column-wise" one."""

    def __init__(self, p: float, shared_dim: int):
        super().__init__()
        self.p, self.shared_dim = p, shared_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        shape = list(x.shape)
        shape[self.shared_dim] = 1
        return x * F.dropout(x.new_ones(shape), p=self.p, training=True)


def run_blocks(blocks: nn.ModuleList, state: tuple[torch.Tensor, ...],
               masks: tuple[torch.Tensor, ...], use_checkpoint: bool) -> tuple[torch.Tensor, ...]:
    """Run ``block(*state, *masks) -> state`` for each block, recomputing each block's
    activations in the backward pass when ``use_checkpoint`` (supplement 1.11.8)."""
    for block in blocks:
        if use_checkpoint and torch.is_grad_enabled():
            out = checkpoint(block, *state, *masks, use_reentrant=False)
        else:
            out = block(*state, *masks)
        state = out if isinstance(out, tuple) else (out,)
    return state
