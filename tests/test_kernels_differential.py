"""The cpu and reference backends give the same bits on any call the public API takes.

A differential test: hypothesis draws QuantizeLinear and DequantizeLinear
calls over every type, x and scale dtype, 16-bit precision, granularity
(blocks up to far beyond their axis), view (steps, negative strides),
packed input and output, and ``out=`` (fresh, or sharing memory with
``x``), with values that carry NaN payloads and signs, infinities, signed
zeros, ties and int32 values beyond 2**24; the two backends must agree bit
for bit, or raise the same QuantizationError. The fixed ``@example`` cases
are the holes this test found, kept so they are checked first every run.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import qlinear
from qlinear.dtypes import element_type
from qlinear.kernels.cpu import _lines
from qlinear.spec import operator_version

_Q = operator_version("QuantizeLinear", None, "", caller="tests")
_DQ = operator_version("DequantizeLinear", None, "", caller="tests")
QUANTIZED = sorted(_Q.quantized_types)
PACKABLE = [n for n in QUANTIZED if element_type(n).bits < 8]
WIDE = {"float": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
# NaN with both signs and payloads, infinities, signed zeros, ties, float8
# and float16 thresholds, int32 territory and float32 subnormals.
SPECIAL = np.concatenate(
    [
        np.array([0.0, -0.0, np.inf, -np.inf, 0.5, 1.5, 2.5, -2.5, 448, 464, 57344, 65520, 3e9, -3e9, 1e-40, 7.5], np.float32),
        np.array([0x7FC00000, 0xFFC00000, 0x7FA00001, 0xFF800123, 0x7F800001], np.uint32).view(np.float32),
    ]
)


@dataclass
class Call:
    """One public call: its function, positional arrays and keywords, and how ``x`` and ``out`` are laid out."""

    quantize: bool
    x: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray | None
    kwargs: dict[str, Any] = field(default_factory=dict)
    view: str = "plain"  # "plain", "strided" (every other element) or "reversed" (negative strides)
    out: str = "none"  # "none", "fresh" or "aliased" (sharing x's memory)
    stream: bool = False  # lower the streaming threshold so small calls take the line loops


def _layout(x: np.ndarray, view: str) -> np.ndarray:
    if view == "strided":
        wide = np.zeros((*x.shape[:-1], 2 * x.shape[-1]), x.dtype)
        wide[..., ::2] = x
        return wide[..., ::2]
    if view == "reversed":
        return np.ascontiguousarray(x[::-1])[::-1]
    return x


def _out(call: Call, x: np.ndarray, dtype: np.dtype, shape: tuple[int, ...]) -> tuple[np.ndarray | None, np.ndarray]:
    """The ``out`` for ``call``, and the ``x`` to pass (a view into the same bytes when aliased)."""
    if call.out == "none":
        return None, x
    n = int(np.prod(shape)) * dtype.itemsize
    if call.out == "fresh":
        return np.empty(shape, dtype), x
    # x and out over one buffer, out starting at x's first byte.
    buf = np.zeros(max(n, x.nbytes) + 64, np.uint8)
    start = -buf.ctypes.data % 64
    shared_x = buf[start : start + x.nbytes].view(x.dtype).reshape(x.shape)
    shared_x[...] = x
    return buf[start : start + n].view(dtype).reshape(shape), shared_x


def _run(call: Call, backend: str) -> np.ndarray | str:
    x = _layout(call.x.copy(), call.view)
    kwargs = dict(call.kwargs)
    if call.quantize:
        t = element_type(kwargs.get("output_dtype") or (call.zero_point.dtype if call.zero_point is not None else "uint8"))
        packed = kwargs.get("packed", False)
        dtype, shape = (np.dtype(np.uint8), (-(-x.size * t.bits // 8),)) if packed else (t.dtype, x.shape)
        fn = qlinear.quantize_linear
    else:
        out_type = kwargs.get("output_dtype")
        dtype = np.dtype(
            WIDE[out_type]
            if out_type
            else (call.scale.dtype if call.scale.dtype.name in WIDE or call.scale.dtype == np.float32 else np.float32)
        )
        shape = tuple(kwargs["shape"]) if "shape" in kwargs else x.shape
        fn = qlinear.dequantize_linear
    if call.out != "none" and call.view != "plain":
        x = np.ascontiguousarray(x)
    out, x = _out(call, x, dtype, shape)
    stream = contextlib.nullcontext()
    if call.stream:
        stream = _streaming()
    with stream, np.errstate(all="ignore"):
        try:
            return fn(x, call.scale, call.zero_point, out=out, backend=backend, **kwargs)
        except qlinear.QuantizationError as e:
            return str(e)


@contextlib.contextmanager
def _streaming():
    before = _lines.STREAM_MIN_BYTES
    _lines.STREAM_MIN_BYTES = 0
    try:
        yield
    finally:
        _lines.STREAM_MIN_BYTES = before


def _bits(a: np.ndarray) -> list[int]:
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize]).reshape(-1).tolist()


def _assert_same(call: Call) -> None:
    got, want = _run(call, "cpu"), _run(call, "reference")
    if isinstance(want, str) or isinstance(got, str):
        assert got == want
        return
    assert got.dtype == want.dtype and got.shape == want.shape
    assert _bits(got) == _bits(want)


@st.composite
def _shapes(draw):
    rank = draw(st.integers(1, 4))
    dims = draw(st.lists(st.integers(1, 7), min_size=rank, max_size=rank))
    # One long axis in about half the calls, so the cpu kernel's runs, lines and parallel chunks are reached.
    if draw(st.booleans()):
        dims[draw(st.integers(0, rank - 1))] = draw(st.sampled_from([33, 257, 1030, 4099, 17000]))
    while int(np.prod(dims)) > 40000:
        dims[int(np.argmax(dims))] //= 2
    return tuple(dims)


@st.composite
def _granularity(draw, shape):
    """``(scale shape, axis, block_size)``."""
    kind = draw(st.sampled_from(["per_tensor", "per_axis", "blocked"]))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    if kind == "per_tensor":
        return draw(st.sampled_from([(), (1,)])), axis, 0
    if kind == "per_axis":
        return (shape[axis],), axis, 0
    d = shape[axis]
    block = draw(st.one_of(st.integers(1, max(1, d + 2)), st.sampled_from([2**20, 2**31, 2**40])))
    scale_shape = tuple(-(-n // block) if i == axis % len(shape) else n for i, n in enumerate(shape))
    return scale_shape, axis, block


def _floats(draw, n: int) -> np.ndarray:
    """float32 values at many magnitudes, a share of them special."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    v = (rng.standard_normal(n) * rng.choice([1e-3, 0.4, 3, 300, 7e4, 3e9], n)).astype(np.float32)
    k = rng.random(n) < draw(st.sampled_from([0.0, 0.1, 0.5]))
    v[k] = rng.choice(SPECIAL, int(k.sum()))
    return v


