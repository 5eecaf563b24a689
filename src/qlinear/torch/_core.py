"""The forward computations of QuantizeLinear and DequantizeLinear on tensors.

Validated plans in, tensors out, no autograd: :mod:`qlinear.torch._autograd`
wraps these with gradients and :mod:`qlinear.torch._functional` picks one or
the other. Each step mirrors :mod:`qlinear.kernels.reference` so the results
are bit-identical to it.
"""

from __future__ import annotations

import torch

from qlinear.dtypes import element_type
from qlinear.spec import DequantizePlan, QuantizePlan
from qlinear.torch._layout import expand
from qlinear.torch._round_saturate import to_float, to_integer
from qlinear.torch._types import torch_dtype

__all__ = ["dequantize", "pre_saturation", "quantize", "quotient", "round_quotient"]


def quotient(plan: QuantizePlan, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x / scale`` in ``plan.precision``, both operands converted first.

    16-bit precisions divide in float32 and round once, as numpy and ml_dtypes
    do: float32 carries more than twice the 16-bit significand plus two bits,
    so this is the correctly rounded 16-bit quotient on every device.
    """
    prec = torch_dtype(element_type(plan.precision))
    s = expand(scale, plan.granularity, plan.x_shape)
    return (x.to(prec).to(torch.float32) / s.to(prec).to(torch.float32)).to(prec)


def quantize(plan: QuantizePlan, x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None) -> torch.Tensor:
    """``saturate(round(x / scale) + zero_point)`` as float32 values of the output type.

    ``zero_point`` holds values of the output type (see ``cast_zero_point``).
    """
    return round_quotient(plan, quotient(plan, x, scale), zero_point)


def round_quotient(plan: QuantizePlan, q: torch.Tensor, zero_point: torch.Tensor | None) -> torch.Tensor:
    """The quantized values from quotient ``q`` (the second half of :func:`quantize`)."""
    z = None if zero_point is None else expand(zero_point, plan.granularity, plan.x_shape)
    t = plan.output_type
    return to_integer(q, z, t) if t.is_integer else to_float(q, z, t, plan.saturate)


def pre_saturation(plan: QuantizePlan, q: torch.Tensor, zero_point: torch.Tensor | None) -> torch.Tensor:
    """The value saturation acts on, from quotient ``q``, as float32.

    ``round(q) + zero_point`` for integer types (rounding comes first), and
    ``q + zero_point`` for float types (clipping comes before rounding).
    """
    z = 0.0 if zero_point is None else expand(zero_point, plan.granularity, plan.x_shape).to(torch.float32)
    if plan.output_type.is_integer:
        return torch.round(q.to(torch.float32)) + z
    return (q.to(torch.float32) + z).to(q.dtype).to(torch.float32)


def dequantize(plan: DequantizePlan, x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None) -> torch.Tensor:
    """``(x - zero_point) * scale``: the difference exact, the product in float32.

    ``x`` holds values of ``plan.input_type``: an integer tensor (int64
    difference, as the reference) or a float tensor (a float32 difference,
    exact for every integer type up to 16 bits and the reference's rule for
    float types).
    """
    g, shape = plan.granularity, plan.x_shape
    if not x.is_floating_point():
        diff = x.to(torch.int64)
        if zero_point is not None:
            diff = diff - expand(zero_point, g, shape).to(torch.int64)
        diff = diff.to(torch.float32)
    else:
        diff = x.to(torch.float32)
        if zero_point is not None:
            diff = diff - expand(zero_point, g, shape).to(torch.float32)
    return (diff * expand(scale, g, shape).to(torch.float32)).to(torch_dtype(element_type(plan.output_dtype)))
