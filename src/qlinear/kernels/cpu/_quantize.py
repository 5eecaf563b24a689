"""QuantizeLinear on the fused CPU kernel: arrays and parameters in, codes out."""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import ml_dtypes
import numpy as np

from qlinear._builtins import import_numba
from qlinear.dtypes import ElementType, packed_size, round_to
from qlinear.kernels.cpu._params import (
    L_CHUNK,
    L_N,
    PREC_BF16,
    PREC_F16,
    PREC_F32,
    decode_table,
    float_encoding,
    layout,
    packed_runs_fit,
    precision_code,
    scale_period,
)
from qlinear.kernels.cpu._placement import prepare as prepare_placement
from qlinear.kernels.cpu._pool import empty
from qlinear.kernels.cpu._schedule import dynamic_tasks
from qlinear.kernels.cpu._warm import ready
from qlinear.spec import QuantizePlan

__all__ = ["quantize"]

# float16/bfloat16 x reaches the kernel as its bits; the kernel decodes them.
_WIDE_INPUTS = {np.dtype(np.float16): PREC_F16, np.dtype(ml_dtypes.bfloat16): PREC_BF16}
# Integer zero points are decoded arithmetically; the kernel still takes a table.
_NO_TABLE = np.zeros(256, np.float32)


class _TypeConstants(NamedTuple):
    """The kernel's arguments that depend on the call's types and flags only, not on its arrays."""

    p: np.ndarray  # parameter slots; each call copies it and adds its layout's
    f: np.ndarray
    fk: np.ndarray
    ztab: np.ndarray


@functools.lru_cache(maxsize=256)
def _type_constants(t: ElementType, prec: int, xwide: int, saturate: bool, has_zp: bool, packed: bool) -> _TypeConstants:
    """Parameter slots and encodings for output type ``t``, made once for each combination.

    A call on a few thousand elements spends longer building these (a dozen
    small numpy arrays) than the kernel spends on its elements. The arrays
    are shared between calls and never written (``p`` is copied first).
    They stay writeable all the same: numba compiles a read-only array as
    another type, so the kernel would get a second signature.
    """
    from qlinear.kernels.cpu import _quantize_kernel as kernel
    from qlinear.kernels.cpu._encode import FLOAT_CODE_LEN, float_code_constants

    p = np.zeros(kernel.P_LEN, np.int64)
    p[kernel.P_FLOAT_OUT] = not t.is_integer
    p[kernel.P_XWIDE] = xwide
    p[kernel.P_PREC] = prec
    p[kernel.P_QMIN], p[kernel.P_QMAX] = (t.qmin, t.qmax) if t.is_integer else (0, 0)
    p[kernel.P_MASK] = (1 << t.bits) - 1
    p[kernel.P_HAS_ZP] = has_zp
    p[kernel.P_NAN_TO_ZP] = not t.has_nan
    p[kernel.P_CLIP] = saturate or not t.saturate_applies
    p[kernel.P_PACKED_BITS] = t.bits if packed else 0
    p[kernel.P_ZP_SIGN] = 1 << (t.bits - 1) if t.is_integer and t.qmin < 0 else 0
    f = np.zeros(kernel.F_LEN, np.float64)
    f[kernel.F_LIMIT] = t.max_finite or 0.0
    # Every quantized float type's codes come from float_code, on both paths.
    fk = np.zeros(FLOAT_CODE_LEN, np.float32) if t.is_integer else float_code_constants(t, float_encoding(t)[0])
    if fk is None:
        raise AssertionError(f"_type_constants: float_code has no constants for {t.name}")
    # float32 (or int32) x in float32 precision goes straight from x to the
    # codes; float16 and bfloat16 x or precision through the staged tiles.
    p[kernel.P_DIRECT] = prec == PREC_F32 and xwide == PREC_F32
    ztab = decode_table(t, False) if not t.is_integer else _NO_TABLE
    return _TypeConstants(p, f, fk, ztab)