@st.composite
def quantize_calls(draw):
    shape = draw(_shapes())
    scale_shape, axis, block = draw(_granularity(shape))
    n = int(np.prod(shape))
    x_name = draw(st.sampled_from(["float", "float16", "bfloat16", "int32"]))
    values = _floats(draw, n)
    if x_name == "int32":  # every int32, beyond 2**24 included, and the float values' integer parts
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        ints = rng.integers(-(2**31), 2**31, n, dtype=np.int64)
        with np.errstate(invalid="ignore"):
            near = np.nan_to_num(values.astype(np.float64), posinf=2**31 - 1, neginf=-(2**31)).clip(-(2**31), 2**31 - 1)
            x = np.where(rng.random(n) < 0.5, ints, near).astype(np.int64).astype(np.int32)
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            x = values.astype(WIDE[x_name])
    x = x.reshape(shape)
    scale_name = draw(st.sampled_from(["float", "float16", "bfloat16", "int32", "float8e8m0"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    raw_scale = rng.choice(
        np.array([0.01, 0.37, 1.0, 2.5, 1e-3, 3.0, 1 << 24, (1 << 24) + (1 << 16) + 1], np.float64), scale_shape
    )
    if draw(st.booleans()):  # zero, negative, NaN and infinite scales
        raw_scale = np.where(rng.random(scale_shape) < 0.2, rng.choice([0.0, -1.5, np.nan, -np.nan, np.inf]), raw_scale)
    if scale_name == "int32":
        scale = np.nan_to_num(raw_scale, posinf=7).astype(np.int64).astype(np.int32)
    elif scale_name == "float8e8m0":
        scale = np.abs(np.nan_to_num(raw_scale, nan=1.0, posinf=4.0)).astype(np.float32).astype(ml_dtypes.float8_e8m0fnu)
    else:
        with np.errstate(over="ignore"):
            scale = raw_scale.astype(np.float32).astype(WIDE[scale_name])
    out_name = draw(st.sampled_from(QUANTIZED))
    t = element_type(out_name)
    zero_point = None
    if draw(st.booleans()):
        codes = rng.integers(0, 1 << min(t.bits, 16), scale_shape)
        if t.is_integer:
            zero_point = rng.integers(t.qmin, t.qmax + 1, scale_shape).astype(t.dtype)
        elif t.bits == 8:  # every float8 bit pattern, NaNs of both signs included
            zero_point = codes.astype(np.uint8).view(t.dtype)
        else:
            zero_point = rng.uniform(-2, 2, scale_shape).astype(np.float32).astype(t.dtype)
        if draw(st.booleans()) and zero_point.size == 1:  # a one-element zero point of another rank
            zero_point = zero_point.reshape(draw(st.sampled_from([(), (1,), (1, 1)])))
    kwargs: dict[str, Any] = {"axis": axis, "block_size": block}
    if zero_point is None:
        kwargs["output_dtype"] = out_name
    precision = draw(st.sampled_from([None, None, "float16", "bfloat16", "float"]))
    if precision is not None:
        kwargs["precision"] = precision
    if not t.is_integer and draw(st.booleans()):
        kwargs["saturate"] = False
    if out_name in PACKABLE and draw(st.booleans()):
        kwargs["packed"] = True
    return Call(
        True,
        x,
        np.asarray(scale),
        None if zero_point is None else np.asarray(zero_point),
        kwargs,
        view=draw(st.sampled_from(["plain", "strided", "reversed"])),
        out=draw(st.sampled_from(["none", "fresh", "aliased"])),
        stream=draw(st.booleans()),
    )


@st.composite
def dequantize_calls(draw):
    shape = draw(_shapes())
    scale_shape, axis, block = draw(_granularity(shape))
    n = int(np.prod(shape))
    name = draw(st.sampled_from(sorted(_DQ.x_types)))
    t = element_type(name)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if t.bits == 32:
        x = rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32).reshape(shape)
    elif t.is_integer:
        x = rng.integers(t.qmin, t.qmax + 1, shape).astype(t.dtype)
    else:  # every code of the float type, NaNs of both signs included (one a byte, as ml_dtypes holds them)
        x = rng.integers(0, 1 << t.bits, shape).astype(np.uint8).view(t.dtype)
    scale_name = draw(st.sampled_from(["float", "float16", "bfloat16", "float8e8m0"]))
    raw = rng.choice(np.array([0.01, 0.37, 1.0, 2.5, 3e-3, 3.0, np.nan, -np.nan, -0.5, np.inf], np.float32), scale_shape)
    if scale_name == "float8e8m0":
        scale = np.abs(np.nan_to_num(raw, nan=1.0, posinf=4.0)).astype(ml_dtypes.float8_e8m0fnu)
    else:
        scale = raw.astype(WIDE[scale_name])
    zero_point = None
    if draw(st.booleans()):
        if t.bits == 32:
            zero_point = rng.integers(-(2**31), 2**31, scale_shape, dtype=np.int64).astype(np.int32)
        elif t.is_integer:
            zero_point = rng.integers(t.qmin, t.qmax + 1, scale_shape).astype(t.dtype)
        elif t.bits == 8:
            zero_point = rng.integers(0, 256, scale_shape).astype(np.uint8).view(t.dtype)
        else:
            zero_point = rng.uniform(-2, 2, scale_shape).astype(np.float32).astype(t.dtype)
        if draw(st.booleans()) and zero_point.size == 1:
            zero_point = zero_point.reshape(draw(st.sampled_from([(), (1,), (1, 1)])))
    kwargs: dict[str, Any] = {"axis": axis, "block_size": block}
    output = draw(st.sampled_from([None, "float", "float16", "bfloat16"]))
    if output is not None:
        kwargs["output_dtype"] = output
    view = draw(st.sampled_from(["plain", "strided", "reversed"]))
    if t.bits < 8 and draw(st.booleans()):
        kwargs.update(packed_dtype=name, shape=shape)
        x, view = qlinear.pack(x), "plain"
    return Call(
        False,
        x,
        np.asarray(scale),
        None if zero_point is None else np.asarray(zero_point),
        kwargs,
        view=view,
        out=draw(st.sampled_from(["none", "fresh", "aliased"])),
        stream=draw(st.booleans()),
    )


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(quantize_calls())
@example(  # a NaN zero point on a NaN quotient (0 / 0): the sign of the NaN
    Call(True, np.zeros(1, np.float32), np.asarray(np.float32(0)), np.array(0x7F, np.uint8).view(ml_dtypes.float8_e4m3fn))
)
@example(  # a one-element blocked scale with a zero point of another rank
    Call(True, np.zeros((1, 3), np.float32), np.ones((1, 1), np.float32), np.asarray(np.uint8(5)), {"axis": 1, "block_size": 4})
)
@example(  # a block far longer than its axis
    Call(True, np.ones((4, 3), np.float32), np.ones((4, 1), np.float32), None, {"axis": 1, "block_size": 2**31})
)
@example(  # int32 beyond 2**24 to a bfloat16 precision, x and scale
    Call(True, np.array([16842753], np.int32), np.asarray(ml_dtypes.bfloat16(1024)), None, {"output_dtype": "int16"})
)
@example(
    Call(
        True,
        np.array([1690828800.0], np.float32),
        np.asarray(np.int32(16842753)),
        None,
        {"output_dtype": "uint8", "precision": "bfloat16"},
    )
)
@example(  # out= sharing x's memory
    Call(
        True,
        (np.random.default_rng(1).normal(size=70001) * 50).astype(np.float32),
        np.asarray(np.float32(1)),
        np.asarray(np.uint8(128)),
        out="aliased",
    )
)
def test_quantize_cpu_matches_reference(call):
    _assert_same(call)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(dequantize_calls())
@example(  # a NaN code (fnuz's 0x80) times a NaN scale: the sign of the NaN
    Call(False, np.array([0x80], np.uint8).view(ml_dtypes.float8_e4m3fnuz), np.asarray(np.float32(np.nan)), None)
)
@example(
    Call(False, np.zeros((1, 3), np.uint8), np.ones((1, 1), np.float32), np.asarray(np.uint8(5)), {"axis": 1, "block_size": 4})
)
@example(Call(False, np.ones((4, 3), np.int8), np.ones((4, 1), np.float32), None, {"axis": 1, "block_size": 2**31}))
def test_dequantize_cpu_matches_reference(call):
    _assert_same(call)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_out_sharing_x_gives_the_unaliased_result(backend):
    x = (np.random.default_rng(1).normal(size=70001) * 50).astype(np.float32)
    want = qlinear.quantize_linear(x, np.float32(1), np.uint8(128), backend=backend)
    got = qlinear.quantize_linear(x, np.float32(1), np.uint8(128), out=x.view(np.uint8)[: x.size], backend=backend)
    assert np.shares_memory(got, x) and got.tolist() == want.tolist()
    codes = np.random.default_rng(2).integers(0, 256, 4 * 9000, dtype=np.uint8)
    want = qlinear.dequantize_linear(codes[:9000], np.float32(0.5), np.uint8(3), backend=backend)
    got = qlinear.dequantize_linear(codes[:9000], np.float32(0.5), np.uint8(3), out=codes.view(np.float32), backend=backend)
    assert got.tolist() == want.tolist()
