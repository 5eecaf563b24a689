"""qlinear against independent implementations, over random cases.

Three oracles: qlinear's element-by-element transcription of the spec (on
every input), ``onnx.reference`` and ONNX Runtime (on every input outside the
divergences written in docs/semantics.md, each of which has its own test in
test_semantics.py).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from qlinear.conformance import generated_cases
from qlinear.conformance._oracles import Unsupported, run_onnx_reference, run_onnxruntime, run_spec_model, same
from qlinear.dtypes import element_type
from qlinear.kernels import BACKENDS
from qlinear.onnx import NodeCase
from qlinear.onnx._node_case import run_qlinear
from qlinear.spec import operator_version

OPSETS = [10, 13, 19, 21, 23, 24, 25, 28]
SPECIAL = [0.0, -0.0, math.nan, math.inf, -math.inf, 0.5, 1.5, 2.5, -2.5, 3e38, -3e38, 1e10, 1e-40, 2.5004]
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def node_cases(draw, *, tame: bool = False, max_opset: int = 28, ms: bool = True):
    """A random Q or DQ case. ``tame`` keeps to inputs where onnx.reference and
    ONNX Runtime follow the spec (no NaN, inf, -0 or values beyond int32;
    scales no narrower than x; zero float zero points)."""
    domain = draw(st.sampled_from(["", "com.microsoft"])) if ms else ""
    opset = 1 if domain else draw(st.sampled_from([o for o in OPSETS if o <= max_opset]))
    op = draw(st.sampled_from(["QuantizeLinear", "DequantizeLinear"]))
    row = operator_version(op, opset, domain, caller="test")
    qtype = element_type(draw(st.sampled_from(sorted(row.quantized_types - ({"int32"} if op == "QuantizeLinear" else set())))))
    rank = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(0 if not tame else 1, 5), min_size=rank, max_size=rank)))
    kinds = ["per_tensor"] + (["per_axis"] if row.per_axis and rank else []) + (["blocked"] if row.blocked and rank else [])
    kind = draw(st.sampled_from(kinds))
    attrs: dict = {}
    if kind == "per_tensor":
        sshape: tuple[int, ...] = ()
    else:
        axis = draw(st.integers(-rank, rank - 1))
        attrs["axis"] = axis
        if kind == "per_axis":
            sshape = (shape[axis],)
        else:
            block = draw(st.integers(1, 4))
            attrs["block_size"] = block
            sshape = tuple(-(-d // block) if i == axis % rank else d for i, d in enumerate(shape))
    n, sn = math.prod(shape), math.prod(sshape)
    scale_values = draw(st.lists(st.sampled_from([0.5, 0.25, 1.0, 2.0, 0.1, 3.0, 0.007, 17.0]), min_size=sn, max_size=sn))
    if op == "QuantizeLinear":
        x_name = draw(st.sampled_from(sorted(row.x_types - {"int32"})))
        scale_choices = (
            [x_name] if row.scale_types is None else sorted((row.scale_types - {"int32"}) if not tame else {x_name, "float"})
        )
        s_name = draw(st.sampled_from(scale_choices))
        span = (qtype.qmax - qtype.qmin) if qtype.is_integer else qtype.max_finite
        finite = st.floats(-4 * span, 4 * span, allow_nan=False, allow_infinity=False, width=32)
        values = (
            st.one_of(finite, st.sampled_from(SPECIAL)) if not tame else st.one_of(finite, st.sampled_from([0.5, 1.5, 2.5, -2.5]))
        )
        x_values = draw(st.lists(values, min_size=n, max_size=n))
        with np.errstate(all="ignore"):
            x = np.array(x_values, np.float64).astype(element_type(x_name).dtype).reshape(shape)
            if tame:
                x = np.where(x == 0, np.zeros_like(x), x)  # no -0
        scale = np.array(scale_values, np.float64).astype(element_type(s_name).dtype).reshape(sshape)
        if not row.per_axis and kind == "per_tensor" and sshape != ():
            scale = scale.reshape(())
        if draw(st.booleans()) and qtype.saturate_applies and "saturate" in row.attributes:
            attrs["saturate"] = 0
    else:
        x = _codes(draw, qtype, n, tame).reshape(shape)
        s_name = draw(st.sampled_from(sorted(row.scale_types if not tame else row.scale_types - {"float8e8m0"})))
        scale = np.array(scale_values, np.float64).astype(element_type(s_name).dtype).reshape(sshape)
        if "output_dtype" in row.attributes and draw(st.booleans()):
            attrs["output_dtype"] = element_type(draw(st.sampled_from(sorted(row.output_types)))).onnx_enum
    zero_point = None
    if draw(st.booleans()) or ("output_dtype" not in row.attributes and qtype.name != "uint8" and op == "QuantizeLinear"):
        zero_point = _zero_point(draw, qtype, sshape, tame)
    elif op == "QuantizeLinear" and qtype.name != "uint8":
        attrs["output_dtype"] = qtype.onnx_enum
    return NodeCase(f"{domain}{op}-{opset}/{qtype}/{kind}", op, opset, [x, scale, zero_point], attrs, domain)


def _codes(draw, t, n, tame):
    if t.bits <= 8:
        codes = np.array(draw(st.lists(st.integers(0, (1 << t.bits) - 1), min_size=n, max_size=n)), np.uint8).view(t.dtype)
        if tame and not t.is_integer:
            f = codes.astype(np.float32)
            codes = np.where(np.isfinite(f) & (f != 0), codes, t.dtype.type(1)).astype(t.dtype)
        return codes
    low, high = (t.qmin, t.qmax) if not (tame and t.name == "int32") else (-(2**10), 2**10)
    return np.array(draw(st.lists(st.integers(low, high), min_size=n, max_size=n)), np.int64).astype(t.dtype)


def _zero_point(draw, t, shape, tame):
    n = math.prod(shape)
    if t.is_integer:
        low, high = (t.qmin, t.qmax) if t.name != "int32" else (-(2**10), 2**10)
        return np.array(draw(st.lists(st.integers(low, high), min_size=n, max_size=n)), np.int64).astype(t.dtype).reshape(shape)
    values = [0.0] * n if tame else draw(st.lists(st.sampled_from([0.0, 0.0, 0.5, -1.0]), min_size=n, max_size=n))
    return np.array(values, np.float64).astype(t.dtype).reshape(shape)


def _agree(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert same(g, w), f"got {g!r}\nexpected {w!r}"


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@SETTINGS
@given(case=node_cases())
def test_qlinear_matches_spec_model(case, backend):
    _agree(run_qlinear(case, backend=backend), run_spec_model(case))


def _quotient_stays_finite(case):
    """False when a 16-bit x / scale overflows to inf: onnx.reference and ONNX
    Runtime turn that infinity into the wrong end of the range (docs/semantics.md)."""
    if case.op != "QuantizeLinear" or case.inputs[0].dtype.itemsize != 2:
        return True
    with np.errstate(all="ignore"):
        quotient = case.inputs[0].astype(np.float32) / np.float32(case.inputs[1].astype(np.float32).min())
    return bool(np.all(np.abs(quotient) < 60000))


@SETTINGS
@given(case=node_cases(tame=True, ms=False))
def test_qlinear_matches_onnx_reference(case):
    assume(_quotient_stays_finite(case))
    if case.op == "DequantizeLinear" and case.opset < 19:
        case = NodeCase(case.name, case.op, 19, case.inputs, case.attributes)  # onnx.reference has no DequantizeLinear 10 or 13
    x_type = element_type(case.inputs[0].dtype)
    out = case.attributes.get("output_dtype")
    float8_out = (
        case.op == "QuantizeLinear"
        and (
            element_type(case.inputs[2].dtype) if case.inputs[2] is not None else element_type(out) if out else x_type
        ).saturate_applies
    )
    want = run_onnx_reference(case)
    got = run_qlinear(case)
    if float8_out and case.inputs[2] is not None:
        # onnx.reference ignores a float8 zero point, so x/scale = -0 stays -0 there (docs/semantics.md).
        got, want = _unsigned_zeros(got), _unsigned_zeros(want)
    _agree(got, want)


def _unsigned_zeros(arrays):
    return [np.where(a.astype(np.float32) == 0, np.zeros_like(a), a) for a in arrays]


@SETTINGS
@given(case=node_cases(tame=True, max_opset=25))
def test_qlinear_matches_onnxruntime(case):
    # ONNX Runtime divides 16-bit operands in float32, not in the scale's type (docs/semantics.md).
    assume(case.op == "DequantizeLinear" or case.inputs[1].dtype.itemsize == 4)
    try:
        want = run_onnxruntime(case)
    except Unsupported:
        return
    got = run_qlinear(case)
    if case.op == "QuantizeLinear" and got[0].dtype.kind not in "iu":
        # ONNX Runtime ignores float8 zero points: -0 stays -0 there (docs/semantics.md).
        got, want = _unsigned_zeros(got), _unsigned_zeros(want)
        # ... and answers some float8 overflows (saturate=0) its own way (docs/semantics.md).
        got, want = _overflow_ties_as_nan(case, got, want)
    _agree(got, want)


def _overflow_ties_as_nan(case, got, want):
    """ONNX Runtime's answers past the largest float8 value (saturate=0), where they are not the specification's.

    float8e5m2: ONNX Runtime gives NaN for a quotient of exactly ±61440, qlinear ±inf.
    float8e4m3fn: ONNX Runtime gives ±448 for quotients in [480, 496), qlinear NaN.
    """
    if case.attributes.get("saturate", 1) or got[0].dtype not in (
        np.dtype(ml_dtypes.float8_e5m2),
        np.dtype(ml_dtypes.float8_e4m3fn),
    ):
        return got, want
    g, w = got[0].astype(np.float32), want[0].astype(np.float32)
    if got[0].dtype == np.dtype(ml_dtypes.float8_e5m2):
        quirk = np.isinf(g) & np.isnan(w)
    else:
        quirk = np.isnan(g) & (np.abs(w) == 448)
    if not quirk.any():
        return got, want
    return [np.where(quirk, want[0], got[0]), *got[1:]], want


def test_float8e5m2_overflow_tie_is_inf():
    # 122880 / 2 = 61440, halfway between 57344 (the largest finite float8e5m2) and 65536: to even, inf.
    x = np.array([122880.0, -122880.0, 122879.0], np.float32)
    case = NodeCase("tie", "QuantizeLinear", 19, [x, np.float32(2), ml_dtypes.float8_e5m2(0)], {"saturate": 0})
    for backend in sorted(BACKENDS):
        got = run_qlinear(case, backend=backend)[0].astype(np.float32)
        assert got[0] == np.inf and got[1] == -np.inf and got[2] == 57344, backend
    assert np.array_equal(run_onnx_reference(case)[0].astype(np.float32)[:2], [np.inf, -np.inf])
    try:
        ort = run_onnxruntime(case)[0].astype(np.float32)
    except Unsupported:
        return
    assert np.isnan(ort[:2]).all()  # the divergence the comparison above allows for


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_generated_matrix_matches_spec_model(backend):
    cases = generated_cases()
    assert len(cases) > 1000
    for case in cases:
        got, want = run_qlinear(case, backend=backend), run_spec_model(case)
        assert all(same(g, w) for g, w in zip(got, want, strict=True)), case.name


@SETTINGS
@given(x=st.lists(st.one_of(st.floats(-1e4, 1e4, width=32), st.sampled_from([0.0, -0.0, math.nan])), max_size=40))
def test_dynamic_quantize_matches_spec_model(x):
    case = NodeCase("dynamic", "DynamicQuantizeLinear", 11, [np.array(x, np.float32)])
    _agree(run_qlinear(case), run_spec_model(case))


@SETTINGS
# A range below ~1e-36 makes the float32 scale underflow to 0 (docs/semantics.md).
@given(
    x=st.lists(st.floats(-1e4, 1e4, width=32, allow_nan=False), min_size=1, max_size=40).filter(
        lambda v: max(map(abs, v)) > 1e-30
    )
)
def test_dynamic_quantize_matches_onnx_reference_and_onnxruntime(x):
    case = NodeCase("dynamic", "DynamicQuantizeLinear", 11, [np.array(x, np.float32)])
    got = run_qlinear(case)
    _agree(got, run_onnx_reference(case))
    _agree(got, run_onnxruntime(case))
