"""Bad graphs and models: every class of mistake raises QuantizationError naming the node."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import qlinear
from qlinear import QuantizationError, to_tensor_proto
from qlinear.onnx import Graph, load, run, save


def _raw_model(nodes, inputs, outputs, initializers, opset=21):
    """A model straight from onnx.helper, unchecked, as another tool could write it."""
    graph = helper.make_graph(nodes, "bad", inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _x(shape=(2, 4)):
    return helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)


def _y():
    return helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)


def _feeds(shape=(2, 4)):
    return {"x": np.ones(shape, np.float32)}


# -- an attribute the opset does not allow ------------------------------------------------------


def test_graph_attribute_not_in_opset_has_the_function_message():
    x = np.ones((2, 4), np.float32)
    scale = np.ones((2, 2), np.float32)
    with pytest.raises(QuantizationError) as function_error:
        qlinear.quantize_linear(x, scale, axis=1, block_size=2, opset=19)
    g = Graph(opset=19)
    with pytest.raises(QuantizationError) as graph_error:
        g.quantize_linear(g.input("x", "float", (2, 4)), scale, axis=1, block_size=2, name="q_blocked")
    assert str(graph_error.value) == f"node 'q_blocked': {function_error.value}"
    assert "block_size is not an attribute of QuantizeLinear version 19" in str(graph_error.value)
    # Nothing of the refused node stays behind, not even its scale initializer.
    with pytest.raises(QuantizationError, match="no tensor named 'q_blocked_input1'"):
        g.info("q_blocked_input1")


def test_run_model_with_attribute_not_in_opset_names_the_node():
    node = helper.make_node("QuantizeLinear", ["x", "s"], ["y"], name="q_prec", precision=TensorProto.FLOAT)
    model = _raw_model([node], [_x()], [_y()], [to_tensor_proto(np.array(1, np.float32), "s")], opset=21)
    for backend in ("qlinear", "onnxruntime", "reference"):
        with pytest.raises(
            QuantizationError, match=r"node 'q_prec': quantize_linear: precision is not an attribute of QuantizeLinear version 21"
        ):
            run(model, _feeds(), backend=backend)


# -- scale / zero-point shapes that fit no granularity -------------------------------------------


def test_graph_scale_shape_fitting_no_granularity_names_the_node():
    g = Graph(opset=21)
    with pytest.raises(
        QuantizationError, match=r"node 'dq': dequantize_linear: x_scale has shape \(3,\), expected \(\) or \(4,\) for axis=1"
    ):
        g.dequantize_linear(np.zeros((2, 4), np.int8), np.ones(3, np.float32), name="dq")


def test_run_zero_point_shape_mismatch_names_the_node():
    node = helper.make_node("DequantizeLinear", ["w", "s", "z"], ["y"], name="dq_w", axis=0)
    inits = [
        to_tensor_proto(np.zeros((2, 4), np.int8), "w"),
        to_tensor_proto(np.ones(2, np.float32), "s"),
        to_tensor_proto(np.zeros(3, np.int8), "z"),
    ]
    model = _raw_model([node], [], [_y()], inits)
    with pytest.raises(
        QuantizationError, match=r"node 'dq_w': dequantize_linear: x_zero_point has shape \(3,\), expected \(2,\)"
    ):
        run(model, {})


# -- a missing input -------------------------------------------------------------------------------


def test_graph_missing_input_names_the_node():
    g = Graph(opset=21)
    with pytest.raises(
        QuantizationError, match=r"node 'relu': input 'nowhere' is no graph input, initializer or output of an earlier node"
    ):
        g.op("Relu", ["nowhere"], name="relu")
    with pytest.raises(QuantizationError, match=r"node 'q': input 'nowhere'"):
        g.quantize_linear("nowhere", np.float32(1), name="q")


def test_run_missing_input_names_the_node():
    node = helper.make_node("DequantizeLinear", ["ghost", "s"], ["y"], name="dq_ghost")
    model = _raw_model([node], [], [_y()], [to_tensor_proto(np.array(1, np.float32), "s")])
    with pytest.raises(QuantizationError, match=r"node 'dq_ghost' \(DequantizeLinear\): input 'ghost' is no graph input"):
        run(model, {})


def test_run_missing_feed_is_named():
    g = Graph(opset=21)
    g.output(g.op("Relu", [g.input("x", "float", (2,))]))
    with pytest.raises(QuantizationError, match="missing x"):
        run(g.to_model(), {})


# -- a type mismatch -------------------------------------------------------------------------------


def test_graph_zero_point_type_mismatch_has_the_function_message():
    g = Graph(opset=21)
    with pytest.raises(
        QuantizationError, match=r"node 'dq': dequantize_linear: x_zero_point has type uint8, expected int8 \(the type of x\)"
    ):
        g.dequantize_linear(np.zeros(4, np.int8), np.float32(1), np.uint8(0), name="dq")


def test_graph_schema_type_mismatch_names_the_node():
    g = Graph(opset=21)
    q = g.quantize_linear(g.input("x", "float", (1, 1, 4, 4)), np.float32(1), np.int8(0))
    with pytest.raises(QuantizationError, match=r"node 'conv' \(Conv\): .*int8"):
        g.op("Conv", [q, np.ones((1, 1, 1, 1), np.float32)], name="conv")


def test_graph_unknown_operator_or_attribute_names_the_node():
    g = Graph(opset=21)
    x = g.input("x", "float", (2,))
    with pytest.raises(QuantizationError, match=r"node 'f' \(Frobnicate\): onnx has no operator 'Frobnicate'"):
        g.op("Frobnicate", [x], name="f")
    with pytest.raises(QuantizationError, match=r"node 'r' \(Relu\): alpha is not an attribute of Relu"):
        g.op("Relu", [x], name="r", alpha=0.1)


def test_run_type_mismatch_names_the_node():
    node = helper.make_node("QuantizeLinear", ["x", "s"], ["y"], name="q_int_scale")
    model = _raw_model([node], [_x()], [_y()], [to_tensor_proto(np.array(1, np.float16), "s")], opset=21)
    with pytest.raises(
        QuantizationError,
        match=r"node 'q_int_scale': quantize_linear: y_scale has type float16, expected float \(the type of x\)",
    ):
        run(model, _feeds())


# -- truncated or corrupt files ------------------------------------------------------------------


def _saved(tmp_path, threshold):
    g = Graph(opset=21)
    g.output(g.dequantize_linear(np.arange(4096, dtype=np.int16).reshape(64, 64), np.float32(0.5), name="dq"))
    path = tmp_path / "m.onnx"
    save(g.to_model(), path, external_threshold=threshold)
    return path


@pytest.mark.parametrize("keep", [0.5, 0.9, 0.999])
def test_load_truncated_file_says_so_in_one_line(tmp_path, keep):
    path = _saved(tmp_path, threshold=1 << 30)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(QuantizationError, match="truncated or corrupt") as e:
        load(path)
    assert "\n" not in str(e.value)


def test_load_corrupt_file_says_so(tmp_path):
    path = tmp_path / "junk.onnx"
    path.write_bytes(b"\xff" * 100)
    with pytest.raises(QuantizationError, match="truncated or corrupt"):
        load(path)


def test_load_truncated_external_data_names_file_and_tensor(tmp_path):
    path = _saved(tmp_path, threshold=1024)
    data_file = tmp_path / "m.onnx.data"
    data_file.write_bytes(data_file.read_bytes()[:1000])
    with pytest.raises(
        QuantizationError, match=r"external data file 'm.onnx.data' is truncated: tensor 'dq_input0' needs bytes \[0, 8192\)"
    ):
        load(path)


def test_load_external_data_outside_the_folder_is_refused(tmp_path):
    path = _saved(tmp_path, threshold=1024)
    model = onnx.load(path, load_external_data=False)
    model.graph.initializer[0].external_data[0].value = "../elsewhere.data"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(QuantizationError, match="outside the model's folder"):
        load(path)
