"""8-bit QuantizeLinear lines that multiply by the scale's reciprocal, bit-exact with dividing.

A vector division is the slowest instruction of QuantizeLinear: on one
core of an Intel Xeon (Emerald Rapids), a loop of 16M elements to uint8
in cache takes 3.7 ms dividing and 2.0 ms multiplying, so 8-bit
per-tensor QuantizeLinear ran at the divider's pace, 1.2-1.4x ONNX
Runtime's time (which divides too, with fewer instructions around it). A
multiplication by ``r = fl(1 / s)`` is cheap, but ``fl(x * r)`` is not
always ``fl(x / s)``; these lines use it only where the difference cannot
change the code, and divide the whole line otherwise.

Why that is exact. With ``r`` and ``s`` normal, ``x * r`` rounded differs
from ``x / s`` rounded by at most about ``3u |x / s|`` (``u = 2**-24``: one
rounding in ``r``, one in the product, one in the quotient). The code is
``rint(clamp(q, lo, hi)) + z`` with ``lo = qmin - z`` and ``hi = qmax - z``
integers and ``M = max(|lo|, |hi|) + 1`` at most 1024 here (8-bit codes;
:func:`reciprocal_fits`). For ``c = clamp(fl(x * r), lo, hi)``:

- inside the bounds, ``rint`` gives the same integer for the product and
  the quotient unless a half-integer lies within ``3u M`` of ``c``; the
  line checks that no lane is within ``M * 2**-20`` (five times that) of
  one, so ties and near-ties all go to the division;
- at a bound, the quotient is past the bound less ``3u M``, far under a
  half, so it rounds and clamps to the same bound;
- a NaN lane fails the check, and the division gives it the zero point.

The check costs a VREDUCEPS (``c - rint(c)``; a conversion back and a
subtraction without AVX-512DQ), an absolute value and a compare a
register. Lanes near a half-integer are rare (``2 * M * 2**-20`` of
evenly spread quotients: about 3% of 64-code lines of uint8 codes), and a
line with one costs a division line more. With AVX-512BW the 64 codes
are narrowed by two rounds of saturating packs and one permute (4
instructions, against 4 narrowing moves and 3 inserts).
"""

from __future__ import annotations

import functools

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from qlinear._builtins import max
from qlinear.kernels.cpu._lines import (
    LINE,
    _data,
    _integer_codes,
    _load_values,
    _rint,
    _splat,
    _store_line,
)
from qlinear.kernels.cpu._llvm import call_intrinsic, host_has

__all__ = ["NEAR_HALF", "avx512_bw_dq", "quantize_reciprocal_line", "reciprocal_line_args"]

# A lane whose clamped product lies within M * NEAR_HALF of a half-integer
# goes to the division (M: the largest clamped magnitude, plus one).
NEAR_HALF = 2.0**-20
# The largest M the check is worth making for: near-ties grow with M, and
# at 16-bit ranges most lines would have one.
_LARGEST_M = 1024
_SMALLEST_NORMAL = np.float32(np.finfo(np.float32).tiny)


@njit(cache=True, nogil=True, error_model="numpy")
def reciprocal_line_args(s, z, qmin, qmax):
    """``(fits, r, limit)`` for lines of codes with scale ``s`` and zero point ``z`` (float32).

    ``fits``: the lines may multiply by ``r = fl(1 / s)``: ``s`` and ``r``
    normal and finite (a subnormal reciprocal has fewer bits, and the error
    bound fails), and ``M`` at most :data:`_LARGEST_M`. ``limit``: the
    largest ``|c - rint(c)|`` a lane may have and keep its product,
    ``0.5 - M * NEAR_HALF``.
    """
    r = np.float32(1) / s
    m = max(abs(qmin - z), abs(qmax - z)) + np.float32(1)
    fits = _SMALLEST_NORMAL <= abs(s) < np.inf and _SMALLEST_NORMAL <= abs(r) < np.inf and m <= _LARGEST_M
    return fits, r, np.float32(0.5 - m * NEAR_HALF)


@functools.cache
def avx512_bw_dq() -> bool:
    """Whether the lines may use AVX-512BW's packs and AVX-512DQ's VREDUCEPS, decided once a process (:func:`._lines.host_has`)."""
    return host_has("avx512bw", "avx512dq")


def _quarters(builder, v):
    """The four 16-lane quarters of a 64-lane vector."""
    undefined = ir.Constant(v.type, ir.Undefined)
    index = ir.VectorType(ir.IntType(32), 16)
    return [builder.shuffle_vector(v, undefined, ir.Constant(index, list(range(16 * k, 16 * k + 16)))) for k in range(4)]


def _whole(builder, quarters):
    """The 64-lane vector of four 16-lane ones, in order."""
    index = ir.VectorType(ir.IntType(32), 32)
    low = builder.shuffle_vector(quarters[0], quarters[1], ir.Constant(index, list(range(32))))
    high = builder.shuffle_vector(quarters[2], quarters[3], ir.Constant(index, list(range(32))))
    return builder.shuffle_vector(low, high, ir.Constant(ir.VectorType(ir.IntType(32), 64), list(range(64))))


def _fraction(builder, c, whole, avx512):
    """``c - rint(c)`` for the float32 lanes ``c`` (exact), ``whole`` their int32 ``rint``: one VREDUCEPS a register with AVX-512DQ."""
    if not avx512:
        return builder.fsub(c, builder.sitofp(whole, c.type))
    v16 = ir.VectorType(ir.FloatType(), 16)
    # imm 8: keep no fraction bits, round to nearest even, no precision exception; 4: the current rounding (no SAE).
    reduced = [
        call_intrinsic(
            builder,
            "llvm.x86.avx512.mask.reduce.ps.512",
            v16,
            [
                q,
                ir.Constant(ir.IntType(32), 8),
                ir.Constant(v16, ir.Undefined),
                ir.Constant(ir.IntType(16), -1),
                ir.Constant(ir.IntType(32), 4),
            ],
        )
        for q in _quarters(builder, c)
    ]
    return _whole(builder, reduced)


