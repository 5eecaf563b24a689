"""One-pass reductions the quantizer runs on every batch of every observed tensor and judged output.

Calibration histograms every activation of every batch, and each figure
(the analysis' parts, the search's candidates, the evaluation) sums a
reference's and a candidate's squared values. In numpy each is a chain of
whole-array passes with float64 or int64 temporaries (the recognizer's
calibration spent 14 s in the histograms, its figures 7 s in the sums);
here each is one pass over the values, with no temporary.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["bin_counts", "squared_sums"]


@numba.njit(cache=True, nogil=True)
def bin_counts(flat: np.ndarray, scale: np.floating, first: int, size: int) -> np.ndarray:
    """How many of ``flat``'s values fall in each bin ``k`` of ``floor(value * scale) = first + k``, ``size`` bins.

    ``scale``: a power of two of the values' own type, so ``value * scale``
    is exact, as the floor that picks the bin.
    """
    counts = np.zeros(size, np.int64)
    last = size - 1
    for v in flat:
        # Never past either end: the values lie in the bins' range, but a store out of it would corrupt memory
        # unchecked (a thread whose floating-point flags flush subnormals can floor a value past its range).
        k = min(max(np.int64(np.floor(v * scale)) - first, 0), last)
        counts[k] += 1
    return counts


@numba.njit(cache=True, nogil=True)
def squared_sums(ref: np.ndarray, got: np.ndarray) -> tuple[float, float]:
    """``(sum of ref**2, sum of (ref - got)**2)`` over the elements where ``ref`` is finite, in float64.

    ``ref`` and ``got``: 1-D, of the same size, float32 or float64.
    """
    signal = 0.0
    noise = 0.0
    for i in range(ref.size):
        r = np.float64(ref[i])
        if np.isfinite(r):
            d = r - np.float64(got[i])
            signal += r * r
            noise += d * d
    return signal, noise
