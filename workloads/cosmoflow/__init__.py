"""CosmoFlow (MLPerf HPC): regress four cosmological parameters from 3-D dark-matter density cubes.

Reference: mlcommons/hpc cosmoflow; MLPerf HPC rules. Metric ``eval_error`` = mean absolute
error over the four normalised parameters on the validation set; target 0.124.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mlhpc.workload import QualityMetric, Workload
from .data import build_datasets
from .model import ModelConfig, build_model
from .optim import OptimizerConfig, build_optimizer, hyperparameters
from .synth import SynthConfig, synthesize

TARGET_EVAL_ERROR = 0.124
REFERENCE_SAMPLES = (524288, 65536)  # train/validation samples of the v1.0+ reference dataset


def mae_stats(output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of |output - target|, number of elements) as float64, for an exact all-reduced MAE.

    Shapes: (N, 4) and (N, 4), any float dtype.
    """
    err = (output.detach().double() - target.double()).abs()
    return err.sum(), torch.tensor(float(err.numel()), dtype=torch.float64, device=err.device)


def build_loss(config):
    """Mean squared error, as the reference (``loss: mse``)."""
    return F.mse_loss


WORKLOAD = Workload(
    name="cosmoflow",
    model_config=ModelConfig,
    optimizer_config=OptimizerConfig,
    synth_config=SynthConfig,
    build_model=build_model,
    build_datasets=build_datasets,
    synthesize=synthesize,
    build_loss=build_loss,
    metric=QualityMetric(key="eval_error", target=TARGET_EVAL_ERROR, direction="min",
                         batch_stats=mae_stats),
    build_optimizer=build_optimizer,
    hyperparameters=hyperparameters,
    reference_samples=REFERENCE_SAMPLES,
)
