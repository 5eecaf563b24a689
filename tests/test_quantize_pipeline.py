"""quantize_model end to end on real data: the shipped digits CNN, a transformer block, a detector head."""

from __future__ import annotations

import io
import json
import math
import time
import tracemalloc
from collections import Counter
from importlib import resources

import numpy as np
import onnx
import pytest
from rich.console import Console

import qlinear.onnx as qo
import qlinear.quantize as qq
import qlinear.quantize._calibrate as calibration
from qlinear._errors import QuantizationError
from qlinear.kernels.cpu import compiling
from qlinear.quantize._calibrate import calibrate
from qlinear.quantize._data import load_dataset
from qlinear.quantize._evaluate import Runner
from qlinear.quantize._latency import Latency
from qlinear.quantize._model import load_float_model
from qlinear.quantize._placement import plan
from qlinear.quantize._session import session, with_outputs
from qlinear.quantize.targets import ORT_CPU
from qlinear.quantize.targets.ort_cpu import prepare
from quantize_models import audio_front_end, conv_batchnorm, detection_head, layernorm_attention, outlier_mlp

DEMO = resources.files("qlinear.quantize") / "_demo"
MODEL, CALIBRATION, EVAL = str(DEMO / "digits_cnn.onnx"), str(DEMO / "digits_calibration.npz"), str(DEMO / "digits_eval.npz")


def test_demo_model_keeps_its_accuracy(tmp_path):
    out = tmp_path / "q.onnx"
    result = qq.quantize_model(MODEL, out, CALIBRATION, eval=EVAL, labels="label")
    r = result.report
    assert out.exists() and r.size_bytes.after < 0.45 * r.size_bytes.before
    assert r.output.accuracy.before > 0.99 and r.output.accuracy.after >= r.output.accuracy.before - 0.005
    assert r.output.top1_agreement >= 0.995 and r.output.sqnr_db > 30
    assert r.fusion.unfused == [] and {n.runs_as for n in r.nodes} == {"QLinearConv", "QGemm"}
    # The MatMul whose weight sat in a Constant node is quantized too (as a Gemm with its bias).
    fc2 = next(n for n in r.nodes if n.name == "fc2")
    assert fc2.weight_type == "int8" and fc2.bias_int32
    # The saved model runs on ONNX Runtime and gives the accuracy the report states.
    data = np.load(EVAL)
    logits = qo.run(str(out), {"image": data["image"]}, backend="onnxruntime")["logits"]
    assert float((logits.argmax(1) == data["label"]).mean()) == r.output.accuracy.after
    # The report is strict JSON with the fields tools read.
    parsed = json.loads(qq.report_json(r))
    for key in ("size_bytes", "nodes", "output", "latency_ms", "calibration", "fusion", "settings"):
        assert key in parsed
    assert set(parsed["nodes"][0]) >= {
        "name",
        "op_type",
        "weight_type",
        "activation_type",
        "weight_sqnr_db",
        "output_sqnr_db",
        "fused",
    }


def test_same_model_for_any_batch_size():
    models = [
        qq.quantize_model(MODEL, None, CALIBRATION, eval=EVAL, method=m, batch_size=b).model
        for m in ("entropy",)
        for b in (1, 7, 64)
    ]
    blobs = {m.SerializeToString(deterministic=True) for m in models}
    assert len(blobs) == 1


def test_calibration_memory_does_not_grow_with_batches():
    # tracemalloc sees every thread: let kernels that earlier tests left compiling in the background finish first.
    while compiling():
        time.sleep(0.2)
    fm = load_float_model(MODEL)
    p = plan(fm, qq.QuantizeOptions())
    images = np.load(CALIBRATION)["image"][:64]
    peaks = []
    for repeat in (1, 20):
        data = load_dataset({"image": np.concatenate([images] * repeat)}, fm, what="calibration")
        tracemalloc.start()
        calibrate(fm, p.calibrate, data, batch_size=16, runtime=ORT_CPU)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    # 20 times the batches: the same peak (one batch's tensors and the statistics), within noise.
    assert peaks[1] < 1.3 * peaks[0]


def test_calibration_means_are_each_channels_mean_over_every_batch():
    # Bias correction's input means: along a Conv's channel axis (1) and a MatMul's last one, over batches of 7.
    fm = load_float_model(MODEL)
    p = plan(fm, qq.QuantizeOptions())
    images = np.load(CALIBRATION)["image"][:50]
    data = load_dataset({"image": images}, fm, what="calibration")
    tensor = p.calibrate[1]
    run = calibrate(fm, p.calibrate, data, batch_size=7, runtime=ORT_CPU, channel_axes={tensor: 1, "image": -1})
    values = Runner(fm.model, [tensor], ORT_CPU)({"image": images})[tensor].astype(np.float64)
    assert np.allclose(run.means[tensor], values.mean(axis=tuple(a for a in range(values.ndim) if a != 1)), rtol=1e-12)
    flat = images.astype(np.float64).reshape(-1, images.shape[-1])
    assert np.allclose(run.means["image"], flat.mean(axis=0), rtol=1e-12)


