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
