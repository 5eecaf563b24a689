"""The run loop of the fused QuantizeLinear kernel for float32 (or int32) ``x`` in float32 precision.

A run is a stretch of consecutive elements whose scale and zero point are
either one constant or step with each element. Each run is one tight loop
from ``x`` straight to the codes (``x / scale``, then the integer or float
code of the quotient), with every branch outside the loops so LLVM
vectorizes them. The loops are written out in :func:`integer_runs` and
:func:`float_runs` themselves: a call per block of 32, or a function
inlined by numba (which then counts references to every array it is
passed), costs more than the block; and integer and float loops in one
function slow each other down (registers spilled around them). Indices are
unsigned (``_U``): numba then skips its negative-index wraparound and LLVM
sees consecutive addresses.

Runs come in batches (:func:`next_batch`): blocks along the last axis are
found by counting, a row's whole blocks at a time. The runs of a batch do
not depend on each other, so the processor starts a block before the one
before has been found; found one by one (through :func:`next_run`, or by
counting), finding the next block was the slowest link at 32 elements a
block.

Calls that stream their output to integer codes over blocks (of up to 256)
along the last axis go line by line instead (:func:`integer_period_lines`):
each 64-byte line of codes with the up to three scales it spans.

Packed 4-bit (int4, uint4, float4e2m1) and 2-bit integer codes go the
same way straight into their bytes (:func:`._quantize_packed.packed_runs`), where every run
starts on a byte: each byte's two or four codes computed together, with no
buffer of codes in between; blocks of 32 along the last axis, a row's at a
time, by one vector function a block (:func:`._packed_lines.quantize_nibble_block`
and its siblings).

Zero points arrive as their codes (the output's own bytes or 16-bit words,
never copied): integers are sign-extended in float32, ``z - 2 * sign`` when
``z >= sign`` (``sign`` 0 for unsigned types); float codes are looked up in a
256-entry table of their values.
"""

from __future__ import annotations

import numpy as np
from numba import literally, njit

from qlinear._builtins import min
from qlinear.kernels.cpu._encode import add_zero_point, float_code, integer_code, integer_zero_point
from qlinear.kernels.cpu._lines import (
    LINE,
    STREAM_MIN_RUN,
    line_scales,
    line_span,
    period_scale,
    quantize_cached_line,
    quantize_float_line,
    quantize_line,
)
from qlinear.kernels.cpu._params import L_B, L_D, L_I, L_SB, L_SI, L_SO
from qlinear.kernels.cpu._reciprocal_lines import quantize_reciprocal_line, reciprocal_line_args
from qlinear.kernels.cpu._tiles import (
    bfloat_value,
    half_value_by_bits,
    locate,
    next_run,
    round_bfloat,
    round_half_by_bits,
)

__all__ = ["float_runs", "integer_code", "integer_runs", "integer_period_lines", "integer_zero_point"]

_jit = njit(cache=True, nogil=True, error_model="numpy")
_U = np.uint64


@_jit
def first_batch(start, lay):
    """The walk's state at flat index ``start``: ``(o, d, i, b, d_end, row_si, block_si)``.

    ``(o, d, i, b)`` as :func:`locate` gives them; for blocks along the last
    axis also the end of the current block and the scale indices of the
    row's first block and of the current one.
    """
    o, d, i, b = locate(start, lay)
    row_si = o * lay[L_SO]
    return o, d, i, b, min((b + 1) * lay[L_B], lay[L_D]), row_si, row_si + b * lay[L_SB]


@_jit
def next_batch(j, end, lay, state):
    """``(n, si, step, runs, state)``: ``runs`` runs of ``n`` elements from ``j``, then the state after them.

    The scale of the r-th run starts at ``si + r * lay[L_SB]`` and steps
    with each element if ``step``. Blocks along the last axis come a row's
    whole blocks at a time; everything else one run at a time.
    """
    o, d, i, b, d_end, row_si, block_si = state
    if lay[L_I] != 1 or lay[L_SI]:
        n, si, step, o, d, i, b = next_run(o, d, i, b, j, end, lay)
        return n, si, step, 1, (o, d, i, b, d_end, row_si, block_si)
    d_len, block = lay[L_D], lay[L_B]
    n, si, runs = min(d_end - d, end - j), block_si, 1
    if n == block:
        runs = min(d_len - d, end - j) // block
    d += runs * n
    if d >= d_end:
        block_si += runs * lay[L_SB]
        d_end = min(d + block, d_len)
        if d == d_len:
            row_si += lay[L_SO]
            d, d_end, block_si = 0, min(block, d_len), row_si
    return n, si, 0, runs, (o, d, i, b, d_end, row_si, block_si)


