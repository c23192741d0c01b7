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

from mlhpc.workload import Knob, Workload

from ..departures import training_departures
from .convert import DATA_TOOLS
from .data import build_datasets
from .metric import METRIC
from .model import ModelConfig, build_model
from .optim import OptimizerConfig, build_optimizer, hyperparameters
from .synth import SynthConfig, synthesize

REFERENCE_SAMPLES = (121266, 15158)  # train/validation samples (closed_deepcam.yaml)
REFERENCE_GRID = (768, 1152)  # CAM5 grid, latitude x longitude
REFERENCE_GLOBAL_BATCH_SIZE = 2048  # the hpc 3.0.0 reference convergence point (configs/deepcam.yaml)

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


def departures(config: Any) -> list[str]:
    """Every way ``config`` differs from the reference closed-division DeepCAM setting
    (configs/deepcam.yaml: CAM5 768 x 1152 x 16 snapshots, 121,266 / 15,158 samples, the full
    DeepLabv3+ / Xception model, LAMB lr 0.0055 with 400 warm-up steps and x0.1 at step 800,
    global batch 2048, target eval_accuracy 0.82), one line each; empty for the reference.

    Covers the data (embedded synthetic fields, grid, sample counts), every model key (widths,
    depth ``middle_blocks``, ...), every optimizer key, the global batch size and the target.
    """
    notes: list[str] = []
    if config.data.synthesize_if_missing and config.synth is not None:
        synth = config.synth
        notes.append(f"data: embedded synthetic CAM5-like fields (mlhpc_workloads.deepcam.synth), "
                     f"{synth.height} x {synth.width} grid (reference {REFERENCE_GRID[0]} x "
                     f"{REFERENCE_GRID[1]} CAM5 snapshots)")
        notes.append(f"samples {synth.train_samples}/{synth.validation_samples} "
                     f"(reference {REFERENCE_SAMPLES[0]}/{REFERENCE_SAMPLES[1]})")
    return notes + training_departures(config, ModelConfig(), OptimizerConfig(),
                                       REFERENCE_GLOBAL_BATCH_SIZE, METRIC)


WORKLOAD = Workload(
    name="deepcam",
    model_config=ModelConfig,
    optimizer_config=OptimizerConfig,
    synth_config=SynthConfig,
    build_model=build_model,
    build_datasets=build_datasets,
    synthesize=synthesize,
    synth_count_keys=("train_samples", "validation_samples"),
    build_loss=build_loss,
    metric=METRIC,
    build_optimizer=build_optimizer,
    hyperparameters=hyperparameters,
    reference_samples=REFERENCE_SAMPLES,
    departures=departures,
    data_tools=DATA_TOOLS,
    reference_train_flops_per_sample=(1_963_974_567_936.0, "16 x 768 x 1152 climate image"),  # counted, mlhpc.run.step.count_flops_on_meta
    search_knobs=(
        Knob("model.middle_blocks", "architecture", "depth: Xception middle-flow blocks"),
        Knob("model.aspp_channels", "architecture", "width: channels of the ASPP module"),
        Knob("model.decoder_channels", "architecture", "width: channels of the decoder"),
        Knob("optimizer.lr", "hyperparameter", "peak learning rate after warm-up"),
        Knob("optimizer.weight_decay", "hyperparameter", "weight decay"),
    ),
)
