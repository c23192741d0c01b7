"""Output heads of AlphaFold 2 (supplement 1.9): pLDDT (Algorithm 29), distogram, masked MSA,
experimentally resolved; the TM-score head is off in the reference configuration."""

from __future__ import annotations

import torch
from torch import nn

from .config import AlphaFoldConfig
from .primitives import Linear


def compute_plddt(logits: torch.Tensor) -> torch.Tensor:
    """Expected lDDT-Ca in 0..100 from [*, num_bins] logits over equal bins of 0..1."""
    num_bins = logits.shape[-1]
    centres = (torch.arange(num_bins, device=logits.device, dtype=logits.dtype) + 0.5) / num_bins
    return (torch.softmax(logits, dim=-1) * centres).sum(-1) * 100.0


class AuxiliaryHeads(nn.Module):
    """forward(outputs) adds lddt_logits [B, N, 50], plddt [B, N], distogram_logits
    [B, N, N, 64] (symmetrised), masked_msa_logits [B, S, N, 23],
    experimentally_resolved_logits [B, N, 37] (and tm_logits [B, N, N, 64] if enabled)."""

    def __init__(self, cfg: AlphaFoldConfig):
        super().__init__()
        self.plddt = nn.Sequential(
            nn.LayerNorm(cfg.c_s), Linear(cfg.c_s, cfg.plddt_hidden, init="relu"), nn.ReLU(),
            Linear(cfg.plddt_hidden, cfg.plddt_hidden, init="relu"), nn.ReLU(),
            Linear(cfg.plddt_hidden, cfg.plddt_num_bins, init="final"))
        self.distogram = Linear(cfg.c_z, cfg.distogram_num_bins, init="final")
        self.masked_msa = Linear(cfg.c_m, cfg.masked_msa_classes, init="final")
        self.experimentally_resolved = Linear(cfg.c_s, 37, init="final")
        self.tm = Linear(cfg.c_z, 64, init="final") if cfg.tm_score_head else None

    def forward(self, outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        lddt_logits = self.plddt(outputs["sm_single"])
        dist = self.distogram(outputs["pair"])
        aux = {
            "lddt_logits": lddt_logits,
            "plddt": compute_plddt(lddt_logits),
            "distogram_logits": dist + dist.transpose(-2, -3),
            "masked_msa_logits": self.masked_msa(outputs["msa"]),
            "experimentally_resolved_logits": self.experimentally_resolved(outputs["single"]),
        }
        if self.tm is not None:
            aux["tm_logits"] = self.tm(outputs["pair"])
        return aux
