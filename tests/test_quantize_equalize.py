"""Cross-layer equalization: the float function kept, per-tensor weights of unbalanced channels quantized far better."""

from __future__ import annotations

import numpy as np

import qlinear.onnx as qo
import qlinear.quantize as qq
from qlinear.quantize._model import load_float_model
from qlinear.quantize.algorithms.equalize import equalize


def _unbalanced_convs():
    """Conv -> Relu -> Conv -> Relu -> Conv whose filters' ranges differ by 50x (as after folding batch norms)."""
    rng = np.random.default_rng(4)
    g = qo.Graph("cle", opset=17)
    x = g.input("x", "float", ("N", 3, 10, 10))
    gain = np.exp(rng.uniform(np.log(1 / 50), 0, 8)).astype(np.float32)
    w1 = (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32) * gain[:, None, None, None]
    w2 = (rng.standard_normal((8, 8, 3, 3)) * 0.3).astype(np.float32) / gain[None, :, None, None]
    w3 = (rng.standard_normal((4, 8, 1, 1)) * 0.3).astype(np.float32)
    h = g.op("Relu", [g.op("Conv", [x, w1, (gain * 0.1).astype(np.float32)], name="c1", pads=[1, 1, 1, 1])], name="r1")
    h = g.op("Relu", [g.op("Conv", [h, w2], name="c2", pads=[1, 1, 1, 1])], name="r2")
    g.output(g.op("Conv", [h, w3], name="c3", output_names=["y"]))
    return g.to_model(), {"x": rng.standard_normal((32, 3, 10, 10)).astype(np.float32)}


def test_equalization_keeps_the_float_function():
    model, data = _unbalanced_convs()
    fm = load_float_model(model)
    done = equalize(fm, set())
    assert [(e.first, e.second) for e in done] == [("c1", "c2"), ("c2", "c3")]
    assert max(e.largest_scale / e.smallest_scale for e in done) > 5
    ref, got = qo.run(model, data, backend="onnxruntime")["y"], qo.run(fm.model, data, backend="onnxruntime")["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))


def test_equalization_rescues_per_tensor_weights():
    model, data = _unbalanced_convs()
    settings = dict(granularity="per-tensor", activations=None, promote=False, bias_correction=False)
    plain = qq.quantize_model(model, None, data, eval=data, **settings).report
    equalized = qq.quantize_model(model, None, data, eval=data, equalize=True, **settings).report
    assert equalized.output.sqnr_db > plain.output.sqnr_db + 6
    assert [e.first for e in equalized.equalized] == ["c1", "c2"] and plain.equalized == []
