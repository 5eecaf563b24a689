"""DequantizeLinear on the fused CPU kernel: codes and parameters in, values out."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from qlinear.kernels.cpu._params import PREC_BF16, PREC_F16, decode_table, float_encoding, layout
from qlinear.spec import DequantizePlan

__all__ = ["dequantize"]

_WIDE_OUTPUTS = {np.dtype(np.float16): PREC_F16, np.dtype(ml_dtypes.bfloat16): PREC_BF16}
# Unsigned views of the integer inputs of 8 bits or more, and their sign bits.
_INTEGER_VIEWS = {"uint8": (np.uint8, 0), "int8": (np.uint8, 1 << 7), "uint16": (np.uint16, 0),
                  "int16": (np.uint16, 1 << 15), "int32": (np.uint32, 1 << 31)}


def dequantize(plan: DequantizePlan, x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None, *,
               out: np.ndarray | None = None, packed: bool = False) -> np.ndarray:
    """``y = (x - zero_point) * scale`` for a validated plan, fused.

    Bit-exact with the reference kernel. With ``packed``, ``x`` holds ONNX's
    packed bytes of ``plan.input_type`` for ``plan.x_shape``; ``out``
    (already checked by the caller) receives the result.
    """
    from qlinear.kernels.cpu import _dequantize_kernel as kernel

    t = plan.input_type
    count = math.prod(plan.x_shape)
    if out is None:
        out = np.empty(plan.x_shape, plan.output_dtype)
    if count == 0:
        return out
    p = np.zeros(kernel.P_LEN, np.int64)
    flat_x = np.ascontiguousarray(x).reshape(-1)
    if packed:
        p[kernel.P_READ], p[kernel.P_BITS] = kernel.READ_PACKED, t.bits
        table = decode_table(t, packed=True)
    elif t.name in _INTEGER_VIEWS:
        view, p[kernel.P_SIGN_BIT] = _INTEGER_VIEWS[t.name]
        p[kernel.P_READ], p[kernel.P_BITS] = kernel.READ_INTEGER, t.bits
        flat_x = flat_x.view(view)
        table = np.zeros(1, np.float32)
    else:
        p[kernel.P_READ] = kernel.READ_TABLE
        flat_x = flat_x.view(np.uint8)
        table = decode_table(t, packed=False)
    wide = _WIDE_OUTPUTS.get(np.dtype(plan.output_dtype))
    p[kernel.P_WIDE_OUT] = wide is not None
    e_out, submul = float_encoding(wide if wide is not None else PREC_F16)

    scale_f = np.ascontiguousarray(scale.astype(np.float32, copy=False)).reshape(-1)
    zp_f = np.zeros(scale_f.size, np.float64) if zero_point is None else zero_point.astype(np.float64).reshape(-1)
    values = out.reshape(-1)
    values = values.view(np.uint16) if wide is not None else values
    lay = layout(plan.granularity, plan.x_shape, scale.shape)
    kernel.dequantize_kernel(flat_x, table, scale_f, zp_f, values, lay, p, e_out, submul)
    return out
