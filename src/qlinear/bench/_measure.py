"""Timing, the bandwidth floor and peak extra memory."""

from __future__ import annotations

import functools
import statistics
import time
import tracemalloc
from collections.abc import Callable

import numpy as np

__all__ = ["best_time", "copy_bandwidth", "paired_ratio", "peak_extra_bytes"]


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


def paired_ratio(
    first: Callable[[], object],
    second: Callable[[], object],
    pairs: int,
    *,
    settle_s: float,
    calls: int = 3,
    prepare: Callable[[int], None] | None = None,
) -> dict[str, float]:
    """Two ways of doing one thing timed in pairs: their median times and the quartiles of first/second.

    On a shared machine a single timing moves by 20-40% from one minute to
    the next; two ways timed back to back (their order alternating from
    pair to pair), each the best of ``calls`` calls, see the same minute,
    and the median of the pairs' ratios holds to a few percent.
    ``prepare(side)`` (0 or 1), when given, runs before each side is timed.
    """
    sides = (first, second)
    times: tuple[list[float], list[float]] = ([], [])
    ratios = []
    for k in range(pairs):
        pair = [0.0, 0.0]
        for side in (0, 1) if k % 2 == 0 else (1, 0):
            if prepare is not None:
                prepare(side)
            pair[side] = best_time(sides[side], calls, settle_s=settle_s)
            times[side].append(pair[side])
        ratios.append(pair[0] / pair[1])
    q1, median, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
    return {
        "first_s": statistics.median(times[0]),
        "second_s": statistics.median(times[1]),
        "ratio": median,
        "ratio_q1": q1,
        "ratio_q3": q3,
    }


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
    The output pool is off meanwhile, so a call's own output counts (from
    the pool it would cost nothing new), and kernels compiling in the
    background (their allocations are traced too) are waited for first.
    """
    from qlinear.kernels.cpu import compiling
    from qlinear.kernels.cpu._pool import pool_limit, set_pool_limit

    while compiling():
        time.sleep(0.1)
    limit = pool_limit()
    set_pool_limit(0)
    try:
        return _traced_peak(fn)
    finally:
        set_pool_limit(limit)


def _traced_peak(fn: Callable[[], object]) -> int:
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
