"""SmoothQuant: outlier channels moved into the weights, the float function unchanged, the quantized error lower."""

from __future__ import annotations

import numpy as np
import pytest

import qlinear.onnx as qo
import qlinear.quantize as qq
from qlinear._errors import QuantizationError
from qlinear.quantize._data import load_dataset
from qlinear.quantize._model import load_float_model
from qlinear.quantize._prepare import prepare
from qlinear.quantize._smoothquant import smooth
from quantize_models import layernorm_attention, outlier_mlp


def test_an_outlier_channel_no_longer_wipes_out_the_layer():
    model, data = outlier_mlp()
    cal, ev = {"x": data["x"][:800]}, {"x": data["x"][800:]}
    plain = qq.quantize_model(model, None, cal, eval=ev, promote=False, smoothquant=False).report
    smoothed = qq.quantize_model(model, None, cal, eval=ev, promote=False, smoothquant=True).report
    assert plain["output"]["sqnr_db"] < 10 and smoothed["output"]["sqnr_db"] > plain["output"]["sqnr_db"] + 20
    hidden = next(m for m in smoothed["smoothquant"] if m["nodes"] == ["down"])
    assert hidden["alpha"] is not None and hidden["sample_error_after"] < hidden["sample_error_before"] / 100
    assert smoothed["fusion"]["unfused"] == []  # the inserted Mul stays float; the layers still fuse


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
    done = smooth(fm, load_dataset(data, fm, what="calibration"), batch_size=16, excluded=set())
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
    done = smooth(fm, load_dataset(data, fm, what="calibration"), batch_size=16, excluded=set())
    assert done == [] and not any(n.op_type == "Mul" and n.name.endswith("SmoothQuant") for n in fm.graph.node)


def test_smoothquant_needs_data_it_can_read_twice():
    model, data = outlier_mlp()
    stream = ({"x": data["x"][i : i + 100]} for i in range(0, 800, 100))
    with pytest.raises(QuantizationError, match="reads the calibration data twice"):
        qq.quantize_model(model, None, stream, eval={"x": data["x"][800:]}, smoothquant=True)
    # By default a stream is calibrated without it.
    stream = ({"x": data["x"][i : i + 100]} for i in range(0, 800, 100))
    r = qq.quantize_model(model, None, stream, eval={"x": data["x"][800:]}, promote=False).report
    assert r["settings"]["smoothquant"] is False and r["smoothquant"] == []
