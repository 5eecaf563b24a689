"""Large outputs come from reused memory, and memory a live array uses is never handed out again."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import qlinear
from qlinear.kernels.cpu import _pool

N = 1 << 21  # 8 MiB of float32: above the pool's threshold


@pytest.fixture(autouse=True)
def _own_pool():
    before = _pool.pool_limit()
    _pool.set_pool_limit(0)  # start empty
    _pool.set_pool_limit(256 << 20)
    yield
    _pool.set_pool_limit(0)
    _pool.set_pool_limit(before)


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_pool_reuses_a_freed_output_and_never_a_live_one():
    codes = np.arange(N, dtype=np.uint32).astype(np.uint8)
    first = qlinear.dequantize_linear(codes, np.float32(0.5), backend="cpu")
    where = _address(first)
    view = first[10:20]  # a view keeps the whole block in use
    del first
    gc.collect()
    second = qlinear.dequantize_linear(codes, np.float32(0.5), backend="cpu")
    assert _address(second) != where and not np.shares_memory(second, view)
    assert view.tolist() == (np.arange(10, 20) % 256 * 0.5).tolist()  # untouched by the second call
    freed = {where, _address(second)}
    del view, second
    gc.collect()
    third = qlinear.dequantize_linear(codes, np.float32(0.25), backend="cpu")
    assert _address(third) in freed  # one of the two freed blocks comes back: no fresh pages
    np.testing.assert_array_equal(third, (np.arange(N) % 256).astype(np.float32) * np.float32(0.25))


def test_pooled_outputs_start_on_a_cache_line():
    # The kernels stream whole 64-byte lines; outputs from the pool start on
    # one, fresh blocks and reused ones alike, whatever the allocator gives.
    codes = np.zeros(N, np.uint8)
    first = qlinear.dequantize_linear(codes, np.float32(0.5), backend="cpu")  # a fresh block
    where = _address(first)
    del first
    gc.collect()
    reused = qlinear.dequantize_linear(codes, np.float32(0.5), backend="cpu")
    fresh = qlinear.dequantize_linear(codes, np.float32(0.5), backend="cpu")  # the first is in use
    assert _address(reused) == where and _address(fresh) != where
    assert where % 64 == 0 and _address(fresh) % 64 == 0


def test_pooled_results_are_ordinary_arrays():
    x = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    y = qlinear.quantize_linear(x, np.float32(0.01), np.int16(3), backend="cpu")  # 4 MiB of int16
    assert y.flags.c_contiguous and y.flags.writeable and y.shape == (N,) and y.dtype == np.int16
    np.testing.assert_array_equal(y, qlinear.quantize_linear(x, np.float32(0.01), np.int16(3), backend="reference"))
    y[0] = 7  # writeable, and the next result is not affected by writes to a freed one
    assert np.array_equal(np.asarray(y.reshape(2, -1)[0, :1]), [7])


@pytest.mark.parametrize("name", ["float8e4m3fn", "int4", "uint16", "float4e2m1"])
def test_pooled_outputs_keep_every_type(name):
    # Every quantized type, ml_dtypes ones included, one element a value, above the pool's threshold.
    x = np.random.default_rng(1).standard_normal(4 << 20).astype(np.float32)
    y = qlinear.quantize_linear(x, np.float32(0.05), output_dtype=name, backend="cpu")
    want = qlinear.quantize_linear(x, np.float32(0.05), output_dtype=name, backend="reference")
    assert y.dtype == want.dtype and y.shape == want.shape
    np.testing.assert_array_equal(
        y.view(np.uint8 if y.itemsize == 1 else np.uint16), want.view(np.uint8 if y.itemsize == 1 else np.uint16)
    )
    back = qlinear.dequantize_linear(y, np.float32(0.05), output_dtype="float16", backend="cpu")
    assert back.dtype == np.float16 and back.shape == x.shape


def test_pool_limit_zero_allocates_fresh():
    _pool.set_pool_limit(0)
    codes = np.zeros(N, np.uint8)
    a = qlinear.dequantize_linear(codes, np.float32(1), backend="cpu")
    assert a.base is None  # plain numpy memory
    del a
    assert _pool._free_bytes == 0


def test_free_blocks_stay_under_the_limit():
    _pool.set_pool_limit(12 << 20)  # room for one 8 MiB block, not two
    codes = np.zeros(N, np.uint8)
    a = qlinear.dequantize_linear(codes, np.float32(1), backend="cpu")
    b = qlinear.dequantize_linear(codes, np.float32(1), backend="cpu")
    del a, b
    gc.collect()
    assert _pool._free_bytes <= 12 << 20
