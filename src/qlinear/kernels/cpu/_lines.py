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
:func:`._dequantize_runs.integer_runs`' arithmetic for
:func:`._dequantize_lines.dequantize_line`, :func:`._dequantize_runs.float_runs`'
for :func:`._dequantize_lines.dequantize_float8_line`). Being
intrinsics, they are inlined with no call: a call that passes arrays costs
numba's atomic reference counting, and every atomic instruction waits for
all loads in flight.

Where the scale of element ``j`` is ``scale[(j // period) % count]``, a
line may span the end of a block or a row: DequantizeLinear's lines take
two scales and the lane where the second starts, QuantizeLinear's of
integer codes three (64 codes over blocks of 32) and two lanes;
:func:`line_scales` walks them. Float codes keep lines of one scale: their
lines of three measured no faster on blocks.

This module holds what the line functions share (the streaming policy,
LLVM helpers, the line walk) and QuantizeLinear's lines;
:mod:`._dequantize_lines` holds DequantizeLinear's, and
:mod:`._packed_lines` the vector functions of packed codes (QuantizeLinear
on blocks of 32 codes, 6-bit codes).

:func:`store_fence` ends a task's streaming: non-temporal stores are not
ordered with later ones until a fence.
"""

from __future__ import annotations

import functools
import os

from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from qlinear._builtins import max
from qlinear.kernels.cpu._llvm import call_intrinsic, host_has, prefetch

__all__ = [
    "LINE",
    "LONGEST_BLOCK_PERIOD",
    "STREAM_MIN_RUN",
    "last_level_cache_bytes",
    "line_offset",
    "line_scales",
    "line_span",
    "period_scale",
    "quantize_cached_line",
    "quantize_float_line",
    "quantize_line",
    "store_fence",
    "streams",
    "table_lookup",
]

LINE = 64  # bytes of a cache line
# QuantizeLinear's lines of integer codes ask for x this many bytes ahead of
# the line they load. The hardware prefetchers alone left one core of an
# Intel Xeon guest waiting on memory (8-bit per-tensor Q of 16M elements:
# 1.0-1.06x ONNX Runtime's time, 0.6-0.7x with these prefetches; 4 KB ahead
# gave 0.75x, 32 KB 0.68-0.73x). Float codes are bound by computing them
# (about twice the time of the memory they move) and do without.
PREFETCH_AHEAD = 16 << 10
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
    """Whether line functions may look 4-bit codes up in a register of 16 values (an AVX-512 permute)."""
    return host_has("avx512f")


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


def _store_line(builder, value, array_data, index, nontemporal=True):
    """Store the vector ``value`` at element ``index`` of an array's data: aligned and non-temporal, or an ordinary store.

    Ordinary stores claim no alignment: an ``out=`` view at an odd byte
    offset has no element on a line boundary (it never streams).
    """
    pointer = builder.bitcast(builder.gep(array_data, [index]), value.type.as_pointer())
    store = builder.store(value, pointer, align=LINE if nontemporal else 1)
    if nontemporal:
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))


def _load(builder, array_data, index, vector_type):
    pointer = builder.bitcast(builder.gep(array_data, [index]), vector_type.as_pointer())
    return builder.load(pointer, align=1)


def _clamp(builder, v, low, high):
    v = builder.select(builder.fcmp_ordered(">", v, low), v, low)
    return builder.select(builder.fcmp_ordered("<", v, high), v, high)


def _load_values(builder, x_data, xj, lanes, x_is_int, ask_ahead=False):
    """``lanes`` float32 values of ``x`` from element ``xj``: float32 as they are, int32 converted as ``np.float32`` does.

    With ``ask_ahead``, first prefetch the values :data:`PREFETCH_AHEAD` bytes further on (the lines of integer codes).
    """
    f32 = ir.VectorType(ir.FloatType(), lanes)
    if ask_ahead:
        at = builder.add(xj, ir.Constant(xj.type, PREFETCH_AHEAD // 4))
        prefetch(builder, builder.gep(x_data, [at]), lanes * 4, LINE)
    raw = _load(builder, x_data, xj, ir.VectorType(ir.IntType(32), lanes) if x_is_int else f32)
    return builder.sitofp(raw, f32) if x_is_int else raw


def _keep_first_nan(builder, first, result):
    """``result`` of an operation on vector ``first``, but ``first`` in its NaN lanes (``_encode.add_zero_point``)."""
    return builder.select(builder.fcmp_unordered("uno", first, first), first, result)


def _rint(builder, v):
    return call_intrinsic(builder, f"llvm.rint.v{v.type.count}f32", v.type, [v])


def _integer_codes(builder, v, s, z, lo, hi, mask):
    """int32 lanes of :func:`._quantize_runs.integer_code` (``v / s`` with zero points ``z``, float32 vectors)."""
    f32 = v.type
    lanes = f32.count
    i32 = ir.VectorType(ir.IntType(32), lanes)
    q = builder.fdiv(v, s)
    # Clamped to [qmin - z, qmax - z], then rounded and converted in one
    # instruction, NaN lanes given the zero point: integer_code's steps.
    c = _clamp(builder, q, builder.fsub(_splat(builder, lo, f32), z), builder.fsub(_splat(builder, hi, f32), z))
    zi = builder.fptosi(z, i32)
    codes = builder.add(builder.fptosi(_rint(builder, c), i32), zi)
    codes = builder.select(builder.fcmp_ordered("ord", q, q), codes, zi)
    return builder.and_(codes, _splat(builder, mask, i32))


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
    return _quantize_line(x, dst, True)


@intrinsic
def quantize_cached_line(typingctx, x, xj, dst, dj, s, z, splits, qmin, qmax, mask):
    """:func:`quantize_line` by an ordinary store, for outputs that stay in cache."""
    return _quantize_line(x, dst, False)


def _quantize_line(x, dst, nontemporal):
    if not (isinstance(x, types.Array) and isinstance(dst, types.Array)) or dst.dtype.bitwidth not in (8, 16):
        return None
    lanes = LINE * 8 // dst.dtype.bitwidth
    x_is_int = isinstance(x.dtype, types.Integer)
    sig = types.void(x, types.intp, dst, types.intp, _THREE, _THREE, _SPLITS, types.float32, types.float32, types.int32)

    def codegen(context, builder, signature, args):
        xs, xj_, ds, dj_, s_, z_, splits_, lo, hi, mask_ = args
        f32 = ir.VectorType(ir.FloatType(), lanes)
        v = _load_values(builder, _data(context, builder, signature.args[0], xs), xj_, lanes, x_is_int, ask_ahead=True)
        s, z = _three_splat(builder, s_, splits_, f32), _three_splat(builder, z_, splits_, f32)
        codes = _integer_codes(builder, v, s, z, lo, hi, mask_)
        out = builder.trunc(codes, ir.VectorType(ir.IntType(dst.dtype.bitwidth), lanes))
        _store_line(builder, out, _data(context, builder, signature.args[2], ds), dj_, nontemporal)
        return context.get_dummy_value()

    return sig, codegen


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
