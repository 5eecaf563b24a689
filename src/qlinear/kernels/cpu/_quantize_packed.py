"""Packed QuantizeLinear (4- and 2-bit codes): each byte's codes computed together and stored straight into the output.

:func:`packed_runs` walks the runs as :func:`._quantize_runs.integer_runs`
does, a whole byte of codes at a time, with blocks of 32 along the last
axis by one vector function a block (:mod:`._packed_lines`); :func:`pack`
packs codes collected one a byte (the staged path).
"""

from __future__ import annotations

import numpy as np

from qlinear.kernels.cpu._encode import float_code
from qlinear.kernels.cpu._packed_lines import BLOCK_CODES, quantize_crumb_block, quantize_float4_block, quantize_nibble_block
from qlinear.kernels.cpu._params import L_SB
from qlinear.kernels.cpu._quantize_runs import (
    _U,
    _jit,
    first_batch,
    integer_code,
    integer_zero_point,
    next_batch,
    stepping_zero_points,
    zero_point_buffer,
)
from qlinear.kernels.cpu._tiles import pack_codes

__all__ = ["pack", "packed_runs"]


@_jit
def packed_runs(x, start, end, scale, zp, ztab, out, lay, bits, float_out, qmin, qmax, mask, sign, float_args):
    """Packed codes of ``x[start:end]`` straight into the bytes of ``out``; every run starts on a byte.

    ``bits`` is 4 (integer codes, or float4e2m1 codes with ``float_out``)
    or 2 (integer codes). Integer codes are :func:`integer_code`'s, float
    codes :func:`float_code`'s with ``float_args`` (``has_zp, nan_to_zp,
    cap, k``) and zero points looked up in ``ztab``. Only the tensor's
    last run can end inside a byte, and only per tensor (rows and blocks
    whose runs would are kept from here by :func:`._params.packed_runs_fit`):
    a run of one scale writes that byte alone. Stepping runs decode their
    zero points into ``zvalues`` first, as in :func:`integer_runs`.
    """
    has_zp, nan_to_zp, cap, k = float_args
    per_byte = 8 // bits
    zvalues, held = zero_point_buffer(start, end, lay)
    state = first_batch(start, lay)
    j = start
    while j < end:
        n, si, step, runs, state = next_batch(j, end, lay, state)
        whole = n // per_byte
        if n == BLOCK_CODES and not step:
            # Blocks of 32, a row's at a time: each is shorter than the
            # loops' vector step, so one vector function a block, in a loop
            # of its own for each type.
            sb = lay[L_SB]
            if float_out:
                for r in range(runs):
                    sr = si + r * sb
                    jr = j + r * BLOCK_CODES
                    quantize_float4_block(x, jr, scale[sr], ztab[zp[sr]], out, jr // 2, has_zp, nan_to_zp, cap, k)
            elif bits == 4:
                for r in range(runs):
                    sr = si + r * sb
                    jr = j + r * BLOCK_CODES
                    quantize_nibble_block(x, jr, scale[sr], integer_zero_point(zp[sr], sign), out, jr // 2, qmin, qmax, mask)
            else:
                for r in range(runs):
                    sr = si + r * sb
                    jr = j + r * BLOCK_CODES
                    quantize_crumb_block(x, jr, scale[sr], integer_zero_point(zp[sr], sign), out, jr // 4, qmin, qmax, mask)
            j += runs * n
            continue
        for r in range(runs):
            jr, sr = j + r * n, si + r * lay[L_SB]
            o = jr // per_byte
            if step:
                zi = stepping_zero_points(zp, sr, n, zvalues, held, ztab, float_out, sign)
                if float_out:
                    for b in range(whole):
                        q = 2 * b
                        c0 = float_code(
                            np.float32(x[_U(jr + q)]) / scale[_U(sr + q)], zvalues[_U(zi + q)], has_zp, nan_to_zp, cap, k
                        )
                        c1 = float_code(
                            np.float32(x[_U(jr + q + 1)]) / scale[_U(sr + q + 1)],
                            zvalues[_U(zi + q + 1)],
                            has_zp,
                            nan_to_zp,
                            cap,
                            k,
                        )
                        out[_U(o + b)] = c0 | (c1 << 4)
                elif bits == 4:
                    for b in range(whole):
                        q = 2 * b
                        c0 = integer_code(np.float32(x[_U(jr + q)]) / scale[_U(sr + q)], zvalues[_U(zi + q)], qmin, qmax, mask)
                        c1 = integer_code(
                            np.float32(x[_U(jr + q + 1)]) / scale[_U(sr + q + 1)], zvalues[_U(zi + q + 1)], qmin, qmax, mask
                        )
                        out[_U(o + b)] = c0 | (c1 << 4)
                else:
                    for b in range(whole):
                        acc = np.int32(0)
                        for lane in range(4):
                            q = 4 * b + lane
                            v = np.float32(x[_U(jr + q)]) / scale[_U(sr + q)]
                            acc |= integer_code(v, zvalues[_U(zi + q)], qmin, qmax, mask) << (2 * lane)
                        out[_U(o + b)] = acc
            else:
                s = scale[sr]
                z = ztab[zp[sr]] if float_out else integer_zero_point(zp[sr], sign)
                if float_out:
                    for b in range(whole):
                        q = 2 * b
                        c0 = float_code(np.float32(x[_U(jr + q)]) / s, z, has_zp, nan_to_zp, cap, k)
                        c1 = float_code(np.float32(x[_U(jr + q + 1)]) / s, z, has_zp, nan_to_zp, cap, k)
                        out[_U(o + b)] = c0 | (c1 << 4)
                elif bits == 4:
                    for b in range(whole):
                        q = 2 * b
                        c0 = integer_code(np.float32(x[_U(jr + q)]) / s, z, qmin, qmax, mask)
                        c1 = integer_code(np.float32(x[_U(jr + q + 1)]) / s, z, qmin, qmax, mask)
                        out[_U(o + b)] = c0 | (c1 << 4)
                else:
                    for b in range(whole):
                        acc = np.int32(0)
                        for lane in range(4):
                            acc |= integer_code(np.float32(x[_U(jr + 4 * b + lane)]) / s, z, qmin, qmax, mask) << (2 * lane)
                        out[_U(o + b)] = acc
                if n > whole * per_byte:
                    acc = np.int32(0)
                    for q in range(whole * per_byte, n):
                        v = np.float32(x[jr + q]) / s
                        c = float_code(v, z, has_zp, nan_to_zp, cap, k) if float_out else integer_code(v, z, qmin, qmax, mask)
                        acc |= c << (bits * (q - whole * per_byte))
                    out[o + whole] = acc
        j += runs * n


@_jit
def pack(codes, n, out, first, bits):
    """Pack ``codes[:n]`` (element ``first`` onward, ``first % 4 == 0``) into ONNX bytes.

    2- and 4-bit codes by whole bytes in one loop each (the shifts are
    constants, so it vectorizes), a last partial byte alone; 6-bit codes by
    the general packer.
    """
    if bits == 4:
        o0, whole = first // 2, n // 2
        for b in range(whole):
            out[_U(o0 + b)] = codes[_U(2 * b)] | (codes[_U(2 * b + 1)] << 4)
        if n > 2 * whole:
            out[o0 + whole] = codes[n - 1]
    elif bits == 2:
        o0, whole = first // 4, n // 4
        for b in range(whole):
            c = 4 * b
            out[_U(o0 + b)] = codes[_U(c)] | (codes[_U(c + 1)] << 2) | (codes[_U(c + 2)] << 4) | (codes[_U(c + 3)] << 6)
        if n > 4 * whole:
            acc = 0
            for lane in range(n - 4 * whole):
                acc |= np.int64(codes[4 * whole + lane]) << (2 * lane)
            out[o0 + whole] = acc
    else:
        pack_codes(codes, n, out, first, bits)
