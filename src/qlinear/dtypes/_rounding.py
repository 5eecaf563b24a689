"""Conversions to 16-bit floats that round once."""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = ["round_to"]

_SIXTEEN_BIT = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def round_to(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``a`` converted to ``dtype``, rounded once to nearest even.

    numpy converts float32 to float16 with one rounding, but ml_dtypes
    converts int32 and float64 to bfloat16 through float32, which rounds
    twice: ``2**24 + 2**16 + 1`` becomes ``2**24`` instead of ``2**24 +
    2**17``. Wider values going to a 16-bit float are therefore first
    rounded to float32 *to odd* (an inexact result keeps its last bit set),
    which float32's 24 significand bits make safe: rounding that to 8 or 11
    bits gives the same value as rounding the original once.

    >>> round_to(np.array([16842753], np.int32), ml_dtypes.bfloat16).astype(np.float64).tolist()
    [16908288.0]
    """
    dtype = np.dtype(dtype)
    if dtype not in _SIXTEEN_BIT or a.dtype in (np.float32, *_SIXTEEN_BIT):
        return a.astype(dtype, copy=False)
    wide = a.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        nearest = wide.astype(np.float32)
        back = nearest.astype(np.float64)
        even = (nearest.view(np.uint32) & 1) == 0
        move = (back != wide) & even & ~np.isnan(wide)
        toward = np.where(back > wide, np.float32(-np.inf), np.float32(np.inf))
        to_odd = np.where(move, np.nextafter(nearest, toward), nearest)
        return to_odd.astype(dtype)