@_jit
def _integer_lines(x, j, dst, w, n, s, z, qmin, qmax, mask, stream):
    """One long run of integer codes of one scale, whole 64-byte lines of ``dst`` at a time (streamed with ``stream``).

    8-bit codes multiply by the scale's reciprocal where that is exact
    (:mod:`._reciprocal_lines`).

    A function of its own, called once a run, so the vector code of the
    lines stays out of :func:`integer_runs`' loops (inlined there, it made
    LLVM keep its constants in registers across the short runs of blocked
    layouts, which then spilled).
    """
    lanes = LINE // dst.itemsize
    lo, hi = line_span(dst, w, n)
    for q in range(lo):
        dst[_U(w + q)] = integer_code(np.float32(x[_U(j + q)]) / s, z, qmin, qmax, mask)
    fits, r, limit = reciprocal_line_args(s, z, qmin, qmax)
    # Sub-byte codes computed a byte each (to be packed) keep the masked lines.
    fits = fits and mask == (1 << (8 * dst.itemsize)) - 1
    if fits and stream:
        for q in range(lo, hi, lanes):
            quantize_reciprocal_line(x, j + q, dst, w + q, s, r, z, limit, qmin, qmax, True)
    elif fits:
        for q in range(lo, hi, lanes):
            quantize_reciprocal_line(x, j + q, dst, w + q, s, r, z, limit, qmin, qmax, False)
    elif stream:
        for q in range(lo, hi, lanes):
            quantize_line(x, j + q, dst, w + q, (s, s, s), (z, z, z), (lanes, lanes), qmin, qmax, mask)
    else:
        for q in range(lo, hi, lanes):
            quantize_cached_line(x, j + q, dst, w + q, (s, s, s), (z, z, z), (lanes, lanes), qmin, qmax, mask)
    for q in range(hi, n):
        dst[_U(w + q)] = integer_code(np.float32(x[_U(j + q)]) / s, z, qmin, qmax, mask)


@_jit
def _float_lines(x, j, dst, w, n, s, z, has_zp, nan_to_zp, cap, k):
    """One long run of float codes, as :func:`_integer_lines` does for integers."""
    lanes = LINE // dst.itemsize
    lo, hi = line_span(dst, w, n)
    for q in range(lo):
        dst[_U(w + q)] = float_code(np.float32(x[_U(j + q)]) / s, z, has_zp, nan_to_zp, cap, k)
    for q in range(lo, hi, lanes):
        quantize_float_line(x, j + q, dst, w + q, s, z, has_zp, nan_to_zp, cap, k)
    for q in range(hi, n):
        dst[_U(w + q)] = float_code(np.float32(x[_U(j + q)]) / s, z, has_zp, nan_to_zp, cap, k)


@_jit
def _wrap(k, count):
    """``k % count`` for ``k`` a few periods past ``count`` at most, without dividing."""
    while k >= count:
        k -= count
    return k


@_jit
def integer_period_lines(x, start, end, period, count, scale, zp, dst, qmin, qmax, mask, sign):
    """:func:`integer_runs`' codes for a periodic layout, in whole lines by streaming stores.

    The scale of element ``j`` is ``scale[(j // period) % count]``, with
    ``period`` at least half a line of codes. Each line is one
    :func:`._lines.quantize_line` with the (up to three) scales it spans
    (:func:`._lines.line_scales`), whatever the alignment of the periods:
    blocks of 32 then stream as long runs do (the caller keeps longer
    periods to runs). Elements before the first whole line and after the
    last are written one at a time.
    """
    lanes = LINE // dst.itemsize
    lo, hi = line_span(dst, start, end - start)
    for j in range(start, start + lo):
        k = period_scale(j, period, count)
        dst[j] = integer_code(np.float32(x[j]) / scale[k], integer_zero_point(zp[k], sign), qmin, qmax, mask)
    k = period_scale(start + lo, period, count)
    off = (start + lo) % period
    if lanes % period == 0:
        # Periods that divide a line split every line at the same lanes, the
        # scales moving on by lanes // period a line: splits found once stay
        # constant through the loop, and LLVM makes the lane masks once.
        splits, ks, _, _ = line_scales(k, off, period, count, lanes)
        k0, k1, k2 = ks
        step = lanes // period
        for j in range(start + lo, start + hi, lanes):
            s = (scale[_U(k0)], scale[_U(k1)], scale[_U(k2)])
            z = (integer_zero_point(zp[_U(k0)], sign), integer_zero_point(zp[_U(k1)], sign), integer_zero_point(zp[_U(k2)], sign))
            quantize_line(x, j, dst, j, s, z, splits, qmin, qmax, mask)
            k0, k1, k2 = _wrap(k0 + step, count), _wrap(k1 + step, count), _wrap(k2 + step, count)
    else:
        for j in range(start + lo, start + hi, lanes):
            splits, ks, k, off = line_scales(k, off, period, count, lanes)
            if splits[0] == lanes:
                # One scale: constant splits, so LLVM drops the lane selects.
                s0, z0 = scale[_U(ks[0])], integer_zero_point(zp[_U(ks[0])], sign)
                quantize_line(x, j, dst, j, (s0, s0, s0), (z0, z0, z0), (lanes, lanes), qmin, qmax, mask)
            else:
                s = (scale[_U(ks[0])], scale[_U(ks[1])], scale[_U(ks[2])])
                z = (
                    integer_zero_point(zp[_U(ks[0])], sign),
                    integer_zero_point(zp[_U(ks[1])], sign),
                    integer_zero_point(zp[_U(ks[2])], sign),
                )
                quantize_line(x, j, dst, j, s, z, splits, qmin, qmax, mask)
    for j in range(start + hi, end):
        k = period_scale(j, period, count)
        dst[j] = integer_code(np.float32(x[j]) / scale[k], integer_zero_point(zp[k], sign), qmin, qmax, mask)


