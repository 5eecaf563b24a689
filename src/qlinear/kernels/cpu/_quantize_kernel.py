"""The fused QuantizeLinear kernel (numba, parallel over chunks of ``x``).

``y = saturate(round(x / scale) + zero_point)`` in one pass. Each chunk is
walked run by run (a run: consecutive elements whose scale is one constant,
or steps with each element). float32 or int32 ``x`` in float32 precision,
the common case, takes each run as one tight loop from ``x`` straight to the
codes (:mod:`._quantize_runs`), for integer and float outputs alike, and
so does bfloat16 ``x`` in its own precision, and float16 ``x`` in its own
where runs are short (:func:`._quantize_runs.wide_runs`). The other
float16 and bfloat16 ``x`` or precisions go through stages a tile at a
time: each tile is decoded to float32, rounded to the precision, divided
by its scales, rounded again, then turned into integer codes (half to
even, NaN to 0, clamp) or float codes (zero point added and rounded to the
precision, NaN to the zero point where the type has none, clamp, bit-exact
encoding). The float32
holding every intermediate is exact: a float16 or bfloat16 quotient is the
float32 quotient rounded once (float32 has more than twice their
significand bits plus two, so that is the correctly rounded result).

Packed 2/4-bit outputs from float32 (or int32) ``x`` go straight into
their bytes where every run starts on a byte and is long, or a block of 32
(:func:`._quantize_packed.packed_runs`; the caller decides, by
:func:`._params.packed_runs_fit`), in a kernel of their own.
The rest, 6-bit codes among them, are computed a piece of 16K elements at
a time into a buffer of one code a byte, then packed (a piece owns whole
bytes; runs inside it do not).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from qlinear._builtins import min
from qlinear.kernels.cpu._encode import (
    K_NAN,
    K_NEG,
    K_OVF_AT,
    K_PMIN,
    K_POS,
    K_SIGNED_ABOVE,
    K_SIGNED_BELOW,
    K_STEP,
    K_UNIT,
    add_zero_point,
    float_code,
)
from qlinear.kernels.cpu._lines import store_fence
from qlinear.kernels.cpu._params import L_CHUNK, L_GATHER, L_N, MIN_CHUNK, PREC_BF16, PREC_F16, PREC_F32
from qlinear.kernels.cpu._quantize_packed import pack, packed_runs
from qlinear.kernels.cpu._quantize_runs import (
    float_runs,
    integer_code,
    integer_period_lines,
    integer_runs,
    integer_zero_point,
    wide_runs,
)
from qlinear.kernels.cpu._tiles import TILE, decode_wide, gather_scales, locate, next_run, round_to_precision

__all__ = ["quantize_kernel", "quantize_packed_kernel"]

# Slots of the integer parameter array ``p``.
# STREAM: whole lines of output by streaming stores (_lines). PERIOD, COUNT:
# the scale of element j is scale[(j // PERIOD) % COUNT] (PERIOD 0: not so
# simple), which lets integer codes stream whole lines over blocks.
# BYTE_RUNS: every run of a packed 2/4-bit output starts on a byte and is
# long or a block of 32, so the codes go straight into their bytes
# (_quantize_packed.packed_runs).
(
    P_DIRECT,
    P_FLOAT_OUT,
    P_XWIDE,
    P_PREC,
    P_QMIN,
    P_QMAX,
    P_MASK,
    P_HAS_ZP,
    P_NAN_TO_ZP,
    P_CLIP,
    P_PACKED_BITS,
    P_ZP_SIGN,
    P_STREAM,
    P_PERIOD,
    P_COUNT,
    P_BYTE_RUNS,
) = range(16)
P_LEN = 16
# Slots of the float parameter array ``f``.
F_LIMIT = 0
F_LEN = 1

_jit = njit(cache=True, nogil=True, error_model="numpy")


@_jit
def _load(x, n, tile, xwide):
    """float32 ``tile[:n]`` = ``x[:n]``: float32/int32 values, or float16/bfloat16 bits."""
    if xwide == PREC_F32:
        for k in range(n):
            tile[k] = np.float32(x[k])
    else:
        decode_wide(x, n, tile, xwide)


@_jit
def _divide(tile, n, scale, step):
    """``tile[:n] /= scale`` in float32, in place.

    In place on purpose: the same loop reading another array (or this one
    under another name) measured 16x slower, LLVM leaving it scalar.
    """
    if step:
        for k in range(n):
            tile[k] = tile[k] / scale[k]
    else:
        s = scale[0]
        for k in range(n):
            tile[k] = tile[k] / s


@_jit
def _to_integer(tile, n, zp, step, dst, p):
    """Integer codes of the quotients ``tile[:n]``."""
    qmin, qmax = np.float32(p[P_QMIN]), np.float32(p[P_QMAX])
    mask = np.int32(p[P_MASK])
    # Two loops, not zp[k * step]: an index of unknown stride keeps LLVM from vectorizing.
    if step:
        for k in range(n):
            dst[k] = integer_code(tile[k], zp[k], qmin, qmax, mask)
    else:
        z = zp[0]
        for k in range(n):
            dst[k] = integer_code(tile[k], z, qmin, qmax, mask)


@_jit
def _to_float(tile, n, zp, step, dst, p, float_args):
    """Float codes: ``q + zp`` (if a zero point was given) rounded to the precision, then :func:`float_code` of that.

    ``float_code`` takes the sum as it is (no zero point of its own) and
    the zero point only for NaN (types without NaN), then clamps and
    encodes, as on the direct path; ``float_args`` is :func:`_code_args`'
    ``(has_zp, nan_to_zp, cap, k)``, its ``has_zp`` unused (``p`` says).
    """
    prec = p[P_PREC]
    _, nan_to_zp, cap, k = float_args
    # Two loops each, not zp[t * step]: an index of unknown stride keeps LLVM from vectorizing.
    if p[P_HAS_ZP]:
        if step:
            for t in range(n):
                tile[t] = add_zero_point(tile[t], zp[t])
        else:
            for t in range(n):
                tile[t] = add_zero_point(tile[t], zp[0])
        if prec != PREC_F32:
            round_to_precision(tile, n, prec)
    if step:
        for t in range(n):
            dst[t] = float_code(tile[t], zp[t], False, nan_to_zp, cap, k)
    else:
        z = zp[0]
        for t in range(n):
            dst[t] = float_code(tile[t], z, False, nan_to_zp, cap, k)


@_jit
def _quantize_tile(x, n, scale, zp, step, dst, tile, p, float_args):
    """Quantize one run of at most a tile: ``x``, ``dst`` and (when ``step``) ``scale``, ``zp`` start at its first element."""
    prec = p[P_PREC]
    _load(x, n, tile, p[P_XWIDE])
    if prec != PREC_F32:
        round_to_precision(tile, n, prec)
    _divide(tile, n, scale, step)
    if prec != PREC_F32:
        round_to_precision(tile, n, prec)
    if p[P_FLOAT_OUT]:
        _to_float(tile, n, zp, step, dst, p, float_args)
    else:
        _to_integer(tile, n, zp, step, dst, p)


@_jit
def _staged_runs(x, start, end, scale, zp, ztab, dst, d0, lay, p, float_args):
    """Codes of ``x[start:end]`` into ``dst[start - d0:]``, a tile at a time through the stages."""
    tile = np.empty(TILE, np.float32)
    zp_values = np.empty(TILE, np.float32)
    float_out, sign = p[P_FLOAT_OUT], np.float32(p[P_ZP_SIGN])
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
        for k in range(run_zp.size):
            zp_values[k] = ztab[run_zp[k]] if float_out else integer_zero_point(run_zp[k], sign)
        _quantize_tile(x[j : j + m], m, run_scale, zp_values, step, dst[j - d0 : j - d0 + m], tile, p, float_args)
        j += m


@_jit
def _code_args(p, f, fk):
    """The run loops' arguments for integer codes, ``(qmin, qmax, mask, sign)``, and for float codes, ``(has_zp, nan_to_zp, cap, k)``."""
    # A clamp to the limit and the overflow clamp are one clamp of |v|.
    cap = min(np.float32(f[F_LIMIT] if p[P_CLIP] else np.inf), fk[K_OVF_AT])
    k = (fk[K_PMIN], fk[K_UNIT], fk[K_STEP], fk[K_NAN], fk[K_NEG], fk[K_POS], fk[K_SIGNED_ABOVE], fk[K_SIGNED_BELOW])
    integer_args = (np.float32(p[P_QMIN]), np.float32(p[P_QMAX]), np.int32(p[P_MASK]), np.float32(p[P_ZP_SIGN]))
    return integer_args, (p[P_HAS_ZP] != 0, p[P_NAN_TO_ZP] != 0, cap, k)


