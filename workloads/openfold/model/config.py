"""Configuration of the OpenFold (AlphaFold 2) network and of its training loss.

Widths, depths and loss weights follow the MLPerf HPC v3.0 reference (mlcommons/hpc
``openfold/openfold/config.py``, stage "initial_training", the stage the benchmark runs) and
the AlphaFold 2 supplement Table 4/5. ``AlphaFoldConfig.reference()`` builds the network of
93,229,082 parameters that mlperf_logging's closed_openfold.yaml pins.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LossConfig:
    """Loss weights and bins. Units: distances in Angstrom, resolution in Angstrom.

    ``experimentally_resolved_weight`` is 0.0 in the reference's initial training (0.01 only in
    its fine-tuning stage); the structural violation loss is likewise weighted 0.0 there and is
    not implemented here.
    """

    fape_weight: float = 1.0
    fape_backbone_weight: float = 0.5
    fape_sidechain_weight: float = 0.5
    fape_clamp_distance: float = 10.0
    fape_length_scale: float = 10.0
    fape_eps: float = 1e-4
    use_clamped_fape_probability: float = 0.9
    chi_weight: float = 1.0
    chi_angle_weight: float = 0.5
    chi_angle_norm_weight: float = 0.01
    distogram_weight: float = 0.3
    distogram_min_bin: float = 2.3125
    distogram_max_bin: float = 21.6875
    distogram_num_bins: int = 64
    masked_msa_weight: float = 2.0
    plddt_weight: float = 0.01
    plddt_cutoff: float = 15.0
    plddt_num_bins: int = 50
    min_resolution: float = 0.1
    max_resolution: float = 3.0
    experimentally_resolved_weight: float = 0.0
    scale_by_sequence_length: bool = True


@dataclass(frozen=True)
class AlphaFoldConfig:
    """Network widths (c_*), depths (*_blocks), heads, dropout and memory options.

    Channels: c_m MSA, c_z pair, c_e extra MSA, c_t template pair, c_s single.
    Memory: ``chunk_size`` (None: off) splits attention and the outer product mean along a
    batch-like dim; ``checkpoint_blocks`` recomputes each stack block in the backward pass.
    """

    c_m: int = 256
    c_z: int = 128
    c_e: int = 64
    c_t: int = 64
    c_s: int = 384
    target_feat_dim: int = 22
    msa_feat_dim: int = 49
    extra_msa_feat_dim: int = 25
    template_pair_feat_dim: int = 88
    template_angle_feat_dim: int = 57
    relpos_k: int = 32
    recycle_min_bin: float = 3.25
    recycle_max_bin: float = 20.75
    recycle_num_bins: int = 15
    templates_enabled: bool = True
    embed_template_torsion_angles: bool = True
    template_min_bin: float = 3.25
    template_max_bin: float = 50.75
    template_num_bins: int = 39
    template_use_unit_vector: bool = False
    #: zero the template torsion features of angles whose atoms are missing. The reference
    #: feeds them unmasked (False, kept by ``reference()``), which makes the network depend on
    #: where a template sits in space (residue 0's missing predecessor is taken at the
    #: origin); ``mini()`` zeroes them, a departure of the small configuration.
    zero_missing_template_angles: bool = False
    template_blocks: int = 2
    template_tri_att_hidden: int = 16
    template_tri_mul_hidden: int = 64
    template_transition_n: int = 2
    template_dropout: float = 0.25
    template_pointwise_hidden: int = 16
    template_pointwise_heads: int = 4
    extra_msa_blocks: int = 4
    extra_msa_att_hidden: int = 8
    evoformer_blocks: int = 48
    msa_att_hidden: int = 32
    msa_heads: int = 8
    opm_hidden: int = 32
    tri_mul_hidden: int = 128
    tri_att_hidden: int = 32
    tri_heads: int = 4
    transition_n: int = 4
    msa_dropout: float = 0.15
    pair_dropout: float = 0.25
    structure_blocks: int = 8
    ipa_hidden: int = 16
    ipa_heads: int = 12
    ipa_qk_points: int = 4
    ipa_v_points: int = 8
    angle_resnet_hidden: int = 128
    angle_resnet_blocks: int = 2
    structure_dropout: float = 0.1
    position_scale: float = 10.0
    plddt_hidden: int = 128
    plddt_num_bins: int = 50
    distogram_num_bins: int = 64
    masked_msa_classes: int = 23
    tm_score_head: bool = False
    num_recycling_iters: int = 3
    inf: float = 1e9
    eps: float = 1e-8
    chunk_size: int | None = None
    checkpoint_blocks: bool = True
    loss: LossConfig = field(default_factory=LossConfig)

    @classmethod
    def reference(cls, **overrides: Any) -> AlphaFoldConfig:
        """The MLPerf HPC v3.0 network (initial-training stage, no TM-score head)."""
        return dataclasses.replace(cls(), **overrides)

    @classmethod
    def from_mapping(cls, base: str, overrides: dict[str, Any]) -> AlphaFoldConfig:
        """``reference()`` or ``mini()`` (``base``) with overrides read from a config file;
        a "loss" mapping overrides LossConfig fields.

        Raises ValueError naming the first unknown base or key (e.g. "model.c_q").
        """
        if base not in ("reference", "mini"):
            raise ValueError(f"unknown model base {base!r} (reference or mini)")
        known = {f.name for f in dataclasses.fields(cls)}
        loss_known = {f.name for f in dataclasses.fields(LossConfig)}
        values = dict(overrides)
        loss = values.pop("loss", None) or {}
        for key in values:
            if key not in known:
                raise ValueError(f"unknown model key model.{key}")
        for key in loss:
            if key not in loss_known:
                raise ValueError(f"unknown model key model.loss.{key}")
        values["loss"] = dataclasses.replace(LossConfig(), **loss)
        return getattr(cls, base)(**values)

    @classmethod
    def mini(cls, **overrides: Any) -> AlphaFoldConfig:
        """Small widths and depths for one CPU; every block type is kept."""
        small = {
            "c_m": 32, "c_z": 32, "c_e": 16, "c_t": 16, "c_s": 64, "template_blocks": 1,
            "template_tri_att_hidden": 8, "template_tri_mul_hidden": 16,
            "template_pointwise_hidden": 8, "extra_msa_blocks": 1, "extra_msa_att_hidden": 8,
            "evoformer_blocks": 2, "msa_att_hidden": 8, "msa_heads": 4, "opm_hidden": 8,
            "tri_mul_hidden": 32, "tri_att_hidden": 8, "tri_heads": 2, "transition_n": 2,
            "structure_blocks": 4, "ipa_hidden": 16, "ipa_heads": 4, "angle_resnet_hidden": 32,
            "plddt_hidden": 32, "checkpoint_blocks": False, "zero_missing_template_angles": True,
        }
        small.update(overrides)
        return dataclasses.replace(cls(), **small)
