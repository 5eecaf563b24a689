"""qlinear under load and right after ONNX Runtime: the two situations a quiet benchmark hides.

``--load N`` keeps N cores busy with other processes (``while True: pass``)
while each case is timed three ways in rotating order: qlinear on its
threads, qlinear on one thread, and ONNX Runtime on the same threads; each
side the median of a few calls (under load the best call hides the slow
ones users meet), and the median over the rounds is kept.

``--after-ort`` times qlinear's call right after an ONNX Runtime session
run on the same threads, with no pause (the model quantizer's pattern:
inference, then kernels), against the same call after a pause that lets
ONNX Runtime's spinning threads sleep.
"""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from qlinear.bench._cases import GRANULARITIES, TYPES, Case, case_groups, inputs, qlinear_calls
from qlinear.bench._measure import SETTLE_S
from qlinear.bench._others import ort_runner
from qlinear.ops import quantize_linear

__all__ = ["busy_cores", "run_after_ort", "run_load"]

_CALLS = 5
_PAIR = "Q+DQ pair"


@contextlib.contextmanager
def busy_cores(n: int) -> Iterator[None]:
    """``n`` other processes each keeping a core busy, for the duration."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(0.3 if n else 0)  # let them take their cores
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def _median_call(fn: Callable[[], object], calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _calls(
    case: Case, size: int, threads: int
) -> Iterator[tuple[str, Case, Callable[[], object], Callable[[], object] | None, str]]:
    """``(op, case, qlinear call, ONNX Runtime call, ORT mode)`` for Q and DQ of ``case``'s type and granularity."""
    x, scale, zp = inputs(case, size)
    run_q, run_dq, _, _, q = qlinear_calls(case, x, scale, zp)
    ort_q, q_mode = ort_runner(Case("Q", case.type_name, case.granularity), x, q, scale, zp, threads)

    def both() -> None:
        run_q()
        run_dq()

    if q_mode == _PAIR:
        yield "Q+DQ", case, both, ort_q, q_mode
        return
    yield "Q", case, run_q, ort_q, q_mode
    unpacked = quantize_linear(x, scale, zp, axis=case.axis, block_size=case.block_size) if case.packed else q
    ort_dq, dq_mode = ort_runner(Case("DQ", case.type_name, case.granularity), x, unpacked, scale, zp, threads)
    # Where ONNX Runtime can run DequantizeLinear only as a pair, qlinear's Q then DQ is held against it.
    yield ("Q+DQ", case, both, ort_dq, dq_mode) if dq_mode == _PAIR else ("DQ", case, run_dq, ort_dq, dq_mode)


def run_load(
    *,
    size: int,
    threads: int,
    rounds: int,
    load: int,
    types: tuple[str, ...] = TYPES,
    granularities: tuple[str, ...] = tuple(GRANULARITIES),
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Every case timed on ``threads`` threads, on one thread, and on ONNX Runtime, with ``load`` cores kept busy.

    Returns ``{"size", "threads", "load", "rounds", "rows"}``; each row has
    ``op``, ``type``, ``granularity``, ``packed``, ``ort_mode``, and the
    medians ``qlinear_s``, ``qlinear_1_s`` and ``ort_s`` (None where ONNX
    Runtime has no kernel).
    """
    import numba

    rows = []
    groups = case_groups(types, granularities)
    with busy_cores(load):
        for done, group in enumerate(groups):
            for op, case, mine, ort_call, mode in _calls(group, size, threads):
                sides: dict[str, Callable[[], float]] = {
                    "qlinear_s": lambda f=mine: _on_threads(threads, f),
                    "qlinear_1_s": lambda f=mine: _on_threads(1, f),
                }
                if ort_call is not None:
                    sides["ort_s"] = lambda f=ort_call: _median_call(f, _CALLS)
                times: dict[str, list[float]] = {k: [] for k in sides}
                order = list(sides)
                for r in range(rounds):
                    for key in order[r % len(order) :] + order[: r % len(order)]:
                        time.sleep(SETTLE_S)
                        times[key].append(sides[key]())
                numba.set_num_threads(threads)
                row = {"op": op, "type": case.type_name, "granularity": case.granularity, "packed": case.packed, "ort_mode": mode}
                row.update({k: statistics.median(v) for k, v in times.items()})
                row.setdefault("ort_s", None)
                rows.append(row)
            if progress is not None:
                progress(done + 1, len(groups))
    return {"size": size, "threads": threads, "load": load, "rounds": rounds, "rows": rows}


def _on_threads(n: int, fn: Callable[[], object]) -> float:
    import numba

    numba.set_num_threads(n)
    fn()  # a warm-up on these threads
    return _median_call(fn, _CALLS)


def run_after_ort(
    *,
    size: int,
    threads: int,
    rounds: int,
    types: tuple[str, ...] = TYPES,
    granularities: tuple[str, ...] = tuple(GRANULARITIES),
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """qlinear's call timed straight after an ONNX Runtime run (no pause) and after a pause, in alternating rounds.

    Returns ``{"size", "threads", "rounds", "rows"}``; each row has ``op``,
    ``type``, ``granularity``, ``packed``, and the medians ``after_ort_s``
    and ``settled_s`` (cases where ONNX Runtime has no kernel are left out).
    """
    import numba

    numba.set_num_threads(threads)
    rows = []
    groups = case_groups(types, granularities)
    for done, group in enumerate(groups):
        for op, case, mine, ort_call, _mode in _calls(group, size, threads):
            if ort_call is None:
                continue
            mine()
            after, settled = [], []
            for r in range(rounds):
                for side in (0, 1) if r % 2 == 0 else (1, 0):
                    ort_call()
                    if side:
                        time.sleep(SETTLE_S)
                    start = time.perf_counter()
                    mine()
                    (settled if side else after).append(time.perf_counter() - start)
            rows.append(
                {
                    "op": op,
                    "type": case.type_name,
                    "granularity": case.granularity,
                    "packed": case.packed,
                    "after_ort_s": statistics.median(after),
                    "settled_s": statistics.median(settled),
                }
            )
        if progress is not None:
            progress(done + 1, len(groups))
    return {"size": size, "threads": threads, "rounds": rounds, "rows": rows}