@_jit
def _codes(x, start, end, scale, zp, ztab, dst, d0, lay, p, f, fk, stream):
    """One code a slot: elements ``start .. end`` into ``dst[start - d0:]``, by the loop that fits the call."""
    (qmin, qmax, mask, sign), float_args = _code_args(p, f, fk)
    has_zp, nan_to_zp, cap, k = float_args
    if p[P_DIRECT] and not p[P_FLOAT_OUT]:
        if stream and p[P_PERIOD] > 0:
            integer_period_lines(x, start, end, p[P_PERIOD], p[P_COUNT], scale, zp, dst, qmin, qmax, mask, sign)
        else:
            integer_runs(x, start, end, scale, zp, dst, d0, lay, qmin, qmax, mask, sign, stream)
    elif p[P_DIRECT]:
        float_runs(x, start, end, scale, zp, ztab, dst, d0, lay, has_zp, nan_to_zp, cap, k, stream)
    elif p[P_XWIDE] == p[P_PREC] and (p[P_XWIDE] == PREC_BF16 or lay[L_GATHER]):
        # bfloat16 x in its own precision straight to the codes, as float32 x
        # goes; float16 x so where runs are short (the stages would build a
        # scale a code). On long runs float16's stages measured faster
        # (paired, per tensor: int8 1.14x, float8e4m3fn 1.6x slower fused;
        # blocks of 32 along the last axis: 0.34x and 0.51x).
        float_out = p[P_FLOAT_OUT] != 0
        if p[P_XWIDE] == PREC_F16:
            wide_runs(x, start, end, scale, zp, ztab, dst, d0, lay, True, float_out, qmin, qmax, mask, sign, float_args)
        else:
            wide_runs(x, start, end, scale, zp, ztab, dst, d0, lay, False, float_out, qmin, qmax, mask, sign, float_args)
    else:
        _staged_runs(x, start, end, scale, zp, ztab, dst, d0, lay, p, float_args)


