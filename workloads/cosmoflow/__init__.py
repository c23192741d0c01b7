"""CosmoFlow (MLPerf HPC): regress four cosmological parameters from 3-D dark-matter density cubes.

Reference: mlcommons/hpc cosmoflow; MLPerf HPC rules. Metric ``eval_error`` = mean absolute
error over the four normalised parameters on the validation set; target 0.124.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mlhpc.workload import Knob, QualityMetric, Workload

from ..departures import training_departures
from .convert import DATA_TOOLS
from .data import build_datasets
from .model import ModelConfig, build_model
from .optim import OptimizerConfig, build_optimizer, hyperparameters
from .synth import SynthConfig, synthesize

TARGET_EVAL_ERROR = 0.124
REFERENCE_SAMPLES = (524288, 65536)  # train/validation samples of the v1.0+ reference dataset
REFERENCE_CUBE_SIZE = 128  # cells per side of a reference sample (128^3 x 4)
REFERENCE_GLOBAL_BATCH_SIZE = 64  # mlcommons/hpc cosmoflow/configs/cosmo.yaml


def departures(config) -> list[str]:
    """Every way ``config`` differs from the reference closed-division CosmoFlow setting
    (mlcommons/hpc cosmoflow/configs/cosmo.yaml: SGD momentum 0.9, 128^3 x 4 N-body sub-volumes,
    524,288 / 65,536 samples, 32 filters x 5 conv blocks, dropout 0.5, log(1 + x) inputs, target
    eval_error 0.124), one line each; empty for the reference config on the real dataset.

    Covers the data (embedded synthetic universes, their cube size, sample counts and whether
    training and validation share initial phases), every model key (width ``conv_channels``,
    depth ``n_conv_layers``, ``dropout``, ``input_standardization``, ...), every optimizer key
    (``name``: Adam instead of SGD, rates, schedule, weight decay), the global batch size and the
    quality target.
    """
    notes: list[str] = []
    if config.data.synthesize_if_missing and config.synth is not None:
        synth = config.synth
        notes.append(f"data: embedded synthetic universes (mlhpc_workloads.cosmoflow.synth), "
                     f"{synth.cube_size}^3 x 4 cells (reference {REFERENCE_CUBE_SIZE}^3 x 4 "
                     f"N-body sub-volumes of cosmoUniverse_2019_05_4parE)")
        notes.append(f"samples {synth.train_samples}/{synth.eval_samples} "
                     f"(reference {REFERENCE_SAMPLES[0]}/{REFERENCE_SAMPLES[1]})")
        shared = getattr(synth, "phase_realizations", None)
        if shared is not None:
            notes.append(f"phases: {shared} initial-phase realisation(s) shared by training and "
                         f"validation (reference: every universe an independent simulation)")
    return notes + training_departures(config, ModelConfig(), OptimizerConfig(),
                                       REFERENCE_GLOBAL_BATCH_SIZE, METRIC)


def mae_stats(output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of |output - target|, number of elements) as float64, for an exact all-reduced MAE.

    Shapes: (N, 4) and (N, 4), any float dtype.
    """
    err = (output.detach().double() - target.double()).abs()
    return err.sum(), torch.tensor(float(err.numel()), dtype=torch.float64, device=err.device)


METRIC = QualityMetric(key="eval_error", target=TARGET_EVAL_ERROR, direction="min",
                       batch_stats=mae_stats)


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
    synth_count_keys=("train_samples", "eval_samples"),
    build_loss=build_loss,
    metric=METRIC,
    build_optimizer=build_optimizer,
    hyperparameters=hyperparameters,
    reference_samples=REFERENCE_SAMPLES,
    departures=departures,
    data_tools=DATA_TOOLS,
    reference_train_flops_per_sample=(192_090_785_280.0, "4 x 128^3 universe"),  # counted, mlhpc.run.step.count_flops_on_meta
    search_knobs=(
        Knob("model.n_conv_layers", "architecture", "depth: convolution blocks, each halving the cube"),
        Knob("model.conv_channels", "architecture", "width: filters of the first convolution block"),
        Knob("model.kernel_size", "architecture", "side of the Conv3D kernels"),
        Knob("model.fc1_size", "architecture", "units of the first dense layer"),
        Knob("model.fc2_size", "architecture", "units of the second dense layer"),
        Knob("model.dropout", "hyperparameter", "dropout rate after each dense layer"),
        Knob("optimizer.base_learning_rate", "hyperparameter", "learning rate at the base batch size"),
        Knob("optimizer.warmup_epochs", "hyperparameter", "epochs of linear learning-rate warm-up"),
    ),
)
