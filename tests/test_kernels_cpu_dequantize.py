"""The fused cpu DequantizeLinear's fast paths give the reference kernel's bits.

Oracle: ``backend="reference"``, compared on bit patterns. Cases aimed at the
run loops: every code of each float type (decoded by bit arithmetic),
packed runs that start and end inside a byte, blocks that cross the kernel's
parallel chunks (16384 elements), rows shorter than a block, int32 zero
points whose bits read as float32 NaN, and float16/bfloat16 results.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import qlinear
from qlinear.dtypes import element_type

PACKED = ["uint2", "int2", "uint4", "int4", "float4e2m1", "float6e2m3", "float6e3m2"]
FLOATS = ["float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "float4e2m1", "float6e2m3", "float6e3m2"]
OUTPUTS = [np.float32, np.float16, ml_dtypes.bfloat16]

# (shape, axis, block_size): rows of odd lengths so packed runs start at every
# offset within a byte, blocks shorter than a byte's codes and longer, rows
# shorter than a block, blocks across the 16384-element chunk boundary, and
# scales stepping along rows of 101 (runs longer than a vector of codes).
LAYOUTS = [
    ((1, 1), 0, 0),
    ((3, 1), 1, 0),
    ((7, 5), 1, 0),
    ((5, 7), 0, 0),
    ((9, 3), 1, 0),
    ((2, 6, 3), 1, 0),
    ((4, 33), 1, 3),
    ((4, 33), 1, 5),
    ((6, 10), 1, 32),
    ((37, 6), 0, 4),
    ((3, 2, 7), 2, 2),
    ((16390,), 0, 0),
    ((2, 16390), 1, 32),
    ((3, 11001), 1, 7),
    ((16387, 2), 0, 33),
    ((9, 101), 1, 0),
    ((24, 101), 0, 8),
]


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(_bits(got), _bits(want))


def _codes(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random codes of type ``name``, every bit pattern equally likely."""
    t = element_type(name)
    if t.bits == 32:
        return rng.integers(-(2**31), 2**31, shape).astype(np.int32)
    return rng.integers(0, 1 << t.bits, shape).astype(np.uint16 if t.bits == 16 else np.uint8).view(t.dtype)


def _params(name: str, shape: tuple[int, ...], axis: int, block: int, rng: np.random.Generator):
    if block:
        sshape = list(shape)
        sshape[axis] = -(-shape[axis] // block)
    else:
        sshape = [shape[axis]]
    scale = rng.uniform(0.01, 4.0, sshape).astype(np.float32)
    return scale, _codes(name, tuple(sshape), rng)


def _both(*args, **kwargs):
    with np.errstate(all="ignore"):
        return (
            qlinear.dequantize_linear(*args, backend="cpu", **kwargs),
            qlinear.dequantize_linear(*args, backend="reference", **kwargs),
        )


@pytest.mark.parametrize("name", FLOATS)
def test_dequantize_every_float_code(name):
    t = element_type(name)
    codes = (np.arange(256, dtype=np.uint8) & ((1 << t.bits) - 1)).view(t.dtype)
    zp = np.array([0.0, -1.5, 3.0], np.float32).astype(t.dtype).repeat([86, 85, 85])
    scale = np.array([1.0, 0.375, 3e-3], np.float32).repeat([86, 85, 85])
    for s, z in ((np.float32(1), None), (scale, zp)):
        got, want = _both(codes, s, z, axis=0)
        _assert_same(got, want)
        if t.is_packed:
            got, _ = _both(qlinear.pack(codes), s, z, axis=0, packed_dtype=name, shape=codes.shape)
            _assert_same(got, want)


@pytest.mark.parametrize("name", PACKED)
def test_dequantize_packed_runs_at_every_offset(name):
    rng = np.random.default_rng(PACKED.index(name))
    for shape, axis, block in LAYOUTS:
        q = _codes(name, shape, rng)
        scale, zp = _params(name, shape, axis, block, rng)
        for out_dtype in OUTPUTS:
            kw = dict(axis=axis, block_size=block, output_dtype=out_dtype)
            _, want = _both(q, scale, zp, **kw)
            got, _ = _both(qlinear.pack(q), scale, zp, packed_dtype=name, shape=shape, **kw)
            _assert_same(got, want)


@pytest.mark.parametrize("name", ["uint8", "int8", "uint16", "int16", "int32", "float8e4m3fn", "float8e5m2fnuz", "int4"])
def test_dequantize_unpacked_runs(name):
    rng = np.random.default_rng(50)
    for shape, axis, block in LAYOUTS:
        q = _codes(name, shape, rng)
        scale, zp = _params(name, shape, axis, block, rng)
        for z in (zp, None):
            for out_dtype in OUTPUTS:
                got, want = _both(q, scale, z, axis=axis, block_size=block, output_dtype=out_dtype)
                _assert_same(got, want)


def test_dequantize_int32_zero_points_with_nan_bits():
    # 0x7f800001 and 0xffc00000 read as float32 are NaNs: the kernel must only ever read them as int32.
    zp = np.array([0x7F800001, -0x00400000, 0x7FC00000, -1, 2**31 - 1], np.int64).astype(np.int32)
    x = np.arange(-7, 13, dtype=np.int32).reshape(4, 5) * 123457
    for block in (0, 2):
        scale = np.full((4, 3) if block else 5, 0.5, np.float32)
        z = np.stack([zp[:3]] * 4) if block else zp
        got, want = _both(x, scale, z, axis=1, block_size=block)
        _assert_same(got, want)


def test_dequantize_read_only_arrays():
    q = np.frombuffer(bytes(range(200)), np.uint8).view(ml_dtypes.float8_e4m3fn)
    scale = np.linspace(0.1, 2, 200, dtype=np.float32)
    scale.flags.writeable = False
    got, want = _both(q, scale, axis=0)
    _assert_same(got, want)
