"""--target openvino: QDQ models OpenVINO's CPU plugin runs as int8 kernels, judged on OpenVINO, standard ONNX still."""

from __future__ import annotations

import importlib.util
from importlib import resources

import numpy as np
import onnx
import pytest

import qlinear.quantize as qq
from qlinear._errors import QuantizationError
from qlinear.cli import main
from qlinear.quantize._session import session as ort_session
from qlinear.quantize.targets import openvino as ov_target

DEMO = resources.files("qlinear.quantize") / "_demo"


def test_the_digits_cnn_placed_for_openvino_runs_every_conv_and_gemm_as_an_int8_kernel(tmp_path):
    out = tmp_path / "q.onnx"
    r = qq.quantize_model(
        str(DEMO / "digits_cnn.onnx"), out, str(DEMO / "digits_calibration.npz"), eval=str(DEMO / "digits_eval.npz"),
        labels="label", target="openvino",
    )  # fmt: skip
    report = r.report
    assert report.settings.target == "openvino" and report.eval.backend == "openvino"
    assert report.fusion.checked and not report.fusion.unfused
    runs_as = {n.name: n.runs_as for n in report.nodes}
    assert runs_as and all(kernel.endswith("I8)") for kernel in runs_as.values()), runs_as  # integer kernels
    assert report.output.top1_agreement >= 0.99
    # Standard ONNX: ONNX Runtime loads it and agrees with what OpenVINO computed (both in f32).
    model = onnx.load(out)
    onnx.checker.check_model(model, full_check=True)
    x = dict(np.load(DEMO / "digits_eval.npz"))["image"][:64]
    on_ort = ort_session(model).run(None, {"image": x})[0]
    on_openvino = ov_target.session(model).run(None, {"image": x})[0]
    assert (on_ort.argmax(1) == on_openvino.argmax(1)).mean() >= 0.98


def test_weights_are_symmetric_int8_and_concat_is_no_integer_join():
    placement = ov_target.OPENVINO.placement
    assert placement.integer_weight_types == frozenset({"int8"})  # a zero point on a weight gives a float Conv
    assert "Concat" not in placement.integer_joins  # its inputs would need one shared scale
    assert ov_target.float_by_design("Conv", "int8", None).startswith("a weight-only Conv")
    assert ov_target.float_by_design("Conv", "int8", "uint16").startswith("16-bit activations")
    assert ov_target.float_by_design("Conv", "int8", "uint8") is None


def test_without_openvino_the_target_is_refused_before_any_work_naming_the_extra(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else real(name, *a))
    with pytest.raises(QuantizationError, match=r"target openvino needs OpenVINO: pip install 'qlinear\[openvino\]'"):
        qq.QuantizeOptions(target="openvino")
    out = tmp_path / "q.onnx"
    assert main(["quantize", "--demo", "-o", str(out), "--target", "openvino"]) == 2
    assert "pip install 'qlinear[openvino]'" in capsys.readouterr().err and not out.exists()


def test_a_model_openvino_cannot_read_is_one_line(tmp_path):
    bad = onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("NoSuchOp", ["x"], ["y"], domain="example.custom")], "g",
            [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
        ),
        opset_imports=[onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid("example.custom", 1)],
    )  # fmt: skip
    with pytest.raises(QuantizationError, match=r"^quantize: OpenVINO cannot load the model: ") as e:
        ov_target.session(bad)
    assert "\n" not in str(e.value)
    # An op its ONNX frontend cannot convert (a Conv whose input's rank is unknown, as in Silero VAD's decoder): the
    # line names the op and the first such node, not the C++ source line OpenVINO's message opens with.
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((2, 1, 3), np.float32), "w")
    unranked = helper.make_model(
        helper.make_graph(
            [helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w],
        ),
        opset_imports=[helper.make_opsetid("", 15)],
    )  # fmt: skip
    unranked.ir_version = 8
    with pytest.raises(QuantizationError) as e:
        ov_target.session(unranked)
    assert str(e.value).startswith("quantize: OpenVINO cannot load the model: its ONNX frontend cannot convert Conv")
    assert "the Conv writing y" in str(e.value) and "Exception from" not in str(e.value) and "\n" not in str(e.value)


