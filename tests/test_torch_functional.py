"""qlinear.torch's forward against qlinear's numpy operators, bit for bit."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import qlinear  # noqa: E402
import qlinear.torch as qt  # noqa: E402
from qlinear.dtypes import ELEMENT_TYPES, element_type  # noqa: E402
from qlinear.spec import operator_version  # noqa: E402

# Every type QuantizeLinear can produce, in the type table's order.
QUANTIZED_TYPES = [
    t.name for t in ELEMENT_TYPES if t.name in operator_version("QuantizeLinear", 28, "", caller="tests").quantized_types
]
WIDE = {
    "float32": (np.float32, torch.float32),
    "float16": (np.float16, torch.float16),
    "bfloat16": (ml_dtypes.bfloat16, torch.bfloat16),
}


def _bits_equal(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal bit patterns, any NaN matching any NaN."""
    got, want = got.astype(np.float32), want.astype(np.float32)
    nan = np.isnan(got) & np.isnan(want)
    return bool(np.all(nan | (got.view(np.uint32) == want.view(np.uint32))))


def _to_torch(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a, np.float32)).to(dtype)


@st.composite
def cases(draw):
    """A random call: type, granularity, x/scale dtypes, values with edges mixed in."""
    qtype = element_type(draw(st.sampled_from(QUANTIZED_TYPES)))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    kind = draw(st.sampled_from(["per_tensor", "per_axis", "blocked"]))
    axis = draw(st.integers(0, len(shape) - 1))
    block_size = draw(st.integers(1, max(1, shape[axis]))) if kind == "blocked" else 0
    if kind == "per_tensor":
        scale_shape = ()
    elif kind == "per_axis":
        scale_shape = (shape[axis],)
    else:
        scale_shape = tuple(-(-d // block_size) if i == axis else d for i, d in enumerate(shape))
    x_name = draw(st.sampled_from(list(WIDE)))
    s_name = draw(st.sampled_from(list(WIDE)))
    precision = draw(st.sampled_from([None, *WIDE]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    limit = qtype.qmax if qtype.is_integer else qtype.max_finite
    x = rng.normal(0, limit, shape) * rng.choice([0.01, 0.5, 1, 3], shape)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, 2.5, 1e-30, 1e30])
    mask = rng.random(shape) < 0.1
    # 1e30 becomes inf in float16 on purpose: overflowing inputs are part of the draw.
    with np.errstate(over="ignore"):
        x = np.where(mask, rng.choice(specials, shape), x).astype(WIDE[x_name][0])
    scale = np.asarray(2.0 ** rng.integers(-4, 4, scale_shape) * rng.uniform(0.5, 1.5, scale_shape)).astype(WIDE[s_name][0])
    zp = None
    if draw(st.booleans()):
        if qtype.is_integer:
            zp = np.asarray(rng.integers(qtype.qmin, qtype.qmax + 1, scale_shape)).astype(qtype.dtype)
        else:
            zp = np.asarray(rng.normal(0, 2, scale_shape)).astype(qtype.dtype)
    saturate = draw(st.booleans()) if qtype.saturate_applies else True
    return qtype, x, scale, zp, axis, block_size, saturate, precision


def _torch_args(x, scale, zp):
    tx = _to_torch(x, WIDE[next(k for k, v in WIDE.items() if v[0] == x.dtype)][1])
    ts = _to_torch(scale, WIDE[next(k for k, v in WIDE.items() if v[0] == scale.dtype)][1])
    tz = None if zp is None else torch.from_numpy(np.asarray(zp, np.float32))
    return tx, ts, tz


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_quantize_linear_matches_numpy(case):
    qtype, x, scale, zp, axis, block_size, saturate, precision = case
    want = qlinear.quantize_linear(
        x, scale, zp, axis=axis, block_size=block_size, output_dtype=qtype.dtype, saturate=saturate, precision=precision
    )
    tx, ts, tz = _torch_args(x, scale, zp)
    got = qt.quantize_linear(
        tx, ts, tz, axis=axis, block_size=block_size, output_dtype=qtype.name, saturate=saturate, precision=precision
    )
    assert got.dtype == torch.float32
    assert _bits_equal(got.numpy(), want.astype(np.float32))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_fake_quantize_matches_numpy(case):
    qtype, x, scale, zp, axis, block_size, saturate, precision = case
    q = qlinear.quantize_linear(
        x, scale, zp, axis=axis, block_size=block_size, output_dtype=qtype.dtype, saturate=saturate, precision=precision
    )
    want = qlinear.dequantize_linear(q, scale, zp, axis=axis, block_size=block_size, output_dtype=x.dtype)
    tx, ts, tz = _torch_args(x, scale, zp)
    tx.requires_grad_(True)  # the autograd path must compute the same forward
    got = qt.fake_quantize(
        tx, ts, tz, axis=axis, block_size=block_size, output_dtype=qtype.name, saturate=saturate, precision=precision
    )
    assert got.dtype == tx.dtype
    assert _bits_equal(got.detach().to(torch.float32).numpy(), want.astype(np.float32))


@settings(max_examples=200, deadline=None)
@given(cases())
def test_dequantize_linear_matches_numpy(case):
    qtype, x, scale, zp, axis, block_size, saturate, _ = case
    q = qlinear.quantize_linear(x, scale, zp, axis=axis, block_size=block_size, output_dtype=qtype.dtype, saturate=saturate)
    want = qlinear.dequantize_linear(q, scale, zp, axis=axis, block_size=block_size)
    _, ts, tz = _torch_args(x, scale, zp)
    got = qt.dequantize_linear(
        torch.from_numpy(q.astype(np.float32)), ts, tz, axis=axis, block_size=block_size, input_dtype=qtype.name
    )
    assert got.dtype == ts.dtype
    assert _bits_equal(got.to(torch.float32).numpy(), want.astype(np.float32))
