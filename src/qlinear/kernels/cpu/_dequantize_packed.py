"""Packed DequantizeLinear (4-, 2- and 6-bit codes): a whole byte, or 12 bytes of 6-bit codes, at a time.

:func:`nibble_runs`, :func:`crumb_runs` and :func:`sextet_runs` walk the
runs as :func:`._dequantize_runs.integer_runs` does; for periodic layouts
:func:`packed_period_lines` writes whole lines by streaming stores
(:mod:`._dequantize_lines`) where :func:`packed_lines_fit` says the lines
begin on a byte. The walks repeat each other's run loop on purpose, as
the run walks of :mod:`._dequantize_runs` do: a call per run would cost
more than the run.
"""

from __future__ import annotations

import numpy as np

from qlinear.kernels.cpu._dequantize_lines import dequantize_crumb_line, dequantize_float4_line, dequantize_nibble_line
from qlinear.kernels.cpu._dequantize_runs import _U, _finite_value, _format, _jit, _next_run, _shape, _signed
from qlinear.kernels.cpu._lines import LINE, line_offset, line_scales, line_span, period_scale
from qlinear.kernels.cpu._packed_lines import dequantize_sextet_steps, dequantize_sextets
from qlinear.kernels.cpu._tiles import locate

__all__ = ["crumb_runs", "nibble_runs", "packed_lines_fit", "packed_period_lines", "sextet_runs"]


