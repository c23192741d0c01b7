"""The FLOP formulas mlhpc counts with: torch's (`torch.utils.flop_counter`), with a grouped
convolution's backward counted by its own formula.

torch 2.13's ``conv_backward_flop`` counts the weight gradient of a convolution with ``groups`` > 1
as if it were dense, ``groups`` times too many: it computes the weight gradient as a convolution of
the transposed input (C_in, N, ...) with the transposed output gradient (C_out, N, ...), and
those shapes no longer carry the grouping (pytorch/pytorch#183405 proposes dividing by ``groups``
upstream). A network with depthwise convolutions (DeepCAM's Xception) is over-counted by about
2.2 x. Here every count (`flop_counter`, and `FLOP_FORMULAS` for an operator tally) uses
`conv_backward_flops` instead, which, for a convolution of any dimension, transposed or not, is

    forward         = 2 x N x prod(out spatial) x prod(kernel) x C_in / groups x C_out
    input gradient  = the forward count
    weight gradient = the forward count (not x groups)

(for a transposed convolution, prod(in spatial) in place of prod(out spatial)), each from
torch's ``conv_flop_count`` (a multiply-add is 2 FLOPs; a bias is not counted).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count, flop_registry, shape_wrapper


#: ``aten.convolution_backward``'s arguments after grad_output, input and weight, in order.
_CONV_BACKWARD_ARGS = ("bias_sizes", "stride", "padding", "dilation", "transposed",
                       "output_padding", "groups", "output_mask")


def conv_backward_flops(grad_out_shape: Any, x_shape: Any, w_shape: Any, *args: Any,
                        out_shape: Any = None, **kwargs: Any) -> int:
    """FLOPs of ``aten.convolution_backward``, its tensors as shapes (as torch's
    ``register_flop_formula`` passes them; ``out_shape``: the shapes of grad_input, grad_weight,
    grad_bias): the input gradient, where ``output_mask[0]``, as torch counts it (a transposed
    convolution of the output gradient with the weight: the forward count), plus the weight
    gradient, where ``output_mask[1]``, as the forward count of the same convolution
    (input, weight -> grad_output's shape), so that ``groups`` is respected. Returns an int."""
    named = {**dict(zip(_CONV_BACKWARD_ARGS, args)), **kwargs}
    transposed, output_mask = named["transposed"], named["output_mask"]
    flops = 0
    if output_mask[0]:
        flops += conv_flop_count(grad_out_shape, w_shape, out_shape[0], not transposed)
    if output_mask[1]:
        flops += conv_flop_count(x_shape, w_shape, grad_out_shape, transposed)
    return flops


#: ``FlopCounterMode(custom_mapping=...)``: the formulas that replace torch's, keyed by operator.
CUSTOM_FLOP_FORMULAS: dict[Any, Any] = {torch.ops.aten.convolution_backward: conv_backward_flops}

#: torch's formulas with `CUSTOM_FLOP_FORMULAS` in place, called as ``FlopCounterMode`` calls them
#: (``formula(*args, **kwargs, out_val=out)`` on tensors): for an operator tally of its own.
FLOP_FORMULAS: dict[Any, Any] = {**flop_registry,
                                 **{op: shape_wrapper(f) for op, f in CUSTOM_FLOP_FORMULAS.items()}}


def flop_counter() -> FlopCounterMode:
    """A ``FlopCounterMode`` (no table printed) with `CUSTOM_FLOP_FORMULAS`: the counter every
    mlhpc FLOP count uses."""
    return FlopCounterMode(display=False, custom_mapping=CUSTOM_FLOP_FORMULAS)
