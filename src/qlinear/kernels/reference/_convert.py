"""Rounding and saturation of quotients into each quantized type."""

from __future__ import annotations

import numpy as np

from qlinear.dtypes import ElementType

__all__ = ["keep_first_nan", "to_integer", "to_float"]


def keep_first_nan(first: np.ndarray, result: np.ndarray) -> np.ndarray:
    """``result`` of an operation on ``first`` and another operand, but ``first`` where ``first`` is NaN.

    Where two NaNs meet, which one the processor returns depends on the
    operand order its compiler chose; the operators keep the one that comes
    first in the formula (docs/semantics.md), so both backends say so
    explicitly.
    """
    return np.where(np.isnan(first), first, result)


def to_integer(quotient: np.ndarray, zero_point: np.ndarray | None, t: ElementType) -> np.ndarray:
    """``clip(rint(quotient) + zero_point, qmin, qmax)`` as type ``t``.

    The sum is taken in float64: exact for every rounded quotient below 2**53
    and still ordered correctly beyond it, so values far outside int32 and
    infinities saturate instead of wrapping. NaN has no integer, so it
    quantizes to the zero point (docs/semantics.md).
    """
    rounded = np.rint(quotient.astype(np.float64))
    rounded = np.where(np.isnan(rounded), 0.0, rounded)
    if zero_point is not None:
        rounded = rounded + zero_point.astype(np.float64)
    return np.clip(rounded, t.qmin, t.qmax).astype(t.dtype)


def to_float(quotient: np.ndarray, zero_point: np.ndarray | None, t: ElementType, saturate: bool) -> np.ndarray:
    """``quotient + zero_point`` rounded to float type ``t`` (ONNX cast tables).

    Rounding is to nearest even. With ``saturate`` (or for types without
    infinities or NaN: float4, float6) values beyond the largest finite value,
    infinities included, become that value; without it they follow ONNX's
    table (NaN, or infinity for float8e5m2). The zero point is added as the
    formula says, in IEEE arithmetic (so ``-0 + 0`` is ``+0``, as ONNX's
    float4e2m1 backend case expects); a NaN quotient stays itself whatever
    the zero point. NaN becomes the zero point where the type has no NaN.
    """
    q = quotient
    if zero_point is not None:
        q = keep_first_nan(q, q + zero_point.astype(q.dtype))
    if not t.has_nan:
        q = np.where(np.isnan(q), zero_point.astype(q.dtype) if zero_point is not None else q.dtype.type(0), q)
    if saturate or not t.saturate_applies:
        limit = q.dtype.type(t.max_finite)
        q = np.clip(q, -limit, limit)
    return q.astype(t.dtype)