def _attention_scores() -> tuple[onnx.ModelProto, dict]:
    """q = x Wq, k = x Wk, softmax(q k^T): a MatMul of two activations between two weighted ones."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal((64, 64)) * 0.1).astype(np.float32), n) for n in ("wq", "wk")]
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q"),
        helper.make_node("MatMul", ["x", "wk"], ["k"], name="k"),
        helper.make_node("Transpose", ["k"], ["kt"], name="kt", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
        helper.make_node("Softmax", ["s"], ["y"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16, 16])], weights,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model, {"x": rng.standard_normal((64, 16, 64)).astype(np.float32)}


def test_a_matmul_of_two_activations_takes_its_first_input_symmetric_and_runs_int8(monkeypatch):
    import dataclasses

    from qlinear.quantize.targets import TARGETS

    model, data = _attention_scores()
    r = qq.quantize_model(model, None, data, target="openvino", promote=False)
    scores = next(n for n in r.report.nodes if n.name == "scores")
    assert scores.activation_type == "int8" and scores.runs_as.lower().endswith("i8)"), scores
    q_scale = next(t for t in r.model.graph.initializer if t.name == "q_zp")
    assert not onnx.numpy_helper.to_array(q_scale).any()  # zero point 0
    # Without the rule the first input is asymmetric uint8, and OpenVINO runs the MatMul in float.
    unsigned = dataclasses.replace(ov_target.OPENVINO.placement, signed_matmul_inputs=False)
    monkeypatch.setitem(TARGETS, "openvino", dataclasses.replace(ov_target.OPENVINO, placement=unsigned))
    r = qq.quantize_model(model, None, data, target="openvino", promote=False)
    scores = next(n for n in r.report.nodes if n.name == "scores")
    assert scores.activation_type == "uint8" and not scores.runs_as.lower().endswith("i8)"), scores
    # ONNX Runtime's placement is unchanged: its MatMulIntegerToFloat takes zero points.
    r = qq.quantize_model(model, None, data, promote=False)
    assert next(n for n in r.report.nodes if n.name == "scores").activation_type == "uint8"


def _box_and_class_convs() -> tuple[onnx.ModelProto, dict]:
    """A detector head's end: a shared Conv + Relu, then a box Conv and a class Conv whose outputs a Concat joins."""
    import qlinear.onnx as qo

    rng = np.random.default_rng(0)
    w = lambda *shape: (rng.standard_normal(shape) * 0.3).astype(np.float32)  # noqa: E731
    g = qo.Graph("head", opset=17)
    x = g.input("x", "float", ("N", 3, 8, 8))
    h = g.op("Relu", [g.op("Conv", [x, w(8, 3, 3, 3), w(8)], name="stem", pads=[1, 1, 1, 1])], name="stem_relu")
    box = g.op("Conv", [h, w(16, 8, 1, 1), w(16)], name="box")
    cls = g.op("Conv", [h, w(4, 8, 1, 1), w(4)], name="cls")
    both = g.op("Concat", [box, cls], name="join", axis=1)
    g.output(g.op("Reshape", [both, np.array([0, 20, -1], np.int64)], name="flat", output_names=["y"]))
    return g.to_model(), {"x": rng.standard_normal((64, 3, 8, 8)).astype(np.float32)}


def test_a_conv_output_is_quantized_only_where_a_reader_takes_it_quantized():
    # OpenVINO's int8 Conv dequantizes its own result. A Q on an output only a float op reads (a detector's box
    # Conv before the Concat with its class scores) bought nothing there, and on YOLOv8n's head OpenVINO computed
    # such Q/DQ files at 12 dB against the float model where ONNX Runtime computed them at 40 dB.
    model, data = _box_and_class_convs()
    r = qq.quantize_model(model, None, data, target="openvino", promote=False)
    quantized = {n.input[0] for n in r.model.graph.node if n.op_type == "QuantizeLinear"}
    outputs = {n.name: n.output[0] for n in r.model.graph.node if n.op_type == "Conv"}
    assert outputs["box"] not in quantized and outputs["cls"] not in quantized
    relu = next(n.output[0] for n in r.model.graph.node if n.op_type == "Relu")
    assert relu in quantized  # what the box and class Convs read quantized
    assert {n.name: n.runs_as.lower().endswith("i8)") for n in r.report.nodes} == {"stem": True, "box": True, "cls": True}
    on_ort = ort_session(r.model).run(None, {"x": data["x"][:8]})[0]
    on_openvino = ov_target.session(r.model).run(None, {"x": data["x"][:8]})[0]
    # The two runtimes round a requantization of the stem apart by a code at times, not more.
    error = float(((on_openvino - on_ort) ** 2).sum() / (on_ort**2).sum())
    assert error < 1e-4, 10 * np.log10(1 / error)  # over 40 dB
    # ONNX Runtime's QLinearConv needs the Q on each Conv's output.
    r = qq.quantize_model(model, None, data, promote=False)
    quantized = {n.input[0] for n in r.model.graph.node if n.op_type == "QuantizeLinear"}
    outputs = {n.name: n.output[0] for n in r.model.graph.node if n.op_type == "Conv"}
    assert outputs["box"] in quantized and outputs["cls"] in quantized


