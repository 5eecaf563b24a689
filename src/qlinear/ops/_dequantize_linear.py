"""ONNX DequantizeLinear, every version and domain."""

from __future__ import annotations

from typing import Any

import numpy as np

from qlinear.kernels import dequantize as _dequantize
from qlinear.ops._buffers import apart_from_out, check_out, packed_input
from qlinear.spec import plan_dequantize

__all__ = ["dequantize_linear"]


def dequantize_linear(
    x: Any,
    x_scale: Any,
    x_zero_point: Any = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: Any = None,
    opset: int | None = None,
    domain: str = "",
    packed_dtype: Any = None,
    shape: Any = None,
    out: np.ndarray | None = None,
    backend: str = "auto",
) -> np.ndarray:
    """ONNX DequantizeLinear, all versions: ``y = (x - x_zero_point) * x_scale``.

    Args:
        x: the quantized array (any integer or float type the version allows,
            int32 included).
        x_scale: scalar, 1-D along ``axis``, or blocked, as in QuantizeLinear.
        x_zero_point: same shape as ``x_scale`` and same type as ``x``.
        axis: quantization axis for per-axis and blocked.
        block_size: elements per block along ``axis``; 0 means not blocked.
        output_dtype: float, float16 or bfloat16; default the scale's type.
        opset: apply the version in force at this opset; None is the newest.
        domain: ``""`` for ai.onnx or ``"com.microsoft"``.
        packed_dtype: when given (a 2/4/6-bit type), ``x`` is ONNX's packed
            bytes of that type (uint8, as :func:`qlinear.pack` makes them)
            holding an array of ``shape``; they are read without unpacking.
        shape: the shape of the packed array; required with ``packed_dtype``.
        out: array to write the result into and return: the result's dtype
            and shape, writeable, C-contiguous. It may share memory with
            ``x`` or the parameters: those are then copied first, and the
            result is the same.
        backend: ``"auto"`` (the default: ``"reference"`` when ``x`` has
            fewer than ``qlinear.kernels.AUTO_REFERENCE_BELOW`` elements, so
            that small calls need not start numba, else ``"cpu"``),
            ``"cpu"`` (fused multi-threaded numba kernels) or
            ``"reference"`` (the readable numpy oracle); all give the same
            bits.

    Returns:
        The dequantized array.

    Raises:
        QuantizationError: any input the chosen version does not allow,
            packed bytes that do not fit ``packed_dtype`` and ``shape``, or an
            unfit ``out``.

    >>> dequantize_linear(np.array([0, 3, 128, 255], np.uint8), np.float32(2), np.uint8(128)).tolist()
    [-256.0, -250.0, 0.0, 254.0]
    >>> dequantize_linear(np.array([241, 3], np.uint8), np.float32(0.5), packed_dtype="int4", shape=(3,)).tolist()
    [0.5, -0.5, 1.5]
    """
    caller = "dequantize_linear"
    packed = packed_dtype is not None
    if packed:
        data, x, _ = packed_input(x, packed_dtype, shape, caller)
    plan, x, x_scale, x_zero_point = plan_dequantize(
        x,
        x_scale,
        x_zero_point,
        axis=axis,
        block_size=block_size,
        output_dtype=output_dtype,
        opset=opset,
        domain=domain,
    )
    out = check_out(out, plan.output_dtype, plan.x_shape, caller)
    codes, x_scale, x_zero_point = apart_from_out(out, data if packed else x, x_scale, x_zero_point)
    return _dequantize(backend, plan, codes, x_scale, x_zero_point, out=out, packed=packed, caller=caller)
