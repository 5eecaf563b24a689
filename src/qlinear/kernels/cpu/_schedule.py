"""How the fused kernels' parallel tasks reach numba's threads, and which threads those are.

numba schedules a ``prange`` statically by default: each thread gets an
equal share of the tasks up front, and the call ends when the slowest
thread ends. On a machine that does other work, a thread that loses its
core holds its whole share until the scheduler gives the core back (a time
slice, about 4 ms), while the other thread idles. With a chunk size of one
iteration numba's threading layer (OpenMP here; TBB likewise) hands the
tasks out one at a time instead, so the threads that run take the work.
The setting is numba's per calling thread; it is set around each kernel
call and restored, so a user's own numba code keeps its own.

Dynamic tasks are not enough on their own: a call also ends by waiting
for every thread of the team to arrive, and with numba's OpenMP layer a
worker that had gone to sleep is woken onto a busy core, where it waits a
whole time slice before it can say it has nothing left to do. Measured here
(16M elements, int8 per tensor, 2 threads, one core kept busy by another
process, each call after a pause): OpenMP 8.0 ms, TBB 2.0-2.5 ms (one
thread: 1.9 ms); idle both 0.92-0.98 ms. TBB's workers steal work and the
caller does not wait for a worker that never started, so numba's TBB layer
is the one qlinear wants, and numba takes it first when it can load it.
pip installs TBB's library into the environment's ``lib`` folder, which the
dynamic loader does not search, so numba would silently fall back to
OpenMP: :func:`make_tbb_loadable` loads it from there first.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from collections.abc import Iterator
from pathlib import Path

from qlinear.kernels.cpu._placement import keep_workers_off_caller

__all__ = ["dynamic_tasks", "make_tbb_loadable"]

# TBB's runtime as the tbb package installs it (soname 12: TBB 2021 and later).
_TBB = "libtbb.so.12"


def make_tbb_loadable() -> bool:
    """Load TBB's runtime from the environment, if the tbb package put it there, so numba's TBB layer can start.

    Returns whether it is loaded. Does nothing where it is not installed
    (numba then uses OpenMP), and is harmless once numba has chosen a
    layer (it keeps it).
    """
    for folder in {Path(sys.prefix) / "lib", Path(sys.base_prefix) / "lib"}:
        path = folder / _TBB
        if path.exists():
            try:
                ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
            except OSError:
                return False
            return True
    return False


@contextlib.contextmanager
def dynamic_tasks(*, parallel: bool) -> Iterator[None]:
    """Run the ``prange`` loops inside with tasks handed out one at a time.

    ``parallel``: the call has more than one task and more than one thread,
    so it wakes numba's workers, which are first kept off the caller's CPU
    (:mod:`._placement`).
    """
    import numba

    if parallel:
        keep_workers_off_caller()
    before = numba.set_parallel_chunksize(1)
    try:
        yield
    finally:
        numba.set_parallel_chunksize(before)
