"""DequantizeLinear's line functions: a 64-byte line of float32 results from codes, in LLVM vector code.

8/16-bit integer codes (:func:`dequantize_line`), float8 codes
(:func:`dequantize_float8_line`) and packed 4-bit and 2-bit codes
(:func:`dequantize_nibble_line`, :func:`dequantize_float4_line`,
:func:`dequantize_crumb_line`), each line with the one or two scales it
spans, stored whole by a streaming store. How lines are laid out and why
they are intrinsics: :mod:`._lines`.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from qlinear.kernels.cpu._lines import LINE, _data, _keep_first_nan, _load, _splat, _split_splat, _store_line, table_lookup

__all__ = [
    "dequantize_crumb_line",
    "dequantize_float4_line",
    "dequantize_float8_line",
    "dequantize_float8_step_line",
    "dequantize_line",
    "dequantize_nibble_line",
    "dequantize_step_line",
]


@intrinsic
def dequantize_line(typingctx, x, xj, sign, dst, dj, s, z, s1, z1, split):
    """``dst[dj:]``'s line (16 float32) = (signed(x[xj:], sign) - z) * s, for 8- or 16-bit codes ``x``.

    Lanes from ``split`` on use ``s1`` and ``z1`` instead: a line that
    spans two scales' runs. ``sign`` is the codes' sign bit (0: unsigned),
    applied as ``(v ^ sign) - sign`` in int32. ``dst + dj`` must be 64-byte
    aligned.
    """
    if not (isinstance(x, types.Array) and isinstance(dst, types.Array)) or x.dtype.bitwidth not in (8, 16):
        return None
    f = types.float32
    sig = types.void(x, types.intp, types.int32, dst, types.intp, f, f, f, f, types.intp)

    def codegen(context, builder, signature, args):
        xs, xj_, sign_, ds, dj_, s0, z0, s1_, z1_, split_ = args
        values = _integer_line_values(context, builder, signature.args[0], xs, xj_, sign_)
        _scaled_line(builder, values, s0, z0, s1_, z1_, split_, _data(context, builder, signature.args[3], ds), dj_)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def dequantize_step_line(typingctx, x, xj, sign, dst, dj, scale, zp, sj):
    """:func:`dequantize_line` where the scale steps with the element: lane k takes ``scale[sj + k]`` and ``zp[sj + k]``.

    The line of scales and zero points is read as one vector each: per-axis
    on the last axis and blocks across rows stream as per-tensor does.
    """
    if not all(isinstance(a, types.Array) for a in (x, dst, scale, zp)) or x.dtype.bitwidth not in (8, 16):
        return None
    sig = types.void(x, types.intp, types.int32, dst, types.intp, scale, zp, types.intp)
    return sig, _step_line_codegen(_integer_line_values, nan_values=False)


def _step_line_codegen(values_of, nan_values):
    """The code of a step line ``(x, xj, how, dst, dj, scale, zp, sj)``, its codes' values from ``values_of``.

    ``values_of(context, builder, x_type, x, xj, how)`` gives the line's
    float32 values; the 16 scales and zero points from ``sj`` are loaded as
    vectors.
    """

    def codegen(context, builder, signature, args):
        xs, xj, how, ds, dj, ss, zs, sj = args
        values = values_of(context, builder, signature.args[0], xs, xj, how)
        s, z = (_load(builder, _data(context, builder, signature.args[k], a), sj, values.type) for k, a in ((5, ss), (6, zs)))
        _affine_line(builder, values, s, z, _data(context, builder, signature.args[3], ds), dj, nan_values)
        return context.get_dummy_value()

    return codegen


def _integer_line_values(context, builder, x_type, xs, xj, sign):
    """float32 values of the line of 8/16-bit codes at ``xs[xj:]`` whose sign bit is ``sign``."""
    lanes = LINE // 4
    raw = _load(builder, _data(context, builder, x_type, xs), xj, ir.VectorType(ir.IntType(x_type.dtype.bitwidth), lanes))
    return _integer_values(builder, builder.zext(raw, ir.VectorType(ir.IntType(32), lanes)), sign, lanes)


def _integer_values(builder, c, sign, lanes):
    """float32 values of the unsigned codes ``c`` (int32 lanes) whose sign bit is ``sign`` (0: unsigned): ``(c ^ sign) - sign``."""
    sign_v = _splat(builder, sign, ir.VectorType(ir.IntType(32), lanes))
    return builder.sitofp(builder.sub(builder.xor(c, sign_v), sign_v), ir.VectorType(ir.FloatType(), lanes))


def _small_float_values(builder, c, fmt, lanes, specials):
    """float32 values of the small-float codes ``c`` (int32 lanes), :func:`._dequantize_runs._float_value` step for step.

    ``fmt`` is that function's int32 format tuple. Without ``specials``
    (float4e2m1: neither infinity nor NaN), :func:`._dequantize_runs._finite_value`.
    """
    f32 = ir.VectorType(ir.FloatType(), lanes)
    i32 = ir.VectorType(ir.IntType(32), lanes)
    mult, exp_off, sign_bit, max_bits, inf_bits, neg_zero_nan = (builder.extract_value(fmt, k) for k in range(6))

    def splat_i(v):
        return _splat(builder, v, i32)

    def as_float(bits):
        return builder.bitcast(bits, f32)

    sign_v = splat_i(sign_bit)
    magnitude = builder.and_(c, builder.sub(sign_v, splat_i(ir.Constant(ir.IntType(32), 1))))
    f = as_float(builder.add(builder.mul(magnitude, splat_i(mult)), splat_i(exp_off)))
    half_smallest = as_float(splat_i(exp_off))
    two = ir.Constant(f32, [2.0] * lanes)
    subnormal = builder.fcmp_ordered("<", f, builder.fmul(two, half_smallest))
    f = builder.select(subnormal, builder.fmul(two, builder.fsub(f, half_smallest)), f)
    if specials:
        nan = as_float(ir.Constant(i32, [0x7FC00000] * lanes))
        inf = ir.Constant(f32, [float("inf")] * lanes)
        special = builder.select(builder.fcmp_ordered("==", f, as_float(splat_i(inf_bits))), inf, nan)
        f = builder.select(builder.fcmp_ordered(">", f, as_float(splat_i(max_bits))), special, f)
        negative_zero = builder.and_(
            builder.icmp_signed("!=", splat_i(neg_zero_nan), ir.Constant(i32, [0] * lanes)), builder.icmp_signed("==", c, sign_v)
        )
        f = builder.select(negative_zero, nan, f)
    negative = builder.icmp_signed("!=", builder.and_(c, sign_v), ir.Constant(i32, [0] * lanes))
    return builder.select(negative, builder.fneg(f), f)


def _scaled_line(builder, values, s0, z0, s1, z1, split, dst_data, dj, nan_values=False):
    """Store ``(values - z) * s`` (two scales split at lane ``split``) as a streamed line at ``dst_data[dj]``.

    Where ``values`` may hold NaN (``nan_values``), the first NaN in the
    formula is kept, as ``_dequantize_runs.affine`` does.
    """
    f32 = values.type
    s, z = _split_splat(builder, s0, s1, split, f32), _split_splat(builder, z0, z1, split, f32)
    _affine_line(builder, values, s, z, dst_data, dj, nan_values)


def _affine_line(builder, values, s, z, dst_data, dj, nan_values):
    """Store ``(values - z) * s`` (vectors all) as a streamed line, keeping the first NaN where ``nan_values``."""
    if not nan_values:
        _store_line(builder, builder.fmul(builder.fsub(values, z), s), dst_data, dj)
        return
    diff = _keep_first_nan(builder, values, builder.fsub(values, z))
    _store_line(builder, _keep_first_nan(builder, diff, builder.fmul(diff, s)), dst_data, dj)


_F = types.float32
_FORMAT = types.UniTuple(types.int32, 6)


@intrinsic
def dequantize_float8_line(typingctx, x, xj, fmt, dst, dj, s, z, s1, z1, split):
    """``dst[dj:]``'s line (16 float32) = (value(x[xj:]) - z) * s, for float8 codes ``x``.

    ``value`` is :func:`._dequantize_runs._float_value` with its int32
    format tuple ``fmt``, step for step; lanes from ``split`` on use ``s1``
    and ``z1``, as in :func:`dequantize_line`. ``dst + dj`` must be 64-byte
    aligned.
    """
    # 16-bit codes type-check too, and read as their low bytes: one walker
    # serves 8/16-bit integers and float8, and takes this line for float8 only.
    if not (isinstance(x, types.Array) and isinstance(dst, types.Array)) or x.dtype.bitwidth not in (8, 16):
        return None
    sig = types.void(x, types.intp, _FORMAT, dst, types.intp, _F, _F, _F, _F, types.intp)

    def codegen(context, builder, signature, args):
        xs, xj_, fmt_, ds, dj_, s0, z0, s1_, z1_, split_ = args
        f = _float8_line_values(context, builder, signature.args[0], xs, xj_, fmt_)
        _scaled_line(builder, f, s0, z0, s1_, z1_, split_, _data(context, builder, signature.args[3], ds), dj_, nan_values=True)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def dequantize_float8_step_line(typingctx, x, xj, fmt, dst, dj, scale, zp, sj):
    """:func:`dequantize_float8_line` where the scale steps with the element, as :func:`dequantize_step_line`."""
    if not all(isinstance(a, types.Array) for a in (x, dst, scale, zp)) or x.dtype.bitwidth not in (8, 16):
        return None
    sig = types.void(x, types.intp, _FORMAT, dst, types.intp, scale, zp, types.intp)
    return sig, _step_line_codegen(_float8_line_values, nan_values=True)


def _float8_line_values(context, builder, x_type, xs, xj, fmt):
    """float32 values of the line of float8 codes at ``xs[xj:]`` (the low byte of 16-bit ones), format tuple ``fmt``."""
    lanes = LINE // 4
    raw = _load(builder, _data(context, builder, x_type, xs), xj, ir.VectorType(ir.IntType(x_type.dtype.bitwidth), lanes))
    i32 = ir.VectorType(ir.IntType(32), lanes)
    c = builder.and_(builder.zext(raw, i32), ir.Constant(i32, [255] * lanes))
    return _small_float_values(builder, c, fmt, lanes, specials=True)


def _packed_line(x, dst, bits, small_float):
    """Signature and code of a line of 16 float32 from packed ``bits``-bit codes (see :func:`dequantize_nibble_line`)."""
    if not (isinstance(x, types.Array) and isinstance(dst, types.Array)) or x.dtype.bitwidth != 8:
        return None
    lanes = LINE // 4
    per_byte = 8 // bits
    sig = types.void(x, types.intp, types.int32, _FORMAT, dst, types.intp, _F, _F, _F, _F, types.intp)

    def codegen(context, builder, signature, args):
        xs, byte, sign_, fmt_, ds, dj_, s0, z0, s1_, z1_, split_ = args
        i32 = ir.VectorType(ir.IntType(32), lanes)
        raw = _load(
            builder, _data(context, builder, signature.args[0], xs), byte, ir.VectorType(ir.IntType(8), lanes // per_byte)
        )
        # Each byte into the lanes of its codes, shifted down to each code's place: code q is bits q*bits.. of its byte.
        spread = builder.shuffle_vector(
            raw,
            ir.Constant(raw.type, ir.Undefined),
            ir.Constant(ir.VectorType(ir.IntType(32), lanes), [q // per_byte for q in range(lanes)]),
        )
        shifts = ir.Constant(i32, [bits * (q % per_byte) for q in range(lanes)])
        c = builder.and_(builder.lshr(builder.zext(spread, i32), shifts), ir.Constant(i32, [(1 << bits) - 1] * lanes))
        if small_float and table_lookup():
            # The 16 values of the codes, computed once (LLVM hoists them out
            # of the walker's loop) by the same arithmetic, then looked up:
            # one permute a line in place of a dozen operations.
            table = _small_float_values(builder, ir.Constant(i32, list(range(lanes))), fmt_, lanes, specials=False)
            f32 = ir.VectorType(ir.FloatType(), lanes)
            permute = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(f32, [f32, i32]), "llvm.x86.avx512.permvar.sf.512"
            )
            values = builder.call(permute, [table, c])
        elif small_float:
            values = _small_float_values(builder, c, fmt_, lanes, specials=False)
        else:
            values = _integer_values(builder, c, sign_, lanes)
        _scaled_line(builder, values, s0, z0, s1_, z1_, split_, _data(context, builder, signature.args[4], ds), dj_)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def dequantize_nibble_line(typingctx, x, byte, sign, fmt, dst, dj, s, z, s1, z1, split):
    """``dst[dj:]``'s line (16 float32) from the packed 4-bit integers in bytes ``x[byte:byte + 8]``.

    Each byte's low nibble first; signed by ``sign`` (8 for int4, 0 for
    uint4) as :func:`dequantize_line` does, then ``(v - z) * s`` with two
    scales split at lane ``split``. ``fmt`` is unused (the float4 line's).
    ``dst + dj`` must be 64-byte aligned.
    """
    return _packed_line(x, dst, 4, small_float=False)


@intrinsic
def dequantize_float4_line(typingctx, x, byte, sign, fmt, dst, dj, s, z, s1, z1, split):
    """As :func:`dequantize_nibble_line`, for float4e2m1 codes decoded by :func:`._dequantize_runs._finite_value` (``fmt``)."""
    return _packed_line(x, dst, 4, small_float=True)


@intrinsic
def dequantize_crumb_line(typingctx, x, byte, sign, fmt, dst, dj, s, z, s1, z1, split):
    """As :func:`dequantize_nibble_line`, for packed 2-bit integers in bytes ``x[byte:byte + 4]`` (``sign`` 2 for int2)."""
    return _packed_line(x, dst, 2, small_float=False)
