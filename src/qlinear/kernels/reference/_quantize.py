"""QuantizeLinear in plain numpy: the oracle."""

from __future__ import annotations

import numpy as np

from qlinear.dtypes import round_to
from qlinear.kernels.reference._broadcast import expand
from qlinear.kernels.reference._convert import to_float, to_integer
from qlinear.spec import QuantizePlan

__all__ = ["quantize"]


def quantize(plan: QuantizePlan, x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None) -> np.ndarray:
    """``y = saturate(round(x / scale) + zero_point)`` for a validated plan.

    Both operands are rounded once to ``plan.precision`` and divided there:
    numpy and ml_dtypes divide 16-bit floats in float32 and round once, which
    is the correctly rounded 16-bit quotient (float32 carries more than twice
    the 16-bit significand plus two bits).
    """
    g, shape = plan.granularity, plan.x_shape
    with np.errstate(all="ignore"):
        quotient = round_to(x, plan.precision) / round_to(expand(scale, g, shape), plan.precision)
        zp = None if zero_point is None else expand(zero_point, g, shape)
        if plan.output_type.is_integer:
            return to_integer(quotient, zp, plan.output_type)
        return to_float(quotient, zp, plan.output_type, plan.saturate)
