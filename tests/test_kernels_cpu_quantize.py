"""The fused QuantizeLinear kernel's direct path gives the reference's bits where its own arithmetic could go wrong.

Oracle: ``backend="reference"``; comparisons are on bit patterns.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import qlinear
from qlinear.dtypes import element_type

# Float outputs the direct path encodes itself: every quantized float type.
FLOAT_CODED = ["float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "float4e2m1", "float6e2m3", "float6e3m2"]
PACKED_INTEGERS = ["uint4", "int4", "uint2", "int2"]


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _assert_same(fn, *args, **kwargs) -> None:
    with np.errstate(all="ignore"):
        got = fn(*args, backend="cpu", **kwargs)
        want = fn(*args, backend="reference", **kwargs)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(_bits(got), _bits(want))


def _rounding_patterns() -> np.ndarray:
    """Every float32 sign, exponent and top 7 mantissa bits, with the low 16 bits 0, 1 or all ones.

    That covers every tie and both neighbours of every tie for targets of
    up to 3 mantissa bits, in every binade (subnormal targets included),
    and the infinities and NaN.
    """
    high = np.arange(1 << 16, dtype=np.uint32) << 16
    return (high[:, None] | np.array([0, 1, 0xFFFF], np.uint32)).reshape(-1).view(np.float32)


@pytest.mark.parametrize("name", FLOAT_CODED)
def test_quantize_float_codes_every_rounding_case(name):
    x = _rounding_patterns()
    for saturate in (True, False) if element_type(name).saturate_applies else (True,):
        _assert_same(qlinear.quantize_linear, x, np.float32(1), output_dtype=name, saturate=saturate)
        # A zero point shifts every quotient, NaN included for types without NaN.
        zp = np.array(-1.5, np.float32).astype(element_type(name).dtype)
        _assert_same(qlinear.quantize_linear, x, np.float32(1), zp, saturate=saturate)


@pytest.mark.parametrize("name", FLOAT_CODED)
def test_quantize_float_types_take_the_direct_path(name):
    # float32 x in float32 precision goes from x straight to the codes for
    # every float type (the fnuz types' unsigned zero and NaN included);
    # only float16 and bfloat16 inputs or precision go through stages.
    from qlinear.kernels.cpu import _quantize_kernel as kernel
    from qlinear.kernels.cpu._params import PREC_BF16, PREC_F32
    from qlinear.kernels.cpu._quantize import _type_constants

    t = element_type(name)
    for saturate in (True, False):
        assert _type_constants(t, PREC_F32, PREC_F32, saturate, True, False).p[kernel.P_DIRECT] == 1
    assert _type_constants(t, PREC_BF16, PREC_F32, True, True, False).p[kernel.P_DIRECT] == 0


@pytest.mark.parametrize("name", FLOAT_CODED)
def test_quantize_float_stepping_zero_points_reused_across_rows(name):
    # Per-axis on the last axis and blocked on axis 0: every row steps through
    # the same zero points; chunks (16384 elements) start mid-row.
    rng = np.random.default_rng(1)
    dtype = element_type(name).dtype
    x = (rng.standard_normal((40, 1000)) * 3).astype(np.float32)
    x[::7, ::13] = np.nan
    zp = rng.uniform(-2, 2, 1000).astype(np.float32).astype(dtype)
    _assert_same(qlinear.quantize_linear, x, rng.uniform(0.1, 2, 1000).astype(np.float32), zp, axis=1)
    zp_blocks = rng.uniform(-2, 2, (5, 1000)).astype(np.float32).astype(dtype)
    _assert_same(qlinear.quantize_linear, x, rng.uniform(0.1, 2, (5, 1000)).astype(np.float32), zp_blocks, axis=0, block_size=8)


@pytest.mark.parametrize("name", ["int8", "uint16", *PACKED_INTEGERS, *FLOAT_CODED])
def test_quantize_int32_x_direct(name):
    rng = np.random.default_rng(2)
    x = rng.integers(-(2**31), 2**31 - 1, (3, 700), dtype=np.int64).astype(np.int32)
    x[0, :4] = [0, 1, -1, 2**31 - 1]
    _assert_same(qlinear.quantize_linear, x, np.float32(3e8), output_dtype=name)


@pytest.mark.parametrize("name", PACKED_INTEGERS)
def test_quantize_sub_byte_zero_point_bits_above_the_code_ignored(name):
    # ml_dtypes reads only a sub-byte code's own bits; the kernel must too.
    t = element_type(name)
    zp = (np.arange(6, dtype=np.uint8) * 0x35).view(t.dtype)
    x = np.linspace(-9, 9, 6 * 50, dtype=np.float32).reshape(6, 50)
    _assert_same(qlinear.quantize_linear, x, np.full(6, 0.7, np.float32), zp, axis=0)
    _assert_same(qlinear.quantize_linear, x, np.full(6, 0.7, np.float32), zp, axis=0, packed=True)


@pytest.mark.parametrize("name", [*PACKED_INTEGERS, "float4e2m1"])
@pytest.mark.parametrize(("shape", "block"), [((7, 45), 4), ((5, 13), 32), ((3, 7001), 12), ((9, 1), 2)])
def test_quantize_packed_blocks_not_aligned_to_bytes(name, shape, block):
    # Rows shorter than a block, odd rows, blocks that cross a chunk and
    # bytes; the last byte of the output only partly used.
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    nb = -(-shape[1] // block)
    scale = rng.uniform(0.2, 2, (shape[0], nb)).astype(np.float32)
    t = element_type(name)
    zp = (rng.integers(t.qmin, t.qmax + 1, (shape[0], nb)) if t.is_integer else rng.uniform(-2, 2, (shape[0], nb))).astype(
        t.dtype
    )
    _assert_same(qlinear.quantize_linear, x, scale, zp, axis=1, block_size=block, packed=True)


def test_quantize_float4_nan_takes_the_zero_point_without_its_sign():
    x = np.array([np.nan, -np.nan, np.nan, -np.nan], np.float32)
    zp = np.array([0.5, 0.5, -3, -3], np.float32).astype(ml_dtypes.float4_e2m1fn)
    y = qlinear.quantize_linear(x, np.ones(4, np.float32), zp, axis=0, backend="cpu")
    assert _bits(y).tolist() == [0x1, 0x1, 0xD, 0xD]
