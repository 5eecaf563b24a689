"""What the fused kernels are told: plain integer and float parameter arrays.

The kernels are few and generic. Everything that varies between element
types, granularities and precisions reaches them as numbers in small arrays
built here, in numpy, so one compiled kernel serves every output type and
numba compiles a handful of specializations (by the array types of ``x`` and
the output), not one per combination.

Slot names are module constants: numba freezes them into the kernels.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from qlinear.dtypes import ElementType, element_type
from qlinear.spec import Granularity

__all__ = [
    "layout",
    "scale_period",
    "step_lines_fit",
    "packed_runs_fit",
    "float_encoding",
    "decode_table",
    "precision_code",
    "MIN_CHUNK",
    "MAX_CHUNK",
    "TASKS_PER_THREAD",
    "chunk_elements",
]

# Elements one parallel task covers, between these bounds (multiples of 64,
# so a task owns whole bytes of every packed layout: 2, 4 and 6 bits).
# Each task pays a pause where its loops end and the next task's begin
# (about 0.4 us, measured: the loads in flight drain), so tasks are long;
# yet a call is split into TASKS_PER_THREAD tasks a thread, handed out as
# threads come free (kernels/cpu/_schedule.py), so that a thread that loses
# its core to another process delays the call by one task, not by half of
# it. Measured, 16M elements, int8 per tensor, 2 threads, one core kept busy
# by another process: 4.4-8.0 ms with two tasks a thread statically
# scheduled, 1.9-2.3 ms with 16 tasks on TBB (one thread: 1.9 ms); idle,
# tasks of at most 256K elements cost 2-6% against two a thread, tasks of
# up to 1M elements 0-3%.
MIN_CHUNK = 16384
MAX_CHUNK = 1 << 20
TASKS_PER_THREAD = 8
_CHUNK_ALIGN = 64


def chunk_elements(n: int, threads: int) -> int:
    """Elements per parallel task for ``n`` elements on ``threads`` threads.

    :data:`TASKS_PER_THREAD` tasks a thread where that keeps them between
    MIN_CHUNK and MAX_CHUNK.
    """
    wanted = -(-n // (TASKS_PER_THREAD * max(1, threads)))
    wanted = -(-wanted // _CHUNK_ALIGN) * _CHUNK_ALIGN
    return min(MAX_CHUNK, max(MIN_CHUNK, wanted))


# Layout slots: x is seen as (O, D, I) in C order, scales as blocks of B
# along D; the scale of element (o, d, i) is scale[o*SO + (d//B)*SB + i*SI].
# GATHER is 1 where runs of one scale (or of stepping scales) are short.
L_N, L_D, L_I, L_B, L_SO, L_SB, L_SI, L_CHUNK, L_GATHER = range(9)

# Runs shorter than this are gathered into tiles rather than processed one
# by one: per-run overhead would otherwise dominate (blocks of 32).
_SHORT_RUN = 256

# Encoding slots: float32 -> an IEEE-like format with M mantissa bits, by bit
# arithmetic (round half to even). ENC_SUBMUL (a float) lives in the float
# array the kernels receive.
(E_M, E_REBIAS, E_SUBLIM, E_MAXMAG, E_OVF, E_NANBASE, E_NANMASK, E_NANMIN, E_SIGNSHIFT, E_SIGNED_ZERO, E_SIGNED_SPECIAL) = range(
    11
)
_E_LEN = 11

# Precision codes: how a float32 value is rounded to the plan's precision.
PREC_F32, PREC_F16, PREC_BF16 = 0, 1, 2
_PRECISION_CODES = {np.dtype(np.float32): PREC_F32, np.dtype(np.float16): PREC_F16, np.dtype(ml_dtypes.bfloat16): PREC_BF16}


def precision_code(dtype: np.dtype) -> int:
    """The kernels' code for a float32, float16 or bfloat16 dtype."""
    return _PRECISION_CODES[np.dtype(dtype)]


