"""Empirical bias correction: each quantized layer's mean output error, measured on the finished model, out through its bias."""

from __future__ import annotations

from importlib import resources

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import qlinear.quantize as qq
from qlinear._errors import QuantizationError
from qlinear.onnx._graph import producers
from qlinear.quantize._data import load_dataset
from qlinear.quantize._evaluate import Reference
from qlinear.quantize._model import load_float_model
from qlinear.quantize.algorithms.empirical_bias_correction import (
    _biased_layers,
    _channel_means,
    _shifted,
    correct_biases,
)
from qlinear.quantize.targets import ORT_CPU
from qlinear.quantize.targets.ort_cpu import prepare

DEMO = resources.files("qlinear.quantize") / "_demo"
MODEL = str(DEMO / "digits_cnn.onnx")


def _data():
    cal = dict(np.load(str(DEMO / "digits_calibration.npz")))
    return cal, {"image": np.load(str(DEMO / "digits_eval.npz"))["image"]}


def _setup(**options):
    cal, ev = _data()
    qmodel = qq.quantize_model(MODEL, None, cal, eval=ev, promote=False, **options).model
    fm = prepare(load_float_model(MODEL), weight_only=options.get("activations", "uint8") is None)  # as the run's
    data = load_dataset(cal, fm, what="calibration")
    return fm, qmodel, data, Reference(fm.model, load_dataset(ev, fm, what="eval data"), batch_size=16, runtime=ORT_CPU)


def _values(model):
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def test_each_layers_mean_error_is_taken_out_of_its_int32_bias():
    fm, qmodel, data, reference = _setup()
    corrected, done = correct_biases(fm, qmodel, data, reference, batch_size=16)
    assert done.kept and done.held_out.sqnr_db_after > done.held_out.sqnr_db_before + 0.5  # digits: 41.8 -> 42.8 dB
    assert done.held_out.agreement_after >= done.held_out.agreement_before
    assert done.layers == ["conv1", "conv2", "fc1", "fc2"]  # graph order
    # Only the int32 bias codes moved; every other value and the graph are the post-training model's.
    before, after = _values(qmodel), _values(corrected)
    moved = {name for name in before if not np.array_equal(before[name], after[name])}
    assert moved and all(before[name].dtype == np.int32 for name in moved)
    assert [n.SerializeToString() for n in corrected.graph.node] == [n.SerializeToString() for n in qmodel.graph.node]
    onnx.checker.check_model(corrected, full_check=True)
    # The first layer sees the float input: after its correction its mean output error per channel is under one
    # step of its bias's scale (the codes are integers), where before it was not.
    layers = _biased_layers(qmodel, fm)
    q_out, f_out = layers["conv1"]
    batches = list(data.batches(16))
    want = _channel_means(fm.model, [f_out], batches, ORT_CPU)[f_out]
    error_before = _channel_means(qmodel, [q_out], batches, ORT_CPU)[q_out] - want
    error_after = _channel_means(corrected, [q_out], batches, ORT_CPU)[q_out] - want
    bias = next(n for n in corrected.graph.node if n.name == "conv1").input[2]
    bias_scale = after[producers(corrected.graph)[bias].input[1]]
    assert np.abs(error_after).max() <= np.max(bias_scale) < np.abs(error_before).max()


def test_a_float_bias_is_lowered_by_the_shift():
    _, qmodel, _, _ = _setup(activations=None)  # weight-only: biases stay float initializers
    layer = "conv1"
    bias = next(n for n in qmodel.graph.node if n.name == layer).input[2]
    shift = np.linspace(-0.5, 0.5, _values(qmodel)[bias].size)
    moved = _values(_shifted(qmodel, layer, shift))
    np.testing.assert_allclose(moved[bias], (_values(qmodel)[bias] - shift).astype(np.float32))
    assert all(np.array_equal(v, moved[k]) for k, v in _values(qmodel).items() if k != bias)


def test_it_runs_from_the_option_and_is_reported_under_its_name():
    cal, ev = _data()
    plain = qq.quantize_model(MODEL, None, cal, eval=ev, promote=False).report
    assert "empirical_bias_correction" not in plain.algorithms and plain.settings.empirical_bias_correction is False
    r = qq.quantize_model(MODEL, None, cal, eval=ev, promote=False, empirical_bias_correction=True).report
    done = r.algorithms["empirical_bias_correction"]
    assert done.kept and r.output.sqnr_db == pytest.approx(done.held_out.sqnr_db_after)
    assert done.held_out.sqnr_db_before == pytest.approx(plain.output.sqnr_db)


def test_a_correction_that_is_not_better_held_out_keeps_the_model_as_it_was():
    cal, ev = _data()
    # 4-bit blocked weights on the digits: the SQNR rises but one held-out image flips, so it is not kept.
    w4 = {"weights": "int4", "granularity": "blocked"}
    plain = qq.quantize_model(MODEL, None, cal, eval=ev, promote=False, **w4)
    r = qq.quantize_model(MODEL, None, cal, eval=ev, promote=False, empirical_bias_correction=True, **w4)
    done = r.report.algorithms["empirical_bias_correction"]
    assert done.kept == (
        done.held_out.sqnr_db_after > done.held_out.sqnr_db_before
        and done.held_out.agreement_after >= done.held_out.agreement_before
    )
    if not done.kept:
        assert r.model.SerializeToString() == plain.model.SerializeToString()


def test_without_calibration_data_it_is_refused_before_any_work(tmp_path):
    cal, ev = _data()
    stats = tmp_path / "stats.npz"
    qq.quantize_model(MODEL, None, cal, promote=False, save_stats_to=stats)
    with pytest.raises(QuantizationError, match="empirical_bias_correction runs the models on the calibration data"):
        qq.quantize_model(MODEL, None, None, eval=ev, stats=stats, promote=False, empirical_bias_correction=True)
