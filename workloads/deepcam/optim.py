"""DeepCAM optimizers and learning-rate schedules, as in the MLPerf HPC reference.

Reference: mlcommons/hpc deepcam/src/deepCam/utils/optimizer_helpers.py and schedulers.py, and
the hyperparameter table of deepcam/README.md:

- optimizers ``Adam`` and ``AdamW`` (PyTorch) and ``LAMB`` (NVIDIA APEX ``FusedLAMB`` in the
  reference; here `Lamb`, the same algorithm in plain PyTorch), all with eps = 1e-6;
- schedules per optimizer step: ``multistep`` (decay by ``decay_rate`` at each milestone step) or
  ``cosine_annealing`` (period ``t_max`` steps down to ``eta_min``), both optionally after a
  linear warm-up of ``warmup_steps`` steps. With ``warmup_factor == 1`` the warm-up ramps from 0 to
  the base rate; with a larger factor from the base rate to ``warmup_factor`` x base rate (the
  README's definition). After a warm-up, milestone ``m`` takes effect at step ``m + warmup + 1``,
  as the reference's ``MultiStepLRWarmup`` shifts them.

The defaults of `OptimizerConfig` are the reference's closed-division example
(deepcam/src/deepCam/run_scripts/run_training.sh): LAMB, lr 0.0055, weight decay 0.01, multistep
with milestone 800 and decay 0.1, 400 warm-up steps, warm-up factor 1.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Literal

import torch
from pydantic import Field, model_validator

from mlhpc.config import Section

#: DeepCAM's own compliance key (hpc 3.0.0 closed_deepcam.yaml), not one of the harness's.
BATCHNORM_GROUP_SIZE = "batchnorm_group_size"

# DeepCAM log keys of the hpc 3.0.0 rules with no constant in mlperf_logging.mllog.constants.
OPT_NAME = "opt_name"
OPT_LR = "opt_lr"
OPT_BETAS = "opt_betas"
OPT_EPS = "opt_eps"
OPT_WEIGHT_DECAY = "opt_weight_decay"
OPT_BIAS_CORRECTION = "opt_bias_correction"
OPT_GRAD_AVERAGING = "opt_grad_averaging"
OPT_MAX_GRAD_NORM = "opt_max_grad_norm"
SCHEDULER_TYPE = "scheduler_type"
SCHEDULER_MILESTONES = "scheduler_milestones"
SCHEDULER_DECAY_RATE = "scheduler_decay_rate"
SCHEDULER_T_MAX = "scheduler_t_max"
SCHEDULER_ETA_MIN = "scheduler_eta_min"
SCHEDULER_WARMUP_STEPS = "scheduler_lr_warmup_steps"
SCHEDULER_WARMUP_FACTOR = "scheduler_lr_warmup_factor"


class OptimizerConfig(Section):
    """The ``optimizer`` section of a DeepCAM config (defaults: the reference, see module doc).

    Steps count optimizer updates (after gradient accumulation), as in the reference.
    """

    name: Literal["Adam", "AdamW", "LAMB"] = Field("LAMB", description=(
        "optimizer: LAMB (the reference), Adam or AdamW"))
    lr: float = Field(0.0055, gt=0.0, description="peak learning rate (after warm-up)")
    betas: tuple[float, float] = Field((0.9, 0.999), description="Adam/LAMB beta_1 and beta_2")
    eps: float = Field(1e-6, gt=0.0, description=(
        "the optimizer's epsilon (the closed rules require exactly 1e-6)"))
    weight_decay: float = Field(1e-2, ge=0.0, description="weight decay")
    scheduler: Literal["multistep", "cosine_annealing"] = Field("multistep", description=(
        "learning-rate schedule after warm-up: multistep or cosine_annealing"))
    milestones: list[int] = Field(default_factory=lambda: [800], description=(
        "multistep: optimizer steps at which the learning rate is multiplied by decay_rate"))
    decay_rate: float = Field(0.1, gt=0.0, le=1.0, description=(
        "multistep: factor applied at each milestone"))
    t_max: int = Field(10000, ge=1, description=(
        "cosine_annealing: optimizer steps of one cosine half-period"))
    eta_min: float = Field(0.0, ge=0.0, description="cosine_annealing: the lowest learning rate")
    warmup_steps: int = Field(400, ge=0, description="optimizer steps of learning-rate warm-up")
    warmup_factor: float = Field(1.0, ge=1.0, description=(
        "learning rate at the end of warm-up relative to lr (1: warm up to lr)"))
    # LAMB only, fixed by the rules at APEX FusedLAMB's defaults
    bias_correction: bool = Field(True, description=(
        "LAMB only: Adam-style bias correction (fixed by the rules at APEX FusedLAMB's "
        "default)"))
    grad_averaging: bool = Field(True, description=(
        "LAMB only: (1 - beta_1) scaling of the gradient in the first moment (APEX FusedLAMB's"
        " default)"))
    max_grad_norm: float = Field(1.0, gt=0.0, description=(
        "LAMB only: global gradient-norm clip (APEX FusedLAMB's default)"))

    @model_validator(mode="after")
    def _check(self) -> "OptimizerConfig":
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError("betas must both be in [0, 1)")
        if any(m < 0 for m in self.milestones):
            raise ValueError("milestones must be >= 0 steps")
        return self


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning: Training BERT in 76
    minutes", arXiv:1904.00962, Algorithm 2), with the conventions of APEX ``FusedLAMB`` that the
    DeepCAM reference uses:

    1. all gradients are first scaled by ``max_grad_norm / ||g||`` when their global L2 norm
       ``||g||`` exceeds ``max_grad_norm``;
    2. per tensor: ``m = b1 m + (1 - b1) g`` (``(1 - b1)`` replaced by 1 without
       ``grad_averaging``), ``v = b2 v + (1 - b2) g^2``, bias-corrected ``m^ = m / (1 - b1^t)``,
       ``v^ = v / (1 - b2^t)`` when ``bias_correction``;
    3. ``r = m^ / (sqrt(v^) + eps) + weight_decay * x`` (decoupled weight decay);
    4. ``x -= lr * (||x|| / ||r||) * r``, the trust ratio taken as 1 when either norm is 0 or the
       group's weight decay is 0 (FusedLAMB without ``use_nvlamb``).

    State per parameter: ``step`` (int), ``exp_avg`` and ``exp_avg_sq`` (same shape and dtype).
    """

    #: The hyperparameters besides ``lr``, as FusedLAMB names them, and their defaults.
    OPTIONS = {"betas": (0.9, 0.999), "eps": 1e-6, "weight_decay": 0.01, "bias_correction": True,
               "grad_averaging": True, "max_grad_norm": 1.0}

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, **options: Any) -> None:
        """``options``: any of `OPTIONS` by name. Raises TypeError for another name, ValueError
        for lr, eps or max_grad_norm <= 0 or weight_decay < 0."""
        unknown = sorted(set(options) - set(self.OPTIONS))
        if unknown:
            raise TypeError(f"Lamb: unknown option {unknown[0]!r}")
        defaults = {**self.OPTIONS, **options, "lr": lr}
        defaults["betas"] = tuple(defaults["betas"])
        if lr <= 0.0 or defaults["eps"] <= 0.0 or defaults["weight_decay"] < 0.0 \
                or defaults["max_grad_norm"] <= 0.0:
            raise ValueError("Lamb: lr, eps and max_grad_norm must be > 0, weight_decay >= 0")
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        if not grads:
            return loss
        wide = torch.float64 if any(g.dtype == torch.float64 for g in grads) else torch.float32
        global_norm = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g, dtype=wide) for g in grads]))
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            clip = torch.clamp(global_norm / group["max_grad_norm"], min=1.0)
            beta3 = 1.0 - beta1 if group["grad_averaging"] else 1.0
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad / clip
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t = state["step"]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(grad, alpha=beta3)
                v.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                if group["bias_correction"]:
                    m_hat, v_hat = m / (1.0 - beta1**t), v / (1.0 - beta2**t)
                else:
                    m_hat, v_hat = m, v
                update = m_hat / (v_hat.sqrt() + group["eps"])
                if group["weight_decay"] != 0.0:
                    update.add_(p, alpha=group["weight_decay"])
                    w_norm = torch.linalg.vector_norm(p)
                    u_norm = torch.linalg.vector_norm(update)
                    ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm,
                                        torch.ones_like(w_norm))
                else:
                    ratio = torch.ones((), device=p.device)
                p.sub_(update * (ratio * group["lr"]))
        return loss


