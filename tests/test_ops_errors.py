"""Bad input: one test per class, each naming argument, expectation and what was given."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import qlinear
from qlinear import QuantizationError, dequantize_linear, dynamic_quantize_linear, quantize_linear

X = np.arange(8, dtype=np.float32).reshape(2, 4)


def test_quantization_error_is_value_error():
    assert issubclass(QuantizationError, ValueError)


def test_scale_shape_that_fits_no_granularity():
    with pytest.raises(
        QuantizationError,
        match=r"quantize_linear: y_scale has shape \(3,\), expected \(\) or \(4,\) for axis=1 of x with shape \(2, 4\)",
    ):
        quantize_linear(X, np.ones(3, np.float32), np.zeros(3, np.uint8))
    with pytest.raises(QuantizationError, match=r"x_scale has shape \(2, 3\), expected \(2, 2\) for block_size=2"):
        dequantize_linear(np.zeros((2, 4), np.int8), np.ones((2, 3), np.float32), axis=1, block_size=2)
    with pytest.raises(QuantizationError, match="set block_size"):
        quantize_linear(X, np.ones((2, 2), np.float32))


def test_zero_point_shape_differs_from_scale():
    with pytest.raises(QuantizationError, match=r"y_zero_point has shape \(2,\), expected \(4,\), the shape of y_scale"):
        quantize_linear(X, np.ones(4, np.float32), np.zeros(2, np.uint8))


def test_zero_point_type_disagrees_with_output_dtype():
    with pytest.raises(QuantizationError, match="y_zero_point has type int8, expected uint8 to match output_dtype"):
        quantize_linear(X, np.float32(1), np.int8(0), output_dtype="uint8")
    with pytest.raises(QuantizationError, match="x_zero_point has type uint8, expected int8 \\(the type of x\\)"):
        dequantize_linear(np.zeros(4, np.int8), np.float32(1), np.uint8(0))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: quantize_linear(X, np.float32(1), output_dtype="int4", opset=19),
            "output_dtype is not an attribute of QuantizeLinear version 19",
        ),
        (
            lambda: quantize_linear(X, np.float32(1), np.zeros((), ml_dtypes.int4), opset=19),
            "y_zero_point has type int4, expected one of",
        ),
        (lambda: quantize_linear(X, np.float32(1), np.zeros((), ml_dtypes.int2), opset=24), "y_zero_point has type int2"),
        (
            lambda: quantize_linear(X, np.float32(1), np.zeros((), ml_dtypes.float6_e2m3fn), opset=25),
            "y_zero_point has type float6_e2m3fn",
        ),
        (
            lambda: quantize_linear(X, np.ones((2, 2), np.float32), axis=1, block_size=2, opset=19),
            "block_size is not an attribute of QuantizeLinear version 19",
        ),
        (
            lambda: quantize_linear(X, np.float32(1), precision="float16", opset=21),
            "precision is not an attribute of QuantizeLinear version 21",
        ),
        (
            lambda: quantize_linear(X, np.float32(1), saturate=False, opset=13),
            "saturate is not an attribute of QuantizeLinear version 13",
        ),
        (lambda: quantize_linear(X, np.ones(4, np.float32), opset=10), "y_scale must be a scalar for QuantizeLinear version 10"),
        (
            lambda: quantize_linear(X.astype(np.float16), np.float16(1), opset=13),
            "x has type float16, expected one of float, int32",
        ),
        (lambda: quantize_linear(X, np.float32(1).astype(ml_dtypes.float8_e8m0fnu), opset=23), "y_scale has type float8_e8m0fnu"),
        (lambda: dequantize_linear(np.zeros(4, ml_dtypes.float8_e4m3fn), np.float32(1), opset=13), "x has type float8_e4m3fn"),
        (
            lambda: dequantize_linear(np.zeros(4, np.int8), np.float32(1), output_dtype="float16", opset=21),
            "output_dtype is not an attribute of DequantizeLinear version 21",
        ),
        (
            lambda: quantize_linear(X, np.float32(1), np.zeros((), ml_dtypes.float8_e4m3fn), domain="com.microsoft"),
            "y_zero_point has type float8_e4m3fn",
        ),
        (lambda: quantize_linear(X, np.float32(1), domain="ai.onnx.ml"), "domain must be one of"),
    ],
)
def test_type_or_attribute_not_allowed_in_version(call, message):
    with pytest.raises(QuantizationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_axis_out_of_range():
    with pytest.raises(QuantizationError, match=r"axis must be in \[-2, 1\] for x with shape \(2, 4\), got axis=2"):
        quantize_linear(X, np.ones(4, np.float32), axis=2)
    with pytest.raises(QuantizationError, match="axis must be an int"):
        quantize_linear(X, np.ones(4, np.float32), axis=1.0)


def test_block_size_out_of_range():
    # 4 elements in 2 blocks: block_size must be 2 or 3.
    with pytest.raises(
        QuantizationError,
        match=r"y_scale has shape \(2, 2\), expected \(2, 1\) for block_size=4 on axis=1 of x with shape \(2, 4\); block_size in \[2, 3\] fits this y_scale",
    ):
        quantize_linear(X, np.ones((2, 2), np.float32), axis=1, block_size=4)
    with pytest.raises(QuantizationError, match="block_size must be >= 0"):
        quantize_linear(X, np.ones((2, 2), np.float32), axis=1, block_size=-1)


def test_scale_of_the_wrong_type():
    with pytest.raises(QuantizationError, match="y_scale has type float64, expected one of"):
        quantize_linear(X, np.float64(1))
    with pytest.raises(
        QuantizationError, match=r"y_scale has type float16, expected float \(the type of x\) for QuantizeLinear version 21"
    ):
        quantize_linear(X, np.float16(1), opset=21)
    with pytest.raises(QuantizationError, match="x_scale has type int32"):
        dequantize_linear(np.zeros(4, np.int8), np.int32(1))


@pytest.mark.parametrize("bad", [None, "x", {"x": 1.0}])
def test_non_array_input(bad):
    # Python numbers and lists are taken (docs/semantics.md); other values are not arrays.
    with pytest.raises(QuantizationError, match="x must be a numpy array"):
        quantize_linear(bad, np.float32(1))
    with pytest.raises(QuantizationError, match="x must be a numpy array"):
        dequantize_linear(bad, np.float32(1))
    with pytest.raises(QuantizationError, match="x must be a numpy array"):
        dynamic_quantize_linear(bad)
    with pytest.raises(QuantizationError, match="y_scale must be a numpy array"):
        quantize_linear(X, bad)


def test_input_type_outside_every_version():
    with pytest.raises(QuantizationError, match="x has type float64"):
        quantize_linear(X.astype(np.float64), np.float32(1))
    with pytest.raises(QuantizationError, match="dynamic_quantize_linear: x has type float16, expected float32"):
        dynamic_quantize_linear(X.astype(np.float16))


def test_unknown_output_dtype_and_precision():
    with pytest.raises(QuantizationError, match="output_dtype: expected one of"):
        quantize_linear(X, np.float32(1), output_dtype="int3")
    with pytest.raises(QuantizationError, match="precision must be one of bfloat16, float, float16, got int8"):
        quantize_linear(X, np.float32(1), precision="int8")


def test_opset_out_of_range():
    with pytest.raises(QuantizationError, match="opset must be at most 28"):
        quantize_linear(X, np.float32(1), opset=29)
    with pytest.raises(QuantizationError, match="DequantizeLinear exists from opset 10"):
        dequantize_linear(np.zeros(2, np.uint8), np.float32(1), opset=9)


def test_unknown_backend():
    with pytest.raises(QuantizationError, match="backend must be one of"):
        quantize_linear(X, np.float32(1), backend="gpu-magic")


def test_nothing_half_done_on_error():
    x = X.copy()
    with pytest.raises(QuantizationError):
        quantize_linear(x, np.ones(3, np.float32))
    assert np.array_equal(x, X)
    assert qlinear.quantize_linear(x, np.float32(1)).dtype == np.uint8
