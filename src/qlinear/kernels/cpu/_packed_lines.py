"""Packed codes in registers: QuantizeLinear on blocks of 32 codes packed as they are computed, and 6-bit codes.

:func:`quantize_nibble_block`, :func:`quantize_crumb_block` and
:func:`quantize_float4_block` compute a block's codes and pack them into
its 16 (or 8) bytes as one vector, with ordinary stores;
:func:`pack_sextets`, :func:`dequantize_sextets` and
:func:`dequantize_sextet_steps` move 16 6-bit codes in and out of their 12
bytes. LLVM vector code, inlined as intrinsics as the line functions of
:mod:`._lines` are.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from qlinear.kernels.cpu._dequantize_lines import _F, _FORMAT, _small_float_values
from qlinear.kernels.cpu._lines import _FLOAT_CODE_K, _data, _float_quotient_codes, _integer_codes, _load, _load_values, _splat

__all__ = [
    "BLOCK_CODES",
    "dequantize_sextet_steps",
    "dequantize_sextets",
    "pack_sextets",
    "quantize_crumb_block",
    "quantize_float4_block",
    "quantize_nibble_block",
]

# Packed QuantizeLinear on blocks of 32 codes along the last axis: each
# block's 16 (or 8) bytes computed as one vector, with one scale. A loop
# over a block's bytes is shorter than LLVM's vector step, which leaves it
# all to the scalar remainder.
BLOCK_CODES = 32


def _packed_bytes(builder, codes, bits):
    """The int32 ``codes`` (each below ``2**bits``) packed into bytes, the first code in the lowest bits."""
    per_byte = 8 // bits
    nbytes = codes.type.count // per_byte
    narrow = builder.trunc(codes, ir.VectorType(ir.IntType(8), codes.type.count))
    packed = None
    for place in range(per_byte):
        part = builder.shuffle_vector(
            narrow,
            ir.Constant(narrow.type, ir.Undefined),
            ir.Constant(ir.VectorType(ir.IntType(32), nbytes), [b * per_byte + place for b in range(nbytes)]),
        )
        if place:
            part = builder.shl(part, ir.Constant(part.type, [bits * place] * nbytes))
        packed = part if packed is None else builder.or_(packed, part)
    return packed


def _store_bytes(builder, value, array_data, index):
    """Store the vector ``value`` at element ``index`` of an array's data (ordinary, unaligned)."""
    builder.store(value, builder.bitcast(builder.gep(array_data, [index]), value.type.as_pointer()), align=1)


def _block_fits(x, dst):
    return isinstance(x, types.Array) and isinstance(dst, types.Array) and dst.dtype.bitwidth == 8


def _integer_block(x, dst, bits):
    if not _block_fits(x, dst):
        return None
    x_is_int = isinstance(x.dtype, types.Integer)
    f = types.float32
    sig = types.void(x, types.intp, f, f, dst, types.intp, f, f, types.int32)

    def codegen(context, builder, signature, args):
        xs, xj_, s_, z_, ds, byte, lo, hi, mask_ = args
        f32 = ir.VectorType(ir.FloatType(), BLOCK_CODES)
        v = _load_values(builder, _data(context, builder, signature.args[0], xs), xj_, BLOCK_CODES, x_is_int)
        codes = _integer_codes(builder, v, _splat(builder, s_, f32), _splat(builder, z_, f32), lo, hi, mask_)
        _store_bytes(builder, _packed_bytes(builder, codes, bits), _data(context, builder, signature.args[4], ds), byte)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def quantize_nibble_block(typingctx, x, xj, s, z, dst, byte, qmin, qmax, mask):
    """``dst[byte:byte + 16]`` = the packed 4-bit integer codes of ``x[xj:xj + 32]`` (low nibble first).

    Each code is :func:`._quantize_runs.integer_code` of ``x / s`` with zero
    point ``z``; ``x`` is float32 or int32.
    """
    return _integer_block(x, dst, 4)


@intrinsic
def quantize_crumb_block(typingctx, x, xj, s, z, dst, byte, qmin, qmax, mask):
    """As :func:`quantize_nibble_block`, into the 8 bytes of 32 packed 2-bit codes."""
    return _integer_block(x, dst, 2)


@intrinsic
def quantize_float4_block(typingctx, x, xj, s, z, dst, byte, has_zp, nan_to_zp, cap, k):
    """``dst[byte:byte + 16]`` = 32 packed float4e2m1 codes of ``x[xj:] / s``, :func:`._encode.float_code` step for step."""
    if not _block_fits(x, dst):
        return None
    x_is_int = isinstance(x.dtype, types.Integer)
    f = types.float32
    sig = types.void(x, types.intp, f, f, dst, types.intp, types.boolean, types.boolean, f, _FLOAT_CODE_K)

    def codegen(context, builder, signature, args):
        xs, xj_, s_, z_, ds, byte, has_zp_, nan_to_zp_, cap_, k_ = args
        x_data = _data(context, builder, signature.args[0], xs)
        codes = _float_quotient_codes(builder, x_data, xj_, BLOCK_CODES, x_is_int, s_, z_, (has_zp_, nan_to_zp_, cap_, k_))
        _store_bytes(builder, _packed_bytes(builder, codes, 4), _data(context, builder, signature.args[4], ds), byte)
        return context.get_dummy_value()

    return sig, codegen


# 6-bit codes (float6e2m3, float6e3m2), ONNX-packed four to three bytes,
# code q at bits 6q.. of a little-endian bit string: 16 codes are 12 bytes.
SEXTET_CODES = 16
SEXTET_BYTES = 12


