"""dequantize(quantize(x)) stays within half a step of x inside the range."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import qlinear
from qlinear.dtypes import ELEMENT_TYPES

INTEGERS = [t for t in ELEMENT_TYPES if t.is_integer and t.name != "int32"]
FLOATS = [t for t in ELEMENT_TYPES if t.kind == "float"]


@pytest.mark.parametrize("t", INTEGERS, ids=str)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_integer_round_trip_within_half_scale(t, data):
    shape = data.draw(hnp.array_shapes(min_dims=2, max_dims=3, max_side=5))
    axis = data.draw(st.integers(0, len(shape) - 1))
    scale = data.draw(hnp.arrays(np.float32, (shape[axis],), elements=st.floats(0.0009765625, 1024.0, width=32)))
    zp = data.draw(hnp.arrays(np.int64, (shape[axis],), elements=st.integers(t.qmin, t.qmax))).astype(t.dtype)
    # x inside the representable range [(qmin - zp) * s, (qmax - zp) * s].
    u = data.draw(hnp.arrays(np.float64, shape, elements=st.floats(0, 1)))
    dims = [1] * len(shape)
    dims[axis] = -1
    s, z = scale.astype(np.float64).reshape(dims), zp.astype(np.float64).reshape(dims)
    x = (((t.qmin - z) + u * (t.qmax - t.qmin)) * s).astype(np.float32)
    y = qlinear.quantize_linear(x, scale, zp, axis=axis)
    back = qlinear.dequantize_linear(y, scale, zp, axis=axis)
    # Half a step, plus float32 rounding of x, the quotient and the product.
    slack = 8 * np.finfo(np.float32).eps * (np.abs(x.astype(np.float64)) + s * (abs(t.qmin) + abs(t.qmax)))
    assert np.all(np.abs(back.astype(np.float64) - x) <= s / 2 + slack)


@pytest.mark.parametrize("t", FLOATS, ids=str)
@settings(max_examples=40, deadline=None)
@given(
    x=hnp.arrays(np.float32, st.integers(1, 30), elements=st.floats(-1, 1, width=32)), scale=st.floats(0.015625, 8.0, width=32)
)
# A tie in float8e4m3fnuz (x / scale a hair below 168, between 160 and 176): the error is half a step, give or take
# the float32 rounding of x and of the product.
@example(x=np.array([0.7], np.float32), scale=0.99)
def test_float_round_trip_within_half_ulp(t, x, scale):
    scale = np.float32(scale)
    x = (x * np.float32(t.max_finite) * scale).astype(np.float32)
    y = qlinear.quantize_linear(x, scale, output_dtype=t.name)
    back = qlinear.dequantize_linear(y, scale).astype(np.float64)
    q = np.abs(x.astype(np.float64) / scale)
    # Spacing of t at q: 2**(floor(log2 q) - mantissa bits), no finer than the subnormal step.
    info = ml_dtypes.finfo(t.dtype)
    exponent = np.floor(np.log2(np.maximum(q, float(info.smallest_normal))))
    step = 2.0 ** (exponent - info.nmant) * scale
    # Half a step, plus the float32 rounding of x (made from the drawn value) and of the product back.
    slack = 2 * np.finfo(np.float32).eps * (np.abs(x.astype(np.float64)) + np.abs(back))
    assert np.all(np.abs(back - x) <= step / 2 + slack + 1e-30)