def test_saved_statistics_give_the_same_model(tmp_path):
    stats = tmp_path / "stats.npz"
    # Bias correction needs the calibration inputs' means, which statistics do not hold: off in both.
    first = qq.quantize_model(
        MODEL, None, CALIBRATION, eval=EVAL, method="percentile", save_stats_to=stats, bias_correction=False
    )
    again = qq.quantize_model(MODEL, None, None, eval=EVAL, method="percentile", stats=stats)
    assert first.model.SerializeToString(deterministic=True) == again.model.SerializeToString(deterministic=True)
    assert again.report.calibration.from_stats == str(stats) and not again.report.settings.bias_correction
    # Other settings from the same statistics: seconds, no calibration.
    int4 = qq.quantize_model(MODEL, None, None, eval=EVAL, weights="int4", stats=stats)
    assert int4.report.settings.weights == "int4"


def test_transformer_with_additive_mask_and_layernorm_keeps_agreement():
    model, data = layernorm_attention()
    r = qq.quantize_model(model, None, data).report
    # The -3.4e38 mask and the LayerNorm stay float, so the output stays close (held-out: 10 of the 48 sequences).
    assert r.output.sqnr_db > 25 and r.output.top1_agreement >= 0.9
    assert "add_mask" not in {n.name for n in r.nodes}


def test_detector_keeps_boxes_and_scores_apart():
    model, data = detection_head()
    r = qq.quantize_model(model, None, data)
    ref = qo.run(model, data, backend="onnxruntime")["detections"]
    got = qo.run(r.model, data, backend="onnxruntime")["detections"]
    # Class scores (0-1) keep their resolution: under one scale with the boxes (0-320) they would move by 0.6.
    assert np.abs(got[:, 4:] - ref[:, 4:]).max() < 0.02
    assert np.abs(got[:, :4] - ref[:, :4]).max() < 3.0


def test_audio_front_end_keeps_its_accuracy_without_promotions(monkeypatch):
    model, data = audio_front_end()
    r = qq.quantize_model(model, None, data, promote=False).report
    assert r.output.sqnr_db > 35 and r.output.top1_agreement >= 0.98
    assert [n.name for n in r.left_float] == ["mel"]
    printed = io.StringIO()
    qq.print_report(r, Console(file=printed, width=200))
    assert "left float" in printed.getvalue() and "mel (MatMul): output reaches a Log" in printed.getvalue()
    # The hazard is real: with the filterbank quantized like any MatMul the model collapses.
    monkeypatch.setattr("qlinear.quantize._placement.float_regions", lambda *args, **kwargs: {})
    r = qq.quantize_model(model, None, data, promote=False).report
    assert r.output.sqnr_db < 10
    # And with its weights at 4 bits its Log sees negative values: the output holds NaN, which the report
    # ranks as the worst figure (minus infinity) instead of failing.
    r = qq.quantize_model(model, None, data, promote=False, weights="int4", granularity="blocked", activations=None).report
    assert r.output.sqnr_db == -math.inf
    assert qq.report_json(r)  # strict JSON all the same (-inf is written as null)


def test_a_model_whose_every_node_stays_float_says_why():
    model, data = audio_front_end()
    with pytest.raises(
        QuantizationError, match=r"every node stays float: mel \((MatMul|Gemm)\): output reaches a Log.*conv \(Conv\): excluded"
    ):
        qq.quantize_model(model, None, data, exclude=["Conv", "Gemm"])


def test_batch_normalization_is_folded_so_every_conv_fuses():
    model, data = conv_batchnorm()
    r = qq.quantize_model(model, None, data)
    ops = [n.op_type for n in r.model.graph.node]
    assert "BatchNormalization" not in ops
    assert r.report.fusion.unfused == [] and {n.runs_as for n in r.report.nodes} == {"QLinearConv", "QGemm"}
    # Input, the two Relu outputs, the pooled features: one Q each, nothing requantized.
    assert ops.count("QuantizeLinear") == 4
    assert r.report.output.sqnr_db > 35


def test_held_out_split_and_random_calibration_are_reported():
    r = qq.quantize_model(MODEL, None, CALIBRATION).report
    assert "held out" in r.eval.source and r.eval.samples == 60
    r = qq.quantize_model(MODEL, None, calibrate_random=20).report
    assert any("random" in w for w in r.warnings) and "random" in r.calibration.source


def test_iterable_of_batches_calibrates():
    images = np.load(CALIBRATION)["image"]
    batches = [{"image": images[i : i + 10]} for i in range(0, 100, 10)]
    r = qq.quantize_model(MODEL, None, batches, eval=EVAL, labels="label").report
    assert r.calibration.batches == 10 and r.output.accuracy.after > 0.98


