"""The fused cpu kernels give the reference kernels' bits, everywhere.

Oracle: ``backend="reference"``. Every comparison is on bit patterns, so NaN
payloads, the sign of zero and float8 NaN encodings are all checked.
"""

from __future__ import annotations

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import qlinear
from qlinear.dtypes import ELEMENT_TYPES, element_type
from qlinear.spec import operator_version

# Every type QuantizeLinear can produce, in the type table's order.
QUANTIZED = [
    t.name for t in ELEMENT_TYPES if t.name in operator_version("QuantizeLinear", 28, "", caller="tests").quantized_types
]
PACKABLE = [n for n in QUANTIZED if element_type(n).bits < 8]
WIDE = [np.float32, np.float16, ml_dtypes.bfloat16]

# Values that exercise every rule: NaN (both signs, a payload), infinities,
# signed zeros, ties, float8/float16 overflow thresholds, huge values beyond
# int32, float32 subnormals.
EDGES = np.array(
    [
        np.nan,
        -np.nan,
        np.inf,
        -np.inf,
        0.0,
        -0.0,
        0.5,
        1.5,
        2.5,
        -0.5,
        -2.5,
        3.5,
        1e30,
        -1e30,
        3e9,
        -3e9,
        1e-40,
        -1e-40,
        1e-45,
        65504,
        65520,
        448,
        464,
        470,
        240,
        248,
        57344,
        61440,
        6,
        7,
        7.5,
        28,
        30,
        0.25,
        0.75,
        2.0**-7,
        2.0**-10,
    ],
    np.float32,
)
EDGES = np.concatenate([EDGES, np.array([0x7FA00001, 0xFF800123], np.uint32).view(np.float32)])

# (shape, axis, block_size): per-tensor, per-axis on every axis, blocked on
# every axis with ragged last blocks; rows both shorter and longer than the
# kernels' gathering threshold (256) so both run paths are covered; the last
# crosses a parallel chunk (16384 elements) in the middle of a block of 32.
LAYOUTS = [
    ((5, 3, 44), 0, 0),
    ((5, 3, 44), 1, 0),
    ((5, 3, 44), 2, 0),
    ((5, 3, 44), -1, 0),
    ((5, 3, 44), 0, 2),
    ((5, 3, 44), 1, 2),
    ((5, 3, 44), 2, 16),
    ((2, 700), 1, 0),
    ((700, 2), 0, 0),
    ((4, 700), 1, 300),
    ((600, 3), 0, 7),
    ((3, 600), 0, 2),
    ((1000,), 0, 0),
    ((3, 7001), 1, 32),
]


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(_bits(got), _bits(want))


def _values(shape, rng, dtype=np.float32) -> np.ndarray:
    n = int(np.prod(shape))
    v = (rng.standard_normal(n) * rng.choice([1e-3, 0.3, 3, 300, 1e5], n)).astype(np.float32)
    v[: min(n, EDGES.size)] = EDGES[:n]
    rng.shuffle(v)
    with np.errstate(all="ignore"):
        return v.reshape(shape).astype(dtype)


