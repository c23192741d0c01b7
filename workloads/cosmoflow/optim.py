"""CosmoFlow optimizer and learning-rate schedule, as in the MLPerf HPC reference
(mlcommons/hpc cosmoflow/utils/optimizers.py and configs/cosmo.yaml).

SGD with momentum 0.9 (the closed-division optimizer; ``name: adam`` is an open-division option,
logged as such). The peak rate is the base rate scaled with the global batch size
(``linear``: x global/base batch size, ``sqrt``: x its square root); the first
``warmup_epochs`` epochs ramp linearly from the base rate to the peak; after that the rate is the
peak times the factor of the latest decay boundary epoch passed. The schedule is per epoch, as in
the reference; the harness steps the scheduler per optimizer step, so the step is mapped to its
epoch here.

Weight decay is the reference's L2 penalty (``l2`` in configs/cosmo.yaml): mlcommons/hpc
``cosmoflow/models/cosmoflow.py`` puts ``kernel_regularizer=regularizers.l2(l2)`` on the two hidden
Dense layers (fc1, fc2) only; convolution kernels, biases and the output layer are not penalised.
Keras adds ``l2 * sum(w ** 2)`` to the loss, whose gradient is ``2 * l2 * w``, so those kernels get
torch's (coupled, L2) ``weight_decay = 2 * l2`` in a parameter group of their own.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field

from mlhpc.config import DecayFactor, Epoch, Section


class OptimizerConfig(Section):
    """Defaults: the reference closed-division CosmoFlow settings (configs/cosmo.yaml)."""

    name: Literal["sgd", "adam"] = Field("sgd", description=(
        "optimizer: sgd (the reference, with momentum) or adam"))
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="SGD momentum; Adam's beta_1")
    beta_2: float = Field(0.999, gt=0.0, lt=1.0, description="Adam's beta_2 (Adam only)")
    base_learning_rate: float = Field(0.001, gt=0.0, description=(
        "learning rate at base_batch_size; scaled to the global batch size by scaling"))
    base_batch_size: int = Field(64, ge=1, description=(
        "global batch size base_learning_rate is given for"))
    scaling: Literal["linear", "sqrt", "none"] = Field("linear", description=(
        "how the learning rate follows the global batch size: linear, sqrt or none"))
    warmup_epochs: int = Field(4, ge=0, description="epochs of linear learning-rate warm-up")
    decay_schedule: dict[Epoch, DecayFactor] = Field(default_factory=lambda: {32: 0.25, 64: 0.125}, description=(
        "epoch -> factor: from that epoch on the learning rate is multiplied by the factor"))
    weight_decay: float = Field(0.0, ge=0.0, description=(
        "the reference's l2: Keras L2 factor on the fc1/fc2 kernels"))


def scale_factor(cfg: OptimizerConfig, global_batch_size: int) -> float:
    """How much the peak learning rate exceeds the base rate for ``global_batch_size``."""
    if cfg.scaling == "linear":
        return global_batch_size / cfg.base_batch_size
    if cfg.scaling == "sqrt":
        return math.sqrt(global_batch_size / cfg.base_batch_size)
    return 1.0


def learning_rate(cfg: OptimizerConfig, global_batch_size: int, epoch: int) -> float:
    """Learning rate for the 0-based ``epoch`` (reference ``_lr_schedule``)."""
    peak = cfg.base_learning_rate * scale_factor(cfg, global_batch_size)
    if epoch < cfg.warmup_epochs:
        return cfg.base_learning_rate + epoch * (peak - cfg.base_learning_rate) / cfg.warmup_epochs
    factor, latest = 1.0, -1
    for boundary, decay in cfg.decay_schedule.items():
        if latest <= boundary < epoch:
            latest, factor = boundary, decay
    return peak * factor


def dense_kernels(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The weight matrices of the hidden Dense layers: every `torch.nn.Linear` of ``model`` but the
    last (the output layer), in module order; the tensors the reference's L2 penalty covers."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return [m.weight for m in linears[:-1]]


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Two parameter groups: the hidden Dense kernels with ``weight_decay = 2 * weight_decay``
    (Keras ``regularizers.l2`` semantics, see the module docstring), everything else with none."""
    decayed = dense_kernels(model)
    ids = {id(p) for p in decayed}
    rest = [p for p in model.parameters() if id(p) not in ids]
    return [{"params": decayed, "weight_decay": 2.0 * weight_decay},
            {"params": rest, "weight_decay": 0.0}]


def build_optimizer(model: torch.nn.Module, config, steps_per_epoch: int):
    """SGD with momentum (or Adam) and the per-epoch schedule above, as a per-step `LambdaLR`;
    weight decay on the hidden Dense kernels only (`param_groups`)."""
    cfg: OptimizerConfig = config.optimizer
    gbs = config.train.global_batch_size
    groups = param_groups(model, cfg.weight_decay)
    if cfg.name == "adam":
        optimizer = torch.optim.Adam(groups, lr=cfg.base_learning_rate,
                                     betas=(cfg.momentum, cfg.beta_2))
    else:
        optimizer = torch.optim.SGD(groups, lr=cfg.base_learning_rate, momentum=cfg.momentum)
    steps = max(1, steps_per_epoch)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: learning_rate(cfg, gbs, step // steps) / cfg.base_learning_rate)
    return optimizer, scheduler


def hyperparameters(config) -> dict:
    """The CosmoFlow keys of the hpc 3.0.0 closed rules (closed_cosmoflow.yaml), with the values
    the reference logs: ``opt_base_learning_rate`` is the batch-scaled peak rate,
    ``opt_learning_rate_warmup_factor`` the scale factor, and the decay factor the largest one."""
    cfg: OptimizerConfig = config.optimizer
    gbs = config.train.global_batch_size
    factor = scale_factor(cfg, gbs)
    return {
        "opt_name": cfg.name,
        "opt_base_learning_rate": cfg.base_learning_rate * factor,
        "opt_learning_rate_warmup_epochs": cfg.warmup_epochs,
        "opt_learning_rate_warmup_factor": factor,
        "opt_learning_rate_decay_boundary_epochs": sorted(cfg.decay_schedule),
        "opt_learning_rate_decay_factor": max(cfg.decay_schedule.values(), default=1.0),
        "opt_weight_decay": cfg.weight_decay,
        "dropout": config.model.dropout,
    }
