"""The inner loops of the fused QuantizeLinear kernel for float32 (or int32) ``x`` in float32 precision.

A run is a stretch of consecutive elements whose scale and zero point are
either one constant or step with each element. Each run is one tight loop
from ``x`` straight to the codes (``x / scale``, then the integer or float
code of the quotient), with every branch outside the loops so LLVM
vectorizes them. Indices are unsigned (``_U``): numba then skips its
negative-index wraparound and LLVM sees consecutive addresses. The run
functions are inlined into the run loop: a call per block of 32 would cost
more than the block.

Zero points arrive as their codes (the output's own bytes or 16-bit words,
never copied): integers are sign-extended in float32, ``z - 2 * sign`` when
``z >= sign`` (``sign`` 0 for unsigned types); float codes are looked up in a
256-entry table of their values.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from qlinear.kernels.cpu._encode import float_code
from qlinear.kernels.cpu._tiles import pack_codes

__all__ = ["float_runs", "integer_runs", "pack"]

_jit = njit(cache=True, nogil=True, error_model="numpy")
_inline = njit(cache=True, nogil=True, error_model="numpy", inline="always")
_U = np.uint64


@_jit
def integer_code(q, z, qmin, qmax, mask):
    """``clip(rint(q) + z, qmin, qmax)``, NaN -> z, as a masked integer code.

    float32 is enough: a rounded quotient and a zero point below 2**16 add
    exactly unless the sum is far outside every integer range, where the
    clamp gives the same answer either way. ``min``/``max`` and int32
    arithmetic keep the loops that call this in full-width vectors.
    """
    r = np.rint(q)
    v = (np.float32(0) if r != r else r) + z
    return np.int32(min(max(v, qmin), qmax)) & mask


@_jit
def integer_zero_point(code, sign):
    """The value of an integer zero point's code (masked to its width), ``sign`` its sign bit or 0."""
    v = np.float32(code)
    return v - (sign + sign if v >= sign else np.float32(0))


@_inline
def integer_runs(x, j, n, dst, o, scale, zp, si, step, qmin, qmax, mask, sign):
    """``dst[o:o+n]`` = integer codes of ``x[j:j+n]``; scales and zero points from ``si``, by ``step``."""
    if step:
        for k in range(n):
            z = integer_zero_point(zp[_U(si + k)], sign)
            dst[_U(o + k)] = integer_code(np.float32(x[_U(j + k)]) / scale[_U(si + k)], z, qmin, qmax, mask)
    else:
        s, z = scale[si], integer_zero_point(zp[si], sign)
        for k in range(n):
            dst[_U(o + k)] = integer_code(np.float32(x[_U(j + k)]) / s, z, qmin, qmax, mask)


@_inline
def float_runs(x, j, n, dst, o, scale, si, step, z, zs, zi, has_zp, nan_to_zp, limit, k):
    """``dst[o:o+n]`` = float codes of ``x[j:j+n]`` (:func:`float_code`); scales from ``si``, by ``step``.

    The zero point is ``z`` for a constant run, ``zs[zi + q]`` (already
    decoded: a table lookup per element would not vectorize) for a stepping one.
    """
    if step:
        for q in range(n):
            v = np.float32(x[_U(j + q)]) / scale[_U(si + q)]
            dst[_U(o + q)] = float_code(v, zs[_U(zi + q)], has_zp, nan_to_zp, limit, k)
    else:
        s = scale[si]
        for q in range(n):
            dst[_U(o + q)] = float_code(np.float32(x[_U(j + q)]) / s, z, has_zp, nan_to_zp, limit, k)


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
