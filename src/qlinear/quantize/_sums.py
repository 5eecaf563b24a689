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

__all__ = ["PARALLEL_VALUES", "bin_counts", "squared_sums"]


# Values past which a histogram is counted on every core, each a share of the values into its own counts: below it
# the threads' start-up costs more than they save (on 2 cores: 1.2x at 64K values, 1.9x at 4M).
PARALLEL_VALUES = 1 << 15


def bin_counts(flat: np.ndarray, scale: np.floating, first: int, size: int) -> np.ndarray:
    """How many of ``flat``'s values fall in each bin ``k`` of ``floor(value * scale) = first + k``, ``size`` bins.

    ``scale``: a power of two of the values' own type, so ``value * scale``
    is exact, as the floor that picks the bin. Counted on every core from
    :data:`PARALLEL_VALUES` values on (the same counts: sums of integers).
    """
    threads = numba.get_num_threads()
    if flat.size < PARALLEL_VALUES or threads == 1:
        return _bin_counts(flat, scale, first, size)
    return _bin_counts_parallel(flat, scale, first, size, threads)


@numba.njit(cache=True, nogil=True, parallel=True)
def _bin_counts_parallel(flat: np.ndarray, scale: np.floating, first: int, size: int, parts: int) -> np.ndarray:
    step = (flat.size + parts - 1) // parts
    shares = np.zeros((parts, size), np.int64)
    for p in numba.prange(parts):
        shares[p] = _bin_counts(flat[p * step : min(flat.size, (p + 1) * step)], scale, first, size)
    return shares.sum(axis=0)


@numba.njit(cache=True, nogil=True)
def _bin_counts(flat: np.ndarray, scale: np.floating, first: int, size: int) -> np.ndarray:
    # Four counts, a value in turn to each: consecutive values that land in one bin (a ReLU's zeros) would
    # otherwise each wait for the last one's store.
    counts = np.zeros((4, size), np.int64)
    whole = flat.size - flat.size % 4
    for i in range(0, whole, 4):
        counts[0, _bin_of(flat[i], scale, first, size)] += 1
        counts[1, _bin_of(flat[i + 1], scale, first, size)] += 1
        counts[2, _bin_of(flat[i + 2], scale, first, size)] += 1
        counts[3, _bin_of(flat[i + 3], scale, first, size)] += 1
    for i in range(whole, flat.size):
        counts[0, _bin_of(flat[i], scale, first, size)] += 1
    return counts.sum(axis=0)


@numba.njit(cache=True, nogil=True, inline="always")
def _bin_of(v: np.floating, scale: np.floating, first: int, size: int) -> int:
    # Never past either end: the values lie in the bins' range, but a store out of it would corrupt memory
    # unchecked (a thread whose floating-point flags flush subnormals can floor a value past its range).
    return min(max(np.int64(np.floor(v * scale)) - first, 0), size - 1)


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
