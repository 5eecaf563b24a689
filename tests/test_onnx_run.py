"""qlinear.onnx.run on a real QDQ model: a small CNN built with Graph, quantized by ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import qlinear
from qlinear import QuantizationError
from qlinear.onnx import Graph, load, run
from qlinear.onnx._analysis import analyse
from qlinear.onnx._inspect import inspect_model

quantization = pytest.importorskip("onnxruntime.quantization")

BATCH_SHAPE = (4, 3, 16, 16)


def _float_cnn() -> onnx.ModelProto:
    rng = np.random.default_rng(7)

    def weights(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    g = Graph("cnn", opset=21)
    x = g.input("input", "float", ("N", 3, 16, 16))
    for i, (cin, cout) in enumerate([(3, 8), (8, 16)]):
        x = g.op("Conv", [x, weights(cout, cin, 3, 3), weights(cout)], pads=[1, 1, 1, 1], name=f"conv{i}")
        x = g.op("MaxPool", [g.op("Relu", [x], name=f"relu{i}")], kernel_shape=[2, 2], strides=[2, 2], name=f"pool{i}")
    x = g.op("Flatten", [x], name="flatten")
    g.output(g.op("Gemm", [x, weights(10, 16 * 4 * 4), weights(10)], transB=1, name="fc", output_names=["logits"]))
    return g.to_model()


class _Batches(quantization.CalibrationDataReader):
    def __init__(self, seed: int, count: int) -> None:
        rng = np.random.default_rng(seed)
        self._batches = iter([{"input": rng.standard_normal(BATCH_SHAPE).astype(np.float32)} for _ in range(count)])

    def get_next(self):
        return next(self._batches, None)


def _expose_qdq_tensors(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[tuple[str, str]]]:
    """``model`` with each QuantizeLinear's input and output made graph outputs; returns the (input, output) pairs."""
    tensors = analyse(model).tensors
    pairs = [(n.input[0], n.output[0]) for n in model.graph.node if n.op_type == "QuantizeLinear"]
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    have = {o.name for o in model.graph.output}
    for name in dict.fromkeys(n for pair in pairs for n in pair):
        if name not in have:
            exposed.graph.output.append(helper.make_value_info(name, tensors[name].type_proto()))
    return exposed, pairs


@pytest.fixture(scope="module")
def qdq_cnn(tmp_path_factory) -> onnx.ModelProto:
    folder = tmp_path_factory.mktemp("cnn")
    qlinear.onnx.save(_float_cnn(), folder / "float.onnx")
    quantization.quantize_static(
        str(folder / "float.onnx"),
        str(folder / "qdq.onnx"),
        _Batches(seed=1, count=3),
        quant_format=quantization.QuantFormat.QDQ,
        per_channel=True,
        activation_type=quantization.QuantType.QUInt8,
        weight_type=quantization.QuantType.QInt8,
    )
    return load(folder / "qdq.onnx")


def test_qdq_cnn_is_what_quantize_static_writes(qdq_cnn):
    ops = [n.op_type for n in qdq_cnn.graph.node]
    assert ops.count("QuantizeLinear") >= 4 and ops.count("DequantizeLinear") >= 8
    per_channel = [r for r in inspect_model(qdq_cnn).qdq_nodes if r.granularity == "per_axis"]
    # Per-channel int8 weights, and int32 biases quantized with the weights' scales.
    assert {r.quantized_type for r in per_channel} == {"int8", "int32"} and len(per_channel) >= 4


def test_qdq_cnn_qlinear_matches_onnxruntime(qdq_cnn):
    model, pairs = _expose_qdq_tensors(qdq_cnn)
    feeds = {"input": np.random.default_rng(2).standard_normal(BATCH_SHAPE).astype(np.float32)}
    ours = run(model, feeds, backend="qlinear")
    theirs = run(model, feeds, backend="onnxruntime")
    # The float ops differ by rounding only (numpy against MLAS kernels).
    np.testing.assert_allclose(ours["logits"], theirs["logits"], rtol=1e-4, atol=1e-5)
    by_node = {n.output[0]: n for n in model.graph.node if n.op_type == "QuantizeLinear"}
    for x_name, y_name in pairs:
        node = by_node[y_name]
        scale, zp = (qlinear.from_tensor_proto(next(t for t in model.graph.initializer if t.name == n)) for n in node.input[1:3])
        # Given ONNX Runtime's own float input, qlinear's QuantizeLinear gives its output bit for bit ...
        assert qlinear.quantize_linear(theirs[x_name], scale, zp).tobytes() == theirs[y_name].tobytes()
        # ... and the whole qlinear run agrees wherever the float inputs agree.
        same_input = ours[x_name] == theirs[x_name]
        assert np.array_equal(ours[y_name][same_input], theirs[y_name][same_input])
        assert np.abs(ours[y_name].astype(int) - theirs[y_name].astype(int)).max() <= 1


def test_run_rejects_unknown_backend_and_outputs():
    g = Graph(opset=21)
    g.output(g.op("Relu", [g.input("x", "float", (2,))], output_names=["y"]))
    with pytest.raises(QuantizationError, match=r"backend must be one of qlinear, onnxruntime, onnxruntime\+qlinear, reference"):
        run(g.to_model(), {"x": np.ones(2, np.float32)}, backend="tvm")
    with pytest.raises(QuantizationError, match="output_names must be graph outputs"):
        run(g.to_model(), {"x": np.ones(2, np.float32)}, output_names=["nope"])


def test_run_opset_28_float6_on_qlinear_backend():
    x = np.array([[0.3, -7.0, 2.6, 30.0]], np.float32)
    g = Graph(opset=28)
    q = g.quantize_linear(g.input("x", "float", (1, 4)), np.float32(1), output_dtype="float6e3m2", output_names=["y"])
    g.output(q)
    g.output(g.dequantize_linear(q, np.float32(1), output_names=["z"]))
    got = run(g.to_model(), {"x": x})
    want = qlinear.quantize_linear(x, np.float32(1), output_dtype="float6e3m2", opset=28)
    assert got["y"].tobytes() == want.tobytes() and got["y"].dtype == want.dtype
    assert got["z"].tolist() == qlinear.dequantize_linear(want, np.float32(1), opset=28).tolist()
