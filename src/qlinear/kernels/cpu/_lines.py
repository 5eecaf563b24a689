"""Whole cache lines of output written by streaming (non-temporal) stores.

An ordinary store to a line that is not in cache first reads the line from
memory to own it, so writing N bytes of a large output moves 2N. A
non-temporal store writes a whole 64-byte line straight to memory. Where a
call's data are far larger than the last-level cache (the output could not
have stayed in cache anyway), that saves a sixth of QuantizeLinear's memory
traffic from float32 to 8 bits and nearly half of DequantizeLinear's from 8
bits to float32.

LLVM will not vectorize a loop whose stores are non-temporal unless it can
prove them aligned, and numba cannot say so; a buffer streamed out later
costs as much as it saves (measured). So the common loops have a line
function here, written as LLVM vector code: it computes one 64-byte line of
output from registers and stores it aligned and non-temporal, with exactly
the arithmetic of the element function it stands for
(:func:`._quantize_runs.integer_code` for :func:`quantize_line`,
:func:`._encode.float_code` for :func:`quantize_float_line`,
:func:`._dequantize_runs.integer_runs`' arithmetic for :func:`dequantize_line`,
:func:`._dequantize_runs.float_runs`' for :func:`dequantize_float8_line`). Being
intrinsics, they are inlined with no call: a call that passes arrays costs
numba's atomic reference counting, and every atomic instruction waits for
all loads in flight.

Where the scale of element ``j`` is ``scale[(j // period) % count]``, a
line may span the end of a block or a row: DequantizeLinear's lines take
two scales and the lane where the second starts, QuantizeLinear's of
integer codes three (64 codes over blocks of 32) and two lanes;
:func:`line_scales` walks them. Float codes keep lines of one scale: their
lines of three measured no faster on blocks.

Packed QuantizeLinear on blocks of 32 codes has vector functions here too
(:func:`quantize_nibble_block` and its siblings), with ordinary stores:
they compute a block's codes and pack them in registers.

:func:`store_fence` ends a task's streaming: non-temporal stores are not
ordered with later ones until a fence.
"""

from __future__ import annotations

import functools
import os

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = [
    "BLOCK_CODES",
    "LINE",
    "LONGEST_BLOCK_PERIOD",
    "STREAM_MIN_RUN",
    "dequantize_crumb_line",
    "dequantize_float4_line",
    "dequantize_float8_line",
    "dequantize_line",
    "dequantize_nibble_line",
    "last_level_cache_bytes",
    "line_offset",
    "line_scales",
    "line_span",
    "period_scale",
    "quantize_crumb_block",
    "quantize_float4_block",
    "quantize_float_line",
    "quantize_line",
    "quantize_nibble_block",
    "store_fence",
    "streams",
    "table_lookup",
]

LINE = 64  # bytes of a cache line
# Only runs of one scale at least this long stream: a run's partial lines at
# either end go by ordinary stores and small loops, which made runs of 1024
# (a row per scale) slower, not faster, unless the rows start on a line.
STREAM_MIN_RUN = 4096
# Lines that span several scales pay where the runs they replace are short
# (blocks); on periods longer than this, runs measured as fast or faster for
# QuantizeLinear (rows of 1024: 1.09-1.23x slower by lines) and for packed
# DequantizeLinear (its byte loops over long runs).
LONGEST_BLOCK_PERIOD = 256
_FALLBACK_CACHE = 32 << 20
# Calls that read and write at least this many bytes stream their output;
# None: the size of the last-level cache. Tests lower it to reach the
# streaming loops with small arrays.
STREAM_MIN_BYTES: int | None = None


def streams(nbytes: int, out) -> bool:
    """Whether a call that reads and writes ``nbytes`` in all should stream into the array ``out``.

    Never when ``out``'s elements are not aligned to their size (a view at
    an odd offset, say): its lines would then never start on an element.
    """
    limit = STREAM_MIN_BYTES if STREAM_MIN_BYTES is not None else last_level_cache_bytes()
    return nbytes >= limit and out.ctypes.data % out.itemsize == 0


