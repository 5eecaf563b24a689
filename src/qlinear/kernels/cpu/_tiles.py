"""Numba building blocks shared by the fused kernels.

A parallel task takes a chunk of ``x`` in flat order, splits it into runs
where the scale is either constant or steps with each element, and pushes
each run through the conversion stages one small tile at a time: the tile
stays in L1, so the chunk is read and written once and no array the size of
``x`` is ever allocated. Each stage is a simple loop with its branches
outside, so LLVM vectorizes it.

No fastmath: every operation must round exactly as numpy does. A stage's
float16 and bfloat16 loops repeat each other's shape on purpose: one loop
a case, with the branch outside, is what lets each vectorize.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from qlinear._builtins import min
from qlinear.kernels.cpu._packed_lines import pack_sextets
from qlinear.kernels.cpu._params import (
    L_B,
    L_D,
    L_I,
    L_SB,
    L_SI,
    L_SO,
    PREC_F16,
)

__all__ = [
    "TILE",
    "bfloat_value",
    "decode_wide",
    "encode_wide",
    "gather_scales",
    "half_value",
    "half_value_by_bits",
    "locate",
    "next_run",
    "pack_codes",
    "round_bfloat",
    "round_half",
    "round_half_by_bits",
    "round_to_precision",
]

# Elements per tile: 4 KiB of float32, well inside L1.
TILE = 1024

_jit = njit(cache=True, nogil=True, error_model="numpy")


@_jit
def locate(j, lay):
    """``(o, d, i, b)``: where flat index ``j`` lies in the (O, D, I) view, and its block."""
    d_len, i_len = lay[L_D], lay[L_I]
    di = d_len * i_len
    o = j // di
    rem = j - o * di
    d = rem // i_len
    i = rem - d * i_len
    return o, d, i, d // lay[L_B]


@_jit
def next_run(o, d, i, b, j, end, lay):
    """The run at ``(o, d, i, b)`` and the position after it, without a division.

    Returns ``(length, scale index, step, o, d, i, b)``; ``step`` is 0 when
    the scale is constant over the run and 1 when it advances with each
    element. Runs never cross ``end``; the position is only meaningful when
    the run was not cut there.
    """
    d_len, i_len, block = lay[L_D], lay[L_I], lay[L_B]
    if lay[L_SI] == 0:
        # The whole rest of block b (every i of each d in it) shares one scale.
        d_end = min(d_len, (b + 1) * block)
        n = min((d_end - d) * i_len - i, end - j)
        sidx, step = o * lay[L_SO] + b * lay[L_SB], 0
        d, i, b = d_end, 0, b + 1
    else:
        # The rest of row (o, d); the scale follows i.
        n = min(i_len - i, end - j)
        sidx, step = o * lay[L_SO] + b * lay[L_SB] + i * lay[L_SI], 1
        d, i = d + 1, 0
        if d == (b + 1) * block:
            b += 1
    if d == d_len:
        o, d, b = o + 1, 0, 0
    return n, sidx, step, o, d, i, b


@_jit
def gather_scales(j, m, state, end, lay, scale, zp, scale_tile, zp_tile):
    """Copy the scale and zero point of elements ``j .. j+m`` into tiles.

    Used where runs are short (blocks of 32 on the last axis, short rows):
    one tile then spans many runs and is processed as one stepping run.
    ``state`` is ``(remaining, scale index, step, o, d, i, b)`` of the
    current run; the updated state is returned.
    """
    rem, sidx, step, o, d, i, b = state
    t = 0
    while t < m:
        if rem == 0:
            rem, sidx, step, o, d, i, b = next_run(o, d, i, b, j + t, end, lay)
        c = min(rem, m - t)
        if step:
            for k in range(c):
                scale_tile[t + k] = scale[sidx + k]
                zp_tile[t + k] = zp[sidx + k]
        else:
            s, z = scale[sidx], zp[sidx]
            for k in range(c):
                scale_tile[t + k] = s
                zp_tile[t + k] = z
        t += c
        rem -= c
        sidx += c * step
    return rem, sidx, step, o, d, i, b


# float16 and bfloat16 to and from float32 one element at a time, as LLVM
# instructions the loop vectorizer keeps at full width: the processor's
# half-precision conversions (vcvtph2ps, vcvtps2ph), fastest in the stages'
# simple loops, and the same in float32 and 32-bit integer arithmetic
# (``*_by_bits``) for the fused loops, which LLVM left scalar with the
# conversions in them. numba would widen its own integer arithmetic to 64
# bits.


@intrinsic
def half_value_by_bits(typingctx, h):
    """The float32 value of the float16 whose bits are the low 16 of ``h`` (exact; NaN payloads kept, as numpy's cast keeps them)."""
    if not isinstance(h, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        # In 32-bit lanes: the bits below the sign moved to float32's places
        # read, times 2**112, as the value (normal or subnormal, exactly);
        # all-ones exponents (infinity, NaN with its payload) take float32's.
        i32, f32 = ir.IntType(32), ir.FloatType()
        bits = args[0] if h.bitwidth == 16 else builder.trunc(args[0], ir.IntType(16))
        h32 = builder.zext(bits, i32)
        moved = builder.shl(builder.and_(h32, ir.Constant(i32, 0x7FFF)), ir.Constant(i32, 13))
        finite = builder.bitcast(builder.fmul(builder.bitcast(moved, f32), ir.Constant(f32, 2.0**112)), i32)
        special = builder.icmp_unsigned("==", builder.and_(h32, ir.Constant(i32, 0x7C00)), ir.Constant(i32, 0x7C00))
        magnitude = builder.select(special, builder.or_(moved, ir.Constant(i32, 0x7F800000)), finite)
        sign = builder.shl(builder.and_(h32, ir.Constant(i32, 0x8000)), ir.Constant(i32, 16))
        return builder.bitcast(builder.or_(magnitude, sign), f32)

    return types.float32(h), codegen


@intrinsic
def half_value(typingctx, h):
    """As :func:`half_value_by_bits`, by LLVM's conversion (vcvtph2ps): faster in the stages' simple loops, scalar in the fused ones."""
    if not isinstance(h, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        bits = args[0] if h.bitwidth == 16 else builder.trunc(args[0], ir.IntType(16))
        return builder.fpext(builder.bitcast(bits, ir.HalfType()), ir.FloatType())

    return types.float32(h), codegen


@intrinsic
def round_half(typingctx, v):
    """As :func:`round_half_by_bits`, by LLVM's conversions (vcvtps2ph, vcvtph2ps): faster in the stages' simple loops."""

    def codegen(context, builder, sig, args):
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.float32), codegen


@intrinsic
def bfloat_value(typingctx, h):
    """The float32 value of the bfloat16 whose bits are the low 16 of ``h``: those bits moved up (exact)."""
    if not isinstance(h, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        bits = args[0] if h.bitwidth == 16 else builder.trunc(args[0], ir.IntType(16))
        wide = builder.zext(bits, i32)
        return builder.bitcast(builder.shl(wide, ir.Constant(i32, 16)), ir.FloatType())

    return types.float32(h), codegen


@intrinsic
def round_half_by_bits(typingctx, v):
    """``v`` rounded to float16, half to even (past 65504 to infinity), as float32."""

    def codegen(context, builder, sig, args):
        # In float32 and 32-bit lanes, as _encode.float_code rounds: with E
        # the exponent of |v| (at least float16's smallest normal, -14),
        # rint(|v| * 2**(10 - E)) * 2**(E - 10), exact; past 65504 infinity.
        i32, f32 = ir.IntType(32), ir.FloatType()
        v_bits = builder.bitcast(args[0], i32)
        a_bits = builder.and_(v_bits, ir.Constant(i32, 0x7FFFFFFF))
        exponent = builder.and_(a_bits, ir.Constant(i32, 0x7F800000))
        smallest = ir.Constant(i32, (127 - 14) << 23)
        low = builder.select(builder.icmp_signed(">", exponent, smallest), exponent, smallest)  # bits of 2**E
        up = builder.bitcast(builder.sub(ir.Constant(i32, (264 << 23) - (1 << 32)), low), f32)  # 2**(10 - E), modulo 2**32
        down = builder.bitcast(builder.sub(low, ir.Constant(i32, 10 << 23)), f32)  # 2**(E - 10)
        rint = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32]), "llvm.rint.f32")
        r = builder.fmul(builder.call(rint, [builder.fmul(builder.bitcast(a_bits, f32), up)]), down)
        r = builder.select(builder.fcmp_ordered(">", r, ir.Constant(f32, 65504.0)), ir.Constant(f32, float("inf")), r)
        sign = builder.and_(v_bits, ir.Constant(i32, -0x80000000))
        return builder.bitcast(builder.or_(builder.bitcast(r, i32), sign), f32)

    return types.float32(types.float32), codegen


