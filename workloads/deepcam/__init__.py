"""DeepCAM (MLPerf HPC): pixel-wise segmentation of tropical cyclones and atmospheric rivers in
16-variable CAM5 climate snapshots.

Reference: mlcommons/hpc deepcam (DeepLabv3+ / Xception, weighted cross-entropy, Adam/AdamW/LAMB
with multistep or cosine schedules) and the hpc 3.0.0 compliance rules. Metric ``eval_accuracy`` =
mean IoU over the 3 classes per sample, averaged over the validation samples; target 0.82.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from mlhpc.workload import Workload
from .data import build_datasets
from .metric import METRIC
from .model import ModelConfig, build_model
from .optim import OptimizerConfig, build_optimizer, hyperparameters
from .synth import SynthConfig, synthesize

REFERENCE_SAMPLES = (121266, 15158)  # train/validation samples (closed_deepcam.yaml)

#: Pixel frequencies of background, tropical cyclone and atmospheric river in the reference
#: training set, and the power applied to them for the loss weights (reference train.py).
CLASS_FREQUENCIES = (0.986267818390377, 0.0004578708870701058, 0.01327431072255291)
LOSS_POWER = -0.125


def class_weights() -> torch.Tensor:
    """float32 (3,) cross-entropy weights ``frequency ** -0.125`` (reference train.py)."""
    return torch.tensor([f**LOSS_POWER for f in CLASS_FREQUENCIES], dtype=torch.float32)


def build_loss(config: Any) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The reference's ``CELoss``: per-pixel class-weighted cross-entropy, averaged over every
    pixel (``reduction='none'`` then the plain mean, not the weight-normalised mean).

    The returned function takes logits float (N, 3, H, W) and labels int64 (N, H, W) and returns
    a 0-d tensor.
    """
    del config
    weights = class_weights()

    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        w = weights.to(device=logits.device, dtype=logits.dtype)
        return F.cross_entropy(logits, labels, weight=w, reduction="none").mean()

    return loss


WORKLOAD = Workload(
    name="deepcam",
    model_config=ModelConfig,
    optimizer_config=OptimizerConfig,
    synth_config=SynthConfig,
    build_model=build_model,
    build_datasets=build_datasets,
    synthesize=synthesize,
    build_loss=build_loss,
    metric=METRIC,
    build_optimizer=build_optimizer,
    hyperparameters=hyperparameters,
    reference_samples=REFERENCE_SAMPLES,
)
