"""The fused DequantizeLinear kernel (numba, parallel over chunks of ``x``).

``y = (x - zero_point) * scale`` in one pass: each chunk goes run by run,
each run one tight loop from the codes straight to float32
(:mod:`._dequantize_runs`, one run loop for each way of reading the codes).
float16/bfloat16 results are computed a tile at a time as float32, then
rounded to their bits.

One compiled specialization serves every call: codes and results arrive in
arrays of fixed types (those a call does not use are empty), and the zero
points as float32 (for int32 codes, the int32 zero points' bits).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from qlinear._builtins import min
from qlinear.kernels.cpu._dequantize_packed import crumb_runs, nibble_runs, packed_lines_fit, packed_period_lines, sextet_runs
from qlinear.kernels.cpu._dequantize_runs import float_runs, int32_runs, integer_runs, period_lines, step_lines, table_runs
from qlinear.kernels.cpu._lines import LONGEST_BLOCK_PERIOD, store_fence
from qlinear.kernels.cpu._params import L_CHUNK, L_N
from qlinear.kernels.cpu._tiles import TILE, encode_wide

__all__ = ["dequantize_kernel"]

# Slots of the integer parameter array ``p``; MANT .. FINITE describe a
# small float type for its decoding by bit arithmetic (MANT 0 otherwise).
# FINITE: the type has neither infinity nor NaN. STREAM: whole lines of
# float32 output by streaming stores (_lines). PERIOD, COUNT: the scale of
# element j is scale[(j // PERIOD) % COUNT] (PERIOD 0: not so simple), which
# lets 8/16-bit and float8 codes stream whole lines whatever the runs' lengths.
# STEP_LINES: the scale steps with the element along rows long enough for
# 8/16-bit and float8 codes to stream lines of 16 scales (_params.step_lines_fit).
(
    P_READ,
    P_BITS,
    P_SIGN_BIT,
    P_WIDE_OUT,
    P_MANT,
    P_EXP_OFF,
    P_MAX_BITS,
    P_INF_BITS,
    P_NEG_ZERO_NAN,
    P_FINITE,
    P_STREAM,
    P_PERIOD,
    P_COUNT,
    P_STEP_LINES,
) = range(14)
P_LEN = 14
# How x is read (P_READ): bytes through the table, integers of 8 bits or
# more, float8 bytes, packed integers, packed floats.
READ_TABLE, READ_INTEGER, READ_FLOAT, READ_PACKED_INTEGER, READ_PACKED_FLOAT = range(5)

_jit = njit(cache=True, nogil=True, error_model="numpy")


@_jit
def _dequantize_chunk(x8, x16, x32, start, end, table, scale, zp, zi, out32, out16, lay, p):
    """Elements ``start .. end``: float32 results straight into ``out32``, 16-bit ones a tile at a time."""
    read, bits, sign, wide = p[P_READ], p[P_BITS], p[P_SIGN_BIT], p[P_WIDE_OUT]
    stream = p[P_STREAM] != 0 and not wide
    period, count = p[P_PERIOD], p[P_COUNT]
    periodic = stream and period > 0
    stepping = stream and p[P_STEP_LINES] != 0
    # 8/16-bit integers and float8 stream line by line where the layout allows.
    lines = (read == READ_INTEGER and bits <= 16) or read == READ_FLOAT
    # Packed codes read a whole byte at a time: 4-bit integers and float4e2m1, 2-bit integers.
    whole_bytes = (bits == 4 and (read == READ_PACKED_INTEGER or p[P_FINITE] != 0)) or (bits == 2 and read == READ_PACKED_INTEGER)
    fmt = (p[P_MANT], p[P_EXP_OFF], sign, p[P_MAX_BITS], p[P_INF_BITS], p[P_NEG_ZERO_NAN])
    tile = np.empty(TILE if wide else 0, np.float32)
    dst = tile if wide else out32
    piece = TILE if wide else end - start
    for j in range(start, end, piece):
        stop, d0 = min(end, j + piece), j if wide else 0
        if read == READ_TABLE:
            table_runs(x8, j, stop, table, scale, zp, dst, d0, lay)
        elif lines and periodic and bits == 16:
            period_lines(x16, sign, fmt, j, stop, period, count, scale, zp, dst)
        elif lines and periodic:
            period_lines(x8, sign, fmt, j, stop, period, count, scale, zp, dst)
        elif lines and stepping and bits == 16:
            step_lines(x16, sign, fmt, j, stop, scale, zp, dst, lay)
        elif lines and stepping:
            step_lines(x8, sign, fmt, j, stop, scale, zp, dst, lay)
        elif read == READ_INTEGER and bits == 8:
            integer_runs(x8, sign, j, stop, scale, zp, dst, d0, lay)
        elif read == READ_INTEGER and bits == 16:
            integer_runs(x16, sign, j, stop, scale, zp, dst, d0, lay)
        elif read == READ_INTEGER:
            int32_runs(x32, j, stop, scale, zi, dst, d0, lay)
        elif read == READ_FLOAT:
            float_runs(x8, fmt, j, stop, scale, zp, dst, d0, lay)
        elif periodic and period <= LONGEST_BLOCK_PERIOD and whole_bytes and packed_lines_fit(dst, j, bits):
            packed_period_lines(x8, bits, sign, fmt, j, stop, period, count, table, scale, zp, dst)
        elif bits == 4 and whole_bytes:
            nibble_runs(x8, sign, fmt, j, stop, table, scale, zp, dst, d0, lay)
        elif bits == 2 and whole_bytes:
            crumb_runs(x8, sign, j, stop, table, scale, zp, dst, d0, lay)
        else:
            # 6-bit floats, the packed type left (neither infinity nor NaN).
            sextet_runs(x8, fmt, j, stop, table, scale, zp, dst, d0, lay)
        if wide:
            encode_wide(tile, stop - j, out16[j:stop], wide)
    if stream:
        store_fence()


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_kernel(x8, x16, x32, table, scale, zp, out32, out16, lay, p):
    """Dequantize flat codes into a flat ``out32`` or ``out16``.

    Args:
        x8, x16, x32: the codes, in the one of these that matches their
            width (packed or 8-bit, 16-bit, int32); the others are empty.
        table: float32 value of each code (READ_TABLE, packed reads).
        scale: flat float32 scales; zp: flat float32 zero points (0 if
            none), or the bits of int32 zero points for int32 codes.
        out32, out16: the float32 result, or the bits of a float16/bfloat16
            one; the other is empty.
        lay, p: layout and parameters (_params, the slots above; ``P_WIDE_OUT``
            is 0 for float32 results, else the 16-bit type's precision code).
    """
    zi = zp.view(np.int32)
    total, chunk = lay[L_N], lay[L_CHUNK]
    for c in prange((total + chunk - 1) // chunk):
        start = c * chunk
        _dequantize_chunk(x8, x16, x32, start, min(total, start + chunk), table, scale, zp, zi, out32, out16, lay, p)
