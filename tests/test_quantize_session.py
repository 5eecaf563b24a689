"""The ONNX Runtime sessions the quantizer evaluates with run the QDQ model as written."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import qlinear
from qlinear.quantize._calibrate import session

ort = pytest.importorskip("onnxruntime")


def _int4_weight_matmul(rng: np.random.Generator) -> onnx.ModelProto:
    """``x @ DequantizeLinear(w)``: int4 weights in blocks of 32 along K, as the quantizer writes weight-only MatMuls."""
    k, n, block = 256, 64, 32
    w = rng.standard_normal((k, n)).astype(np.float32)
    scale = (np.abs(w.reshape(k // block, block, n)).max(axis=1) / 7).astype(np.float32)
    codes = qlinear.quantize_linear(w, scale, axis=0, block_size=block, output_dtype="int4")
    inits = [
        helper.make_tensor("w_q", TensorProto.INT4, codes.shape, codes.astype(np.int8).ravel().tolist()),
        helper.make_tensor("w_scale", TensorProto.FLOAT, scale.shape, scale.ravel().tolist()),
        helper.make_tensor("w_zp", TensorProto.INT4, scale.shape, [0] * scale.size),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zp"], ["w"], axis=0, block_size=block),
        helper.make_node("MatMul", ["x", "w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "w4",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_fused_int4_matmuls_keep_their_input_in_float(tmp_path):
    # ONNX Runtime fuses DequantizeLinear + MatMul into MatMulNBits; at its default accuracy level it would
    # quantize x to int8 first (errors of about 1e-2 here), which the QDQ model does not say.
    rng = np.random.default_rng(0)
    model = _int4_weight_matmul(rng)
    x = rng.standard_normal((16, 256)).astype(np.float32)
    exact = session(model, optimize=False).run(None, {"x": x})[0]
    optimized = tmp_path / "optimized.onnx"
    fused = session(model, optimized_path=str(optimized)).run(None, {"x": x})[0]
    assert "MatMulNBits" in {n.op_type for n in onnx.load(optimized).graph.node}  # the fusion this is about happened
    np.testing.assert_allclose(fused, exact, rtol=0, atol=1e-4 * float(np.abs(exact).max()))


def test_report_says_how_to_run_fused_int4_matmuls_as_measured(tmp_path):
    import qlinear.quantize as qq

    rng = np.random.default_rng(1)
    w = onnx.numpy_helper.from_array(rng.standard_normal((256, 64)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 64])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    data = {"x": rng.standard_normal((64, 256)).astype(np.float32)}
    report = qq.quantize_model(model, tmp_path / "q.onnx", data, weights="int4", granularity="blocked", activations=None).report
    assert report["nodes"][0]["runs_as"] == "MatMulNBits"
    assert any("qdq_matmulnbits_accuracy_level" in w and "MatMulNBits" in w for w in report["warnings"]), report["warnings"]