def _sextet_codes(builder, raw):
    """int32 lanes of the 16 codes in the 12 bytes ``raw``: code q from the two bytes at bit 6q, shifted down and masked."""
    i32 = ir.VectorType(ir.IntType(32), SEXTET_CODES)
    undefined = ir.Constant(raw.type, ir.Undefined)
    first = [6 * q >> 3 for q in range(SEXTET_CODES)]
    # The last code lies in one byte: its "next" byte is itself, masked away.
    low = builder.shuffle_vector(raw, undefined, ir.Constant(i32, first))
    high = builder.shuffle_vector(raw, undefined, ir.Constant(i32, [min(b + 1, SEXTET_BYTES - 1) for b in first]))
    word = builder.or_(builder.zext(low, i32), builder.shl(builder.zext(high, i32), ir.Constant(i32, [8] * SEXTET_CODES)))
    shifts = ir.Constant(i32, [6 * q & 7 for q in range(SEXTET_CODES)])
    return builder.and_(builder.lshr(word, shifts), ir.Constant(i32, [63] * SEXTET_CODES))


def _sextet_values(context, builder, signature, xs, byte, fmt):
    raw = _load(builder, _data(context, builder, signature.args[0], xs), byte, ir.VectorType(ir.IntType(8), SEXTET_BYTES))
    return _small_float_values(builder, _sextet_codes(builder, raw), fmt, SEXTET_CODES, specials=False)


def _sextets_fit(x, dst):
    return isinstance(x, types.Array) and isinstance(dst, types.Array) and x.dtype.bitwidth == 8 and dst.dtype == types.float32


@intrinsic
def dequantize_sextets(typingctx, x, byte, fmt, dst, dj, s, z):
    """``dst[dj:dj + 16]`` = (value - z) * s of the 16 packed 6-bit float codes in ``x[byte:byte + 12]``.

    ``value`` is :func:`._dequantize_runs._finite_value` with its int32
    format tuple ``fmt``, step for step. Ordinary (unaligned) stores.
    """
    if not _sextets_fit(x, dst):
        return None
    sig = types.void(x, types.intp, _FORMAT, dst, types.intp, _F, _F)

    def codegen(context, builder, signature, args):
        xs, byte_, fmt_, ds, dj_, s_, z_ = args
        f32 = ir.VectorType(ir.FloatType(), SEXTET_CODES)
        values = _sextet_values(context, builder, signature, xs, byte_, fmt_)
        result = builder.fmul(builder.fsub(values, _splat(builder, z_, f32)), _splat(builder, s_, f32))
        _store_bytes(builder, result, _data(context, builder, signature.args[3], ds), dj_)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def dequantize_sextet_steps(typingctx, x, byte, fmt, dst, dj, s, sj, z, zj):
    """As :func:`dequantize_sextets`, with the 16 scales ``s[sj:]`` and zero points ``z[zj:]`` (float32 arrays)."""
    if not (_sextets_fit(x, dst) and isinstance(s, types.Array) and isinstance(z, types.Array)):
        return None
    if s.dtype != types.float32 or z.dtype != types.float32:
        return None
    sig = types.void(x, types.intp, _FORMAT, dst, types.intp, s, types.intp, z, types.intp)

    def codegen(context, builder, signature, args):
        xs, byte_, fmt_, ds, dj_, s_, sj_, z_, zj_ = args
        f32 = ir.VectorType(ir.FloatType(), SEXTET_CODES)
        values = _sextet_values(context, builder, signature, xs, byte_, fmt_)
        scales = _load(builder, _data(context, builder, signature.args[5], s_), sj_, f32)
        zeros = _load(builder, _data(context, builder, signature.args[7], z_), zj_, f32)
        _store_bytes(
            builder, builder.fmul(builder.fsub(values, zeros), scales), _data(context, builder, signature.args[3], ds), dj_
        )
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def pack_sextets(typingctx, codes, c, out, byte):
    """``out[byte:byte + 12]`` = the 16 6-bit codes ``codes[c:c + 16]`` (one a byte, each below 64), ONNX-packed."""
    if not (isinstance(codes, types.Array) and isinstance(out, types.Array)):
        return None
    if codes.dtype.bitwidth != 8 or out.dtype.bitwidth != 8:
        return None
    sig = types.void(codes, types.intp, out, types.intp)

    def codegen(context, builder, signature, args):
        cs, c_, os_, byte_ = args
        i32x4 = ir.VectorType(ir.IntType(32), 4)
        raw = _load(builder, _data(context, builder, signature.args[0], cs), c_, ir.VectorType(ir.IntType(8), SEXTET_CODES))
        undefined = ir.Constant(raw.type, ir.Undefined)
        # Four words of four codes each: code 4g + lane at bits 6 * lane of word g.
        word = None
        for lane in range(4):
            part = builder.zext(
                builder.shuffle_vector(raw, undefined, ir.Constant(i32x4, [4 * g + lane for g in range(4)])), i32x4
            )
            if lane:
                part = builder.shl(part, ir.Constant(i32x4, [6 * lane] * 4))
            word = part if word is None else builder.or_(word, part)
        as_bytes = builder.bitcast(word, ir.VectorType(ir.IntType(8), 16))
        packed = builder.shuffle_vector(
            as_bytes,
            ir.Constant(as_bytes.type, ir.Undefined),
            ir.Constant(ir.VectorType(ir.IntType(32), SEXTET_BYTES), [4 * g + k for g in range(4) for k in range(3)]),
        )
        _store_bytes(builder, packed, _data(context, builder, signature.args[2], os_), byte_)
        return context.get_dummy_value()

    return sig, codegen