@functools.cache
def last_level_cache_bytes() -> int:
    """Size of the largest cache the system reports, or 32 MiB where it reports none."""
    best = 0
    for name in ("SC_LEVEL4_CACHE_SIZE", "SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
        try:
            best = max(best, int(os.sysconf(name)))
        except (ValueError, OSError):
            continue
    return best if best > 0 else _FALLBACK_CACHE


def table_lookup() -> bool:
    """Whether line functions may look 4-bit codes up in a register of 16 values (an AVX-512 permute).

    numba compiles for the host processor unless told otherwise
    (``NUMBA_CPU_NAME``, ``NUMBA_CPU_FEATURES``); told otherwise, the line
    functions keep to portable vector code.
    """
    from llvmlite import binding
    from numba.core import config

    if config.CPU_NAME or config.CPU_FEATURES:
        return False
    return bool(binding.get_host_cpu_features().get("avx512f", False))


def _data(context, builder, array_type, value):
    return context.make_array(array_type)(context, builder, value).data


def _splat(builder, value, vector_type):
    lanes = vector_type.count
    one = builder.insert_element(ir.Constant(vector_type, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(
        one, ir.Constant(vector_type, ir.Undefined), ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes)
    )


def _lane_select(builder, split, below, above):
    """Lanes of vector ``below`` under the int ``split``, those of vector ``above`` from there on."""
    # Lane numbers compared as int32: as wide as the float lanes, one mask a vector register.
    lanes = below.type.count
    index_type = ir.VectorType(ir.IntType(32), lanes)
    split32 = builder.trunc(split, ir.IntType(32)) if split.type.width > 32 else split
    under = builder.icmp_signed("<", ir.Constant(index_type, list(range(lanes))), _splat(builder, split32, index_type))
    return builder.select(under, below, above)


def _split_splat(builder, first, second, split, vector_type):
    """A vector of ``first`` in lanes below the int ``split`` and ``second`` from there on."""
    return _lane_select(builder, split, _splat(builder, first, vector_type), _splat(builder, second, vector_type))


def _three_splat(builder, values, splits, vector_type):
    """A vector of ``values[0]`` below lane ``splits[0]``, ``values[1]`` below ``splits[1]``, ``values[2]`` after."""
    v0, v1, v2 = (_splat(builder, builder.extract_value(values, n), vector_type) for n in range(3))
    split1, split2 = (builder.extract_value(splits, n) for n in range(2))
    return _lane_select(builder, split1, v0, _lane_select(builder, split2, v1, v2))


def _store_line(builder, value, array_data, index):
    """Store the vector ``value`` at element ``index`` of an array's data, aligned and non-temporal."""
    pointer = builder.bitcast(builder.gep(array_data, [index]), value.type.as_pointer())
    store = builder.store(value, pointer, align=LINE)
    store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))


def _load(builder, array_data, index, vector_type):
    pointer = builder.bitcast(builder.gep(array_data, [index]), vector_type.as_pointer())
    return builder.load(pointer, align=1)


def _clamp(builder, v, low, high):
    v = builder.select(builder.fcmp_ordered(">", v, low), v, low)
    return builder.select(builder.fcmp_ordered("<", v, high), v, high)


def _load_values(builder, x_data, xj, lanes, x_is_int):
    """``lanes`` float32 values of ``x`` from element ``xj``: float32 as they are, int32 converted as ``np.float32`` does."""
    f32 = ir.VectorType(ir.FloatType(), lanes)
    raw = _load(builder, x_data, xj, ir.VectorType(ir.IntType(32), lanes) if x_is_int else f32)
    return builder.sitofp(raw, f32) if x_is_int else raw


