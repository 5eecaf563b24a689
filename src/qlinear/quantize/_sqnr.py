"""Signal to quantization noise ratios: a figure in dB, and a weight's against its dequantized codes."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["ERROR_SLICE", "difference", "sqnr_db", "weight_error"]


def sqnr_db(signal_power: float, noise_power: float) -> float | None:
    """``10 log10(signal / noise)``; None where there is no noise (exact).

    A noise that is not finite (the quantized values hold NaN or infinity
    where the float ones do not: a Log, Sqrt or division that quantization
    pushed out of its domain) is minus infinity, the worst figure there is,
    so that every comparison of figures ranks it last.
    """
    if not math.isfinite(noise_power):
        return -math.inf
    if noise_power <= 0:
        return None
    if signal_power <= 0:
        return -math.inf
    return 10.0 * math.log10(signal_power / noise_power)


# Elements a weight's error is summed over at a time: float64 copies of a slice, not of the weight.
ERROR_SLICE = 1 << 22


def difference(back: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``back - w`` in float64, each read as float64 once (no float64 copy of ``w``: a wide layer's is 512 MB)."""
    error = back.astype(np.float64)
    np.subtract(error, w, out=error)
    return error


def weight_error(w: np.ndarray, back: np.ndarray, *, keep: bool) -> tuple[float | None, np.ndarray | None]:
    """The weight's SQNR (dequantized ``back`` against ``w``) and, if ``keep``, its error ``back - w`` in float64."""
    if keep:  # the error whole, and no float64 copy of the weight beside it
        error = difference(back, w)
        return sqnr_db(float(np.square(w, dtype=np.float64).sum()), float(np.square(error).sum())), error
    signal = noise = 0.0
    flat_w, flat_back = w.reshape(-1), back.reshape(-1)
    for start in range(0, flat_w.size, ERROR_SLICE):
        a = flat_w[start : start + ERROR_SLICE].astype(np.float64)
        e = flat_back[start : start + ERROR_SLICE].astype(np.float64) - a
        signal += float(a @ a)
        noise += float(e @ e)
    return sqnr_db(signal, noise), None
