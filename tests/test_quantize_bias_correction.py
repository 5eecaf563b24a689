"""Bias correction: the quantized layer's mean output error on the calibration data goes to zero."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import qlinear.onnx as qo
import qlinear.quantize as qq
from qlinear._errors import QuantizationError

RNG = np.random.default_rng(11)


def _layer(kind: str, *, relu: bool = False):
    """One layer with inputs whose channels have different means (so the weight error shifts the output mean)."""
    g = qo.Graph(f"bias_{kind}", opset=17)
    if kind == "conv":  # no bias and no padding: a bias is added
        x = g.input("x", "float", ("N", 4, 6, 6))
        w = (RNG.standard_normal((8, 4, 3, 3)) * 0.3).astype(np.float32)
        if relu:  # a Relu after it lets ONNX Runtime run it as QLinearConv
            y = g.op("Relu", [g.op("Conv", [x, w], name="layer")], name="relu", output_names=["y"])
        else:
            y = g.op("Conv", [x, w], name="layer", output_names=["y"])
        data = RNG.standard_normal((64, 4, 6, 6)).astype(np.float32) + np.arange(1, 5, dtype=np.float32)[None, :, None, None]
    elif kind == "gemm":
        x = g.input("x", "float", ("N", 24))
        w, b = (RNG.standard_normal((16, 24)) * 0.3).astype(np.float32), RNG.standard_normal(16).astype(np.float32)
        y = g.op("Gemm", [x, w, b], name="layer", transB=1, output_names=["y"])
        data = RNG.standard_normal((64, 24)).astype(np.float32) + np.linspace(-2, 3, 24, dtype=np.float32)
    else:  # a linear layer on 3-D activations: MatMul, then Add of a bias vector
        x = g.input("x", "float", ("N", 5, 24))
        h = g.op("MatMul", [x, (RNG.standard_normal((24, 16)) * 0.3).astype(np.float32)], name="layer")
        y = g.op("Add", [h, RNG.standard_normal(16).astype(np.float32)], name="bias", output_names=["y"])
        data = RNG.standard_normal((64, 5, 24)).astype(np.float32) + np.linspace(-2, 3, 24, dtype=np.float32)
    g.output(y)
    return g.to_model(), {"x": data}


def _mean_error(model: onnx.ModelProto, quantized: onnx.ModelProto, data: dict) -> np.ndarray:
    ref = qo.run(model, data, backend="onnxruntime")["y"].astype(np.float64)
    got = qo.run(quantized, data, backend="onnxruntime")["y"].astype(np.float64)
    channel_axis = 1 if ref.ndim == 4 else -1
    return np.moveaxis(got - ref, channel_axis, -1).reshape(-1, ref.shape[channel_axis]).mean(axis=0)


@pytest.mark.parametrize("kind", ["conv", "gemm", "matmul_add"])
def test_mean_output_error_is_zero_on_the_calibration_data(kind):
    model, data = _layer(kind)
    settings = dict(weights="int4", activations=None, promote=False, gptq=False)  # bias correction alone
    plain = qq.quantize_model(model, None, data, eval=data, bias_correction=False, **settings)
    corrected = qq.quantize_model(model, None, data, eval=data, bias_correction=True, **settings)
    before, after = np.abs(_mean_error(model, plain.model, data)), np.abs(_mean_error(model, corrected.model, data))
    assert before.max() > 0.2  # the 4-bit weights do shift the mean
    if kind == "conv":
        # A Conv's windows do not see every input pixel equally often (the borders), so the input's
        # channel means are those of its windows only up to that.
        assert after.max() < before.max() / 20
    else:
        assert after.max() < 1e-5
    assert corrected.report.output.sqnr_db > plain.report.output.sqnr_db
    # The float model itself is not touched.
    assert (
        qo.run(model, data, backend="onnxruntime")["y"].shape == qo.run(corrected.model, data, backend="onnxruntime")["y"].shape
    )


def test_corrected_bias_stays_int32_with_integer_activations():
    model, data = _layer("gemm")
    r = qq.quantize_model(model, None, data, eval=data, bias_correction=True, promote=False)
    assert r.report.nodes[0].bias_int32 and r.report.settings.bias_correction
    conv_model, conv_data = _layer("conv", relu=True)
    r = qq.quantize_model(conv_model, None, conv_data, eval=conv_data, bias_correction=True, promote=False)
    node = r.report.nodes[0]
    assert node.bias_int32 and node.runs_as == "QLinearConv" and r.report.fusion.unfused == []


def test_bias_correction_is_on_by_default_with_calibration_data():
    model, data = _layer("gemm")
    r = qq.quantize_model(model, None, data, promote=False).report
    assert r.settings.bias_correction and r.nodes[0].bias_corrected


def test_saved_statistics_carry_the_input_means(tmp_path):
    model, data = _layer("gemm")
    with_means, without = tmp_path / "with.npz", tmp_path / "without.npz"
    direct = qq.quantize_model(model, None, data, eval=data, save_stats_to=with_means, promote=False)
    qq.quantize_model(model, None, data, eval=data, save_stats_to=without, promote=False, bias_correction=False)
    again = qq.quantize_model(model, None, None, eval=data, stats=with_means, bias_correction=True, promote=False)
    assert again.model.SerializeToString(deterministic=True) == direct.model.SerializeToString(deterministic=True)
    with pytest.raises(QuantizationError, match="bias correction needs the calibration data's input means"):
        qq.quantize_model(model, None, None, eval=data, stats=without, bias_correction=True)


def test_a_float16_layer_without_a_bias_gets_a_float16_one():
    # Found by the graph fuzzer (case 44): bias correction gave a bias-free Gemm of a float16 model a float32 bias,
    # and the model failed onnx's checker.
    rng = np.random.default_rng(0)
    g = qo.Graph("half", opset=21)
    x = g.input("x", "float16", ("N", 8))
    w = g.initializer("W", (rng.standard_normal((8, 8)) * 0.3).astype(np.float16))
    g.output(g.op("Gemm", [g.op("Sigmoid", [g.op("Gemm", [x, w], name="fc1")], name="act"), w], name="fc2"))
    data = {"x": rng.standard_normal((24, 8)).astype(np.float16)}
    r = qq.quantize_model(g.to_model(), None, data, weights="int2", activations="int16", promote=False, bias_correction=True)
    onnx.checker.check_model(r.model, full_check=True)
    fc2 = next(n for n in r.model.graph.node if n.name == "fc2")
    biases = {t.name: t.data_type for t in r.model.graph.initializer}
    assert len(fc2.input) == 3 and biases[fc2.input[2]] == onnx.TensorProto.FLOAT16