def _bfloat_rounded(builder, bits):
    """float32 ``bits`` (int32) plus half a bfloat16 unit less one plus the kept lowest bit: rounded half to even in the top 16 bits.

    A carry out of the significand moves to the next binade, and past the
    largest finite value to infinity; NaN's bits are left to the caller.
    """
    i32 = ir.IntType(32)
    odd = builder.and_(builder.lshr(bits, ir.Constant(i32, 16)), ir.Constant(i32, 1))
    return builder.add(builder.add(bits, ir.Constant(i32, 0x7FFF)), odd)


@intrinsic
def round_bfloat(typingctx, v):
    """``v`` rounded to bfloat16, half to even on its bits (past the largest to infinity), as float32; NaN unchanged."""

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        up = _bfloat_rounded(builder, builder.bitcast(args[0], i32))
        rounded = builder.bitcast(builder.and_(up, ir.Constant(i32, -65536)), ir.FloatType())
        nan = builder.fcmp_unordered("uno", args[0], args[0])
        return builder.select(nan, args[0], rounded)

    return types.float32(types.float32), codegen


@intrinsic
def _half_bits(typingctx, v):
    """The bits of ``v`` rounded to float16, half to even (NaN: sign, quiet bit and top payload bits, as numpy's cast keeps a quiet NaN's)."""

    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(types.float32), codegen