def test_input_model_is_never_modified(tmp_path):
    before = onnx.load(MODEL).SerializeToString()
    model = onnx.load(MODEL)
    qq.quantize_model(model, tmp_path / "q.onnx", CALIBRATION)
    assert model.SerializeToString() == before


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"weights": "int3"}, "weights must be one of"),
        ({"method": "kl"}, "method must be one of"),
        ({"granularity": "per-row"}, "granularity must be one of"),
        ({"activations": "uint4"}, "activations must be one of"),
        ({"block_size": 16}, "block_size needs granularity='blocked'"),
    ],
)
def test_bad_options_are_named(kwargs, message):
    with pytest.raises(QuantizationError, match=message):
        qq.quantize_model(MODEL, None, CALIBRATION, **kwargs)


def test_bad_calibration_data_names_the_input():
    images = np.load(CALIBRATION)["image"]
    cases = [
        ({"img": images}, "no array for model input 'image'"),
        ({"image": images.astype(np.float64)}, "has dtype float64, expected float32"),
        ({"image": images[:, :, :4]}, r"has shape \(300, 1, 4, 8\), expected \(samples, 1, 8, 8\)"),
    ]
    for data, message in cases:
        with pytest.raises(QuantizationError, match=message):
            qq.quantize_model(MODEL, None, data)


def test_output_without_classes_has_sqnr_but_no_top1():
    # A regression head (one value a sample): agreement along a last axis of 1 means nothing.
    g = qo.Graph("regress", opset=17)
    x = g.input("x", "float", ("N", 16))
    g.output(
        g.op(
            "Gemm",
            [x, np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)],
            name="head",
            transB=1,
            output_names=["y"],
        )
    )
    data = {"x": np.random.default_rng(1).standard_normal((50, 16)).astype(np.float32)}
    r = qq.quantize_model(g.to_model(), None, data, promote=False).report
    assert r.output.top1_agreement is None and r.output.sqnr_db > 20
    # Its default target is the output's SQNR.
    target = qq.quantize_model(g.to_model(), None, data).report.promotions.target
    assert (target.metric, target.value, target.text) == ("sqnr", qq.DEFAULT_SQNR_DB, f"output SQNR >= {qq.DEFAULT_SQNR_DB:g} dB")


def test_streams_of_batches_for_calibration_and_evaluation():
    # Generators are read once: calibration, evaluation and the latency runs all work from one pass each.
    data = np.load(EVAL)

    def stream(images, labels=None):
        for i in range(0, len(images), 50):
            yield {"image": images[i : i + 50]}

    images = np.load(CALIBRATION)["image"]
    r = qq.quantize_model(MODEL, None, stream(images), eval=stream(data["image"])).report
    assert r.eval.samples == 450 and r.output.top1_agreement > 0.99
    # Timed at the batches its users run: one sample and the batch size, cut from the stream's first batch of 50.
    assert [t.batch for t in r.latency_ms] == [1, 16]


def test_unnamed_nodes_are_named_at_once():
    # Exporters leave node names empty; each gets its op type and position (a clash takes a suffix).
    model = onnx.load(MODEL)
    for node in model.graph.node:
        node.name = ""
    model.graph.node[1].name = f"{model.graph.node[0].op_type}_0"  # the name the first node would take
    from qlinear.quantize._model import load_float_model

    fm = load_float_model(model)
    given = [n.name for n in fm.graph.node]
    assert len(set(given)) == len(given) and all(given)
    assert given[0] == f"{model.graph.node[0].op_type}_0_1"


def test_the_size_before_is_the_model_as_given_not_as_rewritten():
    from qlinear.onnx import _large as large

    model, data = outlier_mlp()
    r = qq.quantize_model(model, None, data, weights="int4", granularity="blocked", activations=None, promote=False).report
    assert [a for a in r.awq if a.alpha is not None]  # AWQ put its channel scales into the float model
    assert r.size_bytes.before == large.byte_size(model)


def test_a_model_stamped_with_an_ir_version_onnx_runtime_cannot_read_says_how_to_fix_it():
    model, data = layernorm_attention()
    model.ir_version = 99  # as onnx.helper.make_model stamps the onnx package's newest, past what ONNX Runtime reads
    with pytest.raises(QuantizationError, match=r"Unsupported model IR version: 99.*; set model\.ir_version = \d+ \(or lower"):
        qq.quantize_model(model, None, data)
    model.ir_version = 8
    assert qq.quantize_model(model, None, data, promote=False).report.output.sqnr_db > 30


