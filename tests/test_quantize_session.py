"""The ONNX Runtime sessions the quantizer evaluates with run the QDQ model as written."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import qlinear.quantize as qq
from qlinear.quantize._session import session
from quantize_models import single_op

pytest.importorskip("onnxruntime")


def _int4_weight_only(tmp_path) -> tuple[onnx.ModelProto, dict, np.ndarray]:
    """A MatMul quantized with int4 weights in blocks of 32 along K and float activations, its report and its data.

    No search, so no runtime setting is tried by speed: the model runs at level 0 (see test_quantize_run_settings).
    """
    model, data = single_op("MatMul", opset=21)
    out = tmp_path / "q.onnx"
    report = qq.quantize_model(model, out, data, weights="int4", granularity="blocked", activations=None, promote=False).report
    return onnx.load(out), report, data["x"]


def test_fused_int4_matmuls_keep_their_input_in_float(tmp_path):
    # ONNX Runtime fuses DequantizeLinear + MatMul into MatMulNBits; at its default accuracy level it would
    # quantize x to int8 first, which the QDQ model does not say.
    model, _, x = _int4_weight_only(tmp_path)
    exact = session(model, optimize=False).run(None, {"x": x})[0]
    optimized = tmp_path / "optimized.onnx"
    fused = session(model, optimized_path=str(optimized)).run(None, {"x": x})[0]
    assert "MatMulNBits" in {n.op_type for n in onnx.load(optimized).graph.node}  # the fusion this is about happened
    np.testing.assert_allclose(fused, exact, rtol=0, atol=1e-4 * float(np.abs(exact).max()))


def test_report_says_how_to_run_fused_int4_matmuls_as_measured(tmp_path):
    _, report, _ = _int4_weight_only(tmp_path)
    assert report.nodes[0].runs_as == "MatMulNBits"
    assert any("qdq_matmulnbits_accuracy_level" in w and "MatMulNBits" in w for w in report.warnings), report.warnings
