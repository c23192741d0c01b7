"""The AlphaFold 2 network (supplement Algorithm 2) with recycling, as the MLPerf HPC v3.0
OpenFold reference configures it for training."""

from __future__ import annotations

import random
from collections.abc import Iterator

import torch
from torch import nn

from . import geometry
from .config import AlphaFoldConfig
from .embedders import ExtraMSAEmbedder, InputEmbedder, RecyclingEmbedder
from .evoformer import EvoformerStack, ExtraMSAStack
from .heads import AuxiliaryHeads
from .structure import StructureModule
from .template import TemplateEmbedder


class AlphaFold(nn.Module):
    """AlphaFold 2 / OpenFold. ``forward(batch, num_recycling_iters=None) -> dict``.

    batch (B batch, N residues, S MSA clusters, E extra rows, T templates; float32 unless
    said): aatype [B, N] int64 0..20, residue_index [B, N] int64, seq_mask [B, N],
    target_feat [B, N, 22], msa_feat [B, S, N, 49], msa_mask [B, S, N], extra_msa [B, E, N]
    int64 0..22, extra_has_deletion / extra_deletion_value / extra_msa_mask [B, E, N], and
    with templates enabled template_aatype [B, T, N] int64, template_all_atom_positions
    [B, T, N, 37, 3] (Angstrom), template_all_atom_mask [B, T, N, 37], template_mask [B, T],
    template_pseudo_beta [B, T, N, 3], template_pseudo_beta_mask [B, T, N].

    Recycling (supplement 1.10): ``num_recycling_iters`` extra passes run without gradient
    before the last one, which alone carries gradient. None means the configured maximum in
    eval mode and, in training, a draw uniform over 0..max (the reference draws from shuffled
    blocks of 0..max, see ``recycling_iterations``).

    Returns the structure module outputs (see ``StructureModule``), msa [B, S, N, c_m],
    pair [B, N, N, c_z], single [B, N, c_s], final_atom_positions [B, N, 37, 3] (Angstrom),
    final_atom_mask [B, N, 37], the heads' outputs (plddt [B, N] in 0..100, lddt_logits,
    distogram_logits, masked_msa_logits, experimentally_resolved_logits) and, in training,
    use_clamped_fape [B] (1 with the reference's probability 0.9, else 0).
    """

    def __init__(self, config: AlphaFoldConfig):
        super().__init__()
        self.config = config
        self.input_embedder = InputEmbedder(config)
        self.recycling_embedder = RecyclingEmbedder(config)
        self.template_embedder = TemplateEmbedder(config) if config.templates_enabled else None
        self.extra_msa_embedder = ExtraMSAEmbedder(config)
        self.extra_msa_stack = ExtraMSAStack(config)
        self.evoformer = EvoformerStack(config)
        self.structure_module = StructureModule(config)
        self.aux_heads = AuxiliaryHeads(config)

    def _embed(self, batch: dict[str, torch.Tensor], prev: dict[str, torch.Tensor],
               pair_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        m, z = self.input_embedder(batch["target_feat"], batch["residue_index"], batch["msa_feat"])
        x_prev, _ = geometry.pseudo_beta(batch["aatype"], prev["x"], prev["x_mask"])
        m0, z_update = self.recycling_embedder(prev["m0"], prev["z"], x_prev)
        m = torch.cat([m[:, :1] + m0.unsqueeze(1), m[:, 1:]], dim=1)
        z = z + z_update
        msa_mask = batch["msa_mask"].to(m.dtype)
        if self.template_embedder is not None:
            templates = self.template_embedder(batch, z, pair_mask)
            z = z + templates["pair_update"]
            if "msa_rows" in templates:
                m = torch.cat([m, templates["msa_rows"]], dim=1)
                msa_mask = torch.cat([msa_mask, templates["msa_rows_mask"].to(m.dtype)], dim=1)
        return m, z, msa_mask

    def _iteration(self, batch: dict[str, torch.Tensor],
                   prev: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        seq_mask = batch["seq_mask"].to(batch["target_feat"].dtype)
        pair_mask = seq_mask.unsqueeze(-1) * seq_mask.unsqueeze(-2)
        n_clusters = batch["msa_feat"].shape[1]
        m, z, msa_mask = self._embed(batch, prev, pair_mask)
        extra = self.extra_msa_embedder(batch["extra_msa"], batch["extra_has_deletion"].to(z.dtype),
                                        batch["extra_deletion_value"].to(z.dtype))
        z = self.extra_msa_stack(extra, z, batch["extra_msa_mask"].to(z.dtype), pair_mask)
        m, z, s = self.evoformer(m, z, msa_mask, pair_mask)
        out = {"msa": m[:, :n_clusters], "pair": z, "single": s, "m0": m[:, 0]}
        out.update(self.structure_module(s, z, seq_mask, batch["aatype"]))
        atom_exists = geometry.atom37_exists(batch["aatype"]).to(z.dtype)
        out["final_atom_positions"] = geometry.atom14_to_atom37(
            out["sm_positions"][:, -1], batch["aatype"])
        out["final_atom_mask"] = atom_exists
        return out

    def _initial_prev(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        feat = batch["target_feat"]
        b, n = feat.shape[:2]
        cfg = self.config
        return {"m0": feat.new_zeros(b, n, cfg.c_m), "z": feat.new_zeros(b, n, n, cfg.c_z),
                "x": feat.new_zeros(b, n, 37, 3), "x_mask": feat.new_zeros(b, n, 37)}

    def forward(self, batch: dict[str, torch.Tensor],
                num_recycling_iters: int | None = None) -> dict[str, torch.Tensor]:
        if num_recycling_iters is None:
            top = self.config.num_recycling_iters
            num_recycling_iters = (int(torch.randint(0, top + 1, ()).item())
                                   if self.training else top)
        prev = self._initial_prev(batch)
        for _ in range(num_recycling_iters):
            with torch.no_grad():
                out = self._iteration(batch, prev)
            prev = {"m0": out["m0"], "z": out["pair"], "x": out["final_atom_positions"],
                    "x_mask": out["final_atom_mask"]}
        out = self._iteration(batch, prev)
        out.update(self.aux_heads(out))
        out["num_recycling_iters"] = torch.tensor(num_recycling_iters)
        if self.training:
            p = self.config.loss.use_clamped_fape_probability
            out["use_clamped_fape"] = (torch.rand(batch["aatype"].shape[0],
                                                  device=batch["aatype"].device) < p).to(
                out["single"].dtype)
        return out


def recycling_iterations(max_iters: int, seed: int) -> Iterator[int]:
    """The reference's training draw of recycling counts: endless shuffled blocks of
    0..max_iters (each count once per block, so uniform over 0..max_iters)."""
    rng = random.Random(seed)
    while True:
        block = list(range(max_iters + 1))
        rng.shuffle(block)
        yield from block