@_jit
def packed_lines_fit(dst, start, bits):
    """Whether the whole lines of ``dst`` from element ``start`` begin on a byte of ``bits``-bit codes."""
    return (start + line_offset(dst, start)) % (8 // bits) == 0


@_jit
def packed_period_lines(x, bits, sign, fmt, start, end, period, count, table, scale, zp, dst):
    """:func:`nibble_runs`' and :func:`crumb_runs`' ``dst[j]`` for a periodic layout, in whole lines by streaming stores.

    As :func:`period_lines`, a line of 16 codes (8 or 4 bytes of
    ``x``) at a time: 4-bit integers, float4e2m1 (``fmt[0]`` above 0) or
    2-bit integers. The caller checks :func:`packed_lines_fit`. Elements
    before the first whole line and after the last go through ``table``.
    """
    sign, f32, small_float = np.int32(sign), _format(fmt), fmt[0] > 0
    lanes, per_byte, mask = LINE // dst.itemsize, 8 // bits, (1 << bits) - 1
    lo, hi = line_span(dst, start, end - start)
    for t in range(lo + end - start - hi):
        j = start + t if t < lo else start + hi + t - lo
        k = period_scale(j, period, count)
        dst[j] = (table[(x[j // per_byte] >> (j % per_byte * bits)) & mask] - zp[k]) * scale[k]
    k = period_scale(start + lo, period, count)
    off = (start + lo) % period
    for j in range(start + lo, start + hi, lanes):
        splits, ks, k, off = line_scales(k, off, period, count, lanes)
        split, k0, k1 = splits[0], ks[0], ks[1]
        s0, z0, s1, z1, byte = scale[_U(k0)], zp[_U(k0)], scale[_U(k1)], zp[_U(k1)], j // per_byte
        if bits == 2:
            dequantize_crumb_line(x, byte, sign, f32, dst, j, s0, z0, s1, z1, split)
        elif small_float:
            dequantize_float4_line(x, byte, sign, f32, dst, j, s0, z0, s1, z1, split)
        else:
            dequantize_nibble_line(x, byte, sign, f32, dst, j, s0, z0, s1, z1, split)


@_jit
def nibble_runs(x, sign, fmt, start, end, table, scale, zp, dst, d0, lay):
    """``dst[j - d0]``: 4-bit code ``j`` of packed ``x``, a whole byte (two codes) at a time.

    Integers are signed by ``sign`` (8 for int4, 0 for uint4); float4e2m1
    (``fmt[0]``, its mantissa bits, above 0) is decoded by :func:`_finite_value`.
    """
    sign, by_arithmetic, f32 = np.int32(sign), fmt[0] > 0, _format(fmt)
    o, d, i, b, shape = *locate(start, lay), _shape(lay)
    j = start
    while j < end:
        n, si, step, o, d, i, b = _next_run(o, d, i, b, j, end, shape)
        # Codes [head, head + 2 * whole) of the run fill whole bytes from x[b0].
        head = min(n, j & 1)
        whole = (n - head) >> 1
        b0, dj, sj = (j + head) >> 1, j + head - d0, si + head * step
        if by_arithmetic and step:
            for q in range(whole):
                c = np.int32(x[_U(b0 + q)])
                lo, hi = _finite_value(np.int32(c & 15), f32), _finite_value(np.int32(c >> 4), f32)
                dst[_U(dj + 2 * q)] = (lo - zp[_U(sj + 2 * q)]) * scale[_U(sj + 2 * q)]
                dst[_U(dj + 2 * q + 1)] = (hi - zp[_U(sj + 2 * q + 1)]) * scale[_U(sj + 2 * q + 1)]
        elif by_arithmetic:
            s, z = scale[si], zp[si]
            for q in range(whole):
                c = np.int32(x[_U(b0 + q)])
                dst[_U(dj + 2 * q)] = (_finite_value(np.int32(c & 15), f32) - z) * s
                dst[_U(dj + 2 * q + 1)] = (_finite_value(np.int32(c >> 4), f32) - z) * s
        elif step:
            for q in range(whole):
                c = np.int32(x[_U(b0 + q)])
                lo, hi = _signed(c & 15, sign), _signed(c >> 4, sign)
                dst[_U(dj + 2 * q)] = (lo - zp[_U(sj + 2 * q)]) * scale[_U(sj + 2 * q)]
                dst[_U(dj + 2 * q + 1)] = (hi - zp[_U(sj + 2 * q + 1)]) * scale[_U(sj + 2 * q + 1)]
        else:
            s, z = scale[si], zp[si]
            for q in range(whole):
                c = np.int32(x[_U(b0 + q)])
                dst[_U(dj + 2 * q)] = (_signed(c & 15, sign) - z) * s
                dst[_U(dj + 2 * q + 1)] = (_signed(c >> 4, sign) - z) * s
        # The rest: the head, and the code after the last whole byte.
        for t in range(n - 2 * whole):
            k = t if t < head else t + 2 * whole
            e = j + k
            sk = si + k * step
            dst[e - d0] = (table[(x[e >> 1] >> ((e & 1) * 4)) & 15] - zp[sk]) * scale[sk]
        j += n


@_jit
def _three_bytes(x, at):
    """The little-endian 24-bit word of ``x[at:at + 3]``: four 6-bit codes."""
    return np.int32(x[_U(at)]) | (np.int32(x[_U(at + 1)]) << 8) | (np.int32(x[_U(at + 2)]) << 16)


@_jit
def sextet_runs(x, fmt, start, end, table, scale, zp, dst, d0, lay):
    """``dst[j - d0]``: 6-bit float code ``j`` of packed ``x``, 16 codes (12 bytes) a vector, then four (3 bytes) at a time.

    The float6 types have neither infinity nor NaN: each code is decoded
    by :func:`_finite_value`, as float4e2m1's are.
    """
    f32 = _format(fmt)
    o, d, i, b, shape = *locate(start, lay), _shape(lay)
    j = start
    while j < end:
        n, si, step, o, d, i, b = _next_run(o, d, i, b, j, end, shape)
        # Codes [head, head + 4 * whole) of the run fill whole groups of three bytes from x[b0].
        head = min(n, -j & 3)
        whole = (n - head) >> 2
        b0, dj, sj = (j + head) // 4 * 3, j + head - d0, si + head * step
        # 16 codes (12 bytes) a vector while they last, then a group of four at a time.
        vectors = whole // 4
        if step:
            for v in range(vectors):
                dequantize_sextet_steps(x, b0 + 12 * v, f32, dst, dj + 16 * v, scale, sj + 16 * v, zp, sj + 16 * v)
        else:
            for v in range(vectors):
                dequantize_sextets(x, b0 + 12 * v, f32, dst, dj + 16 * v, scale[si], zp[si])
        if step:
            for q in range(4 * vectors, whole):
                word = _three_bytes(x, b0 + 3 * q)
                for lane in range(4):
                    v = _finite_value(np.int32((word >> (6 * lane)) & 63), f32)
                    dst[_U(dj + 4 * q + lane)] = (v - zp[_U(sj + 4 * q + lane)]) * scale[_U(sj + 4 * q + lane)]
        else:
            s, z = scale[si], zp[si]
            for q in range(4 * vectors, whole):
                word = _three_bytes(x, b0 + 3 * q)
                for lane in range(4):
                    dst[_U(dj + 4 * q + lane)] = (_finite_value(np.int32((word >> (6 * lane)) & 63), f32) - z) * s
        # The rest: the head, and the codes after the last whole group, one at a time.
        for t in range(n - 4 * whole):
            k = t if t < head else t + 4 * whole
            e = j + k
            sk = si + k * step
            pos = e * 6
            word = np.int32(x[pos >> 3]) | (np.int32(x[(pos + 5) >> 3]) << 8)
            dst[e - d0] = (table[(word >> (pos & 7)) & 63] - zp[sk]) * scale[sk]
        j += n


@_jit
def crumb_runs(x, sign, start, end, table, scale, zp, dst, d0, lay):
    """``dst[j - d0]``: 2-bit integer code ``j`` of packed ``x``, a whole byte (four codes) at a time.

    Signed by ``sign`` (2 for int2, 0 for uint2).
    """
    sign = np.int32(sign)
    o, d, i, b, shape = *locate(start, lay), _shape(lay)
    j = start
    while j < end:
        n, si, step, o, d, i, b = _next_run(o, d, i, b, j, end, shape)
        # Codes [head, head + 4 * whole) of the run fill whole bytes from x[b0].
        head = min(n, -j & 3)
        whole = (n - head) >> 2
        b0, dj, sj = (j + head) >> 2, j + head - d0, si + head * step
        if step:
            for q in range(whole):
                c = np.int32(x[_U(b0 + q)])
                for lane in range(4):
                    v = _signed((c >> (2 * lane)) & 3, sign)
                    dst[_U(dj + 4 * q + lane)] = (v - zp[_U(sj + 4 * q + lane)]) * scale[_U(sj + 4 * q + lane)]
        else:
            s, z = scale[si], zp[si]
            for q in range(whole):
                c = np.int32(x[_U(b0 + q)])
                for lane in range(4):
                    dst[_U(dj + 4 * q + lane)] = (_signed((c >> (2 * lane)) & 3, sign) - z) * s
        # The rest: the head, and the codes after the last whole byte.
        for t in range(n - 4 * whole):
            k = t if t < head else t + 4 * whole
            e = j + k
            sk = si + k * step
            dst[e - d0] = (table[(x[e >> 2] >> ((e & 3) * 2)) & 3] - zp[sk]) * scale[sk]
        j += n
