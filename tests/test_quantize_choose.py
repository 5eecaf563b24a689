"""Scales and zero points: hand-computed cases, degenerate ranges, and what each method does to outliers."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import qlinear
from qlinear.dtypes import element_type
from qlinear.quantize import TensorStats
from qlinear.quantize._choose import activation_params, weight_params

UINT8, INT8 = element_type("uint8"), element_type("int8")


def _params(x, t=UINT8, method="minmax", symmetric=False):
    return activation_params(TensorStats.of(np.asarray(x, np.float32)), t, method=method, symmetric=symmetric, percentile=99.0)


def test_activation_minmax_by_hand():
    p = _params([-1.0, 0.5, 3.0])
    # [-1, 3] over 255 levels: scale 4/255, zero point round(0 - (-1) / (4/255)) = round(63.75) = 64.
    assert p.scale == np.float32(4 / 255) and p.zero_point == np.uint8(64) and p.zero_point.dtype == np.uint8
    relu = _params([0.0, 2.0, 5.1])
    assert relu.scale == np.float32(5.1 / 255) and relu.zero_point == 0  # a ReLU range starts at the zero point 0
    positive = _params([2.0, 3.0])  # the range always holds 0: [0, 3]
    assert positive.scale == np.float32(3 / 255) and positive.zero_point == 0
    sym = _params([-1.0, 0.5, 3.0], t=INT8, symmetric=True)
    assert sym.scale == np.float32(3 / 127) and sym.zero_point == 0 and sym.zero_point.dtype == np.int8
    # int8 without symmetric: uint8's levels shifted by 128 (the same values; ONNX Runtime converts one to the other).
    signed = _params([-1.0, 0.5, 3.0], t=INT8)
    assert signed.scale == p.scale and signed.zero_point == np.int8(64 - 128) and signed.zero_point.dtype == np.int8
    assert _params([0.0, 2.0, 5.1], t=INT8).zero_point == np.int8(-128)  # a ReLU range starts at the type's minimum


def test_activation_degenerate_ranges_give_usable_scales():
    zero = _params([0.0, 0.0])
    assert zero.scale == 1.0 and zero.zero_point == 0
    tiny = _params([0.0, 1e-44])
    assert tiny.scale == np.float32(2.0**-126)  # raised to the smallest normal float32
    for p in (zero, tiny):
        y = qlinear.quantize_linear(np.array([0.0, 1e-44], np.float32), p.scale, p.zero_point)
        assert np.all(np.isfinite(qlinear.dequantize_linear(y, p.scale, p.zero_point)))
    f8 = _params([-3.0, 448.0 * 2], t=element_type("float8e4m3fn"))
    assert f8.scale == np.float32(896 / 448) and f8.zero_point.dtype == ml_dtypes.float8_e4m3fn


def test_activation_methods_clip_outliers_but_minmax_does_not():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(200000).astype(np.float32), np.float32([300.0])])
    ranges = {m: _params(x, method=m) for m in ("minmax", "percentile", "entropy", "mse")}
    assert ranges["minmax"].high == pytest.approx(300.0)
    # percentile 99 keeps the 0.5% and 99.5% quantiles of the Gaussian, +-2.58 (on a histogram of 0.25-wide bins).
    assert ranges["percentile"].high == pytest.approx(2.58, abs=0.3) and ranges["percentile"].low == pytest.approx(-2.58, abs=0.3)
    # Entropy clips the outlier; its histogram (2048 bins over [-4.6, 300]) needs a bin a level inside (256), so not below ~60.
    assert 55.0 < ranges["entropy"].high < 150.0 and ranges["entropy"].low < -4.0
    # mse weighs one value clipped from 300 against 200000 values' rounding: N s^2 / 12 + (300 - c)^2 is least
    # near c = 240, and that is what it picks (so it clips, but little).
    assert 200.0 < ranges["mse"].high < 290.0 and ranges["mse"].low < -4.0
    # Never wider than the data.
    for p in ranges.values():
        assert x.min() - 1e-6 <= p.low and p.high <= x.max() + 1e-6


def test_activation_mse_rounds_float8_as_float8_does():
    # float8's grid is relative: clipping the outlier saves little rounding and costs (300 - c)^2. A uniform
    # grid of 448 levels (the integer model) would clip to about 279 and quadruple the error.
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(200000).astype(np.float32), np.float32([300.0])])
    f8 = element_type("float8e4m3fn")

    def error(p):
        y = qlinear.dequantize_linear(qlinear.quantize_linear(x, p.scale, p.zero_point), p.scale, p.zero_point)
        return float(((y.astype(np.float64) - x) ** 2).sum())

    mse, minmax = (activation_params(TensorStats.of(x), f8, method=m, symmetric=True, percentile=99.0) for m in ("mse", "minmax"))
    assert error(mse) <= error(minmax)


def test_activation_methods_do_not_depend_on_batching():
    x = np.random.default_rng(1).standard_normal(30000).astype(np.float32) ** 3
    whole = TensorStats.of(x)
    merged = TensorStats.empty()
    for part in np.array_split(x, 17):
        merged = merged.merge(TensorStats.of(part))
    for m in ("minmax", "percentile", "entropy", "mse"):
        a = activation_params(whole, UINT8, method=m, symmetric=False, percentile=99.9)
        b = activation_params(merged, UINT8, method=m, symmetric=False, percentile=99.9)
        assert a.scale == b.scale and a.zero_point == b.zero_point


@pytest.mark.parametrize("name", ["int8", "uint8", "int4", "uint4", "int2", "uint2", "float8e4m3fn", "float8e5m2", "float4e2m1"])
@pytest.mark.parametrize("granularity", ["per-tensor", "per-channel", "blocked"])
def test_weight_params_fit_the_type(name, granularity):
    t = element_type(name)
    w = (np.random.default_rng(2).standard_normal((6, 40)) * np.arange(1, 7)[:, None]).astype(np.float32)
    w[3] = 0.0  # an all-zero channel
    params, axis, block = weight_params(
        w, t, granularity=granularity, channel_axis=0, reduction_axis=1, block_size=16, clip="minmax"
    )
    codes = qlinear.quantize_linear(w, params.scale, params.zero_point, axis=axis, block_size=block, output_dtype=name)
    back = qlinear.dequantize_linear(codes, params.scale, params.zero_point, axis=axis, block_size=block)
    assert np.all(np.isfinite(back)) and np.all(params.scale > 0)
    assert np.all(back[3] == 0.0)  # zero stays exact
    expected_shape = {"per-tensor": (), "per-channel": (6,), "blocked": (6, 3)}[granularity]
    assert params.scale.shape == expected_shape
    if t.is_integer:
        # Min-max never clips: every error is within half a step (symmetric), or a step where the
        # zero point was rounded too (asymmetric).
        step = qlinear.dequantize_linear(np.ones_like(codes), params.scale, None, axis=axis, block_size=block)
        bound = 0.5 if t.qmin < 0 else 1.0
        assert np.all(np.abs(back - w) <= bound * step * (1 + 1e-6))
    else:
        # The largest magnitude maps to the type's largest finite value, exactly.
        assert np.abs(back).max() == pytest.approx(np.abs(w).max(), rel=1e-6)


def test_weight_params_by_hand():
    w = np.array([[1.0, -0.5, 0.25], [0.0, 0.0, 0.0], [-2.0, 1.0, 0.5]], np.float32)
    p, axis, block = weight_params(
        w, INT8, granularity="per-channel", channel_axis=0, reduction_axis=1, block_size=0, clip="minmax"
    )
    assert axis == 0 and block == 0
    np.testing.assert_array_equal(p.scale, np.float32([1 / 127, 1.0, 2 / 127]))
    np.testing.assert_array_equal(p.zero_point, np.zeros(3, np.int8))
    u, _, _ = weight_params(w, UINT8, granularity="per-tensor", channel_axis=0, reduction_axis=1, block_size=0, clip="minmax")
    # [-2, 1] over 255 levels: zero point round(2 / (3/255)) = 170.
    assert u.scale == np.float32(3 / 255) and u.zero_point == 170


def test_weight_mse_clip_lowers_the_error():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((8, 256)).astype(np.float32)
    w[:, 0] = 12.0  # one outlier a channel
    t = element_type("int4")
    errors = {}
    for clip in ("minmax", "mse"):
        p, axis, _ = weight_params(w, t, granularity="per-channel", channel_axis=0, reduction_axis=1, block_size=0, clip=clip)
        back = qlinear.dequantize_linear(
            qlinear.quantize_linear(w, p.scale, p.zero_point, axis=axis, output_dtype="int4"), p.scale, p.zero_point, axis=axis
        )
        errors[clip] = float(((w - back) ** 2).sum())
    assert errors["mse"] < 0.8 * errors["minmax"]