@_jit
def zero_point_buffer(start, end, lay):
    """``(zvalues, held)`` for :func:`stepping_zero_points` over elements ``start .. end``: nothing held yet.

    A stepping run is at most a row, so ``zvalues`` holds a row's values
    (none where no run steps); ``held`` is the span of ``zp`` they hold.
    """
    return np.empty(min(end - start, lay[L_I]) if lay[L_SI] else 0, np.float32), np.zeros(2, np.int64)


@_jit
def stepping_zero_points(zp, sr, n, zvalues, held, ztab, float_out, sign):
    """Offset in ``zvalues`` of the values of zero points ``zp[sr:sr + n]``, decoding them only if not held already.

    ``zvalues`` holds the values of ``zp[held[0]:held[1]]`` (updated here):
    float codes through ``ztab``, integer ones by :func:`integer_zero_point`.
    Decoding in a run's loop would cost four operations where a load costs
    one; kept, the values serve every row of a per-axis or blocked layout
    on a leading axis, so they are decoded about once a chunk. Called once
    a stepping run, not an element.
    """
    if sr < held[0] or sr + n > held[1]:
        if float_out:
            for q in range(n):
                zvalues[_U(q)] = ztab[zp[_U(sr + q)]]
        else:
            for q in range(n):
                zvalues[_U(q)] = integer_zero_point(zp[_U(sr + q)], sign)
        held[0], held[1] = sr, sr + n
    return sr - held[0]


@_jit
def integer_runs(x, start, end, scale, zp, dst, d0, lay, qmin, qmax, mask, sign, stream):
    """Integer codes of ``x[start:end]`` into ``dst[start - d0:]``: ``clip(rint(x / scale) + zp, qmin, qmax) & mask``.

    With ``stream``, long runs of one scale write their whole 64-byte lines
    of ``dst`` by :func:`._lines.quantize_line` (streaming stores), the
    elements before the first and after the last as usual.

    The zero points of stepping runs are decoded into ``zvalues`` first
    (:func:`stepping_zero_points`).
    """
    zvalues, held = zero_point_buffer(start, end, lay)
    no_table = np.empty(0, np.float32)  # integer zero points are decoded by arithmetic
    state = first_batch(start, lay)
    j = start
    while j < end:
        n, si, step, runs, state = next_batch(j, end, lay, state)
        for r in range(runs):
            jr, sr = j + r * n, si + r * lay[L_SB]
            w = jr - d0
            if step:
                zi = stepping_zero_points(zp, sr, n, zvalues, held, no_table, False, sign)
                for q in range(n):
                    v = np.float32(x[_U(jr + q)]) / scale[_U(sr + q)]
                    dst[_U(w + q)] = integer_code(v, zvalues[_U(zi + q)], qmin, qmax, mask)
            else:
                s, z = scale[sr], integer_zero_point(zp[sr], sign)
                if n >= STREAM_MIN_RUN:
                    _integer_lines(x, jr, dst, w, n, s, z, qmin, qmax, mask, stream)
                else:
                    for q in range(n):
                        dst[_U(w + q)] = integer_code(np.float32(x[_U(jr + q)]) / s, z, qmin, qmax, mask)
        j += runs * n


