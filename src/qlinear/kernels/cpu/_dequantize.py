"""DequantizeLinear on the fused CPU kernel: codes and parameters in, values out."""

from __future__ import annotations

import functools
import math
from types import ModuleType

import ml_dtypes
import numpy as np

from qlinear._builtins import import_numba
from qlinear.dtypes import ElementType
from qlinear.kernels.cpu._params import L_CHUNK, L_N, PREC_BF16, PREC_F16, decode_table, layout, scale_period, step_lines_fit
from qlinear.kernels.cpu._placement import prepare as prepare_placement
from qlinear.kernels.cpu._pool import empty
from qlinear.kernels.cpu._schedule import dynamic_tasks
from qlinear.kernels.cpu._warm import ready
from qlinear.spec import DequantizePlan

__all__ = ["dequantize"]

_WIDE_OUTPUTS = {np.dtype(np.float16): PREC_F16, np.dtype(ml_dtypes.bfloat16): PREC_BF16}
_NO_TABLE = np.zeros(1, np.float32)
# Stand-ins for the kernel's code and result arrays a call does not use.
_EMPTY8, _EMPTY16, _EMPTY32, _EMPTY_F32 = (np.empty(0, t) for t in (np.uint8, np.uint16, np.int32, np.float32))


@functools.lru_cache(maxsize=64)
def _read(kernel: ModuleType, t: ElementType, packed: bool) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's parameters for reading codes of type ``t``, and the table of their values.

    Made once for each type: a call on a few thousand elements would
    otherwise spend longer on them than the kernel on its elements. Shared
    between calls and never written (the caller copies the parameters);
    writeable all the same, since numba compiles a read-only array as
    another type.
    """
    p = np.zeros(kernel.P_LEN, np.int64)
    p[kernel.P_BITS] = t.bits
    if not t.is_integer or (t.qmin < 0 and t.bits < 32):
        p[kernel.P_SIGN_BIT] = 1 << (t.bits - 1)
    if not t.is_integer and t.bits in (4, 6, 8):
        _float_format(kernel, t, p)
    if packed:
        p[kernel.P_READ] = kernel.READ_PACKED_INTEGER if t.is_integer else kernel.READ_PACKED_FLOAT
        return p, decode_table(t, packed=True)
    if t.is_integer and t.bits >= 8:
        p[kernel.P_READ] = kernel.READ_INTEGER
        return p, _NO_TABLE
    p[kernel.P_READ] = kernel.READ_FLOAT if t.bits == 8 else kernel.READ_TABLE
    return p, decode_table(t, packed=False)


def _float_format(kernel: ModuleType, t: ElementType, p: np.ndarray) -> None:
    """Fill ``p``'s slots for decoding float type ``t`` by bit arithmetic.

    The exponent offset moves a code's exponent to float32's bias:
    ``(127 - bias) << 23``. Codes that read as more than the largest finite
    value are infinite if they read as the infinity code does, else NaN
    (NaN bits when the type has no infinity: equal to nothing); fnuz types
    also read their negative zero as NaN.
    """
    info = ml_dtypes.finfo(t.dtype)
    m, exp_off = int(info.nmant), (127 - (1 - int(info.minexp))) << 23
    values = decode_table(t, packed=True)
    half = 1 << (t.bits - 1)
    inf = np.flatnonzero(np.isinf(values[:half]))
    p[kernel.P_MANT], p[kernel.P_EXP_OFF] = m, exp_off
    p[kernel.P_MAX_BITS] = np.float32(t.max_finite).view(np.int32)
    p[kernel.P_INF_BITS] = (int(inf[0]) << (23 - m)) + exp_off if inf.size else np.float32(np.nan).view(np.int32)
    p[kernel.P_NEG_ZERO_NAN] = np.isnan(values[half])
    p[kernel.P_FINITE] = not (t.has_nan or t.has_inf)


def _flat_float32(a: np.ndarray) -> np.ndarray:
    """``a`` as a flat, writeable float32 array, copied only where it must be."""
    flat = np.ascontiguousarray(a, np.float32).reshape(-1)
    return flat if flat.flags.writeable else flat.copy()


def dequantize(
    plan: DequantizePlan,
    x: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | None,
    *,
    out: np.ndarray | None = None,
    packed: bool = False,
    wait: bool = True,
) -> np.ndarray | None:
    """``y = (x - zero_point) * scale`` for a validated plan, fused.

    Bit-exact with the reference kernel. With ``packed``, ``x`` holds ONNX's
    packed bytes of ``plan.input_type`` for ``plan.x_shape``; ``out``
    (already checked by the caller) receives the result. Without ``wait``,
    returns None instead of waiting for the kernel to compile (:mod:`._warm`).
    """
    numba = import_numba()

    from qlinear.kernels.cpu import _dequantize_kernel as kernel
    from qlinear.kernels.cpu._lines import LINE, streams

    t = plan.input_type
    if out is None:
        out = empty(plan.x_shape, plan.output_dtype)
    if math.prod(plan.x_shape) == 0:
        return out
    p, table = _read(kernel, t, packed)
    p = p.copy()
    wide = _WIDE_OUTPUTS.get(np.dtype(plan.output_dtype))
    p[kernel.P_WIDE_OUT] = wide if wide is not None else 0

    scale_f = _flat_float32(scale)
    # Zero points are exact in float32 except int32's, which the kernel reads as int32 from the same bytes.
    if zero_point is None:
        zp_f = np.zeros(scale_f.size, np.float32)
    elif t.name == "int32":
        zp_f = np.ascontiguousarray(zero_point, np.int32).reshape(-1).view(np.float32)
        zp_f = zp_f if zp_f.flags.writeable else zp_f.copy()
    else:
        zp_f = _flat_float32(zero_point)
    codes = np.ascontiguousarray(x).reshape(-1)
    xs = [_EMPTY8, _EMPTY16, _EMPTY32]
    width = {1: 0, 2: 1, 4: 2}[codes.itemsize]
    xs[width] = codes.view(xs[width].dtype)
    values = out.reshape(-1)
    outs = (_EMPTY_F32, values.view(np.uint16)) if wide is not None else (values, _EMPTY16)
    threads = numba.get_num_threads()
    lay = layout(plan.granularity, plan.x_shape, scale.shape, threads)
    p[kernel.P_STREAM] = streams(codes.nbytes + values.nbytes, values)
    lanes = LINE // values.itemsize
    p[kernel.P_PERIOD], p[kernel.P_COUNT] = scale_period(plan.granularity, plan.x_shape, scale.shape, lanes)
    wide_codes = p[kernel.P_READ] == kernel.READ_FLOAT or p[kernel.P_BITS] == 16
    p[kernel.P_STEP_LINES] = p[kernel.P_PERIOD] == 0 and step_lines_fit(lay, values, wide_codes, LINE)
    args = (*xs, table, scale_f, zp_f, *outs, lay, p)
    if not wait and not ready(kernel.dequantize_kernel, args):
        prepare_placement()  # its kernel compiles beside this one, and is cached with it
        return None
    with dynamic_tasks(parallel=threads > 1 and lay[L_CHUNK] < lay[L_N]):
        kernel.dequantize_kernel(*args)
    return out
