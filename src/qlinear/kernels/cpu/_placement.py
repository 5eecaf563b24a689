"""numba's worker threads kept off the CPU of the thread that calls a kernel.

A parallel kernel call wakes numba's TBB workers, which sleep between calls.
Linux places a woken thread by its own rules, and on a virtual machine it
often puts the worker on the caller's CPU, which then runs both threads by
turns while the other CPU idles, until the load balancer moves one (up to a
few milliseconds later). Measured on a 2-vCPU machine, 16M elements of
uint8 QuantizeLinear, calls 3-20 ms apart: in about a third of the calls
the worker ran on the caller's CPU (found by each task recording the CPU it
ran on), and those calls took the time of one thread. Keeping the workers
off the caller's CPU ended it: 2.3-2.6 -> 1.8-2.0 ms a call.

So before a parallel call, each worker's affinity is its own CPUs less the
caller's current one (a system call per worker, made only when the caller
has moved since the last call). Where that would leave a worker nothing
(the process allowed one CPU), it keeps its CPUs. The workers are found
once, by a small parallel kernel in which each of numba's threads records
its thread id. Only numba's workers change; the caller's thread, and every
other thread of the process, keep theirs. Costs: finding the workers,
about 3 ms once; a caller that moved, about 20 us; otherwise a
``sched_getcpu`` call. ``QLINEAR_PLACE_WORKERS=0`` in the environment (read
at import) leaves the workers where the scheduler puts them;
:func:`set_enabled` turns it off or on at run time.

Linux only (``sched_setaffinity``); elsewhere nothing is done.
"""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

from qlinear._builtins import import_numba

__all__ = ["PLACE_ENV", "enabled", "keep_workers_off_caller", "placed_cpu", "prepare", "set_enabled", "workers"]

PLACE_ENV = "QLINEAR_PLACE_WORKERS"
# Tries at finding the workers, in case one woke too late to take a task.
_TRIES = 3

_lock = threading.Lock()
_state: dict = {"on": os.environ.get(PLACE_ENV, "1") != "0", "workers": {}, "tries": 0, "cpu": None}


def _forget_workers() -> None:
    # Around a fork numba's TBB layer ends its workers and starts new ones, in the parent as in the
    # child (which has only the thread that forked): the next parallel call finds them again.
    _state.update(workers={}, tries=0, cpu=None)


def _getcpu():
    try:
        getcpu = ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError):
        return None
    getcpu.restype, getcpu.argtypes = ctypes.c_int, []
    return getcpu


_GETCPU = _getcpu() if hasattr(os, "sched_setaffinity") else None
if _GETCPU is not None:
    os.register_at_fork(after_in_parent=_forget_workers, after_in_child=_forget_workers)


def enabled() -> bool:
    """Whether worker placement applies here: Linux with glibc, and not turned off."""
    return _GETCPU is not None and _state["on"]


def set_enabled(on: bool) -> bool:
    """Turn worker placement on or off (off gives the workers their own CPUs back at the next parallel call); returns the setting before."""
    before = _state["on"]
    _state["on"] = bool(on)
    return before


def _finder():
    numba = import_numba()
    from qlinear.kernels.cpu._worker_ids import thread_ids

    return thread_ids, (np.zeros(numba.config.NUMBA_NUM_THREADS, np.int64),)


def prepare() -> None:
    """Start compiling (or loading) the kernel that finds the workers, without waiting.

    Called while a fresh environment's first kernel compiles, so that it is
    cached with it and a later process finds its workers at its first call.
    """
    if enabled():
        from qlinear.kernels.cpu._warm import ready

        ready(*_finder(), wait_s=0.0)


def _discover() -> dict[int, frozenset[int]] | None:
    """numba's worker threads (thread id -> the CPUs each may run on now), found by running a task on each.

    None while the finding kernel is still being compiled or loaded: no call
    waits for it (placement is only an optimization), a later call finds them.
    """
    numba = import_numba()
    from qlinear.kernels.cpu._warm import ready

    thread_ids, (tids,) = _finder()
    if not ready(thread_ids, (tids,), wait_s=0.0):
        return None
    most = tids.size
    before = numba.get_num_threads()
    numba.set_num_threads(most)  # every worker numba's layer may hand a task to, not only this call's count
    try:
        thread_ids(tids)
    finally:
        numba.set_num_threads(before)
    caller = threading.get_native_id()
    found = {}
    for tid in {int(t) for t in tids if t > 0 and t != caller}:
        try:
            found[tid] = frozenset(os.sched_getaffinity(tid))
        except OSError:  # ended meanwhile
            continue
    return found


def workers() -> dict[int, frozenset[int]]:
    """The workers found so far: thread id -> the CPUs each had when found."""
    return dict(_state["workers"])


def placed_cpu() -> int | None:
    """The caller's CPU that the workers were last kept off, or None."""
    return _state["cpu"]


def _release() -> None:
    with _lock:
        for tid, cpus in _state["workers"].items():
            try:
                os.sched_setaffinity(tid, cpus)
            except OSError:  # ended: found again when placement is back on
                continue
        _state["cpu"] = None


def keep_workers_off_caller() -> None:
    """Keep numba's workers off the calling thread's CPU, before a parallel call. Cheap when nothing changed.

    Turned off (:func:`set_enabled`) after workers were placed, gives them their own CPUs back.
    """
    state = _state
    if not (state["on"] and _GETCPU is not None):
        if state["cpu"] is not None:
            _release()
        return
    cpu = _GETCPU()
    if cpu == state["cpu"]:
        return
    with _lock:
        numba = import_numba()
        pending = False
        if len(state["workers"]) < numba.config.NUMBA_NUM_THREADS - 1 and state["tries"] < _TRIES:
            try:
                found, failed = _discover(), False
            except Exception:  # placement is an optimization: a finder that fails leaves the workers alone
                found, failed = {}, True
            # None: the finder is still compiling. Empty: no worker woke for a task while the caller ran them all (a
            # busy machine); both look again at the next call, the latter at most _TRIES times.
            pending = found is None or (not found and not failed)
            if found is not None:
                state["tries"] = _TRIES if failed else state["tries"] + 1
                state["workers"] = {**found, **state["workers"]}
        for tid, cpus in list(state["workers"].items()):
            wanted = cpus - {cpu} or cpus
            try:
                os.sched_setaffinity(tid, wanted)
            except OSError:  # the thread ended (or is not ours to move): forget it, look again later
                del state["workers"][tid]
                state["tries"] = min(state["tries"], _TRIES - 1)
                pending = True
        state["cpu"] = None if pending else cpu  # None: look again at the next call