def test_statistics_saved_for_one_target_quantize_for_the_other_without_calibrating(tmp_path):
    # One calibration, many targets: the statistics of a run placed for ONNX Runtime hold every tensor OpenVINO's
    # placement quantizes, and give the scales a calibration on OpenVINO gives (its float arithmetic apart).
    stats = tmp_path / "stats.npz"
    settings = dict(eval=str(DEMO / "digits_eval.npz"), bias_correction=False, promote=False)
    qq.quantize_model(str(DEMO / "digits_cnn.onnx"), None, str(DEMO / "digits_calibration.npz"), save_stats_to=stats, **settings)
    from_stats = qq.quantize_model(str(DEMO / "digits_cnn.onnx"), None, None, stats=stats, target="openvino", **settings)
    calibrated = qq.quantize_model(
        str(DEMO / "digits_cnn.onnx"), None, str(DEMO / "digits_calibration.npz"), target="openvino", **settings
    )
    assert from_stats.report.calibration.from_stats == str(stats) and from_stats.report.settings.target == "openvino"

    def scales(r):
        return {t.name: onnx.numpy_helper.to_array(t) for t in r.model.graph.initializer if t.name.endswith("_scale")}

    got, want = scales(from_stats), scales(calibrated)
    assert got.keys() == want.keys() and got
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, err_msg=name)


@pytest.mark.timed  # the speed trials as shipped: what they read is checked, not what they decide
def test_the_plugins_counters_give_each_node_its_time_and_the_speed_trials_read_them():
    # A kernel's time counts to the ONNX node it took in (a Conv with its Relu, a MatMul with its bias Add): the
    # speed trials' bound on what floating a kind of node could save, as ONNX Runtime's profile gives it there.
    model = onnx.load(str(DEMO / "digits_cnn.onnx"))
    x = dict(np.load(DEMO / "digits_eval.npz"))["image"]
    profiled = ov_target.node_times(model, [{"image": x[:1]}, {"image": x[:16]}])
    assert profiled is not None and len(profiled) == 2
    names = {n.name for n in model.graph.node}
    for times, run in profiled:
        assert times["conv1"] > 0 and times["conv2"] > 0 and times["fc1"] > 0 and 0 < sum(times.values()) <= 1.5 * run
        assert all(name in names or "Reorder" in name or "_acdb" in name or "_abcd" in name for name in times), times
    r = qq.quantize_model(str(DEMO / "digits_cnn.onnx"), None, str(DEMO / "digits_calibration.npz"), target="openvino")
    assert r.report.float_where_faster and all(f.share is not None for f in r.report.float_where_faster)


def test_bfloat16_tensors_go_in_and_out_exactly():
    # The plugin's Python API hands bfloat16 tensors over as float16 arrays of their bits, both ways: fed a
    # bfloat16 array as it is, the model computed on float16 bits read as bfloat16 (1.5 came in as 0.125).
    import ml_dtypes
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2, 3])],
        [helper.make_tensor_value_info(n, TensorProto.BFLOAT16, [2, 3]) for n in ("y", "z")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    model.ir_version = 10
    x = np.array([[1.5, -2, 3e30], [1e-30, 1e5, -1]], ml_dtypes.bfloat16)  # past float16's range, and under it
    y, z = ov_target.session(model).run(None, {"x": x})
    assert y.dtype == z.dtype == ml_dtypes.bfloat16
    assert y.tobytes() == np.maximum(x, 0).tobytes() and z.tobytes() == (-x).tobytes()


def test_a_model_onnx_runtime_cannot_load_is_said_where_it_ran_on_openvino(tmp_path):
    # Found by the graph fuzzer run with --target openvino: a bfloat16 model ran on OpenVINO (it had raised a type
    # error in the analysis, fed float16), and its result, which ONNX Runtime has no bfloat16 Resize for, was
    # written without a word. The output is standard ONNX a user may check anywhere: what ONNX Runtime cannot load
    # is said.
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from graph_fuzz import fuzz_case

    case = fuzz_case(25, grammar=11)
    r = qq.quantize_model(case.model, None, case.data, eval=case.data, **{**case.options, "target": "openvino"})
    assert r.report.eval.backend == "openvino"
    (said,) = [w for w in r.report.warnings if w.startswith("ONNX Runtime cannot load the quantized model (")]
    assert "it runs on OpenVINO, where its figures were measured" in said
