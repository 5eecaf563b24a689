"""QuantizeLinear, DequantizeLinear and their composition on torch tensors.

Quantized values live in float32 tensors (every value of every quantized type
is exactly a float32), so they can carry gradients; the forward results are
bit-identical to :func:`qlinear.quantize_linear` and
:func:`qlinear.dequantize_linear` for every type and granularity.
"""

from __future__ import annotations

from typing import Any

import torch

from qlinear._errors import QuantizationError
from qlinear.dtypes import ElementType
from qlinear.spec import QuantizePlan
from qlinear.torch import _fast
from qlinear.torch._autograd import FakeQuantizeFunction, QuantizeFunction, StraightThrough
from qlinear.torch._core import dequantize, quantize
from qlinear.torch._round_saturate import cast_zero_point
from qlinear.torch._spec_check import plan_dq, plan_q
from qlinear.torch._types import numpy_dtype, quantized_type_of, resolve_type

__all__ = ["quantize_linear", "dequantize_linear", "fake_quantize", "quantized_type", "plan_quantize_tensors"]


def _tensor(value: Any, arg: str, caller: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise QuantizationError(f"{caller}: {arg} must be a torch.Tensor, got {type(value).__name__}")
    return value


def quantized_type(
    zero_point: torch.Tensor | None,
    output_dtype: Any,
    *,
    caller: str,
    zp_arg: str = "y_zero_point",
    default: str | None = "uint8",
) -> ElementType:
    """The quantized type a call names: ``output_dtype``, else the zero point's dtype.

    A zero point held in a float tensor (a learnable one) names no type, so
    ``output_dtype`` must then be given.

    Raises:
        QuantizationError: no type is named, or the two disagree.
    """
    zp_type = None if zero_point is None else quantized_type_of(zero_point.dtype)
    if output_dtype is not None:
        t = resolve_type(output_dtype, what=f"{caller}: output_dtype")
        if zp_type is not None and zp_type != t:
            raise QuantizationError(f"{caller}: {zp_arg} has dtype {zero_point.dtype}, expected {t} to match output_dtype")
        return t
    if zp_type is not None:
        return zp_type
    if zero_point is None and default is not None:
        return resolve_type(default, what=caller)
    what = f"{zp_arg} has dtype {zero_point.dtype}, which names no quantized type" if zero_point is not None else "no zero point"
    raise QuantizationError(f"{caller}: output_dtype must name the quantized type: {what}")


def plan_quantize_tensors(
    x: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None,
    *,
    axis: int,
    block_size: int,
    output_dtype: Any,
    saturate: bool,
    precision: Any,
    opset: int | None = None,
    caller: str = "quantize_linear",
) -> QuantizePlan:
    """Validate a QuantizeLinear call on tensors through :mod:`qlinear.spec`."""
    x = _tensor(x, "x", caller)
    scale = _tensor(scale, "y_scale", caller)
    t = quantized_type(zero_point, output_dtype, caller=caller)
    if isinstance(precision, torch.dtype):
        precision = numpy_dtype(precision, what=f"{caller}: precision")
    zp_shape = None if zero_point is None else tuple(_tensor(zero_point, "y_zero_point", caller).shape)
    return plan_q(
        x,
        scale,
        zp_shape,
        t,
        axis=axis,
        block_size=block_size,
        saturate=saturate,
        precision=precision,
        opset=opset,
        caller=caller,
    )


def _needs_graph(*tensors: torch.Tensor | None) -> bool:
    """Autograd records this call: nothing is saved for backward otherwise."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def quantize_linear(
    x: torch.Tensor,
    y_scale: torch.Tensor,
    y_zero_point: torch.Tensor | None = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: Any = None,
    saturate: bool = True,
    precision: Any = None,
    grad_scale: float = 1.0,
) -> torch.Tensor:
    """ONNX QuantizeLinear on tensors: ``y = saturate(round(x / y_scale) + y_zero_point)``.

    The arguments are those of :func:`qlinear.quantize_linear`; types may also
    be torch dtypes. The zero point's values are cast to the output type
    (round half to even, saturating) first, so a float tensor can hold a
    learnable zero point. Gradients are straight-through: ``inside / y_scale``
    for ``x`` (0 where saturated), times ``grad_scale``.

    Returns:
        A float32 tensor holding the quantized values exactly.

    Raises:
        QuantizationError: any input ONNX's newest QuantizeLinear rejects.

    >>> quantize_linear(torch.tensor([0.0, 1.5, 2.5, 300.0]), torch.tensor(1.0)).tolist()
    [0.0, 2.0, 2.0, 255.0]
    """
    plan = plan_quantize_tensors(
        x,
        y_scale,
        y_zero_point,
        axis=axis,
        block_size=block_size,
        output_dtype=output_dtype,
        saturate=saturate,
        precision=precision,
    )
    zp = None if y_zero_point is None else cast_zero_point(y_zero_point.detach(), plan.output_type)
    if _needs_graph(x, y_scale, y_zero_point):
        q, _ = QuantizeFunction.apply(x, y_scale, y_zero_point, zp, plan, float(grad_scale))
        return q
    if _fast.applies(plan, x, y_scale, zp):
        return _fast.quantize(plan, x, y_scale, zp, axis=axis, block_size=block_size)
    return quantize(plan, x, y_scale, zp)


def dequantize_linear(
    x: torch.Tensor,
    x_scale: torch.Tensor,
    x_zero_point: torch.Tensor | None = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    input_dtype: Any = None,
    output_dtype: Any = None,
) -> torch.Tensor:
    """ONNX DequantizeLinear on tensors: ``y = (x - x_zero_point) * x_scale``.

    ``x`` holds values of the quantized type ``input_dtype``; it defaults to
    the type of ``x``'s or the zero point's torch dtype (int8, float8e4m3fn,
    ...) and must be given when both are float. Differentiable in all three
    inputs (the zero point's rounding passes gradients straight through).

    Returns:
        The dequantized tensor, of ``output_dtype`` (default the scale's dtype).

    Raises:
        QuantizationError: any input ONNX's newest DequantizeLinear rejects.

    >>> dequantize_linear(torch.tensor([0, 3, 128, 255], dtype=torch.uint8), torch.tensor(2.0), torch.tensor(128, dtype=torch.uint8)).tolist()
    [-256.0, -250.0, 0.0, 254.0]
    """
    caller = "dequantize_linear"
    x = _tensor(x, "x", caller)
    x_scale = _tensor(x_scale, "x_scale", caller)
    if input_dtype is None and quantized_type_of(x.dtype) is None and x.dtype != torch.int32:
        t = quantized_type(x_zero_point, None, caller=caller, zp_arg="x_zero_point", default=None)
    elif input_dtype is None:
        t = resolve_type(x.dtype, what=f"{caller}: x")
    else:
        t = resolve_type(input_dtype, what=f"{caller}: input_dtype")
    if isinstance(output_dtype, torch.dtype):
        output_dtype = numpy_dtype(output_dtype, what=f"{caller}: output_dtype")
    zp_shape = None if x_zero_point is None else tuple(_tensor(x_zero_point, "x_zero_point", caller).shape)
    plan = plan_dq(
        tuple(x.shape),
        x_scale,
        zp_shape,
        t,
        axis=axis,
        block_size=block_size,
        output_dtype=output_dtype,
        opset=None,
        caller=caller,
    )
    zp = x_zero_point
    if zp is not None and t.name != "int32":
        values = cast_zero_point(zp.detach(), t)
        zp = StraightThrough.apply(zp, values) if _needs_graph(zp) else values
    return dequantize(plan, x, x_scale, zp)


def fake_quantize(
    x: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: Any = None,
    saturate: bool = True,
    precision: Any = None,
    grad_scale: float = 1.0,
) -> torch.Tensor:
    """DequantizeLinear(QuantizeLinear(x)) with LSQ gradients: ``s * (q - z)``.

    ``output_dtype`` is the quantized type (as in :func:`quantize_linear`);
    the result has ``x``'s dtype. Gradients: 1 for ``x`` inside the
    representable range and 0 where saturated, times ``grad_scale``; LSQ's
    for the scale and zero point (see :mod:`qlinear.torch._autograd`).

    Returns:
        ``dequantize_linear(quantize_linear(x, ...), ..., output_dtype=x.dtype)``,
        bit for bit.

    Raises:
        QuantizationError: any input ONNX's newest QuantizeLinear rejects, or
            a non-float ``x``.

    >>> fake_quantize(torch.tensor([0.3, -1.26, 9.0]), torch.tensor(0.5), output_dtype="int4").tolist()
    [0.5, -1.5, 3.5]
    """
    caller = "fake_quantize"
    if not _tensor(x, "x", caller).is_floating_point():
        raise QuantizationError(f"{caller}: x must be a float tensor (float32, float16, bfloat16), got {x.dtype}")
    plan = plan_quantize_tensors(
        x,
        scale,
        zero_point,
        axis=axis,
        block_size=block_size,
        output_dtype=output_dtype,
        saturate=saturate,
        precision=precision,
        caller=caller,
    )
    zp = None if zero_point is None else cast_zero_point(zero_point.detach(), plan.output_type)
    dq_plan = plan_dq(
        tuple(x.shape),
        scale,
        None if zp is None else tuple(zp.shape),
        plan.output_type,
        axis=axis,
        block_size=block_size,
        output_dtype=numpy_dtype(x.dtype, what=f"{caller}: x"),
        opset=None,
        caller=caller,
    )
    if _needs_graph(x, scale, zero_point):
        y, _, _ = FakeQuantizeFunction.apply(x, scale, zero_point, zp, plan, float(grad_scale), dq_plan)
        return y
    if _fast.applies(plan, x, scale, zp):
        return _fast.fake_quantize(plan, x, scale, zp, axis=axis, block_size=block_size)
    return dequantize(dq_plan, quantize(plan, x, scale, zp), scale, zp)
