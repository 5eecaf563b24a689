"""The ``search`` weight range: scales and integer zero points of least squared error, read back through qlinear's Q/DQ."""

from __future__ import annotations

import numpy as np
import pytest

import qlinear
from qlinear.dtypes import element_type
from qlinear.quantize._choose import weight_params


def _decoder_layer(seed: int) -> np.ndarray:
    """A (K, N) MatMul weight whose 1% of input rows are eight times the rest, as language models' outlier channels."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 256**-0.5, (256, 96)).astype(np.float32)
    w[rng.choice(256, 3, replace=False)] *= 8
    return w


def _block_errors(w: np.ndarray, type_name: str, clip: str, *, weight_only: bool, granularity: str = "blocked"):
    """Each block's (or channel's) squared error of ``w`` stored with the ``clip`` range, and its parameters."""
    t = element_type(type_name)
    p, axis, block = weight_params(
        w, t, granularity=granularity, channel_axis=1, reduction_axis=0, block_size=32, clip=clip, weight_only=weight_only
    )
    codes = qlinear.quantize_linear(w, p.scale, p.zero_point, axis=axis, block_size=block, output_dtype=type_name)
    back = qlinear.dequantize_linear(codes, p.scale, p.zero_point, axis=axis, block_size=block)
    squared = (w.astype(np.float64) - back.astype(np.float64)) ** 2
    per_group = squared.reshape(-1, 32, w.shape[1]).sum(axis=1) if granularity == "blocked" else squared.sum(axis=0)
    return per_group, p


@pytest.mark.parametrize("type_name", ["int4", "uint4"])
def test_search_lowers_the_error_of_every_block_against_round_to_nearest_on_outlier_layers(type_name):
    w = _decoder_layer(1)
    rtn, _ = _block_errors(w, type_name, "minmax", weight_only=True)
    mse, _ = _block_errors(w, type_name, "mse", weight_only=True)
    searched, p = _block_errors(w, type_name, "search", weight_only=True)
    # The min-max range is one of the candidates: no block is worse (to the rounding of the error's sum).
    assert np.all(searched <= rtn * (1 + 1e-9) + 1e-12)
    assert searched.sum() < 0.96 * rtn.sum() and searched.sum() < mse.sum()  # 0.28 dB on a decoder's layers
    t = element_type(type_name)
    assert p.zero_point.dtype == t.dtype and p.scale.dtype == np.float32 and np.all(p.scale > 0)


def test_search_keeps_symmetric_weights_symmetric_and_never_worse():
    w = _decoder_layer(2)
    rtn, _ = _block_errors(w, "int8", "minmax", weight_only=False, granularity="per-channel")
    searched, p = _block_errors(w, "int8", "search", weight_only=False, granularity="per-channel")
    assert np.all(p.zero_point == 0)  # ONNX Runtime's integer kernels take a signed weight with zero point 0 only
    assert np.all(searched <= rtn * (1 + 1e-9) + 1e-12) and searched.sum() < rtn.sum()


def test_search_of_constant_and_one_signed_blocks():
    w = np.zeros((64, 3), np.float32)
    w[:32, 1] = 0.5  # all positive: the range still holds 0, the zero point is the lowest code
    w[:, 2] = -np.linspace(0.1, 1.0, 64, dtype=np.float32)  # all negative
    errors, p = _block_errors(w, "uint4", "search", weight_only=True)
    scale, zero_point = p.scale.reshape(2, 3), p.zero_point.reshape(2, 3)
    assert scale[0, 0] == 1 and zero_point[0, 0] == 0  # all zero: scale 1, nothing to round
    assert errors[0, 1] == 0 and zero_point[0, 1] == 0  # one value: exact
    assert zero_point[0, 2] == 15 and zero_point[1, 2] == 15  # all negative: the range ends at 0, the highest code
    assert errors[:, 2].sum() > 0 and np.isfinite(errors).all()


def test_float_types_search_their_range_as_mse_does():
    w = _decoder_layer(3)
    t = element_type("float8e4m3fn")
    kw = dict(granularity="per-channel", channel_axis=1, reduction_axis=0, block_size=0, weight_only=True)
    mse, _, _ = weight_params(w, t, clip="mse", **kw)
    searched, _, _ = weight_params(w, t, clip="search", **kw)
    np.testing.assert_array_equal(searched.scale, mse.scale)