def _keep_first_nan(builder, first, result):
    """``result`` of an operation on vector ``first``, but ``first`` in its NaN lanes (``_encode.add_zero_point``)."""
    return builder.select(builder.fcmp_unordered("uno", first, first), first, result)


def _rint(builder, v):
    lanes = v.type.count
    f32 = v.type
    rint = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32]), f"llvm.rint.v{lanes}f32")
    return builder.call(rint, [v])


def _integer_codes(builder, v, s, z, lo, hi, mask):
    """int32 lanes of :func:`._quantize_runs.integer_code` (``v / s`` with zero points ``z``, float32 vectors)."""
    f32 = v.type
    lanes = f32.count
    r = _rint(builder, builder.fdiv(v, s))
    r = builder.select(builder.fcmp_unordered("uno", r, r), ir.Constant(f32, [0.0] * lanes), r)  # NaN -> 0
    v = _clamp(builder, builder.fadd(r, z), _splat(builder, lo, f32), _splat(builder, hi, f32))
    i32 = ir.VectorType(ir.IntType(32), lanes)
    return builder.and_(builder.fptosi(v, i32), _splat(builder, mask, i32))


def _float_quotient_codes(builder, x_data, xj, lanes, x_is_int, s, z, float_args):
    """int32 lanes of :func:`._encode.float_code` of ``x[xj:] / s`` with one scale ``s`` and zero point ``z``.

    ``float_args`` is ``(has_zp, nan_to_zp, cap, k)``.
    """
    f32 = ir.VectorType(ir.FloatType(), lanes)
    q = builder.fdiv(_load_values(builder, x_data, xj, lanes, x_is_int), _splat(builder, s, f32))
    return _float_codes(builder, q, _splat(builder, z, f32), *float_args)


def _float_codes(builder, q, z, has_zp, nan_to_zp, cap, k):
    """int32 lanes of :func:`._encode.float_code` of the quotients ``q`` with zero points ``z`` (float32 vectors), step for step."""
    f32 = q.type
    lanes = f32.count
    i32 = ir.VectorType(ir.IntType(32), lanes)
    pmin, unit, step, nan, neg, pos, above, below = (_splat(builder, builder.extract_value(k, n), f32) for n in range(8))
    v = _keep_first_nan(builder, q, builder.fadd(q, builder.select(has_zp, z, ir.Constant(f32, [-0.0] * lanes))))
    v = builder.select(
        builder.and_(_splat(builder, nan_to_zp, ir.VectorType(ir.IntType(1), lanes)), builder.fcmp_unordered("!=", v, v)),
        z,
        v,
    )
    v_bits = builder.bitcast(v, i32)
    a = builder.bitcast(builder.and_(v_bits, ir.Constant(i32, [0x7FFFFFFF] * lanes)), f32)
    cap = _splat(builder, cap, f32)
    a = builder.select(builder.fcmp_ordered("<", cap, a), cap, a)
    exponent = builder.bitcast(builder.and_(builder.bitcast(a, i32), ir.Constant(i32, [0x7F800000] * lanes)), f32)
    low = builder.bitcast(builder.select(builder.fcmp_ordered(">", exponent, pmin), exponent, pmin), i32)
    # In 32 bits: modulo 2**32 the difference has the bits of float_code's (unit fits an unsigned int32).
    scale_bits = builder.sub(builder.fptoui(unit, i32), low)
    r = _rint(builder, builder.fmul(a, builder.bitcast(scale_bits, f32)))
    code = builder.fadd(r, builder.fmul(builder.sitofp(low, f32), step))
    code = builder.select(builder.fcmp_ordered("<", code, nan), code, nan)
    signed = builder.and_(
        builder.icmp_signed("<", v_bits, ir.Constant(i32, [0] * lanes)),
        builder.and_(builder.fcmp_ordered(">", code, above), builder.fcmp_ordered("<", code, below)),
    )
    return builder.fptosi(builder.fadd(code, builder.select(signed, neg, pos)), i32)


