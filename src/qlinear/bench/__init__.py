"""Speed of qlinear's cpu kernels against ONNX Runtime, onnx.reference and the bandwidth floor.

``python -m qlinear.bench`` (or ``qlinear bench``) runs every case of
:mod:`qlinear.bench._cases` in one process on the same inputs and prints a
table; :func:`run_benchmark` returns the measurements. ``--startup``
measures start-up and compile times in fresh processes instead
(:func:`run_startup`); ``--stores`` and ``--ort-pairs`` time two ways in
alternating pairs (:func:`run_store_pairs`, :func:`run_ort_pairs`);
``--load N`` times qlinear and ONNX Runtime with N cores kept busy, and
``--after-ort`` qlinear right after an ONNX Runtime run (:func:`run_load`,
:func:`run_after_ort`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from qlinear.bench._cases import GRANULARITIES, MORE_TYPES, TYPES, X_DTYPES, Case, cases, inputs, qlinear_calls
from qlinear.bench._load import run_after_ort, run_load
from qlinear.bench._measure import best_time, copy_bandwidth, peak_extra_bytes
from qlinear.bench._ort_pairs import run_ort_pairs
from qlinear.bench._others import ort_runner, reference_runner
from qlinear.bench._startup import run_startup, startup_table
from qlinear.bench._stores import run_store_pairs
from qlinear.ops import quantize_linear

__all__ = [
    "GRANULARITIES",
    "MORE_TYPES",
    "TYPES",
    "X_DTYPES",
    "run_after_ort",
    "run_benchmark",
    "run_load",
    "run_ort_pairs",
    "run_startup",
    "run_store_pairs",
    "startup_table",
]


def run_benchmark(
    *,
    size: int,
    threads: int,
    repeats: int = 3,
    reference: bool = True,
    types: tuple[str, ...] = TYPES,
    granularities: tuple[str, ...] = tuple(GRANULARITIES),
    x_dtype: str = "float32",
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Measure every case; times in seconds, memory in bytes.

    ``x_dtype`` (a key of ``X_DTYPES``) is x's type and the scale's, and
    DequantizeLinear's result's. Returns ``{"size", "threads", "x_dtype",
    "copy_bandwidth", "copy_bandwidth_range", "rows"}``; each row has ``op``, ``type``, ``granularity``, ``qlinear_s``,
    ``ort_s``, ``ort_mode`` (``"node"``, ``"Q+DQ pair"`` or why it is
    missing), ``reference_s``, ``floor_s``, ``copy_bandwidth`` (a copy
    timed just before the row's type and granularity), ``bytes_moved``,
    ``peak_extra_bytes`` and ``output_bytes``. The report's
    ``copy_bandwidth``, the median of the rows' own, gives every floor.
    With a pair, ``qlinear_pair_s`` is qlinear's Q plus DQ time, the one to
    hold against ONNX Runtime's. ``qlinear_s`` writes into reused ``out=``
    buffers; ``qlinear_plain_s`` (and ``qlinear_plain_pair_s``) is the plain
    call, a fresh result each time, as users call it. qlinear allocates its
    output when its memory is measured.
    """
    import numba

    numba.set_num_threads(threads)
    rows = []
    bandwidths = []
    todo = cases(types, granularities)
    by_input: dict[tuple[str, str], dict[str, Any]] = {}
    for done, case in enumerate(todo):
        key = (case.type_name, case.granularity)
        if key not in by_input:
            by_input.clear()  # one type and granularity's inputs at a time
            x, scale, zp = inputs(case, size, x_dtype=x_dtype)
            # A copy timed before each type and granularity: a shared
            # machine's bandwidth drifts over a run, and a single copy can
            # catch a fast moment or a slow one (20-97 GB/s seen in one
            # run here). The floor takes their median.
            bandwidths.append(copy_bandwidth(x.nbytes, repeats))
            run_q, run_dq, alloc_q, alloc_dq, q = qlinear_calls(case, x, scale, zp)
            # Straight after the copy, on the same numba threads, and before
            # ONNX Runtime's session for this input starts threads of its own.
            q_time = best_time(run_q, repeats, settle_s=0)
            dq_time = best_time(run_dq, repeats, settle_s=0)
            # The plain call, as users make it: no out=, a fresh result each time.
            q_plain = best_time(alloc_q, repeats, settle_s=0)
            dq_plain = best_time(alloc_dq, repeats, settle_s=0)
            ort_q_case = Case("Q", case.type_name, case.granularity)
            ort_q, ort_mode = ort_runner(ort_q_case, x, q, scale, zp, threads)
            unpacked = quantize_linear(x, scale, zp, axis=case.axis, block_size=case.block_size) if case.packed else q
            by_input[key] = dict(
                x=x,
                scale=scale,
                zp=zp,
                q=q,
                unpacked=unpacked,
                q_bytes=q.nbytes,
                allocating={"Q": alloc_q, "DQ": alloc_dq},
                q_time=q_time,
                dq_time=dq_time,
                plain={"Q": q_plain, "DQ": dq_plain},
                ort_q=(ort_q, ort_mode),
            )
        shared = by_input[key]
        x, scale, zp = shared["x"], shared["scale"], shared["zp"]
        own = shared["q_time"] if case.op == "Q" else shared["dq_time"]
        if case.op == "Q":
            ort_call, ort_mode = shared["ort_q"]
        else:
            ort_call, ort_mode = ort_runner(case, x, shared["unpacked"], scale, zp, threads)
        ort_s = best_time(ort_call, repeats) if ort_call is not None else None
        ref_s = None
        if reference:
            ref_call = reference_runner(case, x, shared["unpacked"], scale, zp)
            ref_s = best_time(ref_call, 1) if ref_call is not None else None
        out_bytes = shared["q_bytes"] if case.op == "Q" else x.nbytes
        moved = x.nbytes + shared["q_bytes"] + scale.nbytes + zp.nbytes
        rows.append(
            {
                "op": case.op,
                "type": case.type_name,
                "granularity": case.granularity,
                "packed": case.packed,
                "qlinear_s": own,
                "qlinear_plain_s": shared["plain"][case.op],
                "qlinear_plain_pair_s": shared["plain"]["Q"] + shared["plain"]["DQ"] if ort_mode == "Q+DQ pair" else None,
                "ort_s": ort_s,
                "ort_mode": ort_mode,
                "qlinear_pair_s": shared["q_time"] + shared["dq_time"] if ort_mode == "Q+DQ pair" else None,
                "reference_s": ref_s,
                "bytes_moved": moved,
                "copy_bandwidth": bandwidths[-1],
                "peak_extra_bytes": peak_extra_bytes(shared["allocating"][case.op]),
                "output_bytes": out_bytes,
                "scale_bytes": scale.nbytes + zp.nbytes,
            }
        )
        if progress is not None:
            progress(done + 1, len(todo))
    bandwidth = float(np.median(bandwidths))
    for row in rows:
        row["floor_s"] = row["bytes_moved"] / bandwidth
    return {
        "size": int(np.prod(shared["x"].shape)),
        "threads": threads,
        "x_dtype": x_dtype,
        "copy_bandwidth": bandwidth,
        "copy_bandwidth_range": (min(bandwidths), max(bandwidths)),
        "rows": rows,
    }
