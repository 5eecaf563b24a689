"""A parallel kernel that reports the operating system's id of every numba thread (:mod:`._placement` uses it)."""

from __future__ import annotations

from numba import get_thread_id, njit, prange, types

__all__ = ["TASKS_PER_THREAD", "thread_ids"]

# Each thread takes a task and sleeps in it, so that the others wake and take theirs.
TASKS_PER_THREAD = 4
_TASK_SLEEP_US = 500

# glibc's, found by name when the kernel is linked (so the compiled kernel can be cached on disk).
_gettid = types.ExternalFunction("gettid", types.int32())
_usleep = types.ExternalFunction("usleep", types.int32(types.uint32))


@njit(parallel=True, nogil=True, cache=True)
def thread_ids(tids):
    """``tids[k]`` = the thread id of numba's thread ``k`` of this call, for each thread that took a task."""
    for _ in prange(tids.size * TASKS_PER_THREAD):
        tids[get_thread_id()] = _gettid()
        _usleep(_TASK_SLEEP_US)
