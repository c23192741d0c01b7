"""DeepLabv3+ with a modified aligned Xception encoder: the DeepCAM segmentation network.

Follows the MLPerf HPC reference (mlcommons/hpc, deepcam/src/deepCam/architecture/
deeplab_xception.py), itself after Chen et al. 2018, "Encoder-Decoder with Atrous Separable
Convolution for Semantic Image Segmentation" (arXiv:1802.02611), and Kurth et al. 2018, "Exascale
Deep Learning for Climate Analytics" (arXiv:1810.01993):

- encoder: modified aligned Xception, output stride 16 (entry flow with 3 strided blocks, 16 middle
  blocks, exit flow with dilated separable convolutions up to 2048 channels);
- bottleneck: ASPP with rates 1, 6, 12, 18 and an image-pooling branch (1x1 conv + per-channel
  affine, no batch norm, as the reference);
- decoder: the reference's deconvolution upsampler: two stride-2 transposed convs to stride 4,
  concatenation with the 48-channel projection of the stride-4 low-level features, two 3x3 convs
  and a 1x1 conv, then two more stride-2 transposed convs to full resolution.

At the default `ModelConfig` (the reference) the model has exactly 56,454,720 trainable parameters.
Widths and the number of middle blocks are config values so that a small model for one CPU is the
same architecture, only narrower and shallower.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from mlhpc.config import Section
from mlhpc.errors import ConfigError


class ModelConfig(Section):
    """The ``model`` section of a DeepCAM config. Defaults are the reference network.

    Attributes:
        in_channels: input variables (16 CAM5 fields in the reference).
        num_classes: output classes (background, tropical cyclone, atmospheric river).
        output_stride: encoder output stride; only 16, the reference setting, is implemented.
        entry_channels: widths of conv1, conv2, block1, block2, block3 of the entry flow; the last
            is also the width of every middle-flow block (728 in the reference).
        middle_blocks: number of middle-flow blocks (16 in the reference).
        exit_channels: widths of block20, conv3, conv4, conv5 of the exit flow.
        aspp_channels: width of every ASPP branch and of the ASPP projection.
        low_level_channels: width of the 1x1 projection of the stride-4 features (48).
        decoder_channels: width of the decoder convolutions (256).
        batchnorm_group_size: ranks sharing batch-norm statistics (1: plain BatchNorm2d; > 1 needs
            the harness to provide process groups and is logged as ``batchnorm_group_size``).
    """

    in_channels: int = Field(16, ge=1)
    num_classes: int = Field(3, ge=2)
    output_stride: Literal[16] = 16
    entry_channels: tuple[int, int, int, int, int] = (32, 64, 128, 256, 728)
    middle_blocks: int = Field(16, ge=0)
    exit_channels: tuple[int, int, int, int] = (1024, 1536, 1536, 2048)
    aspp_channels: int = Field(256, ge=1)
    low_level_channels: int = Field(48, ge=1)
    decoder_channels: int = Field(256, ge=1)
    batchnorm_group_size: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _positive_widths(self) -> "ModelConfig":
        if min(self.entry_channels + self.exit_channels) < 1:
            raise ValueError("entry_channels and exit_channels must all be >= 1")
        return self


class SeparableConv2d(nn.Module):
    """Depthwise k x k conv (dilated, 'same' padding) followed by a pointwise 1x1 conv, no bias."""

    def __init__(self, cin: int, cout: int, stride: int = 1, dilation: int = 1) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(cin, cin, 3, stride, padding=dilation, dilation=dilation,
                                   groups=cin, bias=False)
        self.pointwise = nn.Conv2d(cin, cout, 1, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.pointwise(self.depthwise(x))


class XceptionBlock(nn.Module):
    """One residual block of the aligned Xception (the reference's ``Block``).

    ``reps`` separable convs each followed by batch norm, ReLU between them; the width grows at
    the first conv (``grow_first``) or the last. A strided block ends with a stride-2 separable
    conv; a stride-1 ``is_last`` block with an extra stride-1 separable conv (neither has batch
    norm). The shortcut is a 1x1 conv + batch norm when the shape changes, else the identity.
    """

    #: The block's switches besides its shape, as the reference's ``Block`` names them.
    FLAGS = {"end_with_relu": True, "grow_first": True, "is_last": False}

    def __init__(self, cin: int, cout: int, reps: int, stride: int = 1, dilation: int = 1,
                 **flags: bool) -> None:
        """``flags``: any of `FLAGS` by name. Raises TypeError for another name."""
        super().__init__()
        unknown = sorted(set(flags) - set(self.FLAGS))
        if unknown:
            raise TypeError(f"XceptionBlock: unknown switch {unknown[0]!r}")
        end_with_relu, grow_first, is_last = ({**self.FLAGS, **flags}[k] for k in self.FLAGS)
        self.end_with_relu = end_with_relu
        if cout != cin or stride != 1:
            self.skip: nn.Module = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                                 nn.BatchNorm2d(cout))
        else:
            self.skip = nn.Identity()
        widths = ([cin] + [cout] * reps) if grow_first else ([cin] * reps + [cout])
        layers: list[nn.Module] = []
        for i in range(reps):
            if i:
                layers.append(nn.ReLU())
            layers += [SeparableConv2d(widths[i], widths[i + 1], dilation=dilation),
                       nn.BatchNorm2d(widths[i + 1])]
        if stride != 1:
            layers.append(SeparableConv2d(cout, cout, stride=stride))
        elif is_last:
            layers.append(SeparableConv2d(cout, cout))
        self.rep = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        out = self.rep(x) + self.skip(x)
        return torch.relu(out) if self.end_with_relu else out


def _conv_bn_relu(conv: nn.Module, width: int) -> list[nn.Module]:
    return [conv, nn.BatchNorm2d(width), nn.ReLU()]


class Xception(nn.Module):
    """Modified aligned Xception encoder at output stride 16.

    ``forward(x)``: x float32 (N, C_in, H, W), H and W multiples of 16 ->
    (features (N, exit_channels[-1], H/16, W/16), low-level features (N, entry_channels[2], H/4, W/4)).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        c1, c2, b1, b2, b3 = cfg.entry_channels
        e20, e3, e4, e5 = cfg.exit_channels
        self.stem = nn.Sequential(
            *_conv_bn_relu(nn.Conv2d(cfg.in_channels, c1, 3, stride=2, padding=1, bias=False), c1),
            *_conv_bn_relu(nn.Conv2d(c1, c2, 3, padding=1, bias=False), c2))
        self.block1 = XceptionBlock(c2, b1, reps=2, stride=2, end_with_relu=False)
        self.block2 = XceptionBlock(b1, b2, reps=2, stride=2)
        self.block3 = XceptionBlock(b2, b3, reps=2, stride=2, is_last=True)
        self.middle = nn.Sequential(*[XceptionBlock(b3, b3, reps=3) for _ in range(cfg.middle_blocks)])
        self.block20 = XceptionBlock(b3, e20, reps=2, dilation=1, end_with_relu=False,
                                     grow_first=False, is_last=True)
        self.exit = nn.Sequential(*_conv_bn_relu(SeparableConv2d(e20, e3, dilation=2), e3),
                                  *_conv_bn_relu(SeparableConv2d(e3, e4, dilation=2), e4),
                                  *_conv_bn_relu(SeparableConv2d(e4, e5, dilation=2), e5))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        low = torch.relu(self.block1(self.stem(x)))  # the reference's in-place ReLU reaches it too
        x = self.block3(self.block2(low))
        x = self.block20(self.middle(x))
        return self.exit(x), low


class ASPP(nn.Module):
    """Atrous spatial pyramid pooling, rates 1 (as a 1x1 conv), 6, 12, 18, plus image pooling.

    The pooling branch is 1x1 conv + trainable per-channel affine + ReLU (no batch norm), broadcast
    back to the feature-map size, as the reference's ``GlobalAveragePool`` and ``torch.tile``.
    """

    RATES = (1, 6, 12, 18)

    def __init__(self, cin: int, width: int) -> None:
        super().__init__()
        branches = []
        for rate in self.RATES:
            conv = (nn.Conv2d(cin, width, 1, bias=False) if rate == 1 else
                    nn.Conv2d(cin, width, 3, padding=rate, dilation=rate, bias=False))
            branches.append(nn.Sequential(*_conv_bn_relu(conv, width)))
        self.branches = nn.ModuleList(branches)
        self.pool_conv = nn.Conv2d(cin, width, 1, bias=False)
        self.pool_scale = nn.Parameter(torch.ones(width, 1, 1))
        self.pool_shift = nn.Parameter(torch.zeros(width, 1, 1))
        self.project = nn.Sequential(*_conv_bn_relu(nn.Conv2d(5 * width, width, 1, bias=False), width))

    def forward(self, x: Tensor) -> Tensor:
        pooled = self.pool_conv(x.mean(dim=(2, 3), keepdim=True))
        pooled = torch.relu(self.pool_scale * pooled + self.pool_shift).expand(-1, -1, *x.shape[2:])
        return self.project(torch.cat([b(x) for b in self.branches] + [pooled], dim=1))


def _deconv(cin: int, cout: int) -> nn.ConvTranspose2d:
    """Stride-2 3x3 transposed conv doubling H and W exactly, no bias."""
    return nn.ConvTranspose2d(cin, cout, 3, stride=2, padding=1, output_padding=1, bias=False)


class DeepLabV3Plus(nn.Module):
    """The DeepCAM network (reference: ``DeepLabv3_plus(n_input=16, n_classes=3, os=16)``).

    ``forward(x)``: x float32 (N, in_channels, H, W), H and W multiples of 16 -> logits float32
    (N, num_classes, H, W) at full resolution.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d, low = cfg.decoder_channels, cfg.low_level_channels
        self.encoder = Xception(cfg)
        self.aspp = ASPP(cfg.exit_channels[-1], cfg.aspp_channels)
        self.low_level = nn.Sequential(
            *_conv_bn_relu(nn.Conv2d(cfg.entry_channels[2], low, 1, bias=False), low))
        self.up_to_4 = nn.Sequential(*_conv_bn_relu(_deconv(cfg.aspp_channels, d), d),
                                     *_conv_bn_relu(_deconv(d, d), d))
        self.fuse = nn.Sequential(*_conv_bn_relu(nn.Conv2d(d + low, d, 3, padding=1, bias=False), d),
                                  *_conv_bn_relu(nn.Conv2d(d, d, 3, padding=1, bias=False), d),
                                  nn.Conv2d(d, d, 1))
        self.up_to_1 = nn.Sequential(*_conv_bn_relu(_deconv(d, d), d), _deconv(d, cfg.num_classes))
        self._init_weights()

    def _init_weights(self) -> None:
        # as the reference: Kaiming-normal weights for the encoder's and the ASPP branches'
        # convolutions, batch norm scale 1 and shift 0; PyTorch's default initialisation for the
        # image-pooling conv, the projections and the decoder (the reference defines but never
        # calls an initialiser there)
        for part in (self.encoder, self.aspp.branches):
            for module in part.modules():
                if isinstance(module, nn.Conv2d):
                    nn.init.kaiming_normal_(module.weight)
                elif isinstance(module, nn.BatchNorm2d):
                    nn.init.ones_(module.weight)
                    nn.init.zeros_(module.bias)

    def forward(self, x: Tensor) -> Tensor:
        features, low = self.encoder(x)
        x = self.up_to_4(self.aspp(features))
        x = self.fuse(torch.cat([x, self.low_level(low)], dim=1))
        return self.up_to_1(x)


def build_model(cfg: ModelConfig) -> nn.Module:
    """A fresh DeepCAM network for ``cfg`` (float32, CPU).

    With ``batchnorm_group_size == 1`` every batch norm is a plain ``nn.BatchNorm2d`` (statistics
    of the local batch). With a larger group, as the reference's ``--batchnorm_group_size``, the
    ranks are split into consecutive groups of that size and every batch norm becomes an
    ``nn.SyncBatchNorm`` over this rank's group (SyncBatchNorm computes on CUDA devices only).

    Raises:
        ConfigError: ``batchnorm_group_size > 1`` without an initialised process group, or a world
            size it does not divide.
    """
    model: nn.Module = DeepLabV3Plus(cfg)
    if cfg.batchnorm_group_size > 1:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model, _batchnorm_group(cfg.batchnorm_group_size))
    return model


def _batchnorm_group(size: int) -> "torch.distributed.ProcessGroup":
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigError(f"model.batchnorm_group_size: {size} needs a distributed run "
                          "(one process has no group to share batch norm with); use 1")
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % size:
        raise ConfigError(f"model.batchnorm_group_size: {size} does not divide the world size {world}")
    mine = None
    for start in range(0, world, size):  # every rank creates every group, in the same order
        group = dist.new_group(list(range(start, start + size)))
        if start <= rank < start + size:
            mine = group
    return mine


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters (the reference prints the same count at start-up)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
