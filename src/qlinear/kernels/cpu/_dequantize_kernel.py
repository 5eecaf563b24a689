"""The fused DequantizeLinear kernel (numba, parallel over chunks of ``x``).

``y = (x - zero_point) * scale`` in one pass: ``x`` is read as float32
(float8 bytes through a table of their values, packed 2/4/6-bit codes
straight from their bytes, 8/16/32-bit integers directly), the zero point
subtracted, the scale multiplied in float32, and the result written as
float32 or rounded to float16/bfloat16 bits. float32 results from bytes or
integers below 32 bits go straight from ``x`` to ``out`` a run at a time;
the rest go through a small tile.

Integer differences are exact as the reference wants: below 32 bits both
operands and their difference are exact in float32; int32 differences are
taken in float64 (exact) and rounded once to float32.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from qlinear.kernels.cpu._params import L_CHUNK, L_GATHER, L_N
from qlinear.kernels.cpu._tiles import TILE, encode, gather_scales, locate, next_run

__all__ = ["dequantize_kernel"]

# Slots of the integer parameter array ``p``.
(P_READ, P_BITS, P_SIGN_BIT, P_WIDE_OUT) = range(4)
P_LEN = 4
# How x is read (P_READ).
READ_TABLE, READ_PACKED, READ_INTEGER = range(3)

_jit = njit(cache=True, nogil=True, error_model="numpy")


# Stages take views that start at the run's first element (packed bytes
# excepted: they are addressed by bit position): indices are plain loop
# counters and LLVM vectorizes.


@_jit
def _load(x, j, n, tile, table, zp, step, p):
    """float32 ``tile[:n]`` = elements ``j .. j+n`` of ``x`` minus ``zp``."""
    read = p[P_READ]
    if read == READ_INTEGER:
        # Unsigned views of int16/int32: subtracting twice the sign bit
        # restores the signed value, then the difference is exact in float64.
        sign_bit = p[P_SIGN_BIT]
        for k in range(n):
            v = np.int64(x[k])
            v -= (v & sign_bit) << 1
            tile[k] = np.float32(np.float64(v) - zp[k * step])
        return
    if read == READ_TABLE:
        for k in range(n):
            tile[k] = table[x[k]]
    else:
        bits = p[P_BITS]
        mask = (1 << bits) - 1
        for k in range(n):
            pos = (j + k) * bits
            word = np.int64(x[pos >> 3]) | (np.int64(x[(pos + bits - 1) >> 3]) << 8)
            tile[k] = table[(word >> (pos & 7)) & mask]
    if step:
        for k in range(n):
            tile[k] = tile[k] - np.float32(zp[k])
    else:
        z = np.float32(zp[0])
        for k in range(n):
            tile[k] = tile[k] - z


@_jit
def _direct_runs(x, start, end, table, scale, zp, out, lay, p):
    """float32 ``out[start:end]`` from bytes (by the table) or integers below 32 bits, a run at a time.

    Integers are sign-extended in int32 (``(v ^ sign) - sign``). Below 32 bits the integer and its zero point are exact in float32 and so
    is their difference. The loops are written out per run: a call per
    32-element block would cost more than the block.
    """
    sign_bit = np.int32(p[P_SIGN_BIT])
    by_table = p[P_READ] == READ_TABLE
    o, d, i, b = locate(start, lay)
    j = start
    while j < end:
        n, sidx, step, o, d, i, b = next_run(o, d, i, b, j, end, lay)
        src, dst = x[j:j + n], out[j:j + n]
        if step:
            run_scale, run_zp = scale[sidx:sidx + n], zp[sidx:sidx + n]
            if by_table:
                for k in range(n):
                    dst[k] = (table[src[k]] - np.float32(run_zp[k])) * run_scale[k]
            else:
                for k in range(n):
                    dst[k] = (np.float32((np.int32(src[k]) ^ sign_bit) - sign_bit) - np.float32(run_zp[k])) * run_scale[k]
        else:
            s, z = scale[sidx], np.float32(zp[sidx])
            if by_table:
                for k in range(n):
                    dst[k] = (table[src[k]] - z) * s
            else:
                for k in range(n):
                    dst[k] = (np.float32((np.int32(src[k]) ^ sign_bit) - sign_bit) - z) * s
        j += n


@_jit
def _dequantize_run(x, j, n, table, scale, zp, step, out, tile, p, e_out, submul):
    """Dequantize one run; ``out`` and (when ``step``) ``scale``, ``zp`` start at element ``j``."""
    read = p[P_READ]
    _load(x if read == READ_PACKED else x[j:j + n], j, n, tile, table, zp, step, p)
    if step:
        for k in range(n):
            tile[k] = tile[k] * scale[k]
    else:
        s = scale[0]
        for k in range(n):
            tile[k] = tile[k] * s
    if p[P_WIDE_OUT]:
        encode(tile, n, out, e_out, submul)
    else:
        for k in range(n):
            out[k] = tile[k]


@_jit
def _dequantize_chunk(x, start, end, table, scale, zp, out, lay, p, e_out, submul):
    read = p[P_READ]
    if not p[P_WIDE_OUT] and (read == READ_TABLE or (read == READ_INTEGER and p[P_BITS] < 32)):
        _direct_runs(x, start, end, table, scale, zp, out, lay, p)
        return
    tile = np.empty(TILE, np.float32)
    gather = lay[L_GATHER]
    scale_tile = np.empty(TILE if gather else 0, scale.dtype)
    zp_tile = np.empty(TILE if gather else 0, zp.dtype)
    o, d, i, b = locate(start, lay)
    state = (0, 0, 0, o, d, i, b)
    j = start
    while j < end:
        if gather:
            m = min(TILE, end - j)
            state = gather_scales(j, m, state, end, lay, scale, zp, scale_tile, zp_tile)
            run_scale, run_zp, step = scale_tile[:m], zp_tile[:m], 1
        else:
            rem, sidx, step, o, d, i, b = state
            if rem == 0:
                rem, sidx, step, o, d, i, b = next_run(o, d, i, b, j, end, lay)
            m = min(rem, TILE)
            s_end = sidx + (m if step else 1)
            run_scale, run_zp = scale[sidx:s_end], zp[sidx:s_end]
            state = (rem - m, sidx + m * step, step, o, d, i, b)
        _dequantize_run(x, j, m, table, run_scale, run_zp, step, out[j:j + m], tile, p, e_out, submul)
        j += m


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_kernel(x, table, scale, zp, out, lay, p, e_out, submul):
    """Dequantize flat ``x`` into flat ``out``.

    Args:
        x: uint8 codes or packed bytes, or uint16/uint32 views of integers.
        table: float32 value of each code (READ_TABLE, READ_PACKED).
        scale: flat float32 scales; zp: flat float64 zero points (0 if none).
        out: float32 values, or uint16 float16/bfloat16 bits.
        lay, p, e_out, submul: layout, parameters, output encoding (_params).
    """
    total, chunk = lay[L_N], lay[L_CHUNK]
    for c in prange((total + chunk - 1) // chunk):
        start = c * chunk
        _dequantize_chunk(x, start, min(total, start + chunk), table, scale, zp, out, lay, p, e_out, submul)