def _with_fixed_batch(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    """``model`` with the first dimension of its inputs and outputs fixed at ``batch`` (as many exporters write it)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for v in (*out.graph.input, *out.graph.output):
        v.type.tensor_type.shape.dim[0].dim_value = batch
    return out


def test_a_model_with_a_fixed_batch_is_walked_at_that_batch():
    model, data = conv_batchnorm()  # 48 samples
    r = qq.quantize_model(_with_fixed_batch(model, 1), None, data, promote=False)  # ONNX Runtime refused batches of 16
    assert r.report.settings.batch_size == 1 and [t.batch for t in r.report.latency_ms] == [1]
    assert r.report.calibration.batches == r.report.calibration.samples and r.report.output.sqnr_db > 40
    r = qq.quantize_model(_with_fixed_batch(model, 4), None, data, promote=False)
    assert r.report.calibration.samples == 40 and r.report.eval.samples == 8  # the held-out part, whole batches
    with pytest.raises(QuantizationError, match=r"fixed batch of 5, and the calibration data holds 38 samples, not a multiple"):
        qq.quantize_model(_with_fixed_batch(model, 5), None, data, promote=False)


def test_batches_whose_tensors_are_large_are_cut_and_give_the_same_model(monkeypatch):
    model, data = conv_batchnorm()  # 48 samples
    whole = qq.quantize_model(model, None, data, promote=False)
    fm = prepare(load_float_model(model), weight_only=False)  # its batch normalizations folded, as the run does
    observed = plan(fm, qq.QuantizeOptions()).calibrate
    sess = session(with_outputs(fm.model, observed))
    per_sample = sum(v.nbytes for v in sess.run(observed, {"x": data["x"][:1]}))
    monkeypatch.setattr(calibration, "HELD_BYTES", 5 * per_sample)  # room for 5 samples' calibrated tensors
    cut = qq.quantize_model(model, None, data, promote=False)
    assert whole.report.calibration.batch_size == 16 and cut.report.calibration.batch_size == 5
    assert cut.report.calibration.batches == math.ceil(38 / 5)
    assert [t.batch for t in cut.report.latency_ms] == [1, 10]  # one sample, the batch asked for (its 10 held out)
    # Histograms merge exactly: the same statistics, the same model.
    assert cut.model.SerializeToString(deterministic=True) == whole.model.SerializeToString(deterministic=True)
    # A model with a fixed batch runs at it, whatever its tensors take.
    fixed = qq.quantize_model(_with_fixed_batch(model, 4), None, data, promote=False)
    assert fixed.report.calibration.batch_size == 4


def test_only_class_scores_are_judged_by_top1_agreement():
    # A text detector's output: a Sigmoid probability per pixel, (N, 1, H, W). Its last axis is the image's
    # width, so the top-1 along it says nothing; the default target is the decisions its scores carry.
    rng = np.random.default_rng(0)
    g = qo.Graph("prob_map", opset=17)
    x = g.input("x", "float", ("N", 3, 16, 16))
    h = g.op(
        "Relu", [g.op("Conv", [x, (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)], name="c0", pads=[1, 1, 1, 1])]
    )
    logit = g.op("Conv", [h, (rng.standard_normal((1, 8, 1, 1)) * 0.3).astype(np.float32)], name="c1")
    g.output(g.op("Sigmoid", [logit], name="prob", output_names=["prob"]))
    data = {"x": rng.standard_normal((40, 3, 16, 16)).astype(np.float32)}
    r = qq.quantize_model(g.to_model(), None, data).report
    assert r.output.top1_agreement is None
    assert r.promotions.target.metric == "decisions" and r.promotions.target.value == qq.DEFAULT_AGREEMENT


def test_what_classifies():
    from qlinear.quantize._evaluate import classifies

    rng = np.random.default_rng(0)
    scores = rng.standard_normal((4, 10)).astype(np.float32)

    def made_by(*ops: tuple[str, list, dict]) -> onnx.ModelProto:
        g = qo.Graph("head", opset=17)
        h = g.input("x", "float", ("N", 8))
        for op, extra, attrs in ops:
            h = g.op(op, [h, *extra], **attrs)
        g.output(g.op("Identity", [h], output_names=["y"]))
        return g.to_model()

    w, b = rng.standard_normal((8, 10)).astype(np.float32), rng.standard_normal(10).astype(np.float32)
    assert classifies(made_by(("MatMul", [w], {}), ("Add", [b], {})), "y", scores)  # logits and their bias
    assert classifies(made_by(("Gemm", [w], {}), ("Softmax", [], {"axis": -1})), "y", scores)
    assert classifies(
        made_by(("MatMul", [w], {}), ("Div", [np.float32(2)], {}), ("Reshape", [np.array([-1, 10])], {})), "y", scores
    )
    assert not classifies(made_by(("MatMul", [w], {}), ("Sigmoid", [], {})), "y", scores)  # per-class probabilities, multi-label

    def written_softmax(axis, same_exp: bool = True, opset: int = 17, reshaped: bool = False) -> onnx.ModelProto:
        """A Softmax as jax2tf writes it: Exp(x - max) / Expand(Reshape(ReduceSum(Exp(x - max))))."""
        g = qo.Graph("head", opset=opset)
        x = g.input("x", "float", ("N", 8))
        logits = g.op("Relu", [g.op("MatMul", [x, w])])  # not a score-making op next to the output: the Div decides
        top = g.op("ReduceMax", [logits], axes=[-1], keepdims=1)
        e = g.op("Exp", [g.op("Sub", [logits, g.op("Expand", [top, np.array([4, 10], np.int64)])])])
        source = e if same_exp else g.op("Exp", [logits])
        if opset < 13:  # the axes an attribute
            summed = g.op("ReduceSum", [source], axes=[axis], keepdims=0)
        else:
            summed = g.op("ReduceSum", [source, np.array(axis, np.int64).reshape(np.shape(axis))], keepdims=0)
        shape = np.array([-1, 1] if np.reshape(axis, -1)[0] in (-1, 1) else [1, 10], np.int64)
        spread = g.op("Expand", [g.op("Reshape", [summed, shape]), np.array([4, 10], np.int64)])
        y = g.op("Div", [e, spread])
        if reshaped:  # a reshape after the Div: the Exp's rank is no longer the output's
            y = g.op("Reshape", [y, np.array([-1, 10], np.int64)])
        g.output(g.op("Identity", [y], output_names=["y"]))
        return g.to_model()

    assert classifies(written_softmax(-1), "y", scores) and classifies(written_softmax(1), "y", scores)
    assert classifies(written_softmax(-1, opset=11), "y", scores) and classifies(written_softmax([-1]), "y", scores)
    assert classifies(written_softmax(-1, reshaped=True), "y", scores)  # -1 is the Exp's last axis whatever its rank
    assert not classifies(written_softmax(1, reshaped=True), "y", scores)  # axis 1 of an Exp of unknown rank: not read
    assert not classifies(written_softmax(0), "y", scores)  # normalized over the batch: no distribution a sample
    assert not classifies(written_softmax(-1, same_exp=False), "y", scores)  # divided by another Exp's sum
    assert not classifies(made_by(("Relu", [], {})), "y", scores)  # the same model without its Softmax
    assert not classifies(made_by(("MatMul", [w], {})), "y", scores[:, :1])  # one value a sample
    assert not classifies(made_by(("MatMul", [w], {})), "y", scores.astype(np.int64))


def _stateful_model() -> onnx.ModelProto:
    """A step of a streaming model: features (batch, 8), a recurrent state (2, batch, 16) and a scalar gain."""
    rng = np.random.default_rng(0)
    g = qo.Graph("stateful", opset=17)
    x = g.input("x", "float", ("batch", 8))
    state = g.input("state", "float", (2, "batch", 16))
    gain = g.input("gain", "float", ())
    h = g.op("Relu", [g.op("MatMul", [x, (rng.standard_normal((8, 16)) * 0.4).astype(np.float32)], name="in_proj")])
    h = g.op("Mul", [g.op("Add", [h, g.op("ReduceSum", [state, np.array([0], np.int64)], keepdims=0)]), gain])
    g.output(g.op("MatMul", [h, (rng.standard_normal((16, 4)) * 0.4).astype(np.float32)], name="head", output_names=["y"]))
    return g.to_model()


def test_inputs_whose_batch_axis_is_not_the_first_and_scalar_inputs():
    # The model names its batch "batch": the state's samples are along its axis 1; the gain is fed whole.
    rng = np.random.default_rng(1)
    n = 40
    data = {
        "x": rng.standard_normal((n, 8)).astype(np.float32),
        "state": rng.standard_normal((2, n, 16)).astype(np.float32),
        "gain": np.array(1.5, np.float32),
    }
    r = qq.quantize_model(_stateful_model(), None, data, promote=False).report
    assert r.calibration.samples == 32 and r.eval.samples == 8  # the held-out fifth, along each batch axis
    assert r.output.sqnr_db > 20 and r.fusion.unfused == []
    # A batch of the state along its first axis, or a gain with a sample axis, is refused by name.
    with pytest.raises(QuantizationError, match=r"array 'state' has shape \(40, 2, 16\), expected \(2, samples, 16\)"):
        qq.quantize_model(_stateful_model(), None, {**data, "state": data["state"].transpose(1, 0, 2)})
    with pytest.raises(QuantizationError, match=r"array 'gain' has shape \(40,\), expected a scalar"):
        qq.quantize_model(_stateful_model(), None, {**data, "gain": np.full(n, 1.5, np.float32)})
    # A stream of batches as the model takes them works the same.
    stream = [
        {k: (v if k == "gain" else v[:, i : i + 10] if k == "state" else v[i : i + 10]) for k, v in data.items()}
        for i in range(0, n, 10)
    ]
    r = qq.quantize_model(_stateful_model(), None, stream, eval=stream, promote=False).report
    assert r.calibration.samples == n and r.eval.samples == n


def test_initializers_read_only_inside_a_subgraph_are_kept():
    # An exporter's If (Silero VAD picks its decoder by sample rate this way): the branch reads an initializer
    # of the outer graph by name alone. Dropping it as unread left a model the checker refuses.
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    outer = numpy_helper.from_array((rng.standard_normal((16, 4)) * 0.3).astype(np.float32), "branch_weight")
    then_g = helper.make_graph(
        [helper.make_node("MatMul", ["h", "branch_weight"], ["y_then"])],
        "then",
        [],
        [helper.make_tensor_value_info("y_then", TensorProto.FLOAT, ["batch", 4])],
    )
    else_g = helper.make_graph(
        [helper.make_node("ReduceMean", ["h"], ["y_else"], axes=[1], keepdims=1)],
        "else",
        [],
        [helper.make_tensor_value_info("y_else", TensorProto.FLOAT, ["batch", 1])],
    )
    w = numpy_helper.from_array((rng.standard_normal((8, 16)) * 0.3).astype(np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="proj"),
        helper.make_node("Relu", ["m"], ["h"]),
        helper.make_node("Equal", ["rate", "sixteen_k"], ["is_16k"]),
        helper.make_node("If", ["is_16k"], ["y"], then_branch=then_g, else_branch=else_g),
    ]
    graph = helper.make_graph(
        nodes, "branches",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8]), helper.make_tensor_value_info("rate", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", None])],
        [w, outer, numpy_helper.from_array(np.array(16000, np.int64), "sixteen_k")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    data = {"x": rng.standard_normal((40, 8)).astype(np.float32), "rate": np.array(16000, np.int64)}
    r = qq.quantize_model(model, None, data, promote=False)
    onnx.checker.check_model(r.model, full_check=True)
    assert "branch_weight" in {t.name for t in r.model.graph.initializer}
    assert r.report.output.sqnr_db > 25


def test_a_quantized_model_slower_than_the_float_one_is_a_warning_with_the_causes_the_run_knows(monkeypatch):
    import qlinear.quantize._latency as latency_module

    model, data = layernorm_attention()
    texts, decisions = {}, {}
    for timing in ((1.0, 2.0), (1.0, 1.1)):  # the timing's noise is about 0.1: a 10% slower model is not warned of
        timed = [Latency(1, timing[0], timing[1], timing[1] / timing[0]), Latency(16, 10.0, 9.0, 0.9)]
        monkeypatch.setattr(
            latency_module.UserBatchTimer, "time", lambda self, model, again=False, give_up_above=None, timed=timed: tuple(timed)
        )
        r = qq.quantize_model(model, None, data, activations="uint16", promote=False).report
        texts[timing] = [w for w in r.warnings if w.startswith("the quantized model is slower")]
        decisions[timing] = r.decision
    assert texts[(1.0, 1.1)] == []
    (text,) = texts[(1.0, 2.0)]
    assert "2.000 ms against 1.000 ms a batch of 1" in text and "(2.00x)" in text
    # Slower at any batch the users run: the first line says so, whatever the warning's margin for noise.
    for timing in texts:
        assert decisions[timing].faster is False and decisions[timing].line.startswith("SLOWER than the float model")
    assert "1.10x at a batch of 1, 0.90x at a batch of 16" in decisions[(1.0, 1.1)].line
    assert "in float by design (16-bit activations) (promotions: --no-promote" in text and "Q/DQ nodes left" in text


def test_a_concatenated_output_is_judged_by_its_worst_part():
    # Boxes in pixels (0-320) beside class scores (0-1): one SQNR over both is the boxes' alone. A YOLOv8
    # export quantized without promotion read 22.4 dB there while its scores were at 0.1 dB.
    model, data = detection_head()
    r = qq.quantize_model(model, None, data, promote=False)
    out = r.report.output
    assert len(out.sqnr_db_parts) == 2 and out.sqnr_db == min(out.sqnr_db_parts)
    # The parts' figures, by hand: the first four columns are the boxes, the last three the scores.
    from qlinear.quantize._session import session

    feeds = {"image": data["image"][26:]}  # the held-out fifth (6 of 32), as the report's figures
    want, got = session(model).run(None, feeds)[0], session(r.model).run(None, feeds)[0]

    def db(a, b):
        return 10 * np.log10(np.sum(a.astype(np.float64) ** 2) / np.sum((a.astype(np.float64) - b) ** 2))

    np.testing.assert_allclose(out.sqnr_db_parts, [db(want[:, :4], got[:, :4]), db(want[:, 4:], got[:, 4:])], atol=1e-6)
    whole = db(want, got)
    assert abs(whole - out.sqnr_db_parts[0]) < 0.1  # the whole is the boxes' figure
    from qlinear.quantize._report_print import print_report

    printed = io.StringIO()
    print_report(r.report, Console(file=printed, width=200, color_system=None))
    assert "the worst of 2 concatenated parts" in printed.getvalue()


def test_every_float_output_is_judged_and_the_worst_counts():
    # The same detector with boxes and scores as two outputs, as SSD-style exports give them: judged by the
    # first alone, its destroyed scores would go unseen. Nothing about the quantization differs from the
    # concatenated form: each output's figure is that form's part's.
    joined, data = detection_head()
    model, _ = detection_head(separate=True)
    parts = qq.quantize_model(joined, None, data, promote=False).report.output.sqnr_db_parts
    r = qq.quantize_model(model, None, data, promote=False)
    out = r.report.output
    np.testing.assert_allclose(list(out.sqnr_db_outputs.values()), parts, atol=1e-6)
    assert list(out.sqnr_db_outputs) == ["boxes", "scores"] and out.sqnr_db == min(parts)
    printed = io.StringIO()
    qq.print_report(r.report, Console(file=printed, width=200, color_system=None))
    worst = min(out.sqnr_db_outputs, key=out.sqnr_db_outputs.get)
    assert f"(the worst of 2 outputs: {worst})" in printed.getvalue()
    # The search reads the same figure: with a target the boxes meet and the scores do not, it promotes.
    boxes, scores = parts
    assert scores < boxes
    searched = qq.quantize_model(model, None, data, target_sqnr_db=(boxes + scores) / 2).report.promotions
    assert searched.before == pytest.approx(scores) and searched.steps and searched.after >= (boxes + scores) / 2


def test_too_little_data_and_unread_arrays_are_said():
    # 3 samples: 2 calibrate and 1 judges a 99% agreement target; an array no input reads is named, not dropped silently.
    cal = dict(np.load(CALIBRATION))
    r = qq.quantize_model(MODEL, None, {"image": cal["image"][:3], "extra": np.zeros(3)}).report
    warned = "\n".join(r.warnings)
    assert "calibrated on 2 sample(s)" in warned
    assert "was judged on 1 held-out sample(s), each 100.0% of the agreement" in warned
    assert "holds arrays no model input reads, ignored: extra" in warned
    enough = qq.quantize_model(MODEL, None, cal).report
    assert not [w for w in enough.warnings if "sample(s)" in w or "ignored" in w]
    # One sample: nothing to hold out, said as such (not "the eval data holds no batch", which was never given).
    with pytest.raises(QuantizationError, match="holds 1 sample: too few to hold out a share for the accuracy figures"):
        qq.quantize_model(MODEL, None, {"image": cal["image"][:1]})


def test_the_summary_says_the_types_the_model_holds_where_promotions_changed_them():
    # Asked for int4 weights, every node promoted: the summary says what was asked and what the model holds.
    from rich.console import Console

    from qlinear.quantize._report_print import print_report

    cal = dict(np.load(CALIBRATION))
    r = qq.quantize_model(MODEL, None, cal, weights="int4", target_sqnr_db=200, max_float=0.25).report
    held = Counter(n.weight_type for n in r.nodes)
    assert "int4" not in held and r.left_float
    buf = io.StringIO()
    print_report(r, Console(file=buf, width=200))
    row = next(line for line in buf.getvalue().splitlines() if line.startswith("types"))
    assert "weights int4 per-channel asked, held as int8 x3, float x1" in row
    assert "activations uint8 asked, held as uint8 x3, float x1" in row  # ONNX Runtime gains nothing at 16 bits
    plain = io.StringIO()
    print_report(qq.quantize_model(MODEL, None, cal, promote=False).report, Console(file=plain, width=200))
    assert "weights int8 per-channel, activations uint8, opset" in plain.getvalue()


def test_a_model_onnx_runtime_cannot_load_is_never_written_silently(tmp_path):
    # float8 activations: ONNX Runtime's optimizer fuses their Q/DQ around a Conv or Gemm into kernels it has no
    # float8 form of, and the session fails: refused before any work, nothing written.
    import onnxruntime as ort

    cal = dict(np.load(CALIBRATION))
    out = tmp_path / "f8.onnx"
    with pytest.raises(QuantizationError, match="activations float8e4m3fn cannot be written around Conv and Gemm"):
        qq.quantize_model(MODEL, out, cal, weights="float8e4m3fn", activations="float8e4m3fn", promote=False)
    assert not out.exists()
    # float4 weights: ONNX Runtime has no float4 DequantizeLinear. The model is still standard ONNX (qlinear runs
    # it); the report says so, why, and what loads.
    out = tmp_path / "f4.onnx"
    r = qq.quantize_model(MODEL, out, cal, weights="float4e2m1", activations=None, promote=False).report
    with pytest.raises(Exception, match="NOT_IMPLEMENTED"):
        ort.InferenceSession(str(out))
    assert r.eval.backend == "onnxruntime+qlinear" and "DequantizeLinear" in r.eval.onnxruntime_error
    warned = [w for w in r.warnings if w.startswith("ONNX Runtime cannot load the quantized model")]
    assert len(warned) == 1 and "--weights int8" in warned[0]
    plain = qq.quantize_model(MODEL, None, cal, promote=False).report
    assert plain.eval.onnxruntime_error is None and not [w for w in plain.warnings if "cannot load" in w]


def test_an_input_with_a_fixed_batch_of_1_beside_open_ones_sets_the_batch():
    # A streaming model: audio frames at an open batch, a recurrent state declared (1, 8). Batches of 16 would feed
    # the state 16 rows, which ONNX Runtime refuses; the state's fixed 1 is the batch, and the report says why.
    rng = np.random.default_rng(0)
    g = qo.Graph("stateful", opset=17)
    x = g.input("audio", "float", ("N", 16))
    h = g.input("h", "float", (1, 8))
    y = g.op("Gemm", [x, rng.standard_normal((16, 8)).astype(np.float32), np.zeros(8, np.float32)], name="frame")
    g.output(g.op("Add", [g.op("Relu", [y], name="act"), h], name="state", output_names=["h_next"]))
    data = {"audio": rng.standard_normal((40, 16)).astype(np.float32), "h": rng.standard_normal((40, 8)).astype(np.float32)}
    r = qq.quantize_model(g.to_model(), None, data, promote=False).report
    assert r.calibration.batch_size == 1 and r.calibration.batch_fixed_by == "h"
    assert r.settings.batch_size == 1 and r.output.sqnr_db > 30
    plain = qq.quantize_model(MODEL, None, dict(np.load(CALIBRATION)), promote=False).report
    assert plain.calibration.batch_fixed_by is None


def test_an_input_of_fixed_shape_beside_an_open_batch_is_fed_whole():
    # Found by the graph fuzzer (grammar 10: a rank-1 input of fixed size beside an open batch): a per-feature offset
    # declared (8,) was read as 8 samples beside 24 of the data, and the run stopped ("arrays hold different numbers of
    # samples"). Such an input holds no samples: its array, of that shape, goes whole to every batch, and it fixes no
    # batch.
    rng = np.random.default_rng(0)
    g = qo.Graph("offset", opset=17)
    x = g.input("x", "float", ("N", 8))
    offset = g.input("offset", "float", (8,))
    y = g.op("Gemm", [g.op("Add", [x, offset]), rng.standard_normal((8, 4)).astype(np.float32), np.zeros(4, np.float32)])
    g.output(g.op("Relu", [y], name="act", output_names=["y"]))
    data = {"x": rng.standard_normal((24, 8)).astype(np.float32), "offset": rng.standard_normal(8).astype(np.float32)}
    r = qq.quantize_model(g.to_model(), None, data, promote=False).report
    assert r.calibration.batch_fixed_by is None and r.calibration.samples + r.eval.samples == 24
    assert r.output.sqnr_db > 30
    with pytest.raises(QuantizationError, match=r"array 'offset' has shape \(24, 8\), expected \(8,\): model input"):
        qq.quantize_model(g.to_model(), None, {**data, "offset": data["x"]}, promote=False)
    # The same beside a batch fixed at one (an exporter's batch of 1): the batch is that one's.
    fixed = g.to_model()
    fixed.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    r = qq.quantize_model(fixed, None, data, promote=False).report
    assert r.calibration.batch_fixed_by == "x" and r.calibration.batch_size == 1


def test_the_profile_gives_each_stage_in_order_and_they_add_up_to_the_run(capsys):
    start = time.perf_counter()
    r = qq.quantize_model(MODEL, None, CALIBRATION, eval=EVAL, analyze=True)
    wall = time.perf_counter() - start
    profile = r.report.profile
    assert [t.stage for t in profile] == [
        "load", "float rewrites", "calibrate", "build", "float reference", "meet the target", "refine", "finalize",
        "evaluate", "report", "write",
    ]  # fmt: skip
    total = sum(t.seconds for t in profile)
    # The stages cover the run: what is outside them (checking the arguments) is a small share of it.
    assert 0.9 * wall <= total <= wall
    assert all(t.seconds >= 0 and t.peak_rss_bytes > 0 for t in profile)
    assert all(sum(p.seconds for p in t.parts) <= t.seconds * 1.01 + 1e-3 for t in profile)
    calibrate = next(t for t in profile if t.stage == "calibrate")
    assert [p.name for p in calibrate.parts] == ["calibrating (samples)"]
    assert {p.name for t in profile for p in t.parts} >= {"analysing nodes", "evaluating"}
    # On Linux each stage's own peak, not the run's so far (read beside the process's peak, which stays as it is).
    assert {t.peak_since for t in profile} == {"stage"}
    # The JSON holds it; --profile prints it.
    assert qq.Report.from_json(r.report.to_json()).profile == profile


def test_the_profile_flag_prints_the_stages_and_keeps_json_on_stdout_alone(tmp_path, capsys):
    from qlinear.cli import main

    argv = ["quantize", MODEL, "-o", str(tmp_path / "q.onnx"), "--calibration", CALIBRATION, "--no-promote", "--profile"]
    assert main([*argv, "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "where the run's" in printed and "meet the target" in printed and "calibrating (samples)" in printed
    assert main([*argv, "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["profile"][0]["stage"] == "load" and "where the run's" in err


def test_progress_names_each_stage_from_its_first_second():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    qq.quantize_model(MODEL, None, CALIBRATION, console=console, progress=True, promote=False)
    shown = out.getvalue()
    for name in ("load", "calibrate", "meet the target", "evaluate"):
        assert name in shown, name


def test_a_shared_weight_with_a_float_reader_is_said_to_be_stored_twice():
    # One weight read by two MatMuls, one excluded: the float reader keeps the float copy beside the quantized one, and
    # the model grows. The warning says why, not that the Q/DQ outweigh the weights; with both quantized, it shrinks.
    from quantize_models import shared_weight

    model, data = shared_weight()
    r = qq.quantize_model(model, None, data, exclude=("mm2",), promote=False).report
    grew = [w for w in r.warnings if "larger than the float model" in w]
    assert r.size_bytes.after > r.size_bytes.before and len(grew) == 1
    assert "weight(s) W are read by quantized nodes and by nodes left float, so each is stored twice" in grew[0]
    both = qq.quantize_model(model, None, data, promote=False).report
    assert both.size_bytes.after < both.size_bytes.before / 3 and not [w for w in both.warnings if "larger" in w]
