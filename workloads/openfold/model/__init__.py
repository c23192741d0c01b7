"""OpenFold (AlphaFold 2) network and training loss in plain PyTorch.

Public API:

- ``AlphaFoldConfig``: widths, depths, memory options and the ``LossConfig``;
  ``AlphaFoldConfig.reference()`` is the MLPerf HPC v3.0 network (93,229,082 parameters),
  ``AlphaFoldConfig.mini(**overrides)`` a small one for a CPU,
  ``AlphaFoldConfig.from_mapping(base, overrides)`` either one with keys from a config file.
- ``AlphaFold(config)``: ``forward(batch, num_recycling_iters=None) -> dict`` (inputs and
  outputs in ``AlphaFold``'s docstring; final_atom_positions [B, N, 37, 3] Angstrom,
  final_atom_mask [B, N, 37], plddt [B, N] in 0..100, distogram_logits, masked_msa_logits,
  experimentally_resolved_logits, sm_* structure-module trajectories).
- ``openfold_loss(outputs, batch, config) -> (loss, terms)``: the reference's weighted loss
  (a scalar tensor) and each term's batch mean (unweighted) by name.
- ``recycling_iterations(max_iters, seed)``: the reference's training draw of recycle counts.

Sources: Jumper et al. 2021 supplement, Algorithms 1-32; the MLPerf HPC v3.0 OpenFold
reference (mlcommons/hpc ``openfold/``) for layer layout, options and loss weights.
"""

from .config import AlphaFoldConfig, LossConfig
from .loss import openfold_loss
from .model import AlphaFold, recycling_iterations

__all__ = ["AlphaFold", "AlphaFoldConfig", "LossConfig", "openfold_loss", "recycling_iterations"]
