"""Weight-only quantization given no data: the weights rounded and written; what needs data refused before any work."""

from __future__ import annotations

from importlib import resources

import pytest

import qlinear.quantize as qq
from qlinear._errors import QuantizationError
from qlinear.cli import main

DEMO = resources.files("qlinear.quantize") / "_demo"
MODEL, CALIBRATION = str(DEMO / "digits_cnn.onnx"), str(DEMO / "digits_calibration.npz")
INT4 = {"activations": None, "weights": "int4", "granularity": "blocked", "block_size": 16}


def test_weights_are_rounded_as_with_data_and_the_report_says_nothing_was_judged(tmp_path):
    r = qq.quantize_model(MODEL, tmp_path / "q.onnx", **INT4)
    # The same rounding as a run given data with nothing that reads it: byte for byte.
    given = qq.quantize_model(MODEL, None, CALIBRATION, promote=False, gptq=False, awq=False, bias_correction=False, **INT4)
    assert r.model.SerializeToString(deterministic=True) == given.model.SerializeToString(deterministic=True)
    assert (tmp_path / "q.onnx").exists() and r.target_met
    report = r.report
    assert report.decision.faster is None and report.decision.target_met is None
    assert "no accuracy target was checked" in report.decision.line and "--calibration" in report.decision.line
    assert any(w.startswith("no data was given") for w in report.warnings)
    assert report.eval.samples == 0 and report.latency_ms == [] and report.promotions is None
    assert report.calibration.method is None and {n.weight_type for n in report.nodes} == {"int4"}
    assert [t.stage for t in report.profile] == ["load", "float rewrites", "build", "finalize", "report", "write"]


@pytest.mark.parametrize(
    ("asked", "named"),
    [
        ({"gptq": True}, "gptq"),
        ({"target_sqnr_db": 30.0}, "target_sqnr_db"),
        ({"latency_budget": 0.8}, "latency_budget"),
        ({"finetune": 10}, "finetune"),
        ({"awq": True}, "awq"),
        ({"bias_correction": True}, "bias_correction"),
    ],
)
def test_what_needs_data_is_refused_before_any_work_naming_it(tmp_path, asked, named):
    with pytest.raises(QuantizationError, match=rf"^quantize: {named} needs data, and none was given: give calibration data"):
        qq.quantize_model(MODEL, tmp_path / "q.onnx", **{**INT4, **asked})
    assert list(tmp_path.iterdir()) == []


def test_an_algorithm_that_reads_no_data_runs_without_it():
    from quantize_models import single_op

    model, _ = single_op("Conv")  # a Relu then a Conv: no pair to equalize, but equalization is not refused
    r = qq.quantize_model(model, None, activations=None, equalize=True)
    assert r.report.settings.equalize and r.report.equalized == []


def test_the_command_needs_no_data_for_weights_alone(tmp_path, capsys):
    out = tmp_path / "q.onnx"
    assert (
        main(["quantize", MODEL, "-o", str(out), "--activations", "none", "--weights", "int4", "--granularity", "blocked"]) == 0
    )
    printed = " ".join(capsys.readouterr().out.split())
    assert out.exists() and "not measured (no data)" in printed and "no accuracy target was checked" in printed
    assert main(["quantize", MODEL, "-o", str(tmp_path / "g.onnx"), "--activations", "none", "--gptq"]) == 2
    err = capsys.readouterr().err
    assert "--gptq needs data, and none was given" in err and "--calibration" in err and len(err.strip().splitlines()) == 1
    # Quantized activations need calibration data: the message says weight-only needs none.
    assert main(["quantize", MODEL, "-o", str(tmp_path / "a.onnx")]) == 2
    assert "weight-only quantization (activations none) needs none" in capsys.readouterr().err


def test_narrow_signed_weights_beside_float_activations_take_a_zero_point():
    # int4 blocks beside float activations are stored with a zero point (a block's range is rarely centred on 0, and
    # 16 levels are few to leave half a side unused); ONNX Runtime still runs them as MatMulNBits. Beside integer
    # activations and at 8 bits, signed weights stay symmetric, as its integer kernels take them.
    import numpy as np
    from onnx import helper, numpy_helper

    import qlinear

    rng = np.random.default_rng(0)
    w = (rng.normal(0, 0.05, (128, 64)) + rng.uniform(-0.05, 0.05, (4, 64)).repeat(32, axis=0)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")], "g",
        [helper.make_tensor_value_info("x", 1, ["N", 128])], [helper.make_tensor_value_info("y", 1, ["N", 64])],
        [numpy_helper.from_array(w, "w")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10

    def stored(r) -> tuple[np.ndarray | None, float]:
        inits = {t.name: numpy_helper.to_array(t) for t in r.model.graph.initializer}
        dq = next(n for n in r.model.graph.node if n.op_type == "DequantizeLinear" and n.input[0].startswith("w_"))
        codes = qlinear.dtypes.from_tensor_proto(next(t for t in r.model.graph.initializer if t.name == dq.input[0]))
        zp = inits[dq.input[2]] if len(dq.input) > 2 else None
        attrs = {a.name: helper.get_attribute_value(a) for a in dq.attribute}
        back = qlinear.dequantize_linear(
            codes, inits[dq.input[1]], zp, axis=attrs.get("axis", 1), block_size=attrs.get("block_size", 0)
        )
        return zp, 10 * np.log10((w**2).sum() / ((w - back) ** 2).sum())

    weight_only = qq.quantize_model(model, None, **INT4)
    zp, _ = stored(weight_only)
    assert zp is not None and np.any(zp != 0) and weight_only.report.nodes[0].runs_as == "MatMulNBits"
    # Per channel (a blocked MatMul keeps float activations on this target): beside uint8 activations, symmetric.
    per_channel = {"activations": None, "weights": "int4", "granularity": "per-channel"}
    zp_w, db_w = stored(qq.quantize_model(model, None, **per_channel))
    x = {"x": rng.normal(0, 1, (64, 128)).astype(np.float32)}
    beside_uint8 = qq.quantize_model(model, None, x, **{**per_channel, "activations": "uint8", "promote": False})
    zp_a, db_a = stored(beside_uint8)
    assert beside_uint8.report.nodes[0].activation_type == "uint8"
    assert np.any(zp_w != 0) and (zp_a is None or not np.any(zp_a)) and db_w > db_a + 1
    eight = qq.quantize_model(model, None, **{**INT4, "weights": "int8"})
    assert (zp8 := stored(eight)[0]) is None or not np.any(zp8)
