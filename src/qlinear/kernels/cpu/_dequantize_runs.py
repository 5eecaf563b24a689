"""The run loops of the fused DequantizeLinear kernel, one way of reading codes each.

Each function walks elements ``start .. end`` run by run (:func:`_next_run`:
consecutive elements whose scale and zero point are one constant, or step
with each element) and writes ``(value - zero_point) * scale`` as float32,
each run one tight loop from the codes straight to ``dst``. The run loop and
the element loops live in one function: a call per run (a block of 32)
would cost more than the run.

- :func:`table_runs`: one byte a code (unpacked 2/4/6-bit types), its
  value from a 256-entry table.
- :func:`integer_runs`: 8- and 16-bit integers, sign-extended
  arithmetically as ``(v ^ sign) - sign`` on the unsigned code.
- :func:`int32_runs`: differences taken in int64 (exact), rounded once.
- :func:`float_runs`: float8 codes decoded by bit arithmetic (a table
  lookup would be a gather, several times slower).
- :func:`._dequantize_packed.nibble_runs`, :func:`._dequantize_packed.crumb_runs`: ONNX's packed bytes of 4-bit
  codes (two a byte) and 2-bit integers (four a byte), unpacked by shifts
  and masks; integers sign-extended as above, float4e2m1 decoded as
  float8 is. A run's codes before its first whole byte and after its last
  are read one at a time, through the table.
- :func:`._dequantize_packed.sextet_runs`: ONNX's packed 6-bit float codes (four in three
  bytes), 16 codes a vector (:func:`._packed_lines.dequantize_sextets`), decoded
  as float4e2m1 is.
- :func:`period_lines`, :func:`packed_period_lines`: the integer and
  float8 reads, and packed 4/2-bit ones, of calls that stream their
  output, where the layout is periodic (the scale of element ``j`` is
  ``scale[(j // period) % count]``: per tensor, per-axis rows, blocks along
  the last axis). They write line by line, each line with the one or two
  scales it spans, so blocks of 32, rows of 1024 and whole tensors stream
  alike. Packed codes take lines on blocks only
  (``_lines.LONGEST_BLOCK_PERIOD``).
- :func:`step_lines`: the integer and float8 reads of calls that stream
  their output where the scale steps with the element along long rows
  (per-axis on the last axis, blocks across rows): each row's lines read
  their 16 scales and zero points as vectors. On short rows the run walks
  are faster (``_params.step_lines_fit``); the run walks
  never stream.

Below 32 bits an integer code and its zero point are exact in float32, and
so is their difference; float codes and zero points are exact in float32 and
subtracted there, as the reference does. Indices of the element loops are
unsigned (``_U``): numba then skips its negative-index wraparound and LLVM
sees consecutive addresses, and vectorizes.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from qlinear._builtins import min
from qlinear.kernels.cpu._dequantize_lines import (
    dequantize_float8_line,
    dequantize_float8_step_line,
    dequantize_line,
    dequantize_step_line,
)
from qlinear.kernels.cpu._lines import LINE, line_scales, line_span, period_scale
from qlinear.kernels.cpu._params import L_B, L_D, L_I, L_SB, L_SI, L_SO
from qlinear.kernels.cpu._tiles import locate

__all__ = [
    "table_runs",
    "integer_runs",
    "int32_runs",
    "float_runs",
    "period_lines",
    "step_lines",
]

_jit = njit(cache=True, nogil=True, error_model="numpy")
_U = np.uint64
# NaN decodes to 0x7fc00000 with the code's sign (negation flips only the sign bit), as ml_dtypes does.
_NAN = np.float32(np.nan)
_INF, _TWO = np.float32(np.inf), np.float32(2)


@intrinsic
def _float32_from_bits(typingctx, bits):
    """The float32 whose bit pattern is the int32 ``bits``."""
    if bits != types.int32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float32))

    return types.float32(types.int32), codegen


@_jit
def _signed(v, sign):
    """float32 value of unsigned code ``v`` whose sign bit is ``sign`` (0: unsigned), in int32 lanes."""
    return np.float32(np.int32((np.int32(v) ^ sign) - sign))


@_jit
def _format(fmt):
    """``fmt`` (``p``'s float format slots) as int32, the mantissa bits turned into a multiplier."""
    m, exp_off, sign_bit, max_bits, inf_bits, neg_zero_nan = fmt
    return (
        np.int32(1 << (23 - m)),
        np.int32(exp_off),
        np.int32(sign_bit),
        np.int32(max_bits),
        np.int32(inf_bits),
        np.int32(neg_zero_nan),
    )


@_jit
def _magnitude(c, fmt):
    """float32 value of the small-float code ``c``'s magnitude bits, infinity and NaN codes aside.

    ``fmt`` is :func:`_format`'s int32 ``(2**(23 - mantissa bits),
    exponent offset, sign bit, ...)``. The magnitude's bits, moved to
    float32's places and rebiased, read as ``2**(e - bias) * 1.m``: the
    value of a normal code. A subnormal one (``e == 0``) is ``2 * (that -
    2**-bias)``, exact. Every integer is int32 and the mantissa moved by a
    multiply, not a variable shift, so LLVM keeps the vectors 16 lanes wide.
    """
    mult, exp_off, sign_bit = fmt[0], fmt[1], fmt[2]
    half_smallest = _float32_from_bits(exp_off)
    f = _float32_from_bits(np.int32((c & (sign_bit - 1)) * mult + exp_off))
    if f < _TWO * half_smallest:
        f = _TWO * (f - half_smallest)
    return f


@_jit
def _finite_value(c, fmt):
    """float32 value of code ``c`` of a small-float type without infinity or NaN (float4e2m1)."""
    f = _magnitude(c, fmt)
    return -f if c & fmt[2] else f


@_jit
def _float_value(c, fmt):
    """float32 value of the small-float code ``c`` (float8), by bit arithmetic.

    :func:`_magnitude`, then: codes above the largest finite value (bits
    ``fmt[3]``) are infinite where they read as the infinity code does
    (bits ``fmt[4]``), else NaN; fnuz types (``fmt[5]``) read -0 as NaN.
    """
    sign_bit, max_bits, inf_bits, neg_zero_nan = fmt[2], fmt[3], fmt[4], fmt[5]
    f = _magnitude(c, fmt)
    if f > _float32_from_bits(max_bits):
        f = _INF if f == _float32_from_bits(inf_bits) else _NAN
    if neg_zero_nan and c == sign_bit:
        f = _NAN
    return -f if c & sign_bit else f


@_jit
def affine(v, z, s):
    """``(v - z) * s`` for float codes, keeping the first NaN of the formula where two meet.

    The processor returns one of two NaN operands by the operand order its
    compiler chose; DequantizeLinear keeps ``v``'s over the zero point's,
    and the difference's over the scale's, as the reference kernel does
    (docs/semantics.md). Integer codes never are NaN, and skip this.
    """
    d = v - z
    d = v if v != v else d
    y = d * s
    return d if d != d else y


@_jit
def _shape(lay):
    """The layout slots a run walk reads, read once: LLVM cannot tell that stores to ``dst`` leave ``lay`` alone."""
    return lay[L_D], lay[L_I], lay[L_B], lay[L_SO], lay[L_SB], lay[L_SI]


@_jit
def _next_run(o, d, i, b, j, end, shape):
    """``_tiles.next_run`` on the slots of :func:`_shape`: ``(length, scale index, step, o, d, i, b)``."""
    d_len, i_len, block, so, sb, si = shape
    if si == 0:
        # The whole rest of block b (every i of each d in it) shares one scale.
        d_end = min(d_len, (b + 1) * block)
        n = min((d_end - d) * i_len - i, end - j)
        sidx, step = o * so + b * sb, 0
        d, i, b = d_end, 0, b + 1
    else:
        # The rest of row (o, d); the scale follows i.
        n = min(i_len - i, end - j)
        sidx, step = o * so + b * sb + i, 1
        d, i = d + 1, 0
        if d == (b + 1) * block:
            b += 1
    if d == d_len:
        o, d, b = o + 1, 0, 0
    return n, sidx, step, o, d, i, b


@_jit
def _code_value(x, j, sign, f32, small_float):
    """float32 value of code ``x[j]``: a float8 code (``small_float``, format ``f32``) or an integer signed by ``sign``."""
    return _float_value(np.int32(x[j]), f32) if small_float else _signed(x[j], sign)


@_jit
def period_lines(x, sign, fmt, start, end, period, count, scale, zp, dst):
    """:func:`integer_runs`' or :func:`float_runs`' ``dst[j]`` for a periodic layout, in whole lines by streaming stores.

    Float8 codes where ``fmt[0]`` (mantissa bits) is above 0, else 8/16-bit
    integers signed by ``sign``. The scale of element ``j`` is
    ``scale[(j // period) % count]``, with ``period`` at least a line of
    float32. Each line is one :func:`._dequantize_lines.dequantize_line` (or
    :func:`._dequantize_lines.dequantize_float8_line`) with the one or two scales it
    spans (:func:`._lines.line_scales`), whatever the alignment of the
    periods: rows and blocks of 32 then stream as long runs do. Elements
    before the first whole line and after the last are written one at a
    time.
    """
    sign, f32, small_float = np.int32(sign), _format(fmt), fmt[0] > 0
    lanes = LINE // dst.itemsize
    lo, hi = line_span(dst, start, end - start)
    for t in range(lo + end - start - hi):
        # The elements before the first whole line and after the last.
        j = start + t if t < lo else start + hi + t - lo
        k = period_scale(j, period, count)
        dst[j] = affine(_code_value(x, j, sign, f32, small_float), zp[k], scale[k])
    k = period_scale(start + lo, period, count)
    off = (start + lo) % period
    for j in range(start + lo, start + hi, lanes):
        splits, ks, k, off = line_scales(k, off, period, count, lanes)
        split, k0, k1 = splits[0], ks[0], ks[1]  # a period is at least a line: two scales at most
        s0, z0, s1, z1 = scale[_U(k0)], zp[_U(k0)], scale[_U(k1)], zp[_U(k1)]
        if small_float:
            dequantize_float8_line(x, j, f32, dst, j, s0, z0, s1, z1, split)
        else:
            dequantize_line(x, j, sign, dst, j, s0, z0, s1, z1, split)


@_jit
def step_lines(x, sign, fmt, start, end, scale, zp, dst, lay):
    """:func:`integer_runs`' or :func:`float_runs`' ``dst[j]`` for a layout whose scale steps with the element, in lines.

    Every run of such a layout (per-axis on the last axis, blocks across
    rows) is the rest of a row, its scales consecutive: each whole line
    reads its 16 scales and zero points as vectors
    (:func:`._dequantize_lines.dequantize_step_line`) and is stored by a
    streaming store; a run's elements before its first whole line and after
    its last are written one at a time. Float8 codes where ``fmt[0]`` is
    above 0, else 8/16-bit integers signed by ``sign``.
    """
    sign, f32, small_float = np.int32(sign), _format(fmt), fmt[0] > 0
    lanes = LINE // dst.itemsize
    o, d, i, b, shape = *locate(start, lay), _shape(lay)
    j = start
    while j < end:
        n, si, _, o, d, i, b = _next_run(o, d, i, b, j, end, shape)
        lo, hi = line_span(dst, j, n)
        if hi < lo:
            lo, hi = n, n  # no whole line in the run
        for t in range(lo + n - hi):
            k = t if t < lo else hi + t - lo
            dst[j + k] = affine(_code_value(x, j + k, sign, f32, small_float), zp[si + k], scale[si + k])
        # One loop for each kind of line: a branch inside would stay in the loop.
        if small_float:
            for k in range(lo, hi, lanes):
                dequantize_float8_step_line(x, j + k, f32, dst, j + k, scale, zp, si + k)
        else:
            for k in range(lo, hi, lanes):
                dequantize_step_line(x, j + k, sign, dst, j + k, scale, zp, si + k)
        j += n


@_jit
def table_runs(x, start, end, table, scale, zp, dst, d0, lay):
    """``dst[j - d0]`` for ``start <= j < end``: bytes ``x[j]`` through ``table``."""
    o, d, i, b, shape = *locate(start, lay), _shape(lay)
    j = start
    while j < end:
        n, si, step, o, d, i, b = _next_run(o, d, i, b, j, end, shape)
        dj = j - d0
        if step:
            for k in range(n):
                dst[_U(dj + k)] = (table[x[_U(j + k)]] - zp[_U(si + k)]) * scale[_U(si + k)]
        else:
            s, z = scale[si], zp[si]
            for k in range(n):
                dst[_U(dj + k)] = (table[x[_U(j + k)]] - z) * s
        j += n


@_jit
def integer_runs(x, sign, start, end, scale, zp, dst, d0, lay):
    """``dst[j - d0]``: unsigned 8/16-bit ``x[j]``, signed by ``sign`` (its sign bit, 0 if unsigned)."""
    sign = np.int32(sign)
    o, d, i, b, shape = *locate(start, lay), _shape(lay)
    j = start
    while j < end:
        n, si, step, o, d, i, b = _next_run(o, d, i, b, j, end, shape)
        dj = j - d0
        if step:
            for k in range(n):
                v = _signed(x[_U(j + k)], sign)
                dst[_U(dj + k)] = (v - zp[_U(si + k)]) * scale[_U(si + k)]
        else:
            s, z = scale[si], zp[si]
            for k in range(n):
                dst[_U(dj + k)] = (_signed(x[_U(j + k)], sign) - z) * s
        j += n


@_jit
def int32_runs(x, start, end, scale, zp, dst, d0, lay):
    """``dst[j - d0]``: int32 ``x[j]`` less int32 zero points ``zp``, exact in int64."""
    o, d, i, b, shape = *locate(start, lay), _shape(lay)
    j = start
    while j < end:
        n, si, step, o, d, i, b = _next_run(o, d, i, b, j, end, shape)
        dj = j - d0
        for k in range(n):
            sk = si + k * step
            dst[dj + k] = np.float32(np.int64(x[j + k]) - np.int64(zp[sk])) * scale[sk]
        j += n


@_jit
def float_runs(x, fmt, start, end, scale, zp, dst, d0, lay):
    """``dst[j - d0]``: float8 code ``x[j]`` decoded by :func:`_float_value`."""
    f32 = _format(fmt)
    o, d, i, b, shape = *locate(start, lay), _shape(lay)
    j = start
    while j < end:
        n, si, step, o, d, i, b = _next_run(o, d, i, b, j, end, shape)
        dj = j - d0
        if step:
            for k in range(n):
                dst[_U(dj + k)] = affine(_float_value(np.int32(x[_U(j + k)]), f32), zp[_U(si + k)], scale[_U(si + k)])
        else:
            s, z = scale[si], zp[si]
            for k in range(n):
                dst[_U(dj + k)] = affine(_float_value(np.int32(x[_U(j + k)]), f32), z, s)
        j += n
