"""Streaming stores against ordinary ones, timed in pairs.

On a shared machine a single timing moves by 20-40% from one minute to the
next, more than the difference between two ways of writing the output. So
each case is timed as pairs: the two ways back to back (their order
alternating from pair to pair), each the best of a few calls, and the
pair's ratio kept. The median of those ratios holds to a few percent where
the times themselves do not. Streaming is switched through
:data:`qlinear.kernels.cpu._lines.STREAM_MIN_BYTES` (0: always, where the
layout allows; a size no call reaches: never) and restored afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from qlinear.bench._cases import GRANULARITIES, TYPES, cases, inputs, qlinear_calls
from qlinear.bench._measure import SETTLE_S, paired_ratio

__all__ = ["run_store_pairs"]

# Calls timed for each side of a pair, the fastest kept.
_CALLS = 3
_NEVER = 1 << 62


def _paired(fn: Callable[[], object], pairs: int) -> dict[str, float]:
    """Median times of ``fn`` with streaming and ordinary stores, and the quartiles of their paired ratio."""
    from qlinear.kernels.cpu import _lines

    saved = _lines.STREAM_MIN_BYTES

    def switch(side: int) -> None:
        _lines.STREAM_MIN_BYTES = 0 if side == 0 else _NEVER

    try:
        measured = paired_ratio(fn, fn, pairs, settle_s=0, calls=_CALLS, prepare=switch)
    finally:
        _lines.STREAM_MIN_BYTES = saved
    return {
        "streamed_s": measured["first_s"],
        "plain_s": measured["second_s"],
        "ratio": measured["ratio"],
        "ratio_q1": measured["ratio_q1"],
        "ratio_q3": measured["ratio_q3"],
    }


def run_store_pairs(
    *,
    size: int,
    threads: int,
    pairs: int,
    types: tuple[str, ...] = TYPES,
    granularities: tuple[str, ...] = tuple(GRANULARITIES),
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Streamed over ordinary stores for every case, as ``pairs`` paired timings each.

    Returns ``{"size", "threads", "pairs", "rows"}``; each row has ``op``,
    ``type``, ``granularity``, ``packed``, the median ``streamed_s`` and
    ``plain_s``, and the median ``ratio`` (streamed over plain) of the pairs
    with its quartiles ``ratio_q1`` and ``ratio_q3``. Cases whose layout
    never streams (packed QuantizeLinear, scales that step along rows)
    measure about 1.
    """
    import numba

    numba.set_num_threads(threads)
    todo = cases(types, granularities)
    rows = []
    current = None  # (type, granularity) whose calls run_q and run_dq are
    for done, case in enumerate(todo):
        if current != (case.type_name, case.granularity):
            current = (case.type_name, case.granularity)
            run_q, run_dq = qlinear_calls(case, *inputs(case, size))[:2]
        time.sleep(SETTLE_S)
        measured = _paired(run_q if case.op == "Q" else run_dq, pairs)
        rows.append({"op": case.op, "type": case.type_name, "granularity": case.granularity, "packed": case.packed, **measured})
        if progress is not None:
            progress(done + 1, len(todo))
    return {"size": size, "threads": threads, "pairs": pairs, "rows": rows}