@intrinsic
def _bfloat_bits(typingctx, v):
    """The bits of ``v`` rounded to bfloat16, half to even; NaN becomes the quiet 0x7fc0 with its sign, as ml_dtypes casts."""

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        bits = builder.bitcast(args[0], i32)
        rounded = builder.lshr(_bfloat_rounded(builder, bits), ir.Constant(i32, 16))
        quiet = builder.or_(
            builder.and_(builder.lshr(bits, ir.Constant(i32, 16)), ir.Constant(i32, 0x8000)), ir.Constant(i32, 0x7FC0)
        )
        nan = builder.fcmp_unordered("uno", args[0], args[0])
        return builder.trunc(builder.select(nan, quiet, rounded), ir.IntType(16))

    return types.uint16(types.float32), codegen


@_jit
def encode_wide(tile, n, dst, prec):
    """``dst[:n]`` = float16 (``prec == PREC_F16``) or bfloat16 bits of float32 ``tile[:n]``, rounded half to even.

    For the results of arithmetic, whose NaNs are quiet: a float16 NaN then
    keeps its sign and top payload bits as numpy's cast does, a bfloat16
    one becomes ml_dtypes' 0x7fc0 with its sign.
    """
    if prec == PREC_F16:
        for k in range(n):
            dst[k] = _half_bits(tile[k])
    else:
        for k in range(n):
            dst[k] = _bfloat_bits(tile[k])


@_jit
def decode_wide(src, n, tile, prec):
    """float32 ``tile[:n]`` = float16 (``prec == PREC_F16``) or bfloat16 bits ``src[:n]``, exactly.

    A float16 NaN keeps its sign; a signaling one comes out quieted, which
    no later stage can tell (every NaN quotient gives the same code).
    """
    # np.uint16 is the bits' own type; the cast lets the branch compile for
    # the float32 x it is never taken with.
    if prec == PREC_F16:
        for k in range(n):
            tile[k] = half_value(np.uint16(src[k]))
    else:
        for k in range(n):
            tile[k] = bfloat_value(np.uint16(src[k]))


@_jit
def round_to_precision(tile, n, prec):
    """Round float32 ``tile[:n]`` to float16 (``prec == PREC_F16``) or bfloat16 in place, half to even.

    Past the largest finite value a magnitude rounds to infinity, as IEEE
    rounding does; NaN stays NaN (its payload, which no later stage reads,
    may differ from numpy's cast).
    """
    if prec == PREC_F16:
        for k in range(n):
            tile[k] = round_half(tile[k])
    else:
        for k in range(n):
            tile[k] = round_bfloat(tile[k])


@_jit
def pack_codes(codes, n, out, first, bits):
    """Pack ``codes[:n]`` (element ``first`` onward, ``first % 4 == 0``) into ONNX bytes.

    2- and 4-bit codes go several to a byte, lowest bits first; 6-bit codes
    go four to three bytes. Only the bytes the elements need are written.
    """
    if bits == 6:
        o0 = first // 4 * 3
        # 16 codes (12 bytes) a vector, then whole groups of four codes,
        # then the last group's codes and bytes alone.
        whole = n // 4
        vectors = n // 16
        for v in range(vectors):
            pack_sextets(codes, 16 * v, out, o0 + 12 * v)
        for g in range(4 * vectors, whole):
            c = 4 * g
            word = (
                np.int32(codes[c])
                | (np.int32(codes[c + 1]) << 6)
                | (np.int32(codes[c + 2]) << 12)
                | (np.int32(codes[c + 3]) << 18)
            )
            out[o0 + 3 * g] = word & 0xFF
            out[o0 + 3 * g + 1] = (word >> 8) & 0xFF
            out[o0 + 3 * g + 2] = word >> 16
        if n > 4 * whole:
            word = np.int32(0)
            for lane in range(n - 4 * whole):
                word |= np.int32(codes[4 * whole + lane]) << (6 * lane)
            for q in range(((n - 4 * whole) * 6 + 7) // 8):
                out[o0 + 3 * whole + q] = (word >> (8 * q)) & 0xFF
        return
    per = 8 // bits
    o0 = first // per
    full = n // per
    for byte in range(full):
        acc = np.uint32(0)
        for lane in range(per):
            acc |= np.uint32(codes[byte * per + lane]) << (bits * lane)
        out[o0 + byte] = acc
    if full * per < n:
        acc = np.uint32(0)
        for lane in range(n - full * per):
            acc |= np.uint32(codes[full * per + lane]) << (bits * lane)
        out[o0 + full] = acc