def lr_factor(cfg: OptimizerConfig, step: int) -> float:
    """Learning rate at optimizer step ``step`` (0-based: the rate of the first update is at 0)
    as a multiple of ``cfg.lr`` (see the module docstring for the reference's definitions)."""
    warm = cfg.warmup_steps
    if warm > 0 and step <= warm:
        if cfg.warmup_factor == 1.0:
            return step / warm
        return (cfg.warmup_factor - 1.0) * step / warm + 1.0
    peak = cfg.warmup_factor if warm > 0 else 1.0
    after = step - warm
    if cfg.scheduler == "multistep":
        offset = warm + 1 if warm > 0 else 0
        passed = sum(1 for m in cfg.milestones if m + offset <= step)
        return peak * cfg.decay_rate**passed
    eta = cfg.eta_min / cfg.lr
    return eta + (peak - eta) * (1.0 + math.cos(math.pi * after / cfg.t_max)) / 2.0


def build_optimizer(model: torch.nn.Module, config: Any, steps_per_epoch: int
                    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """The configured optimizer over ``model.parameters()`` and its per-step schedule.

    Args:
        model: the network (its trainable parameters all in one group, as the reference).
        config: the run `Config`; reads ``config.optimizer`` (`OptimizerConfig`).
        steps_per_epoch: optimizer steps per epoch (unused: the DeepCAM schedule is in steps).

    Returns:
        ``(optimizer, scheduler)``; the harness calls ``scheduler.step()`` once per optimizer step.
    """
    del steps_per_epoch
    cfg: OptimizerConfig = config.optimizer
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.name == "Adam":
        opt: torch.optim.Optimizer = torch.optim.Adam(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                                                      weight_decay=cfg.weight_decay)
    elif cfg.name == "AdamW":
        opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                                weight_decay=cfg.weight_decay)
    else:
        opt = Lamb(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                   bias_correction=cfg.bias_correction, grad_averaging=cfg.grad_averaging,
                   max_grad_norm=cfg.max_grad_norm)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(cfg, step))


