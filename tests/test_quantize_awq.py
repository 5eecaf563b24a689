"""AWQ: weight rows meeting large inputs scaled up before rounding; lower error at the same bits, the float function kept."""

from __future__ import annotations

import numpy as np

import qlinear.onnx as qo
import qlinear.quantize as qq
from qlinear.quantize._data import load_dataset
from qlinear.quantize._model import load_float_model
from qlinear.quantize.algorithms.awq import scale_for_weights
from qlinear.quantize.targets import ORT_CPU
from qlinear.quantize.targets.ort_cpu import prepare


def _salient_layer():
    """A MatMul whose input has four channels with values ten times the others' (AWQ's salient channels)."""
    rng = np.random.default_rng(8)
    g = qo.Graph("salient", opset=17)
    x = g.input("x", "float", ("N", 6, 64))
    g.output(g.op("MatMul", [x, (rng.standard_normal((64, 32)) * 0.2).astype(np.float32)], name="layer", output_names=["y"]))
    data = rng.standard_normal((300, 6, 64)).astype(np.float32)
    data[..., [3, 17, 40, 51]] *= 10
    return g.to_model(), {"x": data}


def test_awq_lowers_the_error_of_4bit_weights():
    model, data = _salient_layer()
    cal, ev = {"x": data["x"][:240]}, {"x": data["x"][240:]}
    settings = dict(weights="int4", granularity="blocked", activations=None, promote=False, gptq=False, bias_correction=False)
    plain = qq.quantize_model(model, None, cal, eval=ev, awq=False, **settings).report
    scaled = qq.quantize_model(model, None, cal, eval=ev, awq=True, **settings).report
    assert scaled.awq[0].alpha is not None and scaled.awq[0].nodes == ("layer",)
    assert scaled.output.sqnr_db > plain.output.sqnr_db + 1.0
    assert scaled.nodes[0].runs_as == plain.nodes[0].runs_as == "MatMulNBits"


def test_awq_keeps_the_float_function_and_is_on_by_default_for_4bit_weight_only():
    model, data = _salient_layer()
    fm = load_float_model(model)
    prepare(fm, weight_only=True)
    done = scale_for_weights(
        fm,
        load_dataset(data, fm, what="calibration"),
        batch_size=16,
        excluded=set(),
        weights="int4",
        block_size=32,
        runtime=ORT_CPU,
    )
    assert done and done[0].sample_error_after < done[0].sample_error_before
    ref, got = qo.run(model, data, backend="onnxruntime")["y"], qo.run(fm.model, data, backend="onnxruntime")["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))
    r = qq.quantize_model(model, None, data, weights="int4", granularity="blocked", activations=None, promote=False).report
    assert r.settings.awq and r.settings.gptq and not r.settings.smoothquant
    assert qq.quantize_model(model, None, data, promote=False).report.settings.awq is False  # 8-bit: off
