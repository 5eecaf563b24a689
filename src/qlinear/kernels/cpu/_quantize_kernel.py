"""The fused QuantizeLinear kernel (numba, parallel over chunks of ``x``).

``y = saturate(round(x / scale) + zero_point)`` in one pass: each tile of
``x`` is decoded to float32, rounded to the plan's precision, divided by
its scales, rounded again, then turned into integer codes (half to even,
NaN to 0, clamp) or float codes (zero point added in IEEE arithmetic, NaN to
the zero point where the type has none, clamp, bit-exact encoding). The
float32 holding every intermediate is exact: a float16 or bfloat16 quotient
is the float32 quotient rounded once (float32 has more than twice their
significand bits plus two, so that is the correctly rounded result).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from qlinear.kernels.cpu._params import L_CHUNK, L_GATHER, L_N, PREC_F32
from qlinear.kernels.cpu._tiles import TILE, decode_wide, encode, gather_scales, locate, next_run, pack_codes, round_to_precision

__all__ = ["quantize_kernel"]

# Slots of the integer parameter array ``p``.
(P_FLOAT_OUT, P_XWIDE, P_PREC, P_QMIN, P_QMAX, P_MASK, P_HAS_ZP, P_NAN_TO_ZP, P_CLIP, P_PACKED_BITS) = range(10)
P_LEN = 10
# Slots of the float parameter array ``f``.
F_LIMIT, F_SUBMUL_OUT, F_SUBMUL_PREC = range(3)
F_LEN = 3

_jit = njit(cache=True, nogil=True, error_model="numpy")


# Stages take views that start at the run's first element: with offsets
# folded into the views, indices are plain loop counters and LLVM vectorizes.


@_jit
def _load(x, n, tile, xwide):
    """float32 ``tile[:n]`` = ``x[:n]``: float32/int32 values, or float16/bfloat16 bits."""
    if xwide == PREC_F32:
        for k in range(n):
            tile[k] = np.float32(x[k])
    else:
        decode_wide(x, n, tile, xwide)


@_jit
def _divide(src, n, tile, scale, step):
    """``tile[:n] = src[:n] / scale`` in float32 (``src`` may be ``tile``)."""
    if step:
        for k in range(n):
            tile[k] = np.float32(src[k]) / scale[k]
    else:
        s = scale[0]
        for k in range(n):
            tile[k] = np.float32(src[k]) / s


@_jit
def _integer_code(q, z, qmin, qmax, mask):
    """``clip(rint(q) + z, qmin, qmax)``, NaN -> z, as a masked integer code.

    float32 is enough: a rounded quotient and a zero point below 2**16 add
    exactly unless the sum is far outside every integer range, where the
    clamp gives the same answer either way. ``min``/``max`` and int32
    arithmetic keep the loops that call this in full-width vectors.
    """
    r = np.rint(q)
    v = (np.float32(0) if r != r else r) + z
    return np.int32(min(max(v, qmin), qmax)) & mask


@_jit
def _to_integer(src, n, scale, zp, step, dst, p):
    """Integer codes of ``src[:n] / scale`` (``scale`` all ones when already divided)."""
    qmin, qmax = np.float32(p[P_QMIN]), np.float32(p[P_QMAX])
    mask = np.int32(p[P_MASK])
    if step:
        for k in range(n):
            dst[k] = _integer_code(np.float32(src[k]) / scale[k], zp[k], qmin, qmax, mask)
    else:
        s, z = scale[0], zp[0]
        for k in range(n):
            dst[k] = _integer_code(np.float32(src[k]) / s, z, qmin, qmax, mask)


@_jit
def _integer_runs(x, start, end, scale, zp, dst, lay, p):
    """Integer codes of ``x[start:end]`` into ``dst`` (which starts at ``start``), one run at a time.

    The common case (float32 or int32 ``x``, float32 precision, integer
    output) needs no tile, so runs are taken whole however short: a block of
    32 loads its scale once and is one tight loop. The loops are written out
    here rather than calling ``_to_integer``: a call per 32-element run
    (passing four array views) costs more than the run itself.
    """
    qmin, qmax = np.float32(p[P_QMIN]), np.float32(p[P_QMAX])
    mask = np.int32(p[P_MASK])
    o, d, i, b = locate(start, lay)
    j = start
    while j < end:
        n, sidx, step, o, d, i, b = next_run(o, d, i, b, j, end, lay)
        src, out = x[j:j + n], dst[j - start:j - start + n]
        if step:
            run_scale, run_zp = scale[sidx:sidx + n], zp[sidx:sidx + n]
            for k in range(n):
                out[k] = _integer_code(np.float32(src[k]) / run_scale[k], run_zp[k], qmin, qmax, mask)
        else:
            s, z = scale[sidx], zp[sidx]
            for k in range(n):
                out[k] = _integer_code(np.float32(src[k]) / s, z, qmin, qmax, mask)
        j += n


@_jit
def _to_float(tile, codes, n, zp, step, dst, p, f, e_out, e_prec):
    """Float codes: ``q + zp`` (if a zero point was given), NaN -> zp, clamp, encode."""
    prec = p[P_PREC]
    if p[P_HAS_ZP]:
        if step:
            for k in range(n):
                tile[k] = tile[k] + zp[k]
        else:
            z = zp[0]
            for k in range(n):
                tile[k] = tile[k] + z
        if prec != PREC_F32:
            round_to_precision(tile, codes, n, prec, e_prec, f[F_SUBMUL_PREC])
    if p[P_NAN_TO_ZP]:
        for k in range(n):
            if tile[k] != tile[k]:
                tile[k] = zp[k * step]
    if p[P_CLIP]:
        lim = np.float32(f[F_LIMIT])
        for k in range(n):
            v = tile[k]
            tile[k] = lim if v > lim else (-lim if v < -lim else v)
    encode(tile, n, dst, e_out, f[F_SUBMUL_OUT])


@_jit
def _quantize_run(x, n, scale, zp, step, dst, tile, codes, ones, p, f, e_out, e_prec):
    """Quantize one run: ``x``, ``dst`` and (when ``step``) ``scale``, ``zp`` start at its first element."""
    prec = p[P_PREC]
    if prec == PREC_F32 and p[P_XWIDE] == PREC_F32:
        _divide(x, n, tile, scale, step)
    else:
        _load(x, n, tile, p[P_XWIDE])
        if prec != PREC_F32:
            round_to_precision(tile, codes, n, prec, e_prec, f[F_SUBMUL_PREC])
        _divide(tile, n, tile, scale, step)
        if prec != PREC_F32:
            round_to_precision(tile, codes, n, prec, e_prec, f[F_SUBMUL_PREC])
    if p[P_FLOAT_OUT]:
        _to_float(tile, codes, n, zp, step, dst, p, f, e_out, e_prec)
    else:
        _to_integer(tile, n, ones, zp, step, dst, p)


@_jit
def _staged_runs(x, start, end, scale, zp, dst, lay, p, f, e_out, e_prec):
    """Codes of ``x[start:end]`` into ``dst`` (which starts at ``start``), a tile at a time through the stages."""
    tile = np.empty(TILE, np.float32)
    codes = np.empty(TILE, np.int64)
    ones = np.ones(TILE, np.float32)
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
        _quantize_run(x[j:j + m], m, run_scale, run_zp, step, dst[j - start:j - start + m], tile, codes, ones,
                      p, f, e_out, e_prec)
        j += m


@_jit
def _quantize_chunk(x, start, end, scale, zp, out, lay, p, f, e_out, e_prec):
    bits = p[P_PACKED_BITS]
    # Packed outputs collect the chunk's codes first: the chunk owns whole
    # bytes, runs inside it do not.
    dst = np.empty(end - start, out.dtype) if bits else out[start:end]
    if p[P_PREC] == PREC_F32 and p[P_XWIDE] == PREC_F32 and not p[P_FLOAT_OUT]:
        _integer_runs(x, start, end, scale, zp, dst, lay, p)
    else:
        _staged_runs(x, start, end, scale, zp, dst, lay, p, f, e_out, e_prec)
    if bits:
        pack_codes(dst, end - start, out, start, bits)


@njit(cache=True, parallel=True, error_model="numpy")
def quantize_kernel(x, scale, zp, out, lay, p, f, e_out, e_prec):
    """Quantize flat ``x`` into ``out`` (one code per element, or packed bytes).

    Args:
        x: flat float32 or int32 values, or uint16 float16/bfloat16 bits.
        scale, zp: flat float32 scales and zero points in the plan's
            precision (zero points all 0 when the call had none).
        out: flat uint8/uint16 codes, or packed uint8 bytes.
        lay, p, f, e_out, e_prec: layout, parameters, encodings (_params).
    """
    total, chunk = lay[L_N], lay[L_CHUNK]
    for c in prange((total + chunk - 1) // chunk):
        start = c * chunk
        _quantize_chunk(x, start, min(total, start + chunk), scale, zp, out, lay, p, f, e_out, e_prec)
