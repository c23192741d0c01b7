"""lDDT-Ca: the quality metric of MLPerf HPC OpenFold (``eval_accuracy``, target 0.8).

The local Distance Difference Test (Mariani et al. 2013, Bioinformatics 29, 2722) on the C-alpha
atoms alone, superposition-free, as AlphaFold (``alphafold/model/lddt.py``) and OpenFold
(``openfold/utils/loss.py`` ``lddt`` / ``lddt_ca``) compute it:

- the pairs scored are those of two different residues, both resolved in the true structure,
  whose C-alpha atoms lie closer than the inclusion radius (15 Angstrom) in the TRUE structure
  (the predicted structure never chooses the pairs);
- each pair scores the fraction of the thresholds 0.5, 1, 2 and 4 Angstrom that the difference
  between its true and predicted C-alpha distances stays strictly below;
- per residue: the mean score of its pairs; per chain: the mean score over all its pairs (not the
  mean of the per-residue scores); ``eps`` = 1e-10 keeps a chain without pairs at 0 (or 1 where
  the numerator's eps and the denominator's meet: a chain with no pair scores 1, as AlphaFold's).

The benchmark's ``eval_accuracy`` is the mean over validation chains of the per-chain score.
"""

from __future__ import annotations

import torch

#: Inclusion radius of the pairs scored, Angstrom (on the true structure).
INCLUSION_RADIUS_A = 15.0
#: Distance-difference thresholds, Angstrom.
THRESHOLDS_A = (0.5, 1.0, 2.0, 4.0)
#: Index of the C-alpha atom in the atom37 layout (N, CA, C, CB, O, ...).
CA_INDEX = 1
EPS = 1e-10


def lddt(predicted: torch.Tensor, true: torch.Tensor, mask: torch.Tensor,
         per_residue: bool = False, cutoff_A: float = INCLUSION_RADIUS_A,
         thresholds_A: tuple[float, ...] = THRESHOLDS_A) -> torch.Tensor:
    """lDDT of one atom per residue (AlphaFold's ``lddt``).

    Args:
        predicted: ``[..., N, 3]`` predicted coordinates, Angstrom (any float dtype).
        true: ``[..., N, 3]`` true coordinates, Angstrom.
        mask: ``[..., N]`` (or ``[..., N, 1]``) 1 where the true atom is resolved.
        per_residue: ``[..., N]`` scores per residue instead of ``[...]`` per chain.
        cutoff_A: inclusion radius on the true distances (15 A for the benchmark).
        thresholds_A: distance-difference thresholds (0.5, 1, 2, 4 A for the benchmark).

    Returns:
        float64 scores in [0, 1], ``[...]`` (per chain) or ``[..., N]`` (per residue).
    """
    predicted, true = predicted.double(), true.double()
    mask = mask.double().reshape(true.shape[:-1])
    d_true = torch.sqrt(EPS + ((true[..., :, None, :] - true[..., None, :, :]) ** 2).sum(-1))
    d_pred = torch.sqrt(EPS + ((predicted[..., :, None, :] - predicted[..., None, :, :]) ** 2).sum(-1))
    n = true.shape[-2]
    scored = ((d_true < cutoff_A).double() * mask[..., :, None] * mask[..., None, :]
              * (1.0 - torch.eye(n, dtype=torch.float64, device=true.device)))
    diff = (d_true - d_pred).abs()
    score = sum((diff < t).double() for t in thresholds_A) / len(thresholds_A)
    dims = (-1,) if per_residue else (-2, -1)
    return (EPS + (scored * score).sum(dims)) / (EPS + scored.sum(dims))


def lddt_ca(predicted_atom37: torch.Tensor, true_atom37: torch.Tensor, atom37_mask: torch.Tensor,
            per_residue: bool = False) -> torch.Tensor:
    """lDDT-Ca from atom37 structures (OpenFold's ``lddt_ca``).

    Args:
        predicted_atom37: ``[..., N, 37, 3]`` Angstrom; true_atom37: ``[..., N, 37, 3]``;
        atom37_mask: ``[..., N, 37]`` 1 where the true atom is resolved (padding residues 0).

    Returns:
        float64 ``[...]`` per chain (``[..., N]`` with ``per_residue``).
    """
    return lddt(predicted_atom37[..., CA_INDEX, :], true_atom37[..., CA_INDEX, :],
                atom37_mask[..., CA_INDEX], per_residue=per_residue)


def lddt_ca_stats(output: dict[str, torch.Tensor], target: dict[str, torch.Tensor]
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum of per-chain lDDT-Ca, number of chains)``, both 0-d float64: summed over batches
    and ranks, the mean lDDT-Ca over the validation chains (`mlhpc.workload.QualityMetric`).

    ``output["final_atom_positions"]`` ``[B, N, 37, 3]`` Angstrom; ``target["all_atom_positions"]``
    ``[B, N, 37, 3]``, ``target["all_atom_mask"]`` ``[B, N, 37]`` (padding residues masked), and
    ``target["seq_mask"]`` ``[B, N]`` when given (applied to the mask too). A chain counts once
    however it was padded.
    """
    mask = target["all_atom_mask"]
    if "seq_mask" in target:
        mask = mask * target["seq_mask"][..., None]
    scores = lddt_ca(output["final_atom_positions"].detach(), target["all_atom_positions"], mask)
    return scores.sum(), torch.tensor(float(scores.numel()), dtype=torch.float64,
                                      device=scores.device)
