"""Timing, the bandwidth floor and peak extra memory."""

from __future__ import annotations

import functools
import time
import tracemalloc
from collections.abc import Callable

import numpy as np

__all__ = ["best_time", "copy_bandwidth", "peak_extra_bytes"]


# ONNX Runtime's idle intra-op threads spin for about 70 ms after each run
# (measured on 2 cores), on the cores qlinear's threads then need: a qlinear
# call timed in that window took 3x as long, one call in two. numba's
# threads spin briefly too. Every timing starts after this pause, so each
# library is timed with the other's threads asleep, both left at their
# defaults (ONNX Runtime is 20-30% slower with its spinning turned off).
SETTLE_S = 0.15


def best_time(fn: Callable[[], object], repeats: int, settle_s: float = SETTLE_S) -> float:
    """Seconds of the fastest of ``repeats`` calls, after a pause of ``settle_s`` and one warm-up call."""
    time.sleep(settle_s)
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


@functools.cache
def _parallel_copy() -> Callable[[np.ndarray, np.ndarray], None]:
    """A numba copy on the kernels' threads, compiled once a process."""
    from numba import njit, prange

    @njit(parallel=True, cache=False)
    def copy(src, dst):
        for i in prange(src.size):
            dst[i] = src[i]

    return copy


def copy_bandwidth(nbytes: int, repeats: int) -> float:
    """Bytes per second (read plus written) of a parallel copy on numba's threads.

    The same threads the cpu kernels use, so the floor it gives is what
    those threads can move at best.
    """
    copy = _parallel_copy()
    src = np.ones(nbytes // 8, np.float64)
    dst = np.empty_like(src)
    seconds = best_time(lambda: copy(src, dst), repeats)
    return 2 * src.nbytes / seconds


def peak_extra_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes numpy allocated during ``fn()`` (its result included).

    numpy reports its allocations to tracemalloc; the cpu kernels' own small
    per-thread tiles (numba's allocator) are not seen, and are a few KiB.
    """
    fn()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        result = fn()
        peak = tracemalloc.get_traced_memory()[1] - base
        del result
    finally:
        tracemalloc.stop()
    return peak