def layout(g: Granularity, shape: tuple[int, ...], scale_shape: tuple[int, ...], threads: int = 1) -> np.ndarray:
    """Layout slots for ``x`` of ``shape`` quantized with granularity ``g``, in tasks for ``threads``.

    Per-axis on a last (or trailing size-1) axis is laid out as rows whose
    scale steps with each element, so the kernel sees long runs either way.
    """
    n = math.prod(shape)
    if g.kind == "per_tensor":
        o, d, i, b, so, sb, si = 1, 1, n, 1, 0, 0, 0
    else:
        o = math.prod(shape[: g.axis])
        d = shape[g.axis]
        i = math.prod(shape[g.axis + 1 :])
        if g.kind == "per_axis":
            o, d, i, b, so, sb, si = (o, 1, d, 1, 0, 0, 1) if i == 1 else (o, d, i, 1, 0, 1, 0)
        else:
            nb = scale_shape[g.axis]
            b = g.block_size
            so, sb, si = (nb, 1, 0) if i == 1 else (nb * i, i, 1)
    run = i if si else b * i
    return np.array([n, d, i, b, so, sb, si, chunk_elements(n, threads), run < _SHORT_RUN], dtype=np.int64)


def packed_runs_fit(g: Granularity, shape: tuple[int, ...], per_byte: int, shortest: int, exact: int = 0) -> bool:
    """Whether every run (of one scale, or of scales stepping with the element) starts on a byte of ``per_byte`` codes and is ``shortest`` elements or longer.

    Runs end where the scale's pattern does: per tensor, only at the end;
    on a non-last axis, at multiples of the size of the axes after it; on
    the last axis, at the ends of rows and (blocked) of blocks, the last
    block of a row possibly shorter. Blocks along the last axis of exactly
    ``exact`` codes fit too, however short.
    """
    if g.kind == "per_tensor":
        return True
    d, i = shape[g.axis], math.prod(shape[g.axis + 1 :])
    if i > 1:
        return i % per_byte == 0 and i >= shortest
    if g.kind != "blocked":
        return d % per_byte == 0 and d >= shortest
    last = d % g.block_size or g.block_size
    if d % per_byte or g.block_size % per_byte:
        return False
    return min(g.block_size, last) >= shortest or (g.block_size == exact and last == exact)


def scale_period(g: Granularity, shape: tuple[int, ...], scale_shape: tuple[int, ...], at_least: int) -> tuple[int, int]:
    """``(period, count)`` such that flat element ``j`` of ``x`` has scale ``(j // period) % count``.

    ``(0, 0)`` where no such pair exists (the scale steps with the
    element: per-axis on the last axis, blocks across a non-last axis; a
    ragged last block on the last axis) or where the period is shorter than
    ``at_least`` elements.
    """
    n = math.prod(shape)
    if g.kind == "per_tensor":
        period, count = n, 1
    else:
        d, i = shape[g.axis], math.prod(shape[g.axis + 1 :])
        if g.kind == "per_axis" and i > 1:
            period, count = i, d
        elif g.kind == "blocked" and i == 1 and d % g.block_size == 0:
            period, count = g.block_size, n // g.block_size
        else:
            return 0, 0
    return (period, count) if period >= at_least else (0, 0)


# Rows of a layout whose scale steps with the element go by streamed lines
# (DequantizeLinear's 8/16-bit and float8 codes) from these lengths on, by
# runs below them: 8-bit integer codes; 16-bit and float8 codes where every
# row starts on a line (the output aligned, rows a whole number of lines),
# and elsewhere, where each row's partial lines at either end go element by
# element. Measured, 16M elements per-axis on the last axis, alternating
# processes, lines against runs on 2 threads (1 thread): uint8 rows of 256
# 1.66 against 1.20 ms, 512 1.00 against 1.28 (1.90 against 2.29), 1024
# 0.83 against 1.30 (1.65 against 2.01); int16 rows of 1024 on lines
# 1.70-1.80 against 1.99 (1.77 against 2.26-2.34), off lines 1.78-1.82
# against 1.94-1.97 but 2.82-2.94 against 2.30 on one thread (and so under
# load); rows of 2048 off lines 1.69-2.01 against 1.99-2.72 (2.03-2.10
# against 2.21-2.80); float8e4m3fn rows of 2048 off lines 1.57 against
# 1.87-2.29.
STEP_LINES_MIN_ROW = 512
STEP_WIDE_LINES_MIN_ROW = 1024
STEP_WIDE_LINES_OFF_LINE_MIN_ROW = 2048


def step_lines_fit(lay: np.ndarray, out: np.ndarray, wide_codes: bool, line: int) -> bool:
    """Whether a layout whose scale steps with the element writes ``out`` by lines of ``line`` bytes.

    ``lay`` is :func:`layout`'s array; ``wide_codes``: 16-bit or float8
    codes, whose element-by-element row ends cost more (the thresholds above).
    """
    row = int(lay[L_I])
    if lay[L_SI] == 0 or row == 0:
        return False
    if not wide_codes:
        return row >= STEP_LINES_MIN_ROW
    on_lines = out.ctypes.data % line == 0 and row * out.itemsize % line == 0
    return row >= (STEP_WIDE_LINES_MIN_ROW if on_lines else STEP_WIDE_LINES_OFF_LINE_MIN_ROW)