def quantize(
    plan: QuantizePlan,
    x: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | None,
    *,
    out: np.ndarray | None = None,
    packed: bool = False,
    wait: bool = True,
) -> np.ndarray | None:
    """``y = saturate(round(x / scale) + zero_point)`` for a validated plan, fused.

    Bit-exact with the reference kernel. ``packed`` writes 2/4/6-bit outputs
    in ONNX's byte layout; ``out`` (already checked by the caller to have the
    result's dtype and shape, C-contiguous) receives the result. Zero points
    reach the kernel as their own bytes (or 16-bit words), not copied.
    Without ``wait``, returns None instead of waiting for the kernel to
    compile (:mod:`._warm`), ``out`` left unwritten.
    """
    numba = import_numba()

    from qlinear.kernels.cpu import _quantize_kernel as kernel
    from qlinear.kernels.cpu._lines import LINE, LONGEST_BLOCK_PERIOD, streams
    from qlinear.kernels.cpu._packed_lines import BLOCK_CODES

    t = plan.output_type
    count = math.prod(plan.x_shape)
    if out is None:
        out = empty((packed_size(count, t.bits),), np.uint8) if packed else empty(plan.x_shape, t.dtype)
    if count == 0:
        return out
    code_dtype = np.uint16 if t.bits == 16 else np.uint8
    prec = precision_code(plan.precision)
    if x.dtype == np.int32 and prec != PREC_F32:
        # Rounded once to the 16-bit precision here; the kernel would go through float32 and round twice.
        x = round_to(x, plan.precision)
    xwide = _WIDE_INPUTS.get(x.dtype, PREC_F32)
    flat_x = np.ascontiguousarray(x).reshape(-1)
    if xwide != PREC_F32:
        flat_x = flat_x.view(np.uint16)
    scale_f = np.ascontiguousarray(round_to(scale, plan.precision).astype(np.float32, copy=False)).reshape(-1)
    if zero_point is None:
        zp_codes = np.zeros(scale_f.size, code_dtype)
    else:
        zp_codes = np.ascontiguousarray(zero_point).reshape(-1).view(code_dtype)
        if t.is_integer and t.bits < 8 and zp_codes.max(initial=0) >> t.bits:
            # Bits above a sub-byte code are not part of its value.
            zp_codes = zp_codes & np.uint8((1 << t.bits) - 1)

    constants = _type_constants(t, prec, xwide, plan.saturate, zero_point is not None, packed)
    p = constants.p.copy()
    f, fk, ztab = constants.f, constants.fk, constants.ztab

    codes = out.reshape(-1).view(code_dtype)
    p[kernel.P_STREAM] = streams(flat_x.nbytes + codes.nbytes, codes)
    if not packed:
        # Blocks stream a line of codes at a time (a line meets at most three
        # periods of at least half a line); longer periods go by runs, whose
        # long ones stream by themselves.
        period, count = scale_period(plan.granularity, plan.x_shape, scale.shape, LINE // codes.itemsize // 2)
        if period <= LONGEST_BLOCK_PERIOD:
            p[kernel.P_PERIOD], p[kernel.P_COUNT] = period, count
    elif p[kernel.P_DIRECT] and t.bits in (2, 4):
        # 2/4-bit codes go straight into their bytes where every run starts on
        # a byte and fills a line of them, or is a block of 32 (a loop of its
        # own); other short runs measured slower so than through pieces.
        per_byte = 8 // t.bits
        p[kernel.P_BYTE_RUNS] = packed_runs_fit(plan.granularity, plan.x_shape, per_byte, LINE * per_byte, BLOCK_CODES)
    threads = numba.get_num_threads()
    lay = layout(plan.granularity, plan.x_shape, scale.shape, threads)
    run = kernel.quantize_packed_kernel if packed else kernel.quantize_kernel
    args = (flat_x, scale_f, zp_codes, ztab, codes, lay, p, f, fk)
    if not wait and not ready(run, args):
        prepare_placement()  # its kernel compiles beside this one, and is cached with it
        return None
    with dynamic_tasks(parallel=threads > 1 and lay[L_CHUNK] < lay[L_N]):
        run(*args)
    return out
