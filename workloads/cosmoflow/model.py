"""The CosmoFlow 3-D CNN, as in the MLPerf HPC reference (mlcommons/hpc cosmoflow/models/cosmoflow.py,
Keras; Mathuriya et al., "CosmoFlow: using deep learning to learn the universe at scale", SC18).

Per conv block: Conv3D (kernel 3, "same" padding) -> LeakyReLU(0.3) -> MaxPool3D(2); the filters
double each block (32, 64, 128, 256, 512 at the reference size). Then flatten -> Dense(128) ->
LeakyReLU -> Dropout -> Dense(64) -> LeakyReLU -> Dropout -> Dense(4) -> tanh * 1.2. Weights are
Xavier-uniform (Keras' glorot_uniform) and biases zero. At the reference configuration
(128^3 x 4 input) the model has 8,907,556 parameters.

Smaller cubes and fewer filters are `ModelConfig` values, not another model.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from mlhpc.config import Section


class ModelConfig(Section):
    """CosmoFlow hyper-parameters; defaults are the reference closed-division model."""

    input_size: int = Field(128, ge=2, description=(
        "cube side S of the (4, S, S, S) input, in cells; divisible by 2 ** n_conv_layers"))
    in_channels: int = Field(4, ge=1, description="input channels (one per redshift)")
    conv_channels: int = Field(32, ge=1, description=(
        "filters of the first convolution block; doubled in each later block"))
    n_conv_layers: int = Field(5, ge=1, description=(
        "convolution blocks (Conv3D + LeakyReLU + MaxPool), each halving the cube side"))
    kernel_size: int = Field(3, ge=1, description="side of the Conv3D kernels")
    fc1_size: int = Field(128, ge=1, description="units of the first dense layer")
    fc2_size: int = Field(64, ge=1, description="units of the second dense layer")
    dropout: float = Field(0.5, ge=0.0, lt=1.0, description=(
        "dropout rate after each dense layer (0: none)"))
    target_size: int = Field(4, ge=1, description="regressed cosmological parameters")
    negative_slope: float = Field(0.3, description=(
        "LeakyReLU slope for negative inputs (Keras' default alpha)"))
    channels_last: bool = Field(False, description=(
        "torch.channels_last_3d memory format (faster on GPUs)"))
    input_standardization: Literal["none", "channel"] = Field("none", description=(
        "input preprocessing after log(x + 1): none (the reference) or channel (standardise "
        "each channel with the mean and standard deviation of the first 64 training samples; "
        "an open-division departure for small synthetic cubes)"))

    @model_validator(mode="after")
    def _fits(self) -> "ModelConfig":
        if self.input_size % (2 ** self.n_conv_layers):
            raise ValueError(f"input_size {self.input_size} must be divisible by "
                             f"2**n_conv_layers = {2 ** self.n_conv_layers}")
        return self


class CosmoFlow(nn.Module):
    """CosmoFlow regression network.

    Input: float32 (N, C, S, S, S), log(1 + particle counts). Output: float32 (N, target_size)
    in (-1.2, 1.2), the normalised cosmological parameters.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.channels_last = cfg.channels_last
        layers: list[nn.Module] = []
        channels = cfg.in_channels
        for i in range(cfg.n_conv_layers):
            out = cfg.conv_channels * 2 ** i
            layers += [nn.Conv3d(channels, out, cfg.kernel_size, padding="same"),
                       nn.LeakyReLU(cfg.negative_slope), nn.MaxPool3d(2)]
            channels = out
        self.features = nn.Sequential(*layers)
        side = cfg.input_size // 2 ** cfg.n_conv_layers
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(channels * side ** 3, cfg.fc1_size), nn.LeakyReLU(cfg.negative_slope),
            nn.Dropout(cfg.dropout),
            nn.Linear(cfg.fc1_size, cfg.fc2_size), nn.LeakyReLU(cfg.negative_slope),
            nn.Dropout(cfg.dropout),
            nn.Linear(cfg.fc2_size, cfg.target_size), nn.Tanh(),
        )
        for module in self.modules():
            if isinstance(module, (nn.Conv3d, nn.Linear)):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last_3d)
        return self.head(self.features(x)) * 1.2


def build_model(cfg: ModelConfig) -> CosmoFlow:
    """A freshly initialised `CosmoFlow` for ``cfg`` (float32, CPU)."""
    model = CosmoFlow(cfg)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last_3d)
    return model