def _encoding(
    m: int,
    bias: int,
    maxmag: int,
    ovf: int,
    nanbase: int,
    nanmask: int,
    nanmin: int,
    bits: int,
    *,
    signed_zero: bool,
    signed_special: bool,
    subnormals: bool,
) -> tuple[np.ndarray, float]:
    emin = 1 - bias
    e = np.zeros(_E_LEN, dtype=np.int64)
    e[E_M] = m
    e[E_REBIAS] = (127 - bias) << m
    # Below the smallest normal the code is rint(|v| * 2**(m - emin)); bfloat16
    # shares float32's exponent range, so its rounding never needs that path.
    e[E_SUBLIM] = (emin + 127) << 23 if subnormals else 0
    e[E_MAXMAG] = maxmag
    e[E_OVF] = ovf
    e[E_NANBASE], e[E_NANMASK], e[E_NANMIN] = nanbase, nanmask, nanmin
    e[E_SIGNSHIFT] = bits - 1
    e[E_SIGNED_ZERO] = signed_zero
    e[E_SIGNED_SPECIAL] = signed_special
    return e, 2.0 ** (m - emin) if subnormals else 1.0


def _finfo_encoding(t: ElementType) -> tuple[np.ndarray, float]:
    info = ml_dtypes.finfo(t.dtype)
    m, bias = int(info.nmant), 1 - int(info.minexp)
    maxmag = int(np.array(t.max_finite, np.float32).astype(t.dtype).view(np.uint8)) & ((1 << (t.bits - 1)) - 1)
    fnuz = t.name.endswith("fnuz")
    if fnuz:
        # One NaN, 0x80, and no negative zero: overflow, infinities and NaN all land there.
        return _encoding(m, bias, maxmag, 0x80, 0x80, 0, 0, t.bits, signed_zero=False, signed_special=False, subnormals=True)
    if t.has_inf:
        # float8e5m2: overflow rounds to infinity; NaN becomes the quiet 0x7e (ml_dtypes).
        inf = ((1 << (t.bits - 1 - m)) - 1) << m
        return _encoding(
            m, bias, maxmag, inf, inf | (1 << (m - 1)), 0, 0, t.bits, signed_zero=True, signed_special=True, subnormals=True
        )
    if t.has_nan:
        # float8e4m3fn: the all-ones pattern is NaN; overflow and infinities become NaN.
        nan = (1 << (t.bits - 1)) - 1
        return _encoding(m, bias, maxmag, nan, nan, 0, 0, t.bits, signed_zero=True, signed_special=True, subnormals=True)
    # float4/float6 have neither: the kernel always clamps first, so overflow
    # cannot reach the encoder; saturating is the safe answer if it did.
    return _encoding(m, bias, maxmag, maxmag, maxmag, 0, 0, t.bits, signed_zero=True, signed_special=True, subnormals=True)


def float_encoding(t: ElementType) -> tuple[np.ndarray, float]:
    """Encoding slots and subnormal multiplier of a quantized float type (float8/float6/float4).

    float16 and bfloat16 are rounded and encoded by LLVM's conversions and
    bit arithmetic instead (:mod:`._tiles`).
    """
    return _finfo_encoding(t)


def decode_table(t: ElementType, packed: bool) -> np.ndarray:
    """float32 value of every byte (or, packed, every code) of type ``t``.

    DequantizeLinear reads types of 8 bits or fewer through this table: one
    exact lookup per element instead of a decode per element.
    """
    codes = np.arange(1 << t.bits if packed else 256, dtype=np.uint16).astype(np.uint8)
    return codes.view(t.dtype).astype(np.float32)


def _check_encodings() -> None:
    """Each quantized float type's slots reproduce ml_dtypes on its own values."""
    for name in ("float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "float4e2m1", "float6e2m3", "float6e3m2"):
        t = element_type(name)
        e, _ = _finfo_encoding(t)
        if float(np.array(e[E_MAXMAG], np.uint8).view(t.dtype)) != t.max_finite:
            raise AssertionError(f"{name}: largest magnitude code disagrees with the type table")


_check_encodings()
