"""numba's worker threads are kept off the CPU of the thread that calls a parallel kernel, and only they move."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import warnings

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


def test_turned_off_the_workers_get_their_own_cpus_back():
    _placement._state["cpu"] = None
    _parallel_call()
    found = _placement.workers()
    assert _placement.placed_cpu() is not None
    before = _placement.set_enabled(False)
    try:
        _parallel_call()
        assert _placement.placed_cpu() is None
        assert {tid: os.sched_getaffinity(tid) for tid in found} == found
        _parallel_call()  # and they stay there
        assert {tid: os.sched_getaffinity(tid) for tid in found} == found
    finally:
        _placement.set_enabled(before)


def test_the_environment_turns_it_off_at_import():
    code = (
        "from qlinear.kernels.cpu import _placement as p; "
        "import numpy as np, qlinear; qlinear.quantize_linear(np.ones(1 << 20, np.float32), np.float32(1), backend='cpu'); "
        "print(p.enabled(), p.placed_cpu(), p.workers())"
    )
    env = {**os.environ, _placement.PLACE_ENV: "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == ["False", "None", "{}"]


def test_after_a_fork_parent_and_child_look_for_their_workers_again():
    _parallel_call()
    assert _placement.workers()
    read, write = os.pipe()
    with warnings.catch_warnings():  # Python 3.12 warns that forking a process with threads may deadlock the child
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: only the forking thread survives a fork, so nothing is known of workers
        os.write(write, repr((_placement.workers(), _placement.placed_cpu())).encode())
        os._exit(0)
    os.close(write)
    got = os.read(read, 1000).decode()
    os.waitpid(pid, 0)
    assert got == "({}, None)"
    # numba's TBB layer ended the parent's workers before the fork and starts new ones: found at the next call, or on
    # a busy machine (where no new worker woke for a task) at one of the next few.
    assert _placement.workers() == {}
    for _ in range(_placement._TRIES):
        _parallel_call()
        if _placement.workers():
            break
    threads = {int(t) for t in os.listdir("/proc/self/task")}
    assert _placement.workers() and set(_placement.workers()) <= threads
    _assert_kept_off(_placement.placed_cpu())


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


def test_a_finder_that_fails_leaves_the_workers_alone_and_the_call_runs(monkeypatch):
    def broken():
        raise OSError("no gettid in this C library")

    monkeypatch.setattr(_placement, "_finder", broken)
    monkeypatch.setitem(_placement._state, "workers", {})
    monkeypatch.setitem(_placement._state, "tries", 0)
    _placement._state["cpu"] = None
    _parallel_call()  # bit-exact all the same
    assert _placement.workers() == {} and _placement._state["tries"] == _placement._TRIES
    _parallel_call()  # and it is not tried again
    assert _placement.workers() == {}


def test_a_finder_that_finds_no_worker_looks_again_at_the_next_calls_a_few_times(monkeypatch):
    # On a busy machine the caller may run every task before a worker wakes: nothing found is not the last word.
    looked = []

    def none_woke():
        looked.append(1)
        return {}

    monkeypatch.setattr(_placement, "_discover", none_woke)
    monkeypatch.setitem(_placement._state, "workers", {})
    monkeypatch.setitem(_placement._state, "tries", 0)
    _placement._state["cpu"] = None
    for _ in range(_placement._TRIES + 2):
        _parallel_call()
    assert len(looked) == _placement._TRIES and _placement.workers() == {}
