"""ONNX DynamicQuantizeLinear (version 11)."""

from __future__ import annotations

from typing import Any

import numpy as np

from qlinear._errors import QuantizationError
from qlinear.dtypes import element_type
from qlinear.kernels import quantize as _quantize
from qlinear.spec import from_python, plan_quantize

__all__ = ["dynamic_quantize_linear"]

_QMIN, _QMAX = 0, 255


def dynamic_quantize_linear(x: Any, *, backend: str = "auto") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ONNX DynamicQuantizeLinear: uint8 quantization with computed parameters.

    ``scale = (max(0, max(x)) - min(0, min(x))) / 255``,
    ``zero_point = saturate(round(0 - min(0, min(x)) / scale))``, then
    ``y = saturate(round(x / scale) + zero_point)``; all in float32, rounding
    half to even. NaN elements are left out of the range and quantize to the
    zero point; an all-zero (or empty) ``x`` gets scale 1.0 (docs/semantics.md).

    Args:
        x: the float32 array.
        backend: ``"auto"`` (the default), ``"cpu"`` or ``"reference"``, as
            in :func:`qlinear.quantize_linear`; the scale and zero point are
            computed with numpy on every backend.

    Returns:
        ``(y, y_scale, y_zero_point)``: uint8 array, float32 scalar, uint8 scalar.

    Raises:
        QuantizationError: ``x`` is not a float32 array.

    >>> y, s, zp = dynamic_quantize_linear(np.array([0, 2, -3, -2.5, 1.34, 0.5], np.float32))
    >>> y.tolist(), float(s), int(zp)
    ([153, 255, 0, 26, 221, 179], 0.019607843831181526, 153)
    """
    caller = "dynamic_quantize_linear"
    x = from_python(x, "x", caller, element_type("float32"))  # a Python number or list: float32, its only type
    if x.dtype != np.float32:
        raise QuantizationError(
            f"{caller}: x has type {x.dtype}, expected float32 for DynamicQuantizeLinear version 11 (ai.onnx)"
        )
    finite_or_inf = x[~np.isnan(x)]
    high = np.float32(max(0.0, float(finite_or_inf.max()))) if finite_or_inf.size else np.float32(0)
    low = np.float32(min(0.0, float(finite_or_inf.min()))) if finite_or_inf.size else np.float32(0)
    with np.errstate(all="ignore"):
        scale = np.float32(1.0) if high == low else np.float32((high - low) / np.float32(_QMAX - _QMIN))
        initial = np.float32(_QMIN) - low / scale
    zero_point = np.uint8(np.rint(np.clip(np.nan_to_num(initial), _QMIN, _QMAX)))
    plan, x, scale_arr, zp_arr = plan_quantize(
        x,
        np.asarray(scale, np.float32),
        np.asarray(zero_point, np.uint8),
        axis=1,
        block_size=0,
        output_dtype=None,
        saturate=True,
        precision=None,
        opset=None,
        domain="",
    )
    y = _quantize(backend, plan, x, scale_arr, zp_arr, out=None, packed=False, caller=caller)
    return y, np.asarray(scale, np.float32), np.asarray(zero_point, np.uint8)
