"""The FLOPs mlhpc counts (`mlhpc.run.step.count_flops_on_meta`) against an analytic count per
layer, the way AIPerf counts them (Ren et al., arXiv:2008.07141): every workload whose model is
convolutions and matrix products (CosmoFlow, DeepCAM) at its reference size on the meta device,
and a single grouped convolution against its formula exactly. OC20 (graph message passing) and
OpenFold (attention, triangle updates) are not layer stacks this walk can count, so they are
left out.

The analytic count walks the model's convolution and linear modules with forward hooks on a
meta-device batch of 1 and takes each layer's MACs from its output (or, for a transposed conv, its
input) shape: forward FLOPs = 2 x MACs; training FLOPs = forward + 2 x MACs (weight gradient) +
2 x MACs (input gradient), the input gradient left out where the layer's input needs none (the
first layer's: nothing needs the gradient of the batch). What torch's counter counts that this walk
leaves out: matrix products and convolutions called outside these modules (functional
`F.conv*` / `F.linear`, `torch.bmm` / `matmul` of attention); neither workload here has any, so
the two agree to the last FLOP today (asserted within 5%, so that a model gaining a small layer the
walk does not see still passes). Neither counts a bias, batch norm, activation, pooling or the
loss.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from mlhpc import config as cfg
from mlhpc.run.step import count_flops, count_flops_on_meta
from mlhpc.workload import get

CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
TRANSPOSED = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)

#: (workload, config, input shape of one sample, target shape of one sample, target dtype)
REFERENCES = [
    ("cosmoflow", "cosmoflow.yaml", (1, 4, 128, 128, 128), (1, 4), torch.float32),
    ("deepcam", "deepcam.yaml", (1, 16, 768, 1152), (1, 768, 1152), torch.long),
]


def layer_macs(module: nn.Module, x: torch.Tensor, out: torch.Tensor) -> int:
    """Multiply-adds of one layer: a conv, N x prod(out spatial) x prod(kernel) x C_in/groups x
    C_out; a transposed conv, N x prod(in spatial) x prod(kernel) x C_in x C_out/groups (each input
    point is scattered through the kernel); a linear, N x in x out (N: every leading dimension)."""
    if isinstance(module, nn.Linear):
        return x.numel() * module.out_features
    kernel = math.prod(module.kernel_size)
    if isinstance(module, TRANSPOSED):
        return x.numel() * kernel * module.out_channels // module.groups
    return out.numel() * kernel * module.in_channels // module.groups


def analytic_flops(model: nn.Module, x: torch.Tensor) -> tuple[float, float, dict[str, int]]:
    """(forward FLOPs, training FLOPs, layers counted by kind) of ``model`` on the batch ``x`` of 1
    (meta device), from its conv, transposed-conv and linear modules' shapes."""
    forward = backward = 0
    kinds: dict[str, int] = {}

    def hook(module: nn.Module, inputs: tuple, out: torch.Tensor) -> None:
        nonlocal forward, backward
        macs = layer_macs(module, inputs[0], out)
        forward += 2 * macs
        backward += 2 * macs + (2 * macs if inputs[0].requires_grad else 0)
        kinds[type(module).__name__] = kinds.get(type(module).__name__, 0) + 1

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, CONVS + TRANSPOSED + (nn.Linear,))]
    try:
        model(x)
    finally:
        for handle in handles:
            handle.remove()
    return float(forward), float(forward + backward), kinds


@pytest.mark.parametrize("bench, config, x_shape, y_shape, y_dtype", REFERENCES)
def test_counted_flops_match_the_analytic_count_at_the_reference_size(
        repo, bench, config, x_shape, y_shape, y_dtype):
    conf, workload = cfg.load(repo / "configs" / config, ()), get(bench)
    with torch.device("meta"):
        model = workload.build_model(conf.model)
    x = torch.empty(x_shape, device="meta")
    forward, train, kinds = analytic_flops(model, x)
    counted = count_flops_on_meta(model, x, workload.build_loss(conf), torch.empty(y_shape, dtype=y_dtype))
    assert counted.forward_flops == pytest.approx(forward, rel=0.05)
    assert counted.train_flops == pytest.approx(train, rel=0.05)
    assert counted.train_flops == workload.reference_train_flops_per_sample[0]
    if bench == "deepcam":  # the walk reaches the layer types the model really has
        assert set(kinds) == {"Conv2d", "ConvTranspose2d"} and kinds["ConvTranspose2d"] == 4
    else:
        assert set(kinds) == {"Conv3d", "Linear"}


@pytest.mark.parametrize("layer, x_shape", [
    (nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), (2, 8, 10, 12)),  # depthwise
    (nn.Conv2d(8, 12, 3, stride=2, groups=4), (2, 8, 10, 12)),
    (nn.Conv3d(6, 6, 3, padding=1, groups=3, bias=False), (1, 6, 5, 6, 7)),
    (nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1, groups=4, bias=False), (2, 8, 5, 6)),
])
def test_a_grouped_convolution_is_counted_by_its_formula(layer, x_shape):
    """Forward = input gradient = weight gradient = 2 x MACs; the weight gradient is not the
    dense count, groups x 2 x MACs, that torch 2.13's formula gives."""
    x = torch.randn(x_shape)
    out = layer(x)
    flops = 2 * layer_macs(layer, x, out)
    loss = lambda output, target: output.sum()  # noqa: E731
    counted = count_flops(layer, x, loss, None)
    n = x_shape[0]
    assert counted.forward_flops * n == flops  # the batch needs no gradient: forward + weight grad
    assert counted.train_flops * n == 2 * flops
    assert counted.train_flops * n != flops * (1 + layer.groups)  # the old dense weight gradient
    x.requires_grad_(True)  # now the input gradient is counted too
    assert count_flops(layer, x, loss, None).train_flops * n == 3 * flops
