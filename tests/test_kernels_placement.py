"""numba's worker threads are kept off the CPU of the thread that calls a parallel kernel, and only they move."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import qlinear
from qlinear.kernels.cpu import _placement

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's")

N = 1 << 20  # elements: many tasks, so the call wakes numba's workers


@pytest.fixture(autouse=True)
def _two_threads_and_workers_restored():
    import numba

    from qlinear.kernels.cpu._warm import ready

    # Compiled (or loaded) here: a call does not wait for it, so the first call would not find the workers yet.
    assert ready(*_placement._finder(), wait_s=120.0)
    before = numba.get_num_threads()
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    yield
    numba.set_num_threads(before)
    for tid, cpus in _placement.workers().items():
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass
    _placement._state["cpu"] = None


def _parallel_call() -> None:
    x = np.random.default_rng(0).normal(size=N).astype(np.float32)
    got = qlinear.quantize_linear(x, np.float32(0.02), np.uint8(128), backend="cpu")
    want = qlinear.quantize_linear(x, np.float32(0.02), np.uint8(128), backend="reference")
    assert np.array_equal(got, want)


def _assert_kept_off(cpu: int) -> None:
    for tid, cpus in _placement.workers().items():
        assert os.sched_getaffinity(tid) == (cpus - {cpu} or cpus)


def test_workers_are_found_and_kept_off_the_callers_cpu():
    import numba

    _placement._state["cpu"] = None
    _parallel_call()
    found = _placement.workers()
    threads = {int(t) for t in os.listdir("/proc/self/task")}
    # numba's workers: threads of this process, not the caller, as many as numba may start.
    assert set(found) <= threads - {threading.get_native_id()}
    assert len(found) == numba.config.NUMBA_NUM_THREADS - 1
    cpu = _placement.placed_cpu()
    assert cpu in os.sched_getaffinity(0)
    _assert_kept_off(cpu)
    if len(os.sched_getaffinity(0)) > 1:
        assert all(cpu not in os.sched_getaffinity(tid) for tid in found)


def test_workers_follow_the_caller_to_another_cpu(monkeypatch):
    _parallel_call()
    allowed = sorted(os.sched_getaffinity(0))
    for cpu in (allowed[0], allowed[-1], allowed[0]):
        monkeypatch.setattr(_placement, "_GETCPU", lambda cpu=cpu: cpu)
        _placement.keep_workers_off_caller()
        assert _placement.placed_cpu() == cpu
        _assert_kept_off(cpu)


def test_other_threads_keep_their_cpus():
    _parallel_call()
    others = [int(t) for t in os.listdir("/proc/self/task") if int(t) not in _placement.workers()]
    before = {tid: os.sched_getaffinity(tid) for tid in others}
    _placement._state["cpu"] = None
    _parallel_call()
    assert {tid: os.sched_getaffinity(tid) for tid in others} == before


def test_turned_off_the_workers_get_their_own_cpus_back(monkeypatch):
    _placement._state["cpu"] = None
    _parallel_call()
    found = _placement.workers()
    assert _placement.placed_cpu() is not None
    monkeypatch.setenv(_placement.PLACE_ENV, "0")
    _parallel_call()
    assert _placement.placed_cpu() is None
    assert {tid: os.sched_getaffinity(tid) for tid in found} == found
    _parallel_call()  # and they stay there
    assert {tid: os.sched_getaffinity(tid) for tid in found} == found


def test_a_worker_that_ended_is_forgotten_without_an_error():
    _parallel_call()
    ended = threading.Thread(target=lambda: None)
    ended.start()
    ended.join()
    gone = ended.native_id
    _placement._state["workers"][gone] = frozenset(os.sched_getaffinity(0))
    _placement._state["cpu"] = None
    _parallel_call()
    assert gone not in _placement.workers() and _placement.workers()
