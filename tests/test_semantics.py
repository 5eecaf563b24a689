"""Each decision of docs/semantics.md: qlinear follows the spec, hand-computed,
and the divergence from onnx.reference or ONNX Runtime is real."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import qlinear
from qlinear.conformance._oracles import Unsupported, run_onnx_reference, run_onnxruntime
from qlinear.kernels import BACKENDS
from qlinear.onnx import NodeCase
from qlinear.onnx._node_case import run_qlinear

NAN, INF = np.float32(np.nan), np.float32(np.inf)


def q_case(x, scale, zp=None, opset=21, **attrs):
    return NodeCase("semantics", "QuantizeLinear", opset, [x, scale, zp], attrs)


def dq_case(x, scale, zp=None, opset=21, **attrs):
    return NodeCase("semantics", "DequantizeLinear", opset, [x, scale, zp], attrs)


def ort(case):
    try:
        return run_onnxruntime(case)[0]
    except Unsupported:
        pytest.skip("ONNX Runtime has no kernel for this case")


def test_one_element_scale_is_per_tensor():
    x = np.array([[1.0, 2.0, 3.0]], np.float32)
    y = qlinear.quantize_linear(x, np.array([0.5], np.float32), np.array([1], np.uint8), axis=1)
    assert y.tolist() == [[3, 5, 7]]
    assert qlinear.quantize_linear(x, np.float32(0.5), np.array([1], np.uint8)).tolist() == [[3, 5, 7]]
    case = q_case(x, np.array([0.5], np.float32), np.array([1], np.uint8))
    assert run_onnx_reference(case)[0].tolist() == [[3, 5, 7]]
    assert ort(case).tolist() == [[3, 5, 7]]


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_one_element_zero_point_any_rank(backend):
    x = np.zeros((1, 3), np.float32)
    for zp in (np.uint8(5), np.array([5], np.uint8), np.array([[[5]]], np.uint8)):
        y = qlinear.quantize_linear(x, np.ones((1, 1), np.float32), zp, axis=1, block_size=4, backend=backend)
        assert y.tolist() == [[5, 5, 5]]
        back = qlinear.dequantize_linear(y, np.full((1, 1), 2, np.float32), zp, axis=1, block_size=4, backend=backend)
        assert back.tolist() == [[0.0, 0.0, 0.0]]


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_block_size_beyond_the_axis(backend):
    # One block for the whole axis: every row takes its own scale, however long the block.
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    scale = np.array([[1.0], [2.0], [4.0], [0.5]], np.float32)
    for block_size in (3, 4, 2**26, 2**31, 2**62):
        y = qlinear.quantize_linear(x, scale, axis=1, block_size=block_size, backend=backend)
        assert y.tolist() == [[0, 1, 2], [2, 2, 2], [2, 2, 2], [18, 20, 22]]  # ties to even: 5/2 -> 2
        back = qlinear.dequantize_linear(y, scale, axis=1, block_size=block_size, backend=backend)
        assert back.tolist() == (y * scale).tolist()


def test_axis_ignored_for_per_tensor():
    x = np.array([1.0, 2.0], np.float32)
    assert qlinear.quantize_linear(x, np.float32(1), axis=5).tolist() == [1, 2]


@pytest.mark.parametrize(
    ("qtype", "zp"), [(np.int8, -3), (np.uint8, 7), (np.int16, 100), (ml_dtypes.int4, 2), (ml_dtypes.uint2, 1)]
)
def test_nan_to_integer_is_zero_point(qtype, zp):
    x = np.array([NAN, 1.0], np.float32)
    y = qlinear.quantize_linear(x, np.float32(1), np.array(zp, qtype), opset=25)
    assert int(y[0]) == zp and int(y[1]) == zp + 1
    ref = run_onnx_reference(q_case(x, np.float32(1), np.array(zp, qtype), opset=25))[0]
    assert int(ref[0]) != zp  # onnx.reference: NaN cast through int32


def test_nan_to_integer_onnxruntime_gives_qmin():
    x = np.array([NAN], np.float32)
    assert int(ort(q_case(x, np.float32(1), np.int8(5)))[0]) == -128
    assert int(qlinear.quantize_linear(x, np.float32(1), np.int8(5))[0]) == 5


@pytest.mark.parametrize("value", [np.inf, 3e38, 1e10, 2.0**31])
def test_infinity_and_huge_values_saturate(value):
    x = np.array([value, -value], np.float32)
    for qtype, (lo, hi) in [
        (np.int8, (-128, 127)),
        (np.uint8, (0, 255)),
        (np.int16, (-32768, 32767)),
        (ml_dtypes.int4, (-8, 7)),
        (ml_dtypes.uint2, (0, 3)),
    ]:
        y = qlinear.quantize_linear(x, np.float32(1), np.array(0, qtype), opset=25)
        assert [int(v) for v in y] == [hi, lo]
    ref = run_onnx_reference(q_case(x, np.float32(1), np.int8(0)))[0]
    assert ref.tolist() != [127, -128]  # wraps through int32


def test_onnxruntime_int2_positive_infinity_wraps():
    x = np.array([np.inf], np.float32)
    got = run_onnxruntime(q_case(x, np.float32(1), np.array(0, ml_dtypes.int2), opset=25))[0]
    assert int(got[0]) == -2
    assert int(qlinear.quantize_linear(x, np.float32(1), np.array(0, ml_dtypes.int2))[0]) == 1


@pytest.mark.parametrize("qtype", [ml_dtypes.float4_e2m1fn, ml_dtypes.float6_e2m3fn, ml_dtypes.float6_e3m2fn])
def test_nan_to_float4_and_float6_is_zero_point(qtype):
    x = np.array([NAN, -NAN], np.float32)
    y = qlinear.quantize_linear(x, np.float32(1), output_dtype=qtype)
    assert y.view(np.uint8).tolist() == [0, 0]  # +0: the default zero point
    y = qlinear.quantize_linear(x, np.float32(1), np.array(1.0, qtype))
    assert y.astype(np.float32).tolist() == [1.0, 1.0]
    ref = run_onnx_reference(q_case(x, np.float32(1), np.array(0, qtype), opset=28))[0]
    assert ref.view(np.uint8).tolist() != [0, 0]  # ml_dtypes gives a signed zero from the NaN's sign bit


@pytest.mark.parametrize("qtype", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float4_e2m1fn])
def test_float_zero_point_is_added(qtype):
    x = np.array([0.0, 1.0, -2.0], np.float32)
    zp = np.array(0.5, qtype)
    assert qlinear.quantize_linear(x, np.float32(1), zp).astype(np.float32).tolist() == [0.5, 1.5, -1.5]
    if qtype is not ml_dtypes.float4_e2m1fn:
        ref = run_onnx_reference(q_case(x, np.float32(1), zp))[0]
        assert ref.astype(np.float32).tolist() == [0.0, 1.0, -2.0]  # zero point ignored


def test_float8_minus_zero_with_zero_point():
    x = np.array([-0.0, -1e-30], np.float32)
    zp = np.array(0, ml_dtypes.float8_e4m3fn)
    y = qlinear.quantize_linear(x, np.float32(1), zp)
    # -0 + +0 = +0; -1e-30 + 0 is still -1e-30, which rounds to -0 in float8.
    assert y.view(np.uint8).tolist() == [0, 0x80]
    y = qlinear.quantize_linear(x, np.float32(1), output_dtype="float8e4m3fn")
    assert y.view(np.uint8).tolist() == [0x80, 0x80]  # no zero point: nothing added
    assert run_onnx_reference(q_case(x, np.float32(1), zp))[0].view(np.uint8).tolist() == [0x80, 0x80]
    assert ort(q_case(x, np.float32(1), zp)).view(np.uint8).tolist() == [0x80, 0x80]
    # ONNX's own float4 backend case expects -0 / 4 + 0 = +0.
    f4 = qlinear.quantize_linear(np.array([-0.0], np.float32), np.float32(4), np.array(0, ml_dtypes.float4_e2m1fn))
    assert f4.view(np.uint8).tolist() == [0]


def test_division_in_scale_precision():
    # 2.5004 rounds to 2.5 in float16, a tie that rounds to 2; in float32 it rounds to 3.
    x = np.array([2.5004, -0.5002], np.float32)
    y = qlinear.quantize_linear(x, np.float16(1), np.int8(0), opset=23)
    assert y.tolist() == [2, 0]
    assert qlinear.quantize_linear(x, np.float16(1), np.int8(0), precision="float", opset=23).tolist() == [3, -1]
    assert qlinear.quantize_linear(x, ml_dtypes.bfloat16(1), np.int8(0), opset=23).tolist() == [2, 0]
    assert run_onnx_reference(q_case(x, np.float16(1), np.int8(0), opset=23))[0].tolist() == [3, -1]


def test_onnxruntime_divides_float16_in_float32():
    # float16: 2.5 / 0.0999756 = 25.006 rounds to 25.0, a tie between float8 24 and 26 -> 24.
    x, scale, zp = np.array([2.5], np.float16), np.float16(0.1), np.array(0, ml_dtypes.float8_e4m3fn)
    assert qlinear.quantize_linear(x, scale, zp, opset=19).astype(np.float32).tolist() == [24.0]
    assert ort(q_case(x, scale, zp, opset=19)).astype(np.float32).tolist() == [26.0]


def test_int32_input_rounded_to_precision():
    # 25165823 rounds to 25165824 = 1.5 * 2**24 in float32: a tie, to even 2.
    x = np.array([25165823], np.int32)
    scale = np.float32(2**24)
    assert qlinear.quantize_linear(x, scale, np.int8(0), opset=13).tolist() == [2]
    assert run_onnx_reference(q_case(x, scale, np.int8(0), opset=13))[0].tolist() == [1]  # float64 division


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_int32_to_sixteen_bit_precision_rounds_once(backend):
    big = np.array([16842753, -16842753, 16809985, 2**31 - 1], np.int32)  # 2**24 + 2**16 + 1 and neighbours
    # bfloat16 keeps 8 significant bits: 2**24 + 2**16 + 1 is just above the
    # tie between 2**24 and 2**24 + 2**17, so it rounds up; 2**24 + 2**15 + 1
    # (16809985) is below the tie and rounds down; 2**31 - 1 rounds to 2**31.
    # Divided by 1024: 16512, -16512, 16384, 2097152 (saturated to 32767).
    y = qlinear.quantize_linear(big, ml_dtypes.bfloat16(1024), output_dtype="int16", backend=backend)
    assert y.tolist() == [16512, -16512, 16384, 32767]
    # An int32 scale rounded once: 16842753 -> 16908288; 1690828800 / 16908288 = 99.99 -> 100.
    x = np.full(3000, 1690828800.0, np.float32)
    y = qlinear.quantize_linear(x, np.int32(16842753), output_dtype="uint8", precision="bfloat16", backend=backend)
    assert set(y.tolist()) == {100}
    # float16: 2049 + 2**-20 is past the tie between 2048 and 2050, but float32 holds
    # it as 2049 exactly, a tie (to even: 2048); only int32 reaches float16 here,
    # and every int32 value a float16 can hold is exact in float32.
    y = qlinear.quantize_linear(np.array([2049, 2051, 70000], np.int32), np.float16(2), output_dtype="int16", backend=backend)
    assert y.tolist() == [1024, 1026, 32767]


def test_e8m0_scale_divides_in_float32():
    scale = np.array([2.0**-20, 2.0**20], np.float32).astype(ml_dtypes.float8_e8m0fnu)
    x = np.array([[3 * 2.0**-21, 5 * 2.0**19]], np.float32)
    assert qlinear.quantize_linear(x, scale, np.zeros(2, np.int8), axis=1).tolist() == [[2, 2]]  # 1.5 -> 2, 2.5 -> 2


def test_degenerate_scales():
    x = np.array([1.0, -1.0, 0.0], np.float32)
    with np.errstate(all="ignore"):
        assert qlinear.quantize_linear(x, np.float32(0), np.int8(3)).tolist() == [127, -128, 3]
        assert qlinear.quantize_linear(x, np.float32(np.nan), np.int8(3)).tolist() == [3, 3, 3]
        assert qlinear.quantize_linear(x, np.float32(np.inf), np.int8(3)).tolist() == [3, 3, 3]
        assert qlinear.quantize_linear(x, np.float32(-0.5), np.int8(0)).tolist() == [-2, 2, 0]
        assert qlinear.quantize_linear(x, np.float32(0), output_dtype="float8e4m3fn").astype(np.float32)[:2].tolist() == [
            448.0,
            -448.0,
        ]


def _bits(a):
    return np.asarray(a).view(np.dtype(f"u{np.asarray(a).dtype.itemsize}")).tolist()


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_two_nans_keep_the_first(backend):
    e4 = ml_dtypes.float8_e4m3fn
    pos_nan, neg_nan = np.array(0x7F, np.uint8).view(e4), np.array(0xFF, np.uint8).view(e4)
    n = 5000  # above the auto threshold, so the cpu backend's vector loops run too
    x = np.tile(np.array([np.nan, -np.nan, 1.0], np.float32), n)
    # QuantizeLinear: the quotient's NaN over the zero point's.
    for zp in (pos_nan, neg_nan):
        y = qlinear.quantize_linear(x, np.float32(1), zp, backend=backend)
        assert _bits(y[:3]) == [0x7F, 0xFF, 0xFF if zp is neg_nan else 0x7F]
        assert _bits(y) == _bits(np.tile(y[:3], n))
    # DequantizeLinear: x's NaN over the zero point's, the difference's over the scale's.
    codes = np.tile(np.array([0x7F, 0xFF, 0x38], np.uint8), n).view(e4)  # +NaN, -NaN, 1.0
    for zp, scale, want in (
        (neg_nan, np.float32(2), [0x7FC00000, 0xFFC00000, 0xFFC00000]),
        (pos_nan, -NAN, [0x7FC00000, 0xFFC00000, 0x7FC00000]),
        (e4(0), -NAN, [0x7FC00000, 0xFFC00000, 0xFFC00000]),
    ):
        y = qlinear.dequantize_linear(codes, scale, zp, backend=backend)
        assert _bits(y[:3]) == want
        assert _bits(y) == _bits(np.tile(y[:3], n))
    # fnuz types' one NaN (0x80) reads as -NaN, as ml_dtypes reads it, and wins over a NaN scale.
    fnuz = np.array([0x80], np.uint8).view(ml_dtypes.float8_e4m3fnuz)
    assert _bits(qlinear.dequantize_linear(fnuz, NAN, backend=backend)) == [0xFFC00000]


def test_int32_difference_is_exact():
    x = np.array([2**31 - 1, -(2**31)], np.int32)
    zp = np.int32(-(2**31))
    y = qlinear.dequantize_linear(x, np.float32(1), zp)
    assert y.tolist() == [float(np.float32(2.0**32 - 1)), 0.0]
    big = np.array([16777217], np.int32)
    assert qlinear.dequantize_linear(big, np.float32(1), np.int32(1)).tolist() == [16777216.0]
    ref = run_onnx_reference(dq_case(big, np.float32(1), np.int32(1)))[0]
    assert ref.tolist() == [16777215.0]  # 16777217 rounded to float32 first, then 1 subtracted
    assert ort(dq_case(x, np.float32(1), zp)).tolist() != y.tolist()  # int32 subtraction wraps


def test_sixteen_bit_output_rounds_float32_product():
    x = np.arange(-128, 128, dtype=np.int8)
    scale = np.float16(0.0999)
    y = qlinear.dequantize_linear(x, scale, np.int8(3))
    exact = ((x.astype(np.float64) - 3) * np.float64(scale)).astype(np.float16)  # one rounding of the exact product
    assert y.dtype == np.float16 and np.array_equal(y, exact)
    assert np.array_equal(run_onnx_reference(dq_case(x, scale, np.int8(3)))[0], y)


def test_e8m0_scale_default_output_is_float32():
    scale = np.array(0.25, np.float32).astype(ml_dtypes.float8_e8m0fnu)
    x = np.array([4, -8], np.int8)
    y = qlinear.dequantize_linear(x, scale)
    assert y.dtype == np.float32 and y.tolist() == [1.0, -2.0]
    assert run_onnx_reference(dq_case(x, scale, opset=24))[0].dtype == ml_dtypes.float8_e8m0fnu


def test_float_zero_point_is_subtracted():
    x = np.array([1.0, 0.5], np.float32).astype(ml_dtypes.float8_e4m3fn)
    zp = np.array(0.5, ml_dtypes.float8_e4m3fn)
    assert qlinear.dequantize_linear(x, np.float32(2), zp).tolist() == [1.0, 0.0]
    # onnx.reference checks the zero point after a cast to uint8: 0.5 passes as 0 and is ignored, 2.0 raises.
    assert run_onnx_reference(dq_case(x, np.float32(2), zp))[0].tolist() == [2.0, 1.0]
    with pytest.raises(ValueError, match="should be zero"):
        run_onnx_reference(dq_case(x, np.float32(2), np.array(2.0, ml_dtypes.float8_e4m3fn)))
    f4 = np.array([1.0], np.float32).astype(ml_dtypes.float4_e2m1fn)
    zp4 = np.array(0.5, ml_dtypes.float4_e2m1fn)
    assert qlinear.dequantize_linear(f4, np.float32(2), zp4, opset=23).tolist() == [1.0]
    assert run_onnx_reference(dq_case(f4, np.float32(2), zp4, opset=23))[0].tolist() == [2.0]  # zero point ignored


def test_dynamic_all_zero_and_empty():
    for x in (np.zeros(4, np.float32), np.zeros(0, np.float32)):
        y, scale, zp = qlinear.dynamic_quantize_linear(x)
        assert float(scale) == 1.0 and int(zp) == 0 and not y.any() and y.shape == x.shape
    case = NodeCase("zeros", "DynamicQuantizeLinear", 11, [np.zeros(4, np.float32)])
    assert float(run_onnx_reference(case)[1]) == pytest.approx(1 / 255)
    assert float(run_onnxruntime(case)[1]) == 1.0


def test_dynamic_scale_underflow():
    x = np.array([1e-45, 0.0], np.float32)
    y, scale, zp = qlinear.dynamic_quantize_linear(x)
    assert float(scale) == 0.0 and int(zp) == 0 and y.tolist() == [255, 0]
    assert int(run_onnx_reference(NodeCase("tiny", "DynamicQuantizeLinear", 11, [x]))[2]) == 255


def test_dynamic_scale_underflow_negative():
    # 0 - (-1e-45) / 0 is +inf, which saturates: zero point 255, as onnx.reference gives.
    x = np.array([-1e-45], np.float32)
    y, scale, zp = qlinear.dynamic_quantize_linear(x)
    assert float(scale) == 0.0 and int(zp) == 255 and y.tolist() == [0]
    ref = run_onnx_reference(NodeCase("tiny", "DynamicQuantizeLinear", 11, [x]))
    assert (float(ref[1]), int(ref[2]), ref[0].tolist()) == (0.0, 255, [0])


def test_dynamic_ignores_nan():
    x = np.array([np.nan, -1.0, 1.0], np.float32)
    y, scale, zp = qlinear.dynamic_quantize_linear(x)
    # scale = 2/255 in float32; 0 - (-1)/scale = 127.49999 rounds to 127.
    assert float(scale) == np.float32(2 / 255) and int(zp) == 127
    assert y.tolist() == [127, 0, 254]
    ref = run_onnx_reference(NodeCase("nan", "DynamicQuantizeLinear", 11, [x]))
    assert np.isnan(ref[1]) or ref[0].tolist() != [127, 0, 254]


def test_float8e4m3fn_overflow_is_nan():
    # saturate=0: quotients up to 464 round to 448 (464 is the tie, to even); beyond, NaN. ONNX Runtime 1.31
    # gives 448 for quotients in [480, 496) instead (docs/semantics.md).
    q = np.array([448.0, 460.0, 464.0, 465.0, 480.0, 490.0, 496.0, 600.0], np.float32)
    x = np.concatenate([q, -q]) * np.float32(2)
    case = NodeCase("over", "QuantizeLinear", 21, [x, np.float32(2), ml_dtypes.float8_e4m3fn(0)], {"saturate": 0})
    want = np.array([448, 448, 448] + [np.nan] * 5, np.float32)
    for backend in sorted(BACKENDS):
        got = run_qlinear(case, backend=backend)[0].astype(np.float32)
        np.testing.assert_array_equal(got, np.concatenate([want, -want]), err_msg=backend)
    np.testing.assert_array_equal(run_onnx_reference(case)[0].astype(np.float32), np.concatenate([want, -want]))


def test_python_numbers_take_the_default_types():
    x = np.array([0.0, 0.1, -0.2, 3.0], np.float32)
    # The same bits as the typed call the defaults stand for.
    want = qlinear.quantize_linear(x, np.float32(0.05), np.uint8(128))
    got = qlinear.quantize_linear(x, 0.05, 128)
    assert got.dtype == np.uint8 and np.array_equal(got, want)
    signed = qlinear.quantize_linear(x, 0.05, 0, output_dtype="int8")
    assert signed.dtype == np.int8 and np.array_equal(signed, qlinear.quantize_linear(x, np.float32(0.05), np.int8(0)))
    # A list x is float32; a scale beside a float16 x is float16 (opset 19 takes no other).
    assert np.array_equal(qlinear.quantize_linear([0.0, 0.1, -0.2, 3.0], 0.05), qlinear.quantize_linear(x, np.float32(0.05)))
    half = x.astype(np.float16)
    assert np.array_equal(
        qlinear.quantize_linear(half, 0.05, opset=19), qlinear.quantize_linear(half, np.float16(0.05), opset=19)
    )
    # Per-axis parameters as lists; DequantizeLinear's zero point takes x's type.
    w = np.array([[1.0, -1.0], [0.5, 2.0]], np.float32)
    q = qlinear.quantize_linear(w, [0.01, 0.02], [0, 0], axis=0, output_dtype="int8")
    assert np.array_equal(q, qlinear.quantize_linear(w, np.array([0.01, 0.02], np.float32), np.zeros(2, np.int8), axis=0))
    typed = qlinear.dynamic_quantize_linear(np.array([0.0, 0.5, 1.0], np.float32))
    got = qlinear.dynamic_quantize_linear([0.0, 0.5, 1.0])  # float32, its only type
    assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(got, typed, strict=True))
    back = qlinear.dequantize_linear(q, [0.01, 0.02], [0, 0], axis=0)
    assert back.dtype == np.float32
    assert np.array_equal(back, qlinear.dequantize_linear(q, np.array([0.01, 0.02], np.float32), np.zeros(2, np.int8), axis=0))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda x: qlinear.quantize_linear(x, 0.05, 300), r"y_zero_point must be in \[0, 255\] \(type uint8\), got 300"),
        (lambda x: qlinear.quantize_linear(x, 0.05, -9, output_dtype="int4"), r"y_zero_point must be in \[-8, 7\]"),
        (lambda x: qlinear.quantize_linear(x, 0.05, 1.5), r"y_zero_point must be integers \(it takes type uint8\)"),
        (lambda x: qlinear.quantize_linear(x, [[0.1], [0.1, 0.2]]), "y_scale must be a number or a rectangular list"),
        (lambda x: qlinear.quantize_linear(x, True), "y_scale must be a numpy array, got bool"),
        (lambda x: qlinear.dequantize_linear([1, 2], 0.05), "x must be a numpy array, got list"),
    ],
)
def test_python_values_out_of_their_type_are_refused(call, message):
    with pytest.raises(qlinear.QuantizationError, match=message):
        call(np.array([0.0, 0.1], np.float32))
