"""qlinear against ONNX Runtime, timed in pairs.

The benchmark's table times qlinear and ONNX Runtime a few seconds apart;
on a shared machine whose speed moves by 20-40% from one minute to the
next, rows where both are at the bandwidth floor then trade places from
run to run. Here each case is timed as pairs instead: qlinear and ONNX
Runtime back to back, their order alternating, each after the pause that
lets the other's threads go to sleep, and the median of the pairs' ratios
is kept (:func:`._measure.paired_ratio`). qlinear's side is the plain
call, a fresh result each time. Where ONNX Runtime runs a
QuantizeLinear+DequantizeLinear pair (types it cannot hand to numpy), the
case is that pair against qlinear's Q then DQ.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qlinear.bench._cases import GRANULARITIES, TYPES, Case, case_groups, inputs, qlinear_calls
from qlinear.bench._measure import SETTLE_S, paired_ratio
from qlinear.bench._others import ort_runner
from qlinear.ops import quantize_linear

__all__ = ["run_ort_pairs"]

_CALLS = 3
_PAIR = "Q+DQ pair"


def _row(op: str, case: Case, mode: str, measured: dict[str, float] | None) -> dict[str, Any]:
    row = {"op": op, "type": case.type_name, "granularity": case.granularity, "packed": case.packed, "ort_mode": mode}
    if measured is None:
        return {**row, "qlinear_s": None, "ort_s": None, "ratio": None, "ratio_q1": None, "ratio_q3": None}
    return {
        **row,
        "qlinear_s": measured["first_s"],
        "ort_s": measured["second_s"],
        "ratio": measured["ratio"],
        "ratio_q1": measured["ratio_q1"],
        "ratio_q3": measured["ratio_q3"],
    }


def _measure(
    op: str,
    case: Case,
    ort_call: Callable[[], object] | None,
    mode: str,
    run_q: Callable[[], object],
    run_dq: Callable[[], object],
    pairs: int,
) -> dict[str, Any]:
    """The row of ``op`` for ``case``: qlinear's call against ONNX Runtime's, or its Q then DQ against ONNX Runtime's pair."""
    if ort_call is None:
        return _row(op, case, mode, None)
    if mode == _PAIR:

        def both() -> None:
            run_q()
            run_dq()

        return _row("Q+DQ", case, mode, paired_ratio(both, ort_call, pairs, settle_s=SETTLE_S, calls=_CALLS))
    mine = run_q if op == "Q" else run_dq
    return _row(op, case, mode, paired_ratio(mine, ort_call, pairs, settle_s=SETTLE_S, calls=_CALLS))


def run_ort_pairs(
    *,
    size: int,
    threads: int,
    pairs: int,
    types: tuple[str, ...] = TYPES,
    granularities: tuple[str, ...] = tuple(GRANULARITIES),
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """qlinear over ONNX Runtime for every case, as ``pairs`` paired timings each.

    Returns ``{"size", "threads", "pairs", "rows"}``; each row has ``op``
    (``"Q"``, ``"DQ"``, or ``"Q+DQ"`` where ONNX Runtime runs the pair),
    ``type``, ``granularity``, ``packed``, ``ort_mode`` (``"node"``,
    ``"Q+DQ pair"`` or why ONNX Runtime has none), the median
    ``qlinear_s`` and ``ort_s``, and the median ``ratio`` (qlinear over ONNX
    Runtime) with its quartiles ``ratio_q1`` and ``ratio_q3``; None where
    ONNX Runtime has no kernel.
    """
    import numba

    numba.set_num_threads(threads)
    groups = case_groups(types, granularities)
    rows = []
    for done, case in enumerate(groups):
        x, scale, zp = inputs(case, size)
        # The plain calls (a fresh result each), as users make them.
        _, _, run_q, run_dq, q = qlinear_calls(case, x, scale, zp)
        ort_q, q_mode = ort_runner(Case("Q", case.type_name, case.granularity), x, q, scale, zp, threads)
        rows.append(_measure("Q", case, ort_q, q_mode, run_q, run_dq, pairs))
        if q_mode != _PAIR:  # a pair already stands for both
            unpacked = quantize_linear(x, scale, zp, axis=case.axis, block_size=case.block_size) if case.packed else q
            ort_dq, dq_mode = ort_runner(Case("DQ", case.type_name, case.granularity), x, unpacked, scale, zp, threads)
            rows.append(_measure("DQ", case, ort_dq, dq_mode, run_q, run_dq, pairs))
        if progress is not None:
            progress(done + 1, len(groups))
    return {"size": size, "threads": threads, "pairs": pairs, "rows": rows}