def _signed_bytes(builder, codes, avx512):
    """The 64 int32 lanes ``codes`` (each in -128..127) as 64 bytes: saturating packs and one dword permute with AVX-512BW."""
    if not avx512:
        return builder.trunc(codes, ir.VectorType(ir.IntType(8), 64))
    v16i32, v32i16, v64i8 = (ir.VectorType(ir.IntType(w), n) for w, n in ((32, 16), (16, 32), (8, 64)))
    a, b, c, d = _quarters(builder, codes)
    ab = call_intrinsic(builder, "llvm.x86.avx512.packssdw.512", v32i16, [a, b])
    cd = call_intrinsic(builder, "llvm.x86.avx512.packssdw.512", v32i16, [c, d])
    packed = builder.bitcast(call_intrinsic(builder, "llvm.x86.avx512.packsswb.512", v64i8, [ab, cd]), v16i32)
    # Packs work within 128-bit lanes: dword 4k + m holds codes 4k..4k+3 of
    # source m (a, b, c, d); in order, source m's codes 4k.. go to dword 4m + k.
    order = ir.Constant(ir.VectorType(ir.IntType(32), 16), [4 * (p % 4) + p // 4 for p in range(16)])
    return builder.bitcast(builder.shuffle_vector(packed, ir.Constant(v16i32, ir.Undefined), order), v64i8)


def _reduce_or(builder, bits):
    """True when any lane of the i1 vector ``bits`` is."""
    return call_intrinsic(builder, f"llvm.vector.reduce.or.v{bits.type.count}i1", ir.IntType(1), [bits])


@intrinsic
def quantize_reciprocal_line(typingctx, x, xj, dst, dj, s, r, z, limit, qmin, qmax, nontemporal):
    """``dst[dj:]``'s line of codes = integer_code(x[xj:] / s, z, qmin, qmax, mask), by ``x * r`` where that is exact.

    ``r`` and ``limit`` are :func:`reciprocal_line_args`', for a scale that
    fits; ``dst + dj`` is 64-byte aligned;
    ``nontemporal`` (a literal) stores by streaming.
    """
    # 16-bit codes type too, so callers compile for both; their ranges never fit.
    if not (isinstance(x, types.Array) and isinstance(dst, types.Array)) or dst.dtype.bitwidth not in (8, 16):
        return None
    if not isinstance(nontemporal, types.BooleanLiteral):
        return None
    streaming = nontemporal.literal_value
    avx512 = avx512_bw_dq()
    bits = dst.dtype.bitwidth
    lanes = LINE * 8 // bits
    x_is_int = isinstance(x.dtype, types.Integer)
    f = types.float32
    sig = types.void(x, types.intp, dst, types.intp, f, f, f, f, f, f, nontemporal)

    def codegen(context, builder, signature, args):
        xs, xj_, ds, dj_, s_, r_, z_, limit_, lo_, hi_, _ = args
        f32 = ir.VectorType(ir.FloatType(), lanes)
        i32 = ir.VectorType(ir.IntType(32), lanes)
        codes_type = ir.VectorType(ir.IntType(bits), lanes)
        dst_data = _data(context, builder, signature.args[2], ds)
        v = _load_values(builder, _data(context, builder, signature.args[0], xs), xj_, lanes, x_is_int, ask_ahead=True)
        z = _splat(builder, z_, f32)
        low, high = builder.fsub(_splat(builder, lo_, f32), z), builder.fsub(_splat(builder, hi_, f32), z)
        q = builder.fmul(v, _splat(builder, r_, f32))
        # Clamped with NaN kept (a NaN lane must fail the check below and be divided).
        c = builder.select(builder.fcmp_ordered("<", q, low), low, q)
        c = builder.select(builder.fcmp_ordered(">", c, high), high, c)
        whole = builder.fptosi(_rint(builder, c), i32)
        # c - rint(c) is exact (c and its integer are within a factor of two, or the integer is 0).
        away = _fraction(builder, c, whole, avx512 and lanes == 64)  # 16-bit lines (32 lanes) never take the product
        distance = call_intrinsic(builder, f"llvm.fabs.v{lanes}f32", f32, [away])
        near = builder.fcmp_unordered(">=", distance, _splat(builder, limit_, f32))
        with builder.if_else(_reduce_or(builder, near), likely=False) as (divide, multiplied):
            with divide:
                exact = _integer_codes(
                    builder, v, _splat(builder, s_, f32), z, lo_, hi_, ir.Constant(ir.IntType(32), (1 << bits) - 1)
                )
                _store_line(builder, builder.trunc(exact, codes_type), dst_data, dj_, streaming)
            with multiplied:
                codes = builder.add(whole, builder.fptosi(z, i32))
                if bits == 8:
                    # Unsigned codes go through the signed packs 128 lower, their top bit flipped back after.
                    flip = builder.select(
                        builder.fcmp_ordered("<", lo_, ir.Constant(ir.FloatType(), 0)),
                        ir.Constant(ir.IntType(32), 0),
                        ir.Constant(ir.IntType(32), 128),
                    )
                    packed = _signed_bytes(builder, builder.sub(codes, _splat(builder, flip, i32)), avx512)
                    out = builder.xor(packed, _splat(builder, builder.trunc(flip, ir.IntType(8)), codes_type))
                else:
                    out = builder.trunc(codes, codes_type)
                _store_line(builder, out, dst_data, dj_, streaming)
        return context.get_dummy_value()

    return sig, codegen