@_jit
def float_runs(x, start, end, scale, zp, ztab, dst, d0, lay, has_zp, nan_to_zp, cap, k, stream):
    """Float codes of ``x[start:end]`` into ``dst[start - d0:]`` (:func:`float_code` with ``has_zp``, ``nan_to_zp``, ``cap``, ``k``).

    Zero points are looked up in ``ztab``; those of stepping runs into
    ``zvalues`` first (a table lookup in the loop would not vectorize),
    kept while later runs use the same ones, as in :func:`integer_runs`.
    With ``stream``, long runs of one scale into one byte a code write their
    whole lines by :func:`._lines.quantize_float_line`.
    """
    zvalues, held = zero_point_buffer(start, end, lay)
    state = first_batch(start, lay)
    j = start
    while j < end:
        n, si, step, runs, state = next_batch(j, end, lay, state)
        for r in range(runs):
            jr, sr = j + r * n, si + r * lay[L_SB]
            w = jr - d0
            if step:
                zi = stepping_zero_points(zp, sr, n, zvalues, held, ztab, True, np.float32(0))
                for q in range(n):
                    v = np.float32(x[_U(jr + q)]) / scale[_U(sr + q)]
                    dst[_U(w + q)] = float_code(v, zvalues[_U(zi + q)], has_zp, nan_to_zp, cap, k)
            else:
                s, z = scale[sr], ztab[zp[sr]]
                if stream and n >= STREAM_MIN_RUN:
                    _float_lines(x, jr, dst, w, n, s, z, has_zp, nan_to_zp, cap, k)
                else:
                    for q in range(n):
                        dst[_U(w + q)] = float_code(np.float32(x[_U(jr + q)]) / s, z, has_zp, nan_to_zp, cap, k)
        j += runs * n


@_jit
def _wide_quotient(bits, s, half):
    """``x / s`` in x's 16-bit type (float16 if ``half``, else bfloat16), ``x`` given by its bits and ``s`` a value of that type, as float32.

    The float32 quotient of two 16-bit values rounded once to 16 bits is the
    correctly rounded 16-bit quotient (float32 carries more than twice their
    significand bits plus two). ``np.uint16`` is the bits' own type; the
    cast lets the call compile for the float32 x it never gets.
    """
    if half:
        return round_half_by_bits(half_value_by_bits(np.uint16(bits)) / s)
    return round_bfloat(bfloat_value(np.uint16(bits)) / s)


@_jit
def _wide_float_code(q, z, half, has_zp, nan_to_zp, cap, k):
    """:func:`float_code` of the 16-bit quotient ``q`` plus zero point ``z``, their sum rounded to the 16-bit type first."""
    if has_zp:
        v = add_zero_point(q, z)
        q = round_half_by_bits(v) if half else round_bfloat(v)
    return float_code(q, z, False, nan_to_zp, cap, k)


@_jit
def wide_runs(x, start, end, scale, zp, ztab, dst, d0, lay, half, float_out, qmin, qmax, mask, sign, float_args):
    """Codes of 16-bit ``x[start:end]`` (its bits; float16 if ``half``, else bfloat16) into ``dst[start - d0:]``, in x's precision.

    Scales are values of x's type as float32. As :func:`integer_runs` and
    :func:`float_runs`, from x straight to the codes, each run one loop:
    the quotient rounded to x's type (:func:`_wide_quotient`), then
    :func:`integer_code`, or for float codes the sum with the zero point
    rounded again (:func:`_wide_float_code`).
    """
    literally(half)  # compiled once for each 16-bit type: the loops hold only its conversions
    has_zp, nan_to_zp, cap, k = float_args
    zvalues, held = zero_point_buffer(start, end, lay)
    state = first_batch(start, lay)
    j = start
    while j < end:
        n, si, step, runs, state = next_batch(j, end, lay, state)
        for r in range(runs):
            jr, sr = j + r * n, si + r * lay[L_SB]
            w = jr - d0
            if step:
                zi = stepping_zero_points(zp, sr, n, zvalues, held, ztab, float_out, sign)
                if float_out:
                    for q in range(n):
                        v = _wide_quotient(x[_U(jr + q)], scale[_U(sr + q)], half)
                        dst[_U(w + q)] = _wide_float_code(v, zvalues[_U(zi + q)], half, has_zp, nan_to_zp, cap, k)
                else:
                    for q in range(n):
                        v = _wide_quotient(x[_U(jr + q)], scale[_U(sr + q)], half)
                        dst[_U(w + q)] = integer_code(v, zvalues[_U(zi + q)], qmin, qmax, mask)
            else:
                s = scale[sr]
                if float_out:
                    z = ztab[zp[sr]]
                    for q in range(n):
                        dst[_U(w + q)] = _wide_float_code(
                            _wide_quotient(x[_U(jr + q)], s, half), z, half, has_zp, nan_to_zp, cap, k
                        )
                else:
                    z = integer_zero_point(zp[sr], sign)
                    for q in range(n):
                        dst[_U(w + q)] = integer_code(_wide_quotient(x[_U(jr + q)], s, half), z, qmin, qmax, mask)
        j += runs * n
