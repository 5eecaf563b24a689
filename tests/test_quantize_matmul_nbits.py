"""The MatMulNBits form: the QDQ form's blocked weight-only MatMuls as com.microsoft.MatMulNBits, computing the same bits."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import qlinear.quantize as qq
from qlinear._errors import QuantizationError
from qlinear.cli import main
from qlinear.dtypes import to_tensor_proto
from qlinear.quantize._session import session
from qlinear.quantize.targets._matmul_nbits import to_matmul_nbits


def _model(k: int, n: int, *, gemm: bool = False, shared: bool = False) -> onnx.ModelProto:
    """x @ w -> Relu (or a Gemm with a bias); ``shared``: w is also added to a constant, read as values."""
    rng = np.random.default_rng(k * n)
    w = rng.standard_normal((k, n)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")]
    if gemm:
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b"))
        nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="fc")]
    else:
        nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc")]
    nodes.append(helper.make_node("Relu", ["h"], ["y"], name="relu"))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])]
    if shared:
        nodes.append(helper.make_node("Transpose", ["w"], ["w_t"], name="wt"))
        nodes.append(helper.make_node("MatMul", ["h", "w_t"], ["z"], name="back"))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, ["M", k]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def _both(model: onnx.ModelProto, **options) -> tuple[qq.QuantizeResult, qq.QuantizeResult]:
    kw = dict(activations=None, granularity="blocked", **options)
    return qq.quantize_model(model, None, **kw), qq.quantize_model(model, None, format="matmulnbits", **kw)


def _outputs(model: onnx.ModelProto, k: int) -> list[np.ndarray]:
    x = np.random.default_rng(1).standard_normal((7, k)).astype(np.float32)
    return session(model).run(None, {"x": x})  # qlinear's session: a fused MatMulNBits at accuracy level 0


@pytest.mark.parametrize(
    ("weights", "k", "n", "block"),
    [("int4", 96, 40, 32), ("uint4", 100, 24, 16), ("int8", 64, 8, 32), ("uint8", 64, 12, 64), ("uint2", 128, 8, 32)],
)
def test_the_matmulnbits_form_computes_the_qdq_forms_bits(weights, k, n, block):
    qdq, nbits = _both(_model(k, n), weights=weights, block_size=block)
    ops = [node.op_type for node in nbits.model.graph.node]
    assert ops == ["MatMulNBits", "Relu"] and "DequantizeLinear" in [node.op_type for node in qdq.model.graph.node]
    node = nbits.model.graph.node[0]
    attrs = {a.name: a.i for a in node.attribute}
    assert node.domain == "com.microsoft" and attrs["K"] == k and attrs["N"] == n and attrs["block_size"] == block
    assert attrs["accuracy_level"] == 0  # its input stays float, as the QDQ model says
    for a, b in zip(_outputs(qdq.model, k), _outputs(nbits.model, k), strict=True):
        assert np.array_equal(a, b)
    row = next(r for r in nbits.report.nodes if r.name == "fc")
    assert nbits.report.settings.format == "matmulnbits" and row.runs_as == "MatMulNBits" and not nbits.report.fusion.unfused
    assert not any("qdq_matmulnbits_accuracy_level" in w for w in nbits.report.warnings)  # no session setting needed
    assert any("qdq_matmulnbits_accuracy_level" in w for w in qdq.report.warnings)


def test_a_gemm_takes_its_bias_and_a_weight_read_as_values_keeps_its_dequantize():
    qdq, nbits = _both(_model(64, 32, gemm=True), weights="int4")
    assert [node.op_type for node in nbits.model.graph.node] == ["MatMulNBits", "Relu"]
    assert list(nbits.model.graph.node[0].input)[5] == "b"
    assert np.array_equal(_outputs(qdq.model, 64)[0], _outputs(nbits.model, 64)[0])
    # A weight the quantizer shares with a float reader is stored for each: its quantized reader still converts.
    qdq, nbits = _both(_model(64, 32, shared=True), weights="int4", exclude=("back",))
    assert [node.op_type for node in nbits.model.graph.node] == ["MatMulNBits", "Relu", "Transpose", "MatMul"]
    assert all(np.array_equal(a, b) for a, b in zip(_outputs(qdq.model, 64), _outputs(nbits.model, 64), strict=True))


def test_a_dequantized_weight_read_as_values_keeps_its_dequantize():
    codes = np.random.default_rng(0).integers(-8, 8, (64, 16)).astype(ml_dtypes.int4)
    graph = helper.make_graph(
        [
            helper.make_node("DequantizeLinear", ["w_q", "w_scale"], ["w"], name="w_dq", axis=0, block_size=32),
            helper.make_node("MatMul", ["x", "w"], ["y"], name="fc"),
            helper.make_node("Transpose", ["w"], ["w_t"], name="wt"),
        ],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", 16]),
         helper.make_tensor_value_info("w_t", TensorProto.FLOAT, [16, 64])],
        [to_tensor_proto(codes, "w_q"), numpy_helper.from_array(np.full((2, 16), 0.1, np.float32), "w_scale")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    before = model.SerializeToString()
    assert to_matmul_nbits(model) == 0 and model.SerializeToString() == before


def test_blocks_matmulnbits_cannot_take_stay_qdq():
    _, nbits = _both(_model(64, 16), weights="int4", block_size=8)  # MatMulNBits takes powers of two from 16
    assert [node.op_type for node in nbits.model.graph.node][:2] == ["DequantizeLinear", "MatMul"]


def test_the_form_is_checked_and_the_command_line_writes_it(tmp_path, capsys):
    with pytest.raises(QuantizationError, match="format must be 'qdq' or a form target 'ort-cpu' reads"):
        qq.QuantizeOptions(format="tflite")
    path = tmp_path / "m.onnx"
    onnx.save(_model(64, 16), path)
    out = tmp_path / "q.onnx"
    args = ["--weights", "int4", "--activations", "none", "--granularity", "blocked", "--format", "matmulnbits"]
    assert main(["quantize", str(path), "-o", str(out), *args]) == 0
    assert "form matmulnbits" in capsys.readouterr().out
    assert onnx.load(out).graph.node[0].op_type == "MatMulNBits"


@pytest.mark.parametrize(
    ("weights", "k", "block", "gemm"),
    [("int4", 96, 32, False), ("uint4", 100, 16, False), ("int8", 64, 64, False), ("int4", 64, 32, True)],
)
def test_streamed_weights_write_the_same_matmulnbits_form(tmp_path, weights, k, block, gemm):
    path = tmp_path / "m.onnx"
    onnx.save(_model(k, 24, gemm=gemm), path, save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    options = dict(weights=weights, activations=None, granularity="blocked", block_size=block, format="matmulnbits")
    qq.quantize_weights_streaming(path, tmp_path / "s.onnx", qq.QuantizeOptions(**options))
    streamed = onnx.load(tmp_path / "s.onnx")
    in_memory = qq.quantize_model(path, None, **options).model
    assert [n.op_type for n in streamed.graph.node] == ["MatMulNBits", "Relu"]
    stored = {t.name: numpy_helper.to_array(t) for t in streamed.graph.initializer}
    expected = {t.name: numpy_helper.to_array(t) for t in in_memory.graph.initializer}
    assert stored.keys() == expected.keys() and "w_nbits" in stored  # packed as the in-memory form, byte for byte
    assert all(np.array_equal(stored[name], expected[name]) for name in stored)
    assert all(np.array_equal(a, b) for a, b in zip(_outputs(streamed, k), _outputs(in_memory, k), strict=True))


def test_a_weight_two_matmuls_share_is_packed_once(tmp_path):
    rng = np.random.default_rng(5)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["a"], name="left"), helper.make_node("MatMul", ["z", "w"], ["b"], name="right")],
        "tied", [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["M", 64]) for n in ("x", "z")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["M", 32]) for n in ("a", "b")],
        [numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "w")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    qdq, nbits = _both(model, weights="int4")
    assert [n.op_type for n in nbits.model.graph.node] == ["MatMulNBits", "MatMulNBits"]
    packed = [t.name for t in nbits.model.graph.initializer if "_nbits" in t.name]
    assert sorted(packed) == ["w_nbits", "w_nbits_scale", "w_nbits_zp"]  # one copy for both readers
    feeds = {n: rng.standard_normal((3, 64)).astype(np.float32) for n in ("x", "z")}
    for a, b in zip(session(qdq.model).run(None, feeds), session(nbits.model).run(None, feeds), strict=True):
        assert np.array_equal(a, b)
