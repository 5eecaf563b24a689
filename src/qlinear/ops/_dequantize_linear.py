"""ONNX DequantizeLinear, every version and domain."""

from __future__ import annotations

from typing import Any

import numpy as np

from qlinear.kernels import backend as _backend
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
    backend: str = "reference",
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
        backend: kernel set computing the result.

    Returns:
        The dequantized array.

    Raises:
        QuantizationError: any input the chosen version does not allow.

    >>> dequantize_linear(np.array([0, 3, 128, 255], np.uint8), np.float32(2), np.uint8(128)).tolist()
    [-256.0, -250.0, 0.0, 254.0]
    """
    plan, x, x_scale, x_zero_point = plan_dequantize(
        x, x_scale, x_zero_point, axis=axis, block_size=block_size, output_dtype=output_dtype,
        opset=opset, domain=domain,
    )
    return _backend(backend, caller="dequantize_linear").dequantize(plan, x, x_scale, x_zero_point)
