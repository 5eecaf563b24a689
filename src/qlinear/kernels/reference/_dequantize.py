"""DequantizeLinear in plain numpy: the oracle."""

from __future__ import annotations

import numpy as np

from qlinear.kernels.reference._broadcast import expand
from qlinear.kernels.reference._convert import keep_first_nan
from qlinear.spec import DequantizePlan

__all__ = ["dequantize"]


def dequantize(plan: DequantizePlan, x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None) -> np.ndarray:
    """``y = (x - zero_point) * scale`` for a validated plan.

    Integer differences are exact (int64); float differences are taken in
    float32. The product is rounded once in float32, then to the output type.
    Where two NaNs meet, the first in the formula is kept: ``x``'s over the
    zero point's, the difference's over the scale's.
    """
    g, shape = plan.granularity, plan.x_shape
    with np.errstate(all="ignore"):
        if plan.input_type.is_integer:
            diff = x.astype(np.int64)
            if zero_point is not None:
                diff = diff - expand(zero_point, g, shape).astype(np.int64)
            diff = diff.astype(np.float32)
        else:
            diff = x.astype(np.float32)
            if zero_point is not None:
                diff = keep_first_nan(diff, diff - expand(zero_point, g, shape).astype(np.float32))
        y = keep_first_nan(diff, diff * expand(scale, g, shape).astype(np.float32))
        return y.astype(plan.output_dtype, copy=False)