@intrinsic
def line_offset(typingctx, array, index):
    """Elements from ``array[index]`` to the next 64-byte boundary (0 if it is on one)."""
    if not isinstance(array, types.Array) or not isinstance(index, types.Integer):
        return None
    itemsize = array.dtype.bitwidth // 8

    def codegen(context, builder, signature, args):
        intp = context.get_value_type(types.intp)
        pointer = builder.gep(_data(context, builder, signature.args[0], args[0]), [args[1]])
        address = builder.ptrtoint(pointer, intp)
        to_boundary = builder.and_(builder.neg(address), ir.Constant(intp, LINE - 1))
        return builder.udiv(to_boundary, ir.Constant(intp, itemsize))

    return types.intp(array, types.intp), codegen


@njit(cache=True, nogil=True)
def line_span(dst, start, n):
    """``(lo, hi)``: of elements ``start .. start + n`` of ``dst``, those from ``lo`` to ``hi`` fill whole lines."""
    lanes = LINE // dst.itemsize
    lo = line_offset(dst, start)
    return lo, lo + (n - lo) // lanes * lanes


@njit(cache=True, nogil=True)
def period_scale(j, period, count):
    """Index of the scale of flat element ``j`` in a periodic layout (:func:`._params.scale_period`)."""
    return (j // period) % count


@njit(cache=True, nogil=True)
def line_scales(k, off, period, count, lanes):
    """The scales of the line at position ``off`` of period ``k`` of a periodic layout.

    In a periodic layout the scale of element ``j`` is ``(j // period) %
    count``. Returns ``(splits, ks, k, off)``: lanes below ``splits[0]`` take
    scale ``ks[0]``, those below ``splits[1]`` ``ks[1]``, the rest
    ``ks[2]``; then where the next line starts. A line meets at most three
    periods, since ``period >= lanes / 2``.
    """
    first = period - off
    if first > lanes:
        return (lanes, lanes), (k, k, k), k, off + lanes
    k1 = k + 1 if k + 1 < count else 0
    rest = lanes - first
    if rest < period:
        return (first, lanes), (k, k1, k1), k1, rest
    k2 = k1 + 1 if k1 + 1 < count else 0
    return (first, first + period), (k, k1, k2), k2, rest - period


@intrinsic
def store_fence(typingctx):
    """A full memory fence: on x86 the lighter ones do not order non-temporal stores."""

    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(), codegen


# The scales (and zero points) of a quantized line: up to three, lanes
# below splits[0] take the first, below splits[1] the second, the rest the
# third. A line of one scale passes it three times and splits (lanes, lanes).
_THREE = types.UniTuple(types.float32, 3)
_FLOAT_CODE_K = types.UniTuple(types.float32, 8)  # float_code's k: its constants from K_PMIN on
_SPLITS = types.UniTuple(types.intp, 2)


@intrinsic
def quantize_line(typingctx, x, xj, dst, dj, s, z, splits, qmin, qmax, mask):
    """``dst[dj:]``'s line (64 bytes of 8- or 16-bit codes) = integer_code(x[xj:] / s, z, qmin, qmax, mask).

    ``s`` and ``z`` are three scales and zero points split at lanes
    ``splits`` (:data:`_THREE`). ``dst + dj`` must be 64-byte aligned. ``x``
    is float32 or int32 (converted to float32 first, as ``np.float32`` does).
    """
    if not (isinstance(x, types.Array) and isinstance(dst, types.Array)) or dst.dtype.bitwidth not in (8, 16):
        return None
    lanes = LINE * 8 // dst.dtype.bitwidth
    x_is_int = isinstance(x.dtype, types.Integer)
    sig = types.void(x, types.intp, dst, types.intp, _THREE, _THREE, _SPLITS, types.float32, types.float32, types.int32)

    def codegen(context, builder, signature, args):
        xs, xj_, ds, dj_, s_, z_, splits_, lo, hi, mask_ = args
        f32 = ir.VectorType(ir.FloatType(), lanes)
        v = _load_values(builder, _data(context, builder, signature.args[0], xs), xj_, lanes, x_is_int)
        s, z = _three_splat(builder, s_, splits_, f32), _three_splat(builder, z_, splits_, f32)
        codes = _integer_codes(builder, v, s, z, lo, hi, mask_)
        out = builder.trunc(codes, ir.VectorType(ir.IntType(dst.dtype.bitwidth), lanes))
        _store_line(builder, out, _data(context, builder, signature.args[2], ds), dj_)
        return context.get_dummy_value()

    return sig, codegen


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
    lanes = LINE // 4
    f = types.float32
    sig = types.void(x, types.intp, types.int32, dst, types.intp, f, f, f, f, types.intp)

    def codegen(context, builder, signature, args):
        xs, xj_, sign_, ds, dj_, s0, z0, s1_, z1_, split_ = args
        i32 = ir.VectorType(ir.IntType(32), lanes)
        raw = _load(
            builder, _data(context, builder, signature.args[0], xs), xj_, ir.VectorType(ir.IntType(x.dtype.bitwidth), lanes)
        )
        values = _integer_values(builder, builder.zext(raw, i32), sign_, lanes)
        _scaled_line(builder, values, s0, z0, s1_, z1_, split_, _data(context, builder, signature.args[3], ds), dj_)
        return context.get_dummy_value()

    return sig, codegen


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
    lanes = LINE // 4
    sig = types.void(x, types.intp, _FORMAT, dst, types.intp, _F, _F, _F, _F, types.intp)

    def codegen(context, builder, signature, args):
        xs, xj_, fmt_, ds, dj_, s0, z0, s1_, z1_, split_ = args
        raw = _load(
            builder, _data(context, builder, signature.args[0], xs), xj_, ir.VectorType(ir.IntType(x.dtype.bitwidth), lanes)
        )
        c = builder.and_(
            builder.zext(raw, ir.VectorType(ir.IntType(32), lanes)),
            ir.Constant(ir.VectorType(ir.IntType(32), lanes), [255] * lanes),
        )
        f = _small_float_values(builder, c, fmt_, lanes, specials=True)
        _scaled_line(builder, f, s0, z0, s1_, z1_, split_, _data(context, builder, signature.args[3], ds), dj_, nan_values=True)
        return context.get_dummy_value()

    return sig, codegen


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


@intrinsic
def quantize_float_line(typingctx, x, xj, dst, dj, s, z, has_zp, nan_to_zp, cap, k):
    """``dst[dj:]``'s line (64 bytes of codes) = float_code(x[xj:] / s, z, has_zp, nan_to_zp, cap, k).

    :func:`._encode.float_code` step for step; ``dst + dj`` must be 64-byte
    aligned. ``x`` is float32 or int32 (converted to float32 first).
    """
    if not (isinstance(x, types.Array) and isinstance(dst, types.Array)) or dst.dtype.bitwidth not in (8, 16):
        return None
    lanes = LINE * 8 // dst.dtype.bitwidth
    x_is_int = isinstance(x.dtype, types.Integer)
    sig = types.void(
        x,
        types.intp,
        dst,
        types.intp,
        types.float32,
        types.float32,
        types.boolean,
        types.boolean,
        types.float32,
        _FLOAT_CODE_K,
    )

    def codegen(context, builder, signature, args):
        xs, xj_, ds, dj_, s_, z_, has_zp_, nan_to_zp_, cap_, k_ = args
        x_data = _data(context, builder, signature.args[0], xs)
        code = _float_quotient_codes(builder, x_data, xj_, lanes, x_is_int, s_, z_, (has_zp_, nan_to_zp_, cap_, k_))
        _store_line(
            builder, builder.trunc(code, ir.VectorType(ir.IntType(8), lanes)), _data(context, builder, signature.args[2], ds), dj_
        )
        return context.get_dummy_value()

    return sig, codegen


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
