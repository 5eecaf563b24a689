"""SmoothQuant: outlier channels moved into the weights, the float function unchanged, the quantized error lower."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import qlinear.onnx as qo
import qlinear.quantize as qq
from qlinear._errors import QuantizationError
from qlinear.dtypes import element_type
from qlinear.quantize._data import load_dataset
from qlinear.quantize._model import load_float_model
from qlinear.quantize.algorithms import smoothquant
from qlinear.quantize.algorithms.smoothquant import smooth
from qlinear.quantize.targets import ORT_CPU
from qlinear.quantize.targets.ort_cpu import prepare
from quantize_models import layernorm_attention, outlier_mlp


def test_an_outlier_channel_no_longer_wipes_out_the_layer():
    model, data = outlier_mlp()
    cal, ev = {"x": data["x"][:800]}, {"x": data["x"][800:]}
    plain = qq.quantize_model(model, None, cal, eval=ev, promote=False, smoothquant=False).report
    smoothed = qq.quantize_model(model, None, cal, eval=ev, promote=False, smoothquant=True).report
    assert plain.output.sqnr_db < 10 and smoothed.output.sqnr_db > plain.output.sqnr_db + 20
    hidden = next(m for m in smoothed.smoothquant if m.nodes == ("down",))
    assert hidden.alpha is not None and hidden.sample_error_after < hidden.sample_error_before / 100
    assert smoothed.fusion.unfused == []  # the inserted Mul stays float; the layers still fuse


def _two_layers_on_one_input():
    """Two MatMuls reading one activation whose channel 3 is 50 times the others (as q, k and v read one LayerNorm)."""
    rng = np.random.default_rng(2)
    g = qo.Graph("shared", opset=17)
    x = g.input("x", "float", ("N", 16))
    a = g.op("MatMul", [x, (rng.standard_normal((16, 8)) * 0.3).astype(np.float32)], name="a")
    b = g.op("MatMul", [x, (rng.standard_normal((16, 8)) * 0.3).astype(np.float32)], name="b")
    g.output(g.op("Add", [a, b], name="sum", output_names=["y"]))
    data = rng.standard_normal((200, 16)).astype(np.float32)
    data[:, 3] *= 50
    return g.to_model(), {"x": data}


@pytest.mark.parametrize("make", [outlier_mlp, _two_layers_on_one_input])
def test_the_float_function_is_unchanged(make):
    model, data = make()
    fm = load_float_model(model)
    prepare(fm, weight_only=False)
    done = smooth(fm, load_dataset(data, fm, what="calibration"), batch_size=16, excluded=set(), runtime=ORT_CPU)
    assert any(m.alpha is not None for m in done)
    before, after = qo.run(model, data, backend="onnxruntime"), qo.run(fm.model, data, backend="onnxruntime")
    for name, ref in before.items():
        np.testing.assert_allclose(after[name], ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))
    if make is _two_layers_on_one_input:  # layers that read one activation share one Mul
        assert [m.nodes for m in done] == [("a", "b")]
        assert sum(n.op_type == "Mul" for n in fm.graph.node) == 1


def test_activations_without_outliers_are_left_alone():
    # The transformer block's activations have no outlier channels: nothing to smooth, nothing changed.
    model, data = layernorm_attention()
    fm = load_float_model(model)
    prepare(fm, weight_only=False)
    done = smooth(fm, load_dataset(data, fm, what="calibration"), batch_size=16, excluded=set(), runtime=ORT_CPU)
    assert done == [] and not any(n.op_type == "Mul" and n.name.endswith("SmoothQuant") for n in fm.graph.node)


def test_smoothquant_needs_data_it_can_read_twice():
    model, data = outlier_mlp()
    stream = ({"x": data["x"][i : i + 100]} for i in range(0, 800, 100))
    with pytest.raises(QuantizationError, match="reads the calibration data twice"):
        qq.quantize_model(model, None, stream, eval={"x": data["x"][800:]}, smoothquant=True)
    # By default a stream is calibrated without it.
    stream = ({"x": data["x"][i : i + 100]} for i in range(0, 800, 100))
    r = qq.quantize_model(model, None, stream, eval={"x": data["x"][800:]}, promote=False).report
    assert r.settings.smoothquant is False and r.smoothquant == []


def _smoothed_graph(model, data, **options):
    fm = load_float_model(model)
    prepare(fm, weight_only=False)
    done = smooth(fm, load_dataset(data, fm, what="calibration"), batch_size=16, excluded=set(), runtime=ORT_CPU, **options)
    before, after = qo.run(model, data, backend="onnxruntime"), qo.run(fm.model, data, backend="onnxruntime")
    for name, ref in before.items():
        np.testing.assert_allclose(after[name], ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))
    return fm, done


def test_the_division_goes_into_the_layer_that_computes_the_activation():
    # The outlier channel is made by "up": dividing its output columns removes it at the source, with no Mul.
    model, data = outlier_mlp()
    fm, done = _smoothed_graph(model, data)
    assert [m.nodes for m in done if m.alpha is not None] == [("down",)]
    assert [n.op_type for n in fm.graph.node] == ["MatMul", "MatMul"]
    columns = np.abs(fm.constant(fm.node("up").input[1])).max(axis=0)
    assert columns[5] < 4 * np.median(columns)  # "up" no longer makes channel 5 a hundred times the others
    # With one scale a weight, "up"'s columns scaled apart would share it: the Mul stays.
    fm, _ = _smoothed_graph(model, data, weights_per_tensor=True)
    assert [n.op_type for n in fm.graph.node] == ["MatMul", "Mul", "MatMul"]


def _layernorm_then_dense(outlier: float = 60.0):
    """A LayerNorm written out (its gamma with one channel ``outlier`` times the rest), a Relu, then a dense layer."""
    rng = np.random.default_rng(4)
    g = qo.Graph("ln_dense", opset=17)
    x = g.input("x", "float", ("N", 24))
    c = g.op("Sub", [x, g.op("ReduceMean", [x], axes=[-1], keepdims=1)])
    var = g.op("ReduceMean", [g.op("Mul", [c, c])], axes=[-1], keepdims=1)
    normed = g.op("Div", [c, g.op("Sqrt", [g.op("Add", [var, np.float32(1e-5)])])])
    gamma = rng.uniform(0.5, 1.5, 24).astype(np.float32)
    gamma[7] *= outlier
    h = g.op(
        "Add", [g.op("Mul", [normed, gamma], name="ln_gamma"), rng.uniform(-0.1, 0.1, 24).astype(np.float32)], name="ln_beta"
    )
    h = g.op("Relu", [h], name="act")
    g.output(g.op("MatMul", [h, (rng.standard_normal((24, 8)) * 0.3).astype(np.float32)], name="dense", output_names=["y"]))
    return g.to_model(), {"x": rng.standard_normal((400, 24)).astype(np.float32)}


def test_the_division_goes_through_a_relu_into_a_layernorms_gamma_and_beta():
    model, data = _layernorm_then_dense()
    fm, done = _smoothed_graph(model, data)
    assert [m.nodes for m in done if m.alpha is not None] == [("dense",)]
    assert not any(n.op_type == "Mul" and "SmoothQuant" in n.name for n in fm.graph.node)
    gamma = fm.constant(fm.node("ln_gamma").input[1])
    assert gamma[7] < 10 * np.median(gamma)  # the outlier left gamma for the dense layer's weight rows
    # The quantized model: the same function, no Mul between the LayerNorm and the layer, and a smaller error.
    plain = qq.quantize_model(model, None, data, promote=False, smoothquant=False).report
    smoothed = qq.quantize_model(model, None, data, promote=False, smoothquant=True).report
    assert smoothed.output.sqnr_db > plain.output.sqnr_db + 6


def test_a_tensor_another_node_reads_keeps_its_mul():
    # The dense layer's input is also a graph output: divided at the source, that output would change.
    model, data = _layernorm_then_dense()
    model.graph.output.append(onnx.helper.make_tensor_value_info(model.graph.node[-2].output[0], onnx.TensorProto.FLOAT, None))
    fm, _ = _smoothed_graph(model, data)
    assert any(n.op_type == "Mul" and "SmoothQuant" in n.name for n in fm.graph.node)


def test_the_division_goes_into_a_layernormalization_before_dense_layers_of_open_shape():
    # LayerNormalization (the operator) before a dense layer on (batch, length, width): the Gemm reads the rows of the
    # normalized tensor, whose leading dimensions a Shape reads too; the Shape reads no values and does not count.
    rng = np.random.default_rng(4)
    g = qo.Graph("ln_op", opset=17)
    x = g.input("x", "float", ("N", "T", 24))
    gamma = rng.uniform(0.5, 1.5, 24).astype(np.float32)
    gamma[7] *= 60
    h = g.op("LayerNormalization", [x, gamma, rng.uniform(-0.1, 0.1, 24).astype(np.float32)], name="ln", axis=-1)
    dense = g.op("MatMul", [h, (rng.standard_normal((24, 8)) * 0.3).astype(np.float32)], name="dense")
    g.output(g.op("Relu", [g.op("Add", [dense, np.ones(8, np.float32)])], output_names=["y"]))
    fm, done = _smoothed_graph(g.to_model(), {"x": rng.standard_normal((64, 5, 24)).astype(np.float32)})
    assert [m.nodes for m in done if m.alpha is not None] == [("dense",)]
    assert "Mul" not in [n.op_type for n in fm.graph.node] and fm.node("dense").op_type == "Gemm"
    scale = fm.constant(fm.node("ln").input[1])
    assert scale[7] < 10 * np.median(scale)


def test_a_large_models_wide_layer_is_judged_on_a_sample_of_its_output_channels_and_picks_the_same_alpha(monkeypatch):
    # An 8192 x 8192 layer simulated whole takes seven float64 passes of 512 MB an alpha: a large model's wide layer's
    # error is estimated on evenly spaced output channels (each quantized on its own), its share of the layer counted.
    rng = np.random.default_rng(7)
    x = rng.standard_normal((256, 64))
    x[:, [3, 40]] *= 25.0  # outlier channels, as SmoothQuant meets them
    weights = [rng.standard_normal((64, 400)).astype(np.float32), rng.standard_normal((64, 48)).astype(np.float32)]
    wt, at = element_type("int8"), element_type("uint8")
    whole = smoothquant._search(x, np.abs(x).max(axis=0), weights, wt, at)
    monkeypatch.setattr(smoothquant, "_SIMULATED_ELEMENTS", 64 * 100)  # the first layer judged on 100 of its 400
    judged, share = smoothquant._judged(weights[0])
    assert judged.shape == (64, 100) and share == 0.25 and smoothquant._judged(weights[1])[1] == 1.0
    assert smoothquant._search(x, np.abs(x).max(axis=0), weights, wt, at) == whole  # a model under 1 GiB: every channel
    sampled = smoothquant._search(x, np.abs(x).max(axis=0), weights, wt, at, sampled=True)
    assert whole[0] is not None and sampled[0] == whole[0]  # the same alpha
    assert sampled[1] == pytest.approx(whole[1], rel=0.1) and sampled[2] == pytest.approx(whole[2], rel=0.1)
