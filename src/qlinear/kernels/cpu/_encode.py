"""float8/float6/float4 codes of float32 values, one element at a time, in vector-friendly arithmetic.

:func:`float_code` is the fused QuantizeLinear loops' element function for
float outputs: zero point, NaN rule, clamp and the bit-exact encoding (round
half to even, ONNX's saturate and NaN/inf rules) of one float32 quotient,
with selects and no branches, so the loops that call it vectorize.

numba widens integer arithmetic on int32 to int64, which would halve the
vector width, so the encoding is computed in float32 wherever it can be:
with ``E = max(exponent of |v|, emin)`` (the exponent of the target's
smallest normal for smaller values), the code of ``|v|`` is

    (E - emin) * 2**m + rint(|v| * 2**(m - E))

(``m`` mantissa bits): the second term is the rounded significand, counted
in units of the target's spacing in that binade, and a rounding that carries
into the next binade gives that binade's first code. ``2**E`` and
``2**(m - E)`` come from the bits of ``v`` by masking and subtracting,
``rint`` rounds half to even, and every product and sum is exact. Magnitudes
at or past the first one that rounds above the largest finite code take the
overflow code, NaN the NaN code, and the sign bit is added last.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from qlinear._builtins import max
from qlinear.dtypes import ElementType
from qlinear.kernels.cpu._params import (
    E_M,
    E_MAXMAG,
    E_NANBASE,
    E_NANMASK,
    E_NANMIN,
    E_OVF,
    E_SIGNED_SPECIAL,
    E_SIGNED_ZERO,
    E_SIGNSHIFT,
    E_SUBLIM,
)

__all__ = [
    "FLOAT_CODE_LEN",
    "K_NAN",
    "K_NEG",
    "K_OVF_AT",
    "K_PMIN",
    "K_POS",
    "K_SIGNED_ABOVE",
    "K_SIGNED_BELOW",
    "K_STEP",
    "K_UNIT",
    "add_zero_point",
    "float_code",
    "float_code_constants",
    "integer_code",
    "integer_zero_point",
]

_jit = njit(cache=True, nogil=True, error_model="numpy")

# Slots of the constants array float_code_constants returns.
(K_OVF_AT, K_PMIN, K_UNIT, K_STEP, K_NAN, K_NEG, K_POS, K_SIGNED_ABOVE, K_SIGNED_BELOW) = range(9)
FLOAT_CODE_LEN = 9

_NEG_ZERO = np.float32(-0.0)  # q + -0.0 is q for every q, -0.0 and NaN included
_EXPONENT = 0x7F800000  # exponent field of a float32


@intrinsic
def _f32_bits(typingctx, v):
    """The bits of a float32 as an int32."""

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.int32(types.float32), codegen


@intrinsic
def _power_from_bits(typingctx, unit, low):
    """The float32 whose bits are ``unit - low`` modulo 2**32, ``unit`` a float32 holding a whole number below 2**32.

    The subtraction stays in 32 bits (numba would widen it to int64, and
    the vector loops with it); modulo 2**32 it has the bits the int64
    difference truncated would have.
    """

    def codegen(context, builder, sig, args):
        u = builder.fptoui(args[0], ir.IntType(32))
        return builder.bitcast(builder.sub(u, args[1]), ir.FloatType())

    return types.float32(types.float32, types.int32), codegen


@intrinsic
def _bits_f32(typingctx, b):
    """The float32 whose bits are the low 32 bits of an int64."""

    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.trunc(args[0], ir.IntType(32)), ir.FloatType())

    return types.float32(types.int64), codegen


def float_code_constants(t: ElementType, e: np.ndarray) -> np.ndarray | None:
    """float32 constants of :func:`float_code` for float type ``t`` with encoding slots ``e``.

    None where float_code does not compute the encoding: encodings that
    keep NaN payloads (float16's), and unsigned zeros without unsigned NaN
    or the reverse, which no quantized type has.
    """
    if e[E_NANMASK] or e[E_NANMIN] or e[E_SIGNED_ZERO] != e[E_SIGNED_SPECIAL]:
        return None
    m = int(e[E_M])
    emin_field = int(e[E_SUBLIM]) >> 23  # biased exponent of the smallest normal
    offset = emin_field << m  # (E - emin) * 2**m is (E + 127) * 2**m - offset
    if e[E_OVF] == e[E_MAXMAG]:
        # No infinity or NaN (float4, float6): overflow saturates.
        ovf_at = np.float32(t.max_finite)
    else:
        # The code after the largest finite one is the overflow code; the
        # first magnitude that rounds to it lies half a spacing above the
        # largest finite value, and is that midpoint itself when the tie goes
        # up, i.e. when the largest code is odd.
        if e[E_OVF] != e[E_MAXMAG] + 1:
            raise AssertionError(f"float_code_constants: {t.name}'s overflow code does not follow its largest")
        top = math.frexp(t.max_finite)[1] - 1
        mid = np.float32(t.max_finite + 2.0 ** (top - m - 1))
        ovf_at = mid if e[E_MAXMAG] & 1 else np.nextafter(mid, np.float32(np.inf))
    k = np.zeros(FLOAT_CODE_LEN, np.float32)
    k[K_OVF_AT] = ovf_at
    k[K_PMIN] = 2.0 ** (emin_field - 127)
    # Bits of 2**(m - E) are UNIT - bits of 2**E; (m + 254) << 23 is exact in float32.
    k[K_UNIT] = (m + 254) << 23
    k[K_STEP] = 2.0 ** (m - 23)
    k[K_NAN] = e[E_NANBASE] + offset
    k[K_NEG] = (1 << int(e[E_SIGNSHIFT])) - offset
    k[K_POS] = -offset
    if e[E_SIGNED_ZERO]:
        # Every code takes the sign bit, zero and NaN included.
        k[K_SIGNED_ABOVE], k[K_SIGNED_BELOW] = -np.inf, np.inf
    else:
        # fnuz: zero and the one NaN (the overflow code too) are unsigned;
        # only the codes strictly between them take the sign bit.
        k[K_SIGNED_ABOVE], k[K_SIGNED_BELOW] = offset, k[K_NAN]
    return k


@_jit
def add_zero_point(q, z):
    """``q + z``, but ``q`` itself where ``q`` is NaN.

    Where two NaNs meet, the processor returns one of them by the operand
    order its compiler chose; QuantizeLinear keeps the quotient's, the first
    in the formula, as the reference kernel does (docs/semantics.md).
    """
    v = q + z
    return q if q != q else v


@_jit
def float_code(q, z, has_zp, nan_to_zp, cap, k):
    """The code of ``q + z`` (``q`` alone if not ``has_zp``) for the type ``k`` describes.

    NaN becomes ``z`` where ``nan_to_zp`` (types without NaN). ``cap`` is
    the smaller of the clamp (infinity for none) and ``K_OVF_AT``:
    magnitudes past it are brought back to it, which clamps, or encodes as
    the overflow code. NaN goes through as NaN and is then replaced by the
    NaN code; the sign bit is added last, to the codes strictly between
    ``K_SIGNED_ABOVE`` and ``K_SIGNED_BELOW`` (every code but for the fnuz
    types' zero and NaN). ``k`` is the tuple of float_code_constants'
    values from ``K_PMIN`` on, read once per run.
    """
    pmin, unit, step, nan, neg, pos, above, below = k
    v = add_zero_point(q, z if has_zp else _NEG_ZERO)
    v = z if nan_to_zp & (v != v) else v
    a = abs(v)
    a = cap if cap < a else a  # written as x86's min reads it, so NaN passes through
    low = _f32_bits(max(_bits_f32(_f32_bits(a) & _EXPONENT), pmin))  # bits of 2**E
    r = np.rint(a * _power_from_bits(unit, low))
    code = r + np.float32(low) * step  # the code plus offset, or NaN
    code = code if code < nan else nan
    signed = (_f32_bits(v) < 0) & (code > above) & (code < below)
    return np.int32(code + (neg if signed else pos))


@_jit
def integer_code(q, z, qmin, qmax, mask):
    """``clip(rint(q) + z, qmin, qmax)``, NaN -> z, as a masked integer code.

    Clamped before it is rounded, to ``[qmin - z, qmax - z]`` (integers, so
    rounding commutes with the clamp), then rounded and converted at once:
    LLVM makes ``int32(rint(c))`` one vector conversion in the current
    rounding mode, where rounding first took a round and a truncating
    conversion (one core of an Intel Xeon, Emerald Rapids, 16M elements
    to uint8 in cache: 5.2-5.4 ms against 5.6-6.1). The zero point is an
    integer code below 2**16, exact in float32 and in int32.
    """
    low, high = qmin - z, qmax - z
    c = q if q > low else low
    c = c if c < high else high
    zi = np.int32(z)
    return (np.int32(np.rint(c)) + zi if q == q else zi) & mask


@_jit
def integer_zero_point(code, sign):
    """The value of an integer zero point's code (masked to its width), ``sign`` its sign bit or 0."""
    v = np.float32(code)
    return v - (sign + sign if v >= sign else np.float32(0))
