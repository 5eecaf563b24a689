"""Depthwise equalization: each depthwise Conv's input channels scaled to one range, the scales folded into weights."""

from __future__ import annotations

import numpy as np
import pytest

import qlinear.onnx as qo
import qlinear.quantize as qq
from qlinear._errors import QuantizationError
from qlinear.quantize._data import load_dataset
from qlinear.quantize._model import load_float_model
from qlinear.quantize._session import with_outputs
from qlinear.quantize.algorithms.depthwise import MOST_GAIN, equalize_depthwise
from qlinear.quantize.targets import ORT_CPU
from qlinear.quantize.targets.ort_cpu import prepare
from quantize_models import DEPTHWISE_PRODUCERS, depthwise_block


def _equalized(model, data, excluded=frozenset()):
    fm = load_float_model(model)
    prepare(fm, weight_only=False)
    done = equalize_depthwise(
        fm, load_dataset(data, fm, what="calibration"), batch_size=16, excluded=set(excluded), runtime=ORT_CPU
    )
    return fm, done


def _channel_ranges(model, data, tensor):
    out = qo.run(with_outputs(model, [tensor]), data, backend="onnxruntime")[tensor]
    return np.abs(out).max(axis=(0, 2, 3))


@pytest.mark.parametrize("producer", ["conv", "affine"])
def test_the_float_function_is_unchanged_and_the_channels_span_one_range(producer):
    model, data = depthwise_block(producer)
    fm, done = _equalized(model, data)
    assert [e.nodes for e in done.inputs] == [["depthwise"]] and done.not_folded == []
    assert done.inputs[0].spread_before > 5
    before, after = qo.run(model, data, backend="onnxruntime"), qo.run(fm.model, data, backend="onnxruntime")
    np.testing.assert_allclose(after["y"], before["y"], rtol=1e-4, atol=1e-5 * float(np.abs(before["y"]).max()))
    ranges = _channel_ranges(fm.model, data, fm.node("depthwise").input[0])
    assert ranges.max() / ranges.min() < 1.01  # no node added: the producer took the scales
    assert len(fm.graph.node) == len(model.graph.node)


def test_a_producer_that_cannot_take_the_scale_leaves_the_model_as_it_was():
    # HardSwish is not x / s -> f(x) / s: the division would need a float Mul between two integer layers.
    model, data = depthwise_block("hardswish")
    fm, done = _equalized(model, data)
    assert done.inputs == [] and done.not_folded == [fm.node("depthwise").input[0]]
    before, after = qo.run(model, data, backend="onnxruntime"), qo.run(fm.model, data, backend="onnxruntime")
    np.testing.assert_array_equal(after["y"], before["y"])


def test_no_channel_is_scaled_up_more_than_the_cap():
    model, data = depthwise_block("conv")
    fm0 = load_float_model(model)
    before = _channel_ranges(model, data, fm0.node("depthwise").input[0])
    weight, bias = fm0.node("pointwise0").input[1], fm0.node("pointwise0").input[2]
    k = int(np.argmin(before))
    w, b = fm0.constant(weight).copy(), fm0.constant(bias).copy()
    w[k] *= 1e-4
    b[k] *= 1e-4  # a channel nearly always zero
    fm0.set_constant(weight, w)
    fm0.set_constant(bias, b)
    fm, _ = _equalized(fm0.model, data)
    gains = _channel_ranges(fm.model, data, fm.node("depthwise").input[0]) / _channel_ranges(
        fm0.model, data, fm0.node("depthwise").input[0]
    )
    assert gains[k] == pytest.approx(MOST_GAIN, rel=1e-3) and gains.max() <= MOST_GAIN * 1.001


def test_an_excluded_depthwise_conv_keeps_its_input():
    model, data = depthwise_block("conv")
    _, done = _equalized(model, data, excluded={"depthwise"})
    assert done.inputs == [] and done.not_folded == []


@pytest.mark.parametrize("producer", DEPTHWISE_PRODUCERS)
def test_quantized_it_is_more_accurate_where_it_folds_and_the_same_elsewhere(producer):
    model, data = depthwise_block(producer)
    cal, ev = {"x": data["x"][:64]}, {"x": data["x"][64:]}
    options = dict(promote=False, float_where_faster=False)
    plain = qq.quantize_model(model, None, cal, eval=ev, equalize_depthwise=False, **options).report
    evened = qq.quantize_model(model, None, cal, eval=ev, **options).report  # on by default
    assert plain.settings.equalize_depthwise is False and evened.settings.equalize_depthwise is True
    if producer == "hardswish":
        assert evened.output.sqnr_db == plain.output.sqnr_db
        assert evened.algorithms["equalize_depthwise"].not_folded
    else:
        assert evened.output.sqnr_db > plain.output.sqnr_db + 1.5, (evened.output.sqnr_db, plain.output.sqnr_db)
        assert evened.fusion.unfused == plain.fusion.unfused


def test_it_is_off_where_the_weights_cannot_take_the_scales_and_refused_if_asked():
    model, data = depthwise_block("conv")
    r = qq.quantize_model(model, None, data, promote=False, granularity="per-tensor").report
    assert r.settings.equalize_depthwise is False
    with pytest.raises(QuantizationError, match=r"equalize_depthwise.*per-channel.*got per-tensor"):
        qq.quantize_model(model, None, data, equalize_depthwise=True, granularity="per-tensor")
    with pytest.raises(QuantizationError, match=r"equalize_depthwise.*quantized activations"):
        qq.quantize_model(model, None, data, equalize_depthwise=True, activations=None, weights="int4", granularity="blocked")
