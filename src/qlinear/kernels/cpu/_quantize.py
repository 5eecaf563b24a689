"""QuantizeLinear on the fused CPU kernel: arrays and parameters in, codes out."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from qlinear.dtypes import packed_size
from qlinear.kernels.cpu._params import PREC_BF16, PREC_F16, PREC_F32, float_encoding, layout, precision_code
from qlinear.spec import QuantizePlan

__all__ = ["quantize"]

# float16/bfloat16 x reaches the kernel as its bits; the kernel decodes them.
_WIDE_INPUTS = {np.dtype(np.float16): PREC_F16, np.dtype(ml_dtypes.bfloat16): PREC_BF16}


def quantize(plan: QuantizePlan, x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None, *,
             out: np.ndarray | None = None, packed: bool = False) -> np.ndarray:
    """``y = saturate(round(x / scale) + zero_point)`` for a validated plan, fused.

    Bit-exact with the reference kernel. ``packed`` writes 2/4/6-bit outputs
    in ONNX's byte layout; ``out`` (already checked by the caller to have the
    result's dtype and shape, C-contiguous) receives the result.
    """
    from qlinear.kernels.cpu import _quantize_kernel as kernel

    t = plan.output_type
    count = math.prod(plan.x_shape)
    if out is None:
        out = np.empty(packed_size(count, t.bits), np.uint8) if packed else np.empty(plan.x_shape, t.dtype)
    if count == 0:
        return out
    prec = precision_code(plan.precision)
    xwide = _WIDE_INPUTS.get(x.dtype, PREC_F32)
    flat_x = np.ascontiguousarray(x).reshape(-1)
    if xwide != PREC_F32:
        flat_x = flat_x.view(np.uint16)
    zp_type = plan.precision if not t.is_integer else np.float32
    scale_f = np.ascontiguousarray(scale.astype(plan.precision, copy=False).astype(np.float32, copy=False)).reshape(-1)
    zp_f = np.zeros(scale_f.size, np.float32) if zero_point is None else zero_point.astype(zp_type).astype(np.float32).reshape(-1)

    p = np.zeros(kernel.P_LEN, np.int64)
    p[kernel.P_FLOAT_OUT] = not t.is_integer
    p[kernel.P_XWIDE] = xwide
    p[kernel.P_PREC] = prec
    p[kernel.P_QMIN], p[kernel.P_QMAX] = (t.qmin, t.qmax) if t.is_integer else (0, 0)
    p[kernel.P_MASK] = (1 << t.bits) - 1
    p[kernel.P_HAS_ZP] = zero_point is not None
    p[kernel.P_NAN_TO_ZP] = not t.has_nan
    p[kernel.P_CLIP] = plan.saturate or not t.saturate_applies
    p[kernel.P_PACKED_BITS] = t.bits if packed else 0
    e_out, submul_out = float_encoding(t) if not t.is_integer else float_encoding(PREC_F32)
    e_prec, submul_prec = float_encoding(prec)
    f = np.zeros(kernel.F_LEN, np.float64)
    f[kernel.F_LIMIT] = t.max_finite or 0.0
    f[kernel.F_SUBMUL_OUT], f[kernel.F_SUBMUL_PREC] = submul_out, submul_prec

    codes = out.reshape(-1).view(np.uint16 if t.bits == 16 else np.uint8)
    lay = layout(plan.granularity, plan.x_shape, scale.shape)
    kernel.quantize_kernel(flat_x, scale_f, zp_f, codes, lay, p, f, e_out, e_prec)
    return out