def hyperparameters(config: Any) -> dict[str, Any]:
    """The DeepCAM keys of the hpc 3.0.0 closed rules (closed_deepcam.yaml and the scheduler and
    LAMB files it enqueues) beyond those the harness logs, with the values the reference logs."""
    cfg: OptimizerConfig = config.optimizer
    keys: dict[str, Any] = {
        BATCHNORM_GROUP_SIZE: config.model.batchnorm_group_size,
        OPT_NAME: cfg.name,
        OPT_LR: cfg.lr,
        OPT_BETAS: list(cfg.betas),
        OPT_EPS: cfg.eps,
        OPT_WEIGHT_DECAY: cfg.weight_decay,
    }
    if cfg.name == "LAMB":
        keys.update({OPT_BIAS_CORRECTION: cfg.bias_correction, OPT_GRAD_AVERAGING: cfg.grad_averaging,
                     OPT_MAX_GRAD_NORM: cfg.max_grad_norm})
    keys[SCHEDULER_TYPE] = cfg.scheduler
    if cfg.scheduler == "multistep":
        keys.update({SCHEDULER_MILESTONES: list(cfg.milestones), SCHEDULER_DECAY_RATE: cfg.decay_rate})
    else:
        keys.update({SCHEDULER_T_MAX: cfg.t_max, SCHEDULER_ETA_MIN: cfg.eta_min})
    keys.update({SCHEDULER_WARMUP_STEPS: cfg.warmup_steps, SCHEDULER_WARMUP_FACTOR: cfg.warmup_factor})
    return keys
