"""The reference's label normalisation, applied to the network's outputs.

The reference trains DimeNet++ on normalised labels (``normalize_labels: True``: energy
``(y - target_mean) / target_std``, forces ``force / grad_target_std``) and denormalises its
predictions for the metric (``mlperf_forces_trainer._compute_metrics``). `NormalisedOutput`
does the denormalisation inside the model, so that the model speaks eV and eV/Angstrom and the
harness's metric needs no normalisers; the loss normalises prediction and label alike
(`optim.build_loss`), which is the reference's loss on the network's own outputs.
"""

from __future__ import annotations

import torch


class NormalisedOutput(torch.nn.Module):
    """``(energy (B,) eV, forces (N, 3) eV/Angstrom)`` from a network that predicts normalised
    ones: ``energy * target_std + target_mean`` and ``forces * grad_target_std``.

    Args:
        net: a module returning ``(energy (B,), forces (N, 3))`` in normalised units.
        target_mean, target_std: the energy normaliser (eV).
        grad_target_std: the forces normaliser (eV/Angstrom).
    """

    def __init__(self, net: torch.nn.Module, target_mean: float, target_std: float,
                 grad_target_std: float) -> None:
        super().__init__()
        self.net = net
        self.target_mean, self.target_std = float(target_mean), float(target_std)
        self.grad_target_std = float(grad_target_std)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        energy, forces = self.net(batch)
        return energy * self.target_std + self.target_mean, forces * self.grad_target_std