@_jit
def _packed_chunk(x, start, end, scale, zp, ztab, out, lay, p, f, fk):
    """Packed bytes of elements ``start .. end`` (``start`` on a byte)."""
    bits = p[P_PACKED_BITS]
    if p[P_BYTE_RUNS]:
        (qmin, qmax, mask, sign), float_args = _code_args(p, f, fk)
        packed_runs(x, start, end, scale, zp, ztab, out, lay, bits, p[P_FLOAT_OUT] != 0, qmin, qmax, mask, sign, float_args)
    else:
        # Other packed outputs collect codes a piece at a time (a piece owns
        # whole bytes, runs inside it do not), then pack them. Pieces of the
        # smallest task size keep the buffer a small fraction of the output.
        piece = min(MIN_CHUNK, end - start)
        codes = np.empty(piece, out.dtype)
        for j in range(start, end, piece):
            n = min(piece, end - j)
            _codes(x, j, j + n, scale, zp, ztab, codes, j, lay, p, f, fk, False)
            pack(codes, n, out, j, bits)


@njit(cache=True, parallel=True, error_model="numpy")
def quantize_kernel(x, scale, zp, ztab, out, lay, p, f, fk):
    """Quantize flat ``x`` into ``out``, one code a slot.

    Args:
        x: flat float32 or int32 values, or uint16 float16/bfloat16 bits.
        scale: flat float32 scales in the plan's precision.
        zp: flat zero point codes, of ``out``'s dtype (all 0 when the call
            had none).
        ztab: float32 value of each byte, for float zero points.
        out: flat uint8/uint16 codes.
        lay, p, f: layout and parameters (_params, the slots above).
        fk: float32 constants of float_code (_encode), for float outputs
            on every path.
    """
    total, chunk = lay[L_N], lay[L_CHUNK]
    stream = p[P_STREAM] != 0
    for c in prange((total + chunk - 1) // chunk):
        start = c * chunk
        _codes(x, start, min(total, start + chunk), scale, zp, ztab, out, 0, lay, p, f, fk, stream)
        if stream:
            store_fence()


@njit(cache=True, parallel=True, error_model="numpy")
def quantize_packed_kernel(x, scale, zp, ztab, out, lay, p, f, fk):
    """Quantize flat ``x`` into the packed 2/4/6-bit bytes ``out`` (``P_PACKED_BITS``), arguments as :func:`quantize_kernel`'s.

    A kernel of its own: numba compiles every branch of a kernel for each
    specialization, and the packed loops would otherwise add seconds to the
    first compile of every 8/16-bit QuantizeLinear.
    """
    total, chunk = lay[L_N], lay[L_CHUNK]
    for c in prange((total + chunk - 1) // chunk):
        start = c * chunk
        _packed_chunk(x, start, min(total, start + chunk), scale, zp, ztab, out, lay, p, f, fk)