def _params(name, shape, axis, block, rng, scale_dtype=np.float32):
    t = element_type(name)
    if block:
        sshape = list(shape)
        sshape[axis] = -(-shape[axis] // block)
    elif len(shape) == 1:
        sshape = []
    else:
        sshape = [shape[axis]]
    scale = rng.uniform(0.01, 4.0, sshape).astype(np.float32).astype(scale_dtype)
    if t.is_integer:
        zp = rng.integers(t.qmin, t.qmax + 1, sshape).astype(t.dtype)
    else:
        zp = rng.uniform(-2, 2, sshape).astype(np.float32).astype(t.dtype)
    return np.asarray(scale), np.asarray(zp)


def _both(fn, *args, **kwargs):
    with np.errstate(all="ignore"):
        return fn(*args, backend="cpu", **kwargs), fn(*args, backend="reference", **kwargs)


@pytest.mark.parametrize("name", QUANTIZED)
def test_cpu_quantize_matches_reference_every_layout(name):
    rng = np.random.default_rng(QUANTIZED.index(name))
    t = element_type(name)
    for shape, axis, block in LAYOUTS:
        x = _values(shape, rng)
        scale, zp = _params(name, shape, axis, block, rng)
        for z in (zp, None):
            for saturate in (True, False) if t.saturate_applies else (True,):
                kw = dict(axis=axis, block_size=block, saturate=saturate, output_dtype=None if z is not None else name)
                got, want = _both(qlinear.quantize_linear, x, scale, z, **kw)
                _assert_same(got, want)
                if t.is_packed:
                    got, _ = _both(qlinear.quantize_linear, x, scale, z, packed=True, **kw)
                    np.testing.assert_array_equal(got, qlinear.pack(want))


@pytest.mark.parametrize("name", QUANTIZED)
def test_cpu_dequantize_matches_reference_every_layout(name):
    rng = np.random.default_rng(100 + QUANTIZED.index(name))
    t = element_type(name)
    for shape, axis, block in LAYOUTS:
        scale, zp = _params(name, shape, axis, block, rng)
        with np.errstate(all="ignore"):
            q = qlinear.quantize_linear(_values(shape, rng), scale, zp, axis=axis, block_size=block, backend="reference")
        for z in (zp, None):
            for out_dtype in (None, np.float16, ml_dtypes.bfloat16):
                kw = dict(axis=axis, block_size=block, output_dtype=out_dtype)
                got, want = _both(qlinear.dequantize_linear, q, scale, z, **kw)
                _assert_same(got, want)
                if t.is_packed:
                    got, _ = _both(qlinear.dequantize_linear, qlinear.pack(q), scale, z, packed_dtype=name, shape=shape, **kw)
                    _assert_same(got, want)


@pytest.mark.parametrize("x_dtype", WIDE, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("precision", [None, "float", "float16", "bfloat16"])
@pytest.mark.parametrize("name", ["int8", "uint16", "int4", "float8e4m3fn", "float8e5m2fnuz", "float4e2m1", "float6e3m2"])
def test_cpu_quantize_16bit_inputs_and_precisions(name, precision, x_dtype):
    rng = np.random.default_rng(7)
    for shape, axis, block in [((4, 300), 1, 0), ((6, 40), 1, 8), ((900,), 0, 0)]:
        x = _values(shape, rng, x_dtype)
        scale, zp = _params(name, shape, axis, block, rng, scale_dtype=x_dtype)
        # Tiny and huge scales make quotients that underflow and overflow 16 bits.
        if scale.size >= 2:
            scale.reshape(-1)[:2] = np.array([1e-6, 3e4], np.float32).astype(x_dtype)
        for z in (zp, None):
            kw = dict(axis=axis, block_size=block, precision=precision, output_dtype=None if z is not None else name)
            got, want = _both(qlinear.quantize_linear, x, scale, z, **kw)
            _assert_same(got, want)


def test_wide_decoding_and_rounding_match_numpy_and_ml_dtypes():
    # The staged path's float16/bfloat16 stages against the casts they stand
    # for: every 16-bit pattern decodes exactly, and float32 values on both
    # sides of every rounding boundary (low bits around float16's tie at
    # bit 12 and bfloat16's at bit 15, every exponent and sign) round as
    # numpy and ml_dtypes round them, overflow to infinity included. A
    # rounded NaN stays NaN with its sign; its payload (which no later stage
    # reads) may come out quieted.
    # The fused loops' float16 arithmetic (*_by_bits) is held to the same.
    from numba import njit

    from qlinear.kernels.cpu._params import PREC_BF16, PREC_F16
    from qlinear.kernels.cpu._tiles import decode_wide, half_value_by_bits, round_half_by_bits, round_to_precision

    @njit
    def by_bits(src, decoded, values, rounded):
        for k in range(src.size):
            decoded[k] = half_value_by_bits(src[k])
        for k in range(values.size):
            rounded[k] = round_half_by_bits(values[k])

    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    low = np.array([0, 1, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x3000, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)
    values = ((np.arange(1 << 16, dtype=np.uint32) << 16)[:, None] | low).reshape(-1).view(np.float32)
    decoded_by_bits, rounded_by_bits = np.empty(every.size, np.float32), np.empty(values.size, np.float32)
    by_bits(every, decoded_by_bits, values, rounded_by_bits)
    for prec, dtype in ((PREC_F16, np.float16), (PREC_BF16, ml_dtypes.bfloat16)):
        want = every.view(dtype).astype(np.float32)
        tile = np.empty(every.size, np.float32)
        decode_wide(every, every.size, tile, prec)
        nan = np.isnan(want)
        for got in (tile, decoded_by_bits) if prec == PREC_F16 else (tile,):
            np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
            assert np.isnan(got[nan]).all() and (np.signbit(got[nan]) == np.signbit(want[nan])).all()
        tile = values.copy()
        round_to_precision(tile, tile.size, prec)
        with np.errstate(over="ignore", invalid="ignore"):
            want = values.astype(dtype).astype(np.float32)
        nan = np.isnan(values)
        for got in (tile, rounded_by_bits) if prec == PREC_F16 else (tile,):
            np.testing.assert_array_equal(np.isnan(got), nan)
            np.testing.assert_array_equal(np.signbit(got[nan]), np.signbit(values[nan]))
            np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_cpu_int32_inputs_and_e8m0_scales():
    rng = np.random.default_rng(3)
    big = np.array([2**31 - 1, -(2**31), 2**24 + 1, -(2**24) - 3, 0, 7], np.int32)
    x = np.concatenate([big, rng.integers(-(2**31), 2**31 - 1, 594, dtype=np.int64).astype(np.int32)]).reshape(6, 100)
    e8m0 = np.array([0, 1, 120, 127, 130, 254], np.uint8).view(ml_dtypes.float8_e8m0fnu)
    for precision in (None, "float16", "bfloat16"):
        got, want = _both(qlinear.quantize_linear, x, np.float32(1e5), np.int8(3), precision=precision)
        _assert_same(got, want)
    got, want = _both(qlinear.quantize_linear, x.astype(np.float32), e8m0, np.uint8(9).reshape(1).repeat(6), axis=0)
    _assert_same(got, want)
    zp32 = rng.integers(-(2**31), 2**31 - 1, 100, dtype=np.int64).astype(np.int32)
    for scale in (rng.uniform(0.1, 2, 100).astype(np.float32), np.arange(100, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu)):
        got, want = _both(qlinear.dequantize_linear, x, scale, zp32, axis=1)
        _assert_same(got, want)
    x16 = rng.integers(-(2**15), 2**15, (6, 100)).astype(np.int16)
    got, want = _both(qlinear.dequantize_linear, x16, np.float32(0.5), np.int16(-32768), output_dtype=np.float16)
    _assert_same(got, want)


@settings(max_examples=60, deadline=None)
@given(
    bits=hnp.arrays(np.uint32, st.integers(0, 300), elements=st.integers(0, 2**32 - 1)),
    name=st.sampled_from(["int8", "uint4", "float8e4m3fn", "float8e5m2", "float4e2m1"]),
    scale_bits=st.integers(0x00800000, 0x7F000000),
    saturate=st.booleans(),
)
def test_cpu_quantize_any_float32_bit_pattern(bits, name, scale_bits, saturate):
    x = bits.view(np.float32)
    scale = np.array(scale_bits, np.uint32).view(np.float32)
    kw = dict(output_dtype=name, saturate=saturate or not element_type(name).saturate_applies)
    got, want = _both(qlinear.quantize_linear, x, scale, **kw)
    _assert_same(got, want)


@settings(max_examples=40, deadline=None)
@given(
    codes=hnp.arrays(np.uint8, st.integers(0, 200)),
    name=st.sampled_from(["float8e4m3fn", "float8e5m2fnuz", "int8"]),
    out_dtype=st.sampled_from([np.float32, np.float16, ml_dtypes.bfloat16]),
)
def test_cpu_dequantize_any_byte(codes, name, out_dtype):
    x = codes.view(element_type(name).dtype)
    got, want = _both(qlinear.dequantize_linear, x, np.float32(3.0e-3), output_dtype=out_dtype)
    _assert_same(got, want)


def test_cpu_non_contiguous_and_empty_inputs():
    x = _values((40, 30), np.random.default_rng(5))
    for view in (x.T, x[::3, ::2], x[:, 5]):
        scale = np.linspace(0.1, 2, view.shape[-1], dtype=np.float32) if view.ndim == 2 else np.float32(0.3)
        got, want = _both(qlinear.quantize_linear, view, scale, axis=-1, output_dtype="int4")
        _assert_same(got, want)
        got, want = _both(qlinear.dequantize_linear, want, scale, axis=-1)
        _assert_same(got, want)
    empty = np.zeros((0, 4), np.float32)
    got, want = _both(qlinear.quantize_linear, empty, np.ones(4, np.float32), axis=1, output_dtype="int4")
    _assert_same(got, want)
    assert qlinear.quantize_linear(empty, np.float32(1), output_dtype="int4", packed=True).shape == (0,)


def test_cpu_out_buffer_is_filled_and_returned():
    rng = np.random.default_rng(11)
    x = _values((8, 64), rng)
    scale = np.full((8, 2), 0.25, np.float32)
    out = np.empty((8, 64), ml_dtypes.int4)
    for backend in ("cpu", "reference"):
        y = qlinear.quantize_linear(x, scale, axis=1, block_size=32, output_dtype="int4", out=out, backend=backend)
        assert y is out
        _assert_same(out, qlinear.quantize_linear(x, scale, axis=1, block_size=32, output_dtype="int4", backend="reference"))
        packed = np.empty(256, np.uint8)
        assert (
            qlinear.quantize_linear(
                x, scale, axis=1, block_size=32, output_dtype="int4", packed=True, out=packed, backend=backend
            )
            is packed
        )
        np.testing.assert_array_equal(packed, qlinear.pack(out))
        back = np.empty((8, 64), np.float32)
        assert (
            qlinear.dequantize_linear(
                packed, scale, axis=1, block_size=32, packed_dtype="int4", shape=(8, 64), out=back, backend=backend
            )
            is back
        )
        _assert_same(back, qlinear.dequantize_linear(out, scale, axis=1, block_size=32, backend="reference"))


def test_cpu_packed_values_by_hand():
    # int4 codes of [1, -1, 3] are 0x1, 0xf, 0x3: bytes 0xf1, 0x03; uint2 of [3, 0, 1, 2, 1] is 0b10_01_00_11, 0b01.
    assert qlinear.quantize_linear(
        np.array([1.0, -1.0, 3.0], np.float32), np.float32(1), output_dtype="int4", packed=True
    ).tolist() == [0xF1, 0x03]
    assert qlinear.quantize_linear(
        np.array([3, 0, 1, 2, 1], np.float32), np.float32(1), output_dtype="uint2", packed=True
    ).tolist() == [0b10010011, 0b01]
    y = qlinear.dequantize_linear(np.array([0xF1, 0x03], np.uint8), np.float32(2), packed_dtype="int4", shape=(3,))
    assert y.tolist() == [2.0, -2.0, 6.0]


def test_cpu_float8_encodings_by_hand():
    x = np.array([448, 464, 470, np.inf, -np.nan, -1e-30, 2.0**-9], np.float32)
    e4m3 = qlinear.quantize_linear(x, np.float32(1), output_dtype="float8e4m3fn", saturate=False)
    assert _bits(e4m3).tolist() == [0x7E, 0x7E, 0x7F, 0x7F, 0xFF, 0x80, 0x01]
    fnuz = qlinear.quantize_linear(x, np.float32(1), output_dtype="float8e4m3fnuz", saturate=False)
    # fnuz: one NaN (0x80), no -0; 2**-9 is twice its smallest subnormal 2**-10.
    assert _bits(fnuz).tolist() == [0x80, 0x80, 0x80, 0x80, 0x80, 0x00, 0x02]
    e5m2 = qlinear.quantize_linear(
        np.array([61440, 60000, -np.inf], np.float32), np.float32(1), output_dtype="float8e5m2", saturate=False
    )
    assert _bits(e5m2).tolist() == [0x7C, 0x7B, 0xFC]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: qlinear.quantize_linear(np.ones(4, np.float32), np.float32(1), packed=True),
            "packed=True needs a 2-, 4- or 6-bit",
        ),
        (
            lambda: qlinear.quantize_linear(np.ones(4, np.float32), np.float32(1), out=np.empty(3, np.uint8)),
            "out has dtype uint8 and shape (3,)",
        ),
        (
            lambda: qlinear.quantize_linear(
                np.ones(4, np.float32), np.float32(1), output_dtype="int4", packed=True, out=np.empty(3, np.uint8)
            ),
            "expected uint8 and (2,)",
        ),
        (lambda: qlinear.dequantize_linear(np.ones(2, np.uint8), np.float32(1), packed_dtype="int4"), "shape is required"),
        (
            lambda: qlinear.dequantize_linear(np.ones(2, np.uint8), np.float32(1), packed_dtype="int4", shape=(5,)),
            "x has 2 bytes, expected at least 3",
        ),
        (
            lambda: qlinear.dequantize_linear(np.ones(2, np.int8), np.float32(1), packed_dtype="int4", shape=(4,)),
            "x must be a uint8 array",
        ),
        (
            lambda: qlinear.dequantize_linear(np.ones(4, np.uint8), np.float32(1), out=np.empty(4, np.float32)[::-1]),
            "C-contiguous",
        ),
    ],
)
def test_cpu_buffer_arguments_rejected(call, message):
    with pytest.raises(qlinear.QuantizationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_dynamic_quantize_linear_cpu_matches_reference():
    x = _values((33, 65), np.random.default_rng(9))
    for got, want in zip(*_both(qlinear.dynamic_quantize_linear, x), strict=True):
        _assert_same(got, want)


def test_import_does_not_load_numba():
    code = "import sys, qlinear; assert 'numba' not in sys.modules, 'numba imported eagerly'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_kernel_calls_hand_tasks_out_dynamically_and_restore_the_callers_setting():
    import numba

    from qlinear.kernels.cpu import _schedule

    seen = []
    before = numba.set_parallel_chunksize(5)  # a user's own setting
    try:
        with _schedule.dynamic_tasks(parallel=False):
            seen.append(numba.get_parallel_chunksize())
        x = np.ones(1 << 16, np.float32)
        qlinear.quantize_linear(x, np.float32(0.5), backend="cpu")
        qlinear.dequantize_linear(np.ones(1 << 16, np.uint8), np.float32(0.5), backend="cpu")
        assert seen == [1] and numba.get_parallel_chunksize() == 5
    finally:
        numba.set_parallel_chunksize(before)


def test_numba_runs_the_kernels_on_tbb_where_it_is_installed():
    # pyproject.toml installs tbb on Linux x86_64; numba must then find its library and take it.
    from pathlib import Path

    if not (Path(sys.prefix) / "lib" / "libtbb.so.12").exists():
        pytest.skip("tbb is not installed here (it is a dependency on Linux x86_64 only)")
    code = (
        "import numpy as np, numba, qlinear; "
        "qlinear.quantize_linear(np.ones(1 << 16, np.float32), np.float32(1), backend='cpu'); print(numba.threading_layer())"
    )
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_THREADING_LAYER"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == "tbb"


def test_parallel_task_size_follows_size_and_threads():
    from qlinear.kernels.cpu._params import MAX_CHUNK, MIN_CHUNK, TASKS_PER_THREAD, chunk_elements

    assert chunk_elements(100, 2) == MIN_CHUNK
    assert chunk_elements(1 << 24, 2) == MAX_CHUNK
    # Eight tasks a thread in between, rounded up to whole 64-element groups.
    assert TASKS_PER_THREAD == 8
    assert chunk_elements(16 * 20000, 2) == 20032
    assert chunk_elements(32 * 20000, 4) == 20032
    for n in (1, 5000, 65537, 999_999, 1 << 22):
        for threads in (1, 2, 3, 16):
            c = chunk_elements(n, threads)
            assert MIN_CHUNK <= c <= MAX_CHUNK and c % 64 == 0


@pytest.mark.parametrize("name", ["uint8", "int4", "int2", "float8e4m3fn", "float4e2m1"])
def test_cpu_tasks_longer_than_the_smallest(name):
    # On numba's threads these sizes give tasks that are neither 16384
    # elements nor a multiple of the row length: task boundaries fall inside
    # rows and blocks of every layout, and after a packed byte's first code.
    import numba

    from qlinear.kernels.cpu._params import MIN_CHUNK, TASKS_PER_THREAD, chunk_elements

    rng = np.random.default_rng(QUANTIZED.index(name))
    threads = numba.get_num_threads()
    rows = -(-TASKS_PER_THREAD * threads * (MIN_CHUNK + 100) // 257)
    shape = (rows, 257)
    task = chunk_elements(rows * 257, threads)
    assert task != MIN_CHUNK and task % 257
    for axis, block in ((0, 0), (1, 0), (1, 32), (0, 32), (None, 0)):
        x = _values(shape, rng)
        scale, zp = _params(name, shape, axis or 0, block, rng) if axis is not None else (np.float32(0.07), None)
        kw = dict(axis=axis or 0, block_size=block, output_dtype=None if zp is not None else name)
        got, want = _both(qlinear.quantize_linear, x, scale, zp, **kw)
        _assert_same(got, want)
        packed = element_type(name).is_packed
        if packed:
            got, _ = _both(qlinear.quantize_linear, x, scale, zp, packed=True, **kw)
            np.testing.assert_array_equal(got, qlinear.pack(want))
        dkw = dict(axis=axis or 0, block_size=block)
        got, expected = _both(qlinear.dequantize_linear, want, scale, zp, **dkw)
        _assert_same(got, expected)
        if packed:
            got, _ = _both(qlinear.dequantize_linear, qlinear.pack(want), scale, zp, packed_dtype=name, shape=shape, **dkw)
            _assert_same(got, expected)


@pytest.mark.parametrize(
    "name", ["uint8", "int8", "uint16", "int16", "int4", "uint2", "float8e4m3fn", "float8e5m2", "float8e5m2fnuz", "float4e2m1"]
)
def test_cpu_streaming_stores_match_reference(name, monkeypatch):
    # Large calls write whole cache lines of long runs by streaming stores
    # (kernels/cpu/_lines.py); lower the size at which they start so these
    # arrays take that path, with outputs that start at every offset within
    # a line, float32 and int32 x, and every edge value.
    from qlinear.kernels.cpu import _lines

    monkeypatch.setattr(_lines, "STREAM_MIN_BYTES", 0)
    t = element_type(name)
    rng = np.random.default_rng(QUANTIZED.index(name))
    shape = (5, 4099)  # rows past the shortest streamed run (4096) and odd
    n = 5 * 4099
    for x in (_values(shape, rng), rng.integers(-(2**31), 2**31 - 1, shape, dtype=np.int64).astype(np.int32)):
        scale, zp = _params(name, shape, 0, 0, rng)
        for s, z, axis in ((scale, zp, 0), (np.float32(0.37), zp[1], 0), (np.float32(2.5e-3), None, 0)):
            kw = dict(axis=axis, output_dtype=None if z is not None else name)
            want = qlinear.quantize_linear(x, s, z, backend="reference", **kw)
            values = qlinear.dequantize_linear(want, s, z, axis=axis, backend="reference")
            backing = np.zeros(n * t.dtype.itemsize + 128, np.uint8)
            fbacking = np.zeros(n * 4 + 128, np.uint8)
            for offset in (0, 4, 8, 32, 60):  # bytes past a line's start
                start = -backing.ctypes.data % 64 + offset // t.dtype.itemsize * t.dtype.itemsize
                out = backing[start : start + n * t.dtype.itemsize].view(t.dtype).reshape(shape)
                got = qlinear.quantize_linear(x, s, z, out=out, backend="cpu", **kw)
                _assert_same(got, want)
                fstart = -fbacking.ctypes.data % 64 + offset
                fout = fbacking[fstart : fstart + 4 * n].view(np.float32).reshape(shape)
                got = qlinear.dequantize_linear(want, s, z, axis=axis, out=fout, backend="cpu")
                _assert_same(got, values)


@pytest.mark.parametrize("name", ["uint8", "int8", "uint16", "int16", "float8e4m3fn", "float8e5m2", "float4e2m1"])
def test_cpu_streamed_lines_of_several_scales_match_reference(name, monkeypatch):
    # Where the scale of element j is scale[(j // period) % count] (blocks on
    # the last axis, rows of per-axis layouts), DequantizeLinear streams
    # lines of float32 that may span two scales, split at any lane by where
    # the output starts. Scales that step along short rows (per-axis on the
    # last axis, blocks across rows) go by runs. Periods from a line up, ragged blocks (not
    # periodic), outputs at every offset within a line; QuantizeLinear on the
    # same layouts and outputs.
    from qlinear.kernels.cpu import _lines

    monkeypatch.setattr(_lines, "STREAM_MIN_BYTES", 0)
    t = element_type(name)
    rng = np.random.default_rng(100 + QUANTIZED.index(name))
    periodic = [((9, 192), 1, b) for b in (16, 32, 48, 64, 96, 40)] + [((4, 17, 40), 1, 0), ((33, 17), 0, 0)]
    # Scales that step along rows, for QuantizeLinear and DequantizeLinear alike.
    stepping = [
        ((9, 192), 1, 0),
        ((4, 5, 40), 2, 0),
        ((64, 40), 0, 32),
        ((3, 64, 20), 1, 16),
        ((3, 70, 20), 1, 16),
        ((64, 10), 0, 16),
    ]
    for shape, axis, block in periodic + stepping:
        n = int(np.prod(shape))
        x = _values(shape, rng)
        scale, zp = _params(name, shape, axis, block, rng)
        kw = dict(axis=axis, block_size=block)
        want = qlinear.quantize_linear(x, scale, zp, backend="reference", **kw)
        values = qlinear.dequantize_linear(want, scale, zp, backend="reference", **kw)
        backing = np.zeros(n * t.dtype.itemsize + 128, np.uint8)
        fbacking = np.zeros(n * 4 + 128, np.uint8)
        for offset in range(0, 64, 4 * t.dtype.itemsize):  # bytes past a line's start
            start = -backing.ctypes.data % 64 + offset
            out = backing[start : start + n * t.dtype.itemsize].view(t.dtype).reshape(shape)
            _assert_same(qlinear.quantize_linear(x, scale, zp, out=out, backend="cpu", **kw), want)
            fstart = -fbacking.ctypes.data % 64 + offset
            fout = fbacking[fstart : fstart + 4 * n].view(np.float32).reshape(shape)
            _assert_same(qlinear.dequantize_linear(want, scale, zp, out=fout, backend="cpu", **kw), values)


@pytest.mark.parametrize("name", ["uint8", "int8", "uint16", "int16", "float8e4m3fn", "float8e5m2", "float8e4m3fnuz"])
def test_cpu_streamed_stepping_lines_match_reference(name, monkeypatch):
    # Where the scale steps with the element along rows long enough
    # (_params.step_lines_fit), DequantizeLinear streams
    # lines that read 16 scales and zero points at once. Rows of odd
    # lengths put each row's first whole line at a different lane, rows of
    # whole lines keep every row on lines where the output starts on one; outputs
    # at every offset within a line; tasks of 16384 elements end inside
    # rows; NaN and infinite float8 codes keep their first NaN.
    from qlinear.kernels.cpu import _lines
    from qlinear.kernels.cpu._params import STEP_LINES_MIN_ROW, STEP_WIDE_LINES_MIN_ROW, STEP_WIDE_LINES_OFF_LINE_MIN_ROW

    monkeypatch.setattr(_lines, "STREAM_MIN_BYTES", 0)
    t = element_type(name)
    rng = np.random.default_rng(200 + QUANTIZED.index(name))
    row = STEP_WIDE_LINES_OFF_LINE_MIN_ROW
    on_lines = STEP_WIDE_LINES_MIN_ROW  # rows that start on lines where the output does
    assert row >= on_lines >= STEP_LINES_MIN_ROW and on_lines % 16 == 0
    cases = [((19, row + 3), 1, 0), ((2, 5, row + 37), 2, 0), ((40, row + 1), 0, 32), ((3, 33, row), 1, 16)]
    cases += [((21, on_lines), 1, 0), ((40, on_lines), 0, 32)]
    for shape, axis, block in cases:
        n = int(np.prod(shape))
        x = _values(shape, rng)
        scale, zp = _params(name, shape, axis, block, rng)
        kw = dict(axis=axis, block_size=block)
        codes = qlinear.quantize_linear(x, scale, zp, backend="reference", **kw)
        if not t.is_integer:
            # Every code, NaN and infinity among them where the type has them.
            codes = rng.integers(0, 256, shape, dtype=np.uint8).view(t.dtype)
        values = qlinear.dequantize_linear(codes, scale, zp, backend="reference", **kw)
        fbacking = np.zeros(n * 4 + 128, np.uint8)
        for offset in range(0, 64, 4):  # bytes past a line's start
            fstart = -fbacking.ctypes.data % 64 + offset
            fout = fbacking[fstart : fstart + 4 * n].view(np.float32).reshape(shape)
            _assert_same(qlinear.dequantize_linear(codes, scale, zp, out=fout, backend="cpu", **kw), values)


@pytest.mark.parametrize("name", ["int4", "uint4", "float4e2m1", "int2", "uint2", "float6e2m3"])
def test_cpu_streamed_packed_lines_match_reference(name, monkeypatch):
    # DequantizeLinear of packed 4/2-bit codes streams lines of 16 values
    # (8 or 4 bytes of codes) where the layout is periodic with short
    # periods (blocks) and the lines start on a byte; elsewhere (odd output
    # offsets, steps, long periods, 6-bit codes) it reads by runs. Every
    # offset within a line, periods of a line and more, a ragged block and
    # per-axis rows.
    from qlinear.kernels.cpu import _lines

    monkeypatch.setattr(_lines, "STREAM_MIN_BYTES", 0)
    rng = np.random.default_rng(200 + QUANTIZED.index(name))
    layouts = [((9, 192), 1, b) for b in (16, 32, 48, 40)] + [((), 0, 0), ((4, 17, 40), 1, 0), ((33, 17), 0, 0), ((6, 64), 1, 0)]
    for shape, axis, block in layouts:
        shape = shape or (1731,)
        n = int(np.prod(shape))
        x = _values(shape, rng)
        scale, zp = _params(name, shape, axis, block, rng)
        if not shape[1:] and not block:
            scale, zp = scale.reshape(-1)[0], zp.reshape(-1)[0]
        kw = dict(axis=axis, block_size=block)
        codes = qlinear.quantize_linear(x, scale, zp, packed=True, backend="reference", **kw)
        unpacked = qlinear.quantize_linear(x, scale, zp, backend="reference", **kw)
        values = qlinear.dequantize_linear(unpacked, scale, zp, backend="reference", **kw)
        fbacking = np.zeros(n * 4 + 128, np.uint8)
        for offset in range(0, 64, 4):  # bytes past a line's start
            fstart = -fbacking.ctypes.data % 64 + offset
            fout = fbacking[fstart : fstart + 4 * n].view(np.float32).reshape(shape)
            got = qlinear.dequantize_linear(codes, scale, zp, packed_dtype=name, shape=shape, out=fout, backend="cpu", **kw)
            _assert_same(got, values)


# Layouts whose runs all start on a byte and fill a line of packed bytes,
# or are blocks of 32: packed 2/4-bit codes go straight into their bytes
# there. Per tensor with a last byte half full; rows, middle axes, the last
# axis, blocks with a short last one, blocks of 32, blocks across rows;
# several tasks each; rows of 1000 and 300 codes whose scales step with the
# element, not a whole number of 32-code vectors.
BYTE_RUN_LAYOUTS = [
    ((70001,), 0, 0),
    ((70, 1024), 1, 32),
    ((80, 1024), 0, 0),
    ((3, 40, 512), 1, 0),
    ((70, 1024), 1, 0),
    ((30, 1000), 1, 0),
    ((40, 1280), 1, 512),
    ((96, 512), 0, 32),
    ((64, 300), 0, 16),
]


@pytest.mark.parametrize("name", ["int4", "uint4", "int2", "uint2", "float4e2m1"])
def test_cpu_packed_codes_straight_into_bytes(name):
    from qlinear.kernels.cpu._params import packed_runs_fit
    from qlinear.spec import Granularity

    rng = np.random.default_rng(7 + QUANTIZED.index(name))
    per_byte = 8 // element_type(name).bits
    for shape, axis, block in BYTE_RUN_LAYOUTS:
        kind = "per_tensor" if len(shape) == 1 else "blocked" if block else "per_axis"
        assert packed_runs_fit(Granularity(kind, axis, block), shape, per_byte, 64 * per_byte, 32)
        scale, zp = _params(name, shape, axis, block, rng)
        for x in (_values(shape, rng), rng.integers(-40, 40, shape).astype(np.int32)):
            for z in (zp, None):
                kw = dict(axis=axis, block_size=block, output_dtype=None if z is not None else name)
                got, _ = _both(qlinear.quantize_linear, x, scale, z, packed=True, **kw)
                want = qlinear.quantize_linear(x, scale, z, backend="reference", **kw)
                np.testing.assert_array_equal(got, qlinear.pack(want))


def test_packed_runs_fit_each_granularity():
    from qlinear.kernels.cpu._params import packed_runs_fit
    from qlinear.spec import Granularity

    assert packed_runs_fit(Granularity("per_tensor"), (7, 3), 2, 128)  # one run, however short; its last byte half full
    assert packed_runs_fit(Granularity("per_axis", 0), (4, 128), 2, 128)
    assert not packed_runs_fit(Granularity("per_axis", 0), (4, 64), 2, 128)  # rows shorter than a line of bytes
    assert not packed_runs_fit(Granularity("per_axis", 0), (4, 257), 2, 128)  # the second row starts inside a byte
    assert packed_runs_fit(Granularity("per_axis", 1), (4, 256), 4, 256)  # the scale steps along rows of 256
    assert not packed_runs_fit(Granularity("per_axis", 1), (4, 258), 4, 256)
    assert packed_runs_fit(Granularity("blocked", 1, 128), (3, 320), 2, 64)  # blocks of 128, 128, 64
    assert not packed_runs_fit(Granularity("blocked", 1, 128), (3, 320), 2, 128)  # the last block is shorter
    assert not packed_runs_fit(Granularity("blocked", 1, 32), (3, 1024), 2, 128)  # short blocks go through pieces
    assert packed_runs_fit(Granularity("blocked", 1, 32), (3, 1024), 2, 128, 32)  # unless their length has a loop of its own
    assert not packed_runs_fit(Granularity("blocked", 1, 32), (3, 1000), 2, 128, 32)  # a row's last block is 8
    assert packed_runs_fit(Granularity("blocked", 0, 32), (64, 256), 4, 256)  # rows of stepping scales


def test_cpu_float4_line_by_lookup_and_by_arithmetic(monkeypatch):
    # The float4e2m1 line looks its codes up in a register of their 16
    # values where numba compiles for an AVX-512 processor, and decodes them
    # by arithmetic elsewhere. Compiled afresh each way (the kernels' cache
    # holds only this machine's way), both give every code's value, as
    # (value - z) * s, across a split of two scales.
    from numba import njit

    from qlinear.kernels.cpu import _dequantize, _dequantize_lines, _lines
    from qlinear.kernels.cpu import _dequantize_kernel as kernel
    from qlinear.kernels.cpu._dequantize_runs import _format

    t = element_type("float4e2m1")
    p = np.zeros(kernel.P_LEN, np.int64)
    _dequantize._float_format(kernel, t, p)
    fmt = _format(
        (p[kernel.P_MANT], p[kernel.P_EXP_OFF], 8, p[kernel.P_MAX_BITS], p[kernel.P_INF_BITS], p[kernel.P_NEG_ZERO_NAN])
    )
    codes = np.array([0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE], np.uint8)  # codes 0..15, low nibble first
    s0, z0, s1, z1 = np.float32(0.75), np.float32(0.5), np.float32(3.0), np.float32(-1.0)
    values = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    want = np.concatenate([(values[:5] - z0) * s0, (values[5:] - z1) * s1])
    ways = (False, True) if _lines.table_lookup() else (False,)
    for lookup in ways:
        monkeypatch.setattr(_dequantize_lines, "table_lookup", lambda lookup=lookup: lookup)

        @njit
        def line(codes, fmt, dst, start):
            _dequantize_lines.dequantize_float4_line(codes, 0, np.int32(0), fmt, dst, start, s0, z0, s1, z1, 5)

        backing = np.zeros(32, np.float32)
        start = int(-backing.ctypes.data % 64 // 4)
        line(codes, fmt, backing, start)
        _assert_same(backing[start : start + 16], want)


def test_scale_periods_of_each_granularity():
    from qlinear.kernels.cpu._params import scale_period
    from qlinear.spec import Granularity

    per_tensor, rows, middle, last = (
        Granularity("per_tensor"),
        Granularity("per_axis", 0),
        Granularity("per_axis", 1),
        Granularity("per_axis", 2),
    )
    assert scale_period(per_tensor, (4, 6), (), 16) == (24, 1)
    assert scale_period(rows, (4, 64), (4,), 16) == (64, 4)
    assert scale_period(middle, (2, 3, 32), (3,), 16) == (32, 3)
    assert scale_period(last, (2, 3, 32), (32,), 1) == (0, 0)  # the scale steps with the element
    assert scale_period(Granularity("blocked", 1, 32), (3, 64), (3, 2), 16) == (32, 6)
    assert scale_period(Granularity("blocked", 1, 48), (3, 64), (3, 2), 16) == (0, 0)  # a ragged last block
    assert scale_period(Granularity("blocked", 0, 32), (64, 3), (2, 3), 16) == (0, 0)  # blocks across rows
    assert scale_period(Granularity("blocked", 1, 8), (3, 64), (3, 8), 16) == (0, 0)  # shorter than asked


def test_streaming_starts_at_the_last_level_cache():
    from qlinear.kernels.cpu import _lines

    cache = _lines.last_level_cache_bytes()
    assert cache >= 1 << 20
    assert _lines.STREAM_MIN_BYTES is None
    words = np.zeros(8, np.uint16)
    assert _lines.streams(cache, words) and not _lines.streams(cache - 1, words)
    odd = np.zeros(17, np.uint8)[1:].view(np.uint16)
    assert not _lines.streams(cache, odd)


def test_cpu_outputs_not_aligned_to_their_elements(monkeypatch):
    # An out= view at an odd byte offset is legal numpy; the kernels write it
    # with ordinary stores (streaming stores need aligned lines).
    from qlinear.kernels.cpu import _lines

    monkeypatch.setattr(_lines, "STREAM_MIN_BYTES", 0)
    x = _values((3, 5000), np.random.default_rng(9))
    want = qlinear.quantize_linear(x, np.float32(0.01), np.int16(3), backend="reference")
    out = np.zeros(2 * x.size + 1, np.uint8)[1:].view(np.int16).reshape(x.shape)
    assert not out.flags.aligned
    _assert_same(qlinear.quantize_linear(x, np.float32(0.01), np.int16(3), out=out, backend="cpu"), want)
    values = qlinear.dequantize_linear(want, np.float32(0.01), np.int16(3), backend="reference")
    fout = np.zeros(4 * x.size + 2, np.uint8)[2:].view(np.float32).reshape(x.shape)
    _assert_same(qlinear.dequantize_linear(want, np.float32(0.01), np.int16(3), out=fout, backend="cpu"), values)
