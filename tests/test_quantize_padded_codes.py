"""A Pad between a DequantizeLinear and a QuantizeLinear of one scale and zero point pads the codes, bit for bit."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qlinear.quantize._padded_codes import pad_codes
from qlinear.quantize._session import session

_SCALE, _ZERO_POINT = 0.05, 100


def _padded(mode: str, fill: float | None, *, out_scale: float = _SCALE, dtype=np.uint8, opset: int = 17) -> onnx.ModelProto:
    """x -> Q -> DQ -> Pad -> Q (scale ``out_scale``) -> DQ -> y, the Pad by 1 and 2 on the last two axes."""
    zp = np.array(_ZERO_POINT if dtype == np.uint8 else -20, dtype)
    inits = [
        numpy_helper.from_array(np.array(_SCALE, np.float32), "s"),
        numpy_helper.from_array(np.array(out_scale, np.float32), "s_out"),
        numpy_helper.from_array(zp, "z"),
        numpy_helper.from_array(zp.copy(), "z_out"),
        numpy_helper.from_array(np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64), "pads"),
    ]
    pad_inputs = ["xd", "pads"]
    if fill is not None:
        inits.append(numpy_helper.from_array(np.array(fill, np.float32), "fill"))
        pad_inputs.append("fill")
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q_in"),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq_in"),
        helper.make_node("Pad", pad_inputs, ["p"], name="pad", mode=mode),
        helper.make_node("QuantizeLinear", ["p", "s_out", "z_out"], ["pq"], name="q_out"),
        helper.make_node("DequantizeLinear", ["pq", "s_out", "z_out"], ["y"], name="dq_out"),
    ]
    graph = helper.make_graph(
        nodes, "padded", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 8, 9])], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _values() -> np.ndarray:
    return np.random.default_rng(0).uniform(-6, 9, (2, 3, 5, 6)).astype(np.float32)


def _y(model: onnx.ModelProto) -> np.ndarray:
    return session(model).run(None, {"x": _values()})[0]


@pytest.mark.parametrize(
    ("mode", "fill", "dtype"),
    [
        ("constant", 0.8, np.uint8),
        ("constant", 0.0123, np.uint8),  # between two codes: rounds as the QuantizeLinear rounds it
        ("constant", -40.0, np.uint8),  # below the range: saturates as the QuantizeLinear saturates it
        ("constant", None, np.uint8),  # no value: zeros
        ("constant", 1.3, np.int8),
        ("reflect", None, np.uint8),
        ("edge", None, np.int8),
    ],
)
def test_the_codes_padded_give_the_same_values_bit_for_bit(mode, fill, dtype):
    model = _padded(mode, fill, dtype=dtype)
    want = _y(model)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert pad_codes(rewritten) == ["pad_codes"]
    onnx.checker.check_model(rewritten)
    ops = [n.op_type for n in rewritten.graph.node]
    assert ops == ["QuantizeLinear", "Pad", "DequantizeLinear"]
    np.testing.assert_array_equal(_y(rewritten), want)


def test_a_pad_between_different_parameters_is_left():
    model = _padded("constant", 0.5, out_scale=0.1)
    before = model.SerializeToString()
    assert pad_codes(model) == []
    assert model.SerializeToString() == before
