"""OpenCatalyst (OC20 S2EF) training objective, optimizer and schedule, as the MLPerf HPC reference.

Reference: mlcommons/hpc ``open_catalyst/configs/mlperf_hpc.yml`` and
``ocpmodels/trainers/mlperf_forces_trainer.py``:

- labels normalised (``normalize_labels: True``): energy ``(y - target_mean) / target_std``,
  forces ``force / grad_target_std`` (mean 0: a mean is lost in ``-dE/dpos``);
- loss ``energy_coefficient * L1(energy) + force_coefficient * L1(forces on free atoms)``
  (``energy_coefficient: 0``, ``force_coefficient: 50``, the trainer's default ``mae`` criterion,
  ``train_on_free_atoms: True``);
- AdamW at ``lr_initial`` 0.0004 (torch's defaults otherwise: the reference passes no
  ``optimizer_params``), one scheduler step per optimizer step: linear warm-up from
  ``warmup_factor`` 0.2 over ``warmup_steps`` 31,252, then ``lr_gamma`` 0.1 at each of the
  ``lr_milestones`` 125,008 / 187,512 / 250,016 (OCP's ``warmup_lr_lambda``);
- logged (hpc 3.0.0 ``closed_oc20.yaml``): ``opt_name`` AdamW, ``opt_base_learning_rate``,
  ``opt_learning_rate_warmup_steps``, ``opt_learning_rate_warmup_factor``,
  ``opt_learning_rate_decay_boundary_steps``, ``opt_learning_rate_decay_factor``.
"""

from __future__ import annotations

import bisect
from typing import Any, Callable

import torch
from pydantic import Field

from mlhpc.config import Section



class OptimizerConfig(Section):
    """The ``optimizer`` section of an OC20 config: AdamW, its schedule and the loss.

    Defaults are the reference's (``mlperf_hpc.yml``, global batch 256 = 8 per GPU x 32).
    """

    name: str = Field("AdamW", pattern="^AdamW$", description="optimizer; the closed rules require AdamW")
    lr: float = Field(0.0004, gt=0, le=1, description="lr_initial: peak learning rate after warm-up")
    weight_decay: float = Field(0.01, ge=0, le=1, description="AdamW weight decay (torch's default, "
                                "as the reference passes none)")
    warmup_steps: int = Field(31252, ge=0, description="optimizer steps of linear warm-up (4 epochs "
                              "of the 2M split at global batch 256)")
    warmup_factor: float = Field(0.2, ge=0, le=1, description="learning-rate factor at step 0")
    decay_boundary_steps: tuple[int, ...] = Field(
        (125008, 187512, 250016), description="lr_milestones: optimizer steps at which the rate is "
        "multiplied by decay_factor")
    decay_factor: float = Field(0.1, gt=0, le=1, description="lr_gamma")
    force_coefficient: float = Field(50.0, ge=0, description="weight of the forces L1 loss")
    energy_coefficient: float = Field(0.0, ge=0, description="weight of the energy L1 loss")


def lr_factor(step: int, cfg: OptimizerConfig) -> float:
    """The learning-rate factor after ``step`` optimizer steps (OCP ``warmup_lr_lambda``): linear
    from ``warmup_factor`` to 1 over ``warmup_steps``, then ``decay_factor ** k`` after the k-th
    boundary passed."""
    if cfg.warmup_steps and step <= cfg.warmup_steps:
        alpha = step / cfg.warmup_steps
        return cfg.warmup_factor * (1.0 - alpha) + alpha
    return cfg.decay_factor ** bisect.bisect(sorted(cfg.decay_boundary_steps), step)


def build_optimizer(model: torch.nn.Module, config: Any, steps_per_epoch: int):
    """AdamW over every parameter at ``optimizer.lr`` with the step schedule `lr_factor` as a
    per-step ``LambdaLR`` (the harness steps it once per optimizer step)."""
    del steps_per_epoch  # the reference's schedule is in steps, not epochs
    cfg: OptimizerConfig = config.optimizer
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg))
    return optimizer, scheduler


def hyperparameters(config: Any) -> dict[str, Any]:
    """The OC20 keys of the hpc 3.0.0 closed rules (``closed_oc20.yaml``), as the reference
    trainer logs them."""
    cfg: OptimizerConfig = config.optimizer
    return {
        "opt_name": cfg.name,
        "opt_base_learning_rate": cfg.lr,
        "opt_learning_rate_warmup_steps": cfg.warmup_steps,
        "opt_learning_rate_warmup_factor": cfg.warmup_factor,
        "opt_learning_rate_decay_boundary_steps": list(cfg.decay_boundary_steps),
        "opt_learning_rate_decay_factor": cfg.decay_factor,
        "opt_weight_decay": cfg.weight_decay,
    }


Output = tuple[torch.Tensor, torch.Tensor]


def build_loss(config: Any) -> Callable[[Output, dict[str, torch.Tensor]], torch.Tensor]:
    """The reference loss on normalised labels. The model (`mlhpc_workloads.opencatalyst.
    NormalisedOutput`) returns ``(energy (B,) eV, forces (N, 3) eV/Angstrom)`` denormalised; the
    loss normalises prediction and label alike (``model.target_mean``, ``model.target_std``,
    ``model.grad_target_std``), which is the reference's loss on the network's normalised
    outputs: ``energy_coefficient * L1(energy) + force_coefficient * L1(forces[free])``.

    The targets are ``{"energy" (B,) eV, "forces" (N, 3) eV/Angstrom, "fixed" (N,) bool}``;
    returns a 0-d tensor.
    """
    cfg: OptimizerConfig = config.optimizer
    norm = config.model

    def loss(output: Output, target: dict[str, torch.Tensor]) -> torch.Tensor:
        energy, forces = output
        free = ~target["fixed"].bool()
        total = cfg.force_coefficient * torch.nn.functional.l1_loss(
            forces[free] / norm.grad_target_std, target["forces"][free] / norm.grad_target_std)
        if cfg.energy_coefficient:
            total = total + cfg.energy_coefficient * torch.nn.functional.l1_loss(
                energy / norm.target_std, target["energy"] / norm.target_std)
        return total

    return loss


def forces_mae_stats(output: Output, target: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum |F_pred - F| over the free atoms' components, their count)`` as float64: summed over
    batches and ranks, the reference's ``forces_mae`` (eV/Angstrom, ``eval_on_free_atoms: True``,
    the evaluator's mean over every component). ``output`` is the model's ``(energy, forces)``."""
    forces = output[1].detach().double()
    free = ~target["fixed"].bool()
    err = (forces[free] - target["forces"][free].double()).abs()
    return err.sum(), torch.tensor(float(err.numel()), dtype=torch.float64, device=err.device)
