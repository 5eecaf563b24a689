"""Targets: golden placements of ONNX Runtime's CPU provider (model in, nodes quantized, what each runs as), and passes."""

from __future__ import annotations

import dataclasses
from importlib import resources

import numpy as np
import pytest

import qlinear.quantize as qq
from qlinear._errors import QuantizationError
from qlinear.onnx._passes import FunctionPass, Pass, PassResult, Sequential
from qlinear.quantize.targets import DEFAULT_TARGET, TARGETS, target
from quantize_models import conv_batchnorm, dense_on_sequences, detection_head, gated_convs, layernorm_attention, squeeze_excite

DEMO = resources.files("qlinear.quantize") / "_demo"


def _digits():
    return str(DEMO / "digits_cnn.onnx"), dict(np.load(str(DEMO / "digits_calibration.npz")))


# The requested types everywhere (no promotion): every compute node quantized, and the kernel ONNX Runtime's CPU
# provider runs it as once it has fused the Q/DQ (read from its optimized graph).
ORT_CPU_GOLDEN = {
    "digits CNN": (_digits, {"conv1": "QLinearConv", "conv2": "QLinearConv", "fc1": "QGemm", "fc2": "QGemm"}),
    "attention with a written-out LayerNorm": (
        layernorm_attention,
        {
            "embed": "Gather (codes)",
            "q_proj": "QLinearMatMul",
            "k_proj": "QLinearMatMul",
            "v_proj": "QLinearMatMul",
            "scores": "MatMulIntegerToFloat",
            "context": "QLinearMatMul",
            "o_proj": "MatMulIntegerToFloat",
            "head": "QGemm",
        },
    ),
    "detection head": (detection_head, {"backbone": "QLinearConv", "box_fc": "QGemm", "cls_fc": "QGemm"}),
    "paddle squeeze-and-excitation": (
        lambda: squeeze_excite(paddle=True),
        {"conv0": "QLinearConv", "se1": "QLinearConv", "se2": "QLinearConv", "conv1": "QLinearConv", "fc": "QGemm"},
    ),
    "batch norms on two branches": (
        lambda: conv_batchnorm(branch=True),
        {"conv0": "QLinearConv", "conv1": "QLinearConv", "fc": "QGemm"},
    ),
    "HardSwish gates": (
        lambda: gated_convs("HardSwish"),
        {"conv0": "QLinearConv", "conv1": "QLinearConv", "conv2": "QLinearConv", "fc": "QGemm"},
    ),
    "dense layers on an input of open shape": (
        lambda: dense_on_sequences(("N", "T", 32)),
        {"fc1": "QGemm", "fc2": "QGemm", "head": "MatMulIntegerToFloat"},
    ),
}


@pytest.mark.parametrize("case", list(ORT_CPU_GOLDEN))
def test_ort_cpu_places_and_fuses_as_golden(case):
    make, runs_as = ORT_CPU_GOLDEN[case]
    model, data = make()
    r = qq.quantize_model(model, None, data, promote=False, target="ort-cpu").report
    assert {n.name: n.runs_as for n in r.nodes} == runs_as
    assert r.fusion.unfused == [] and r.left_float == []
    assert r.settings.target == "ort-cpu"


def test_the_default_target_is_onnx_runtimes_cpu_provider():
    assert DEFAULT_TARGET == "ort-cpu" and qq.QuantizeOptions().target == "ort-cpu"
    ort = target("ort-cpu")
    assert ort is TARGETS["ort-cpu"] and ort.providers == ("CPUExecutionProvider",)
    # Weight-only runs store a Gemm's weight untransposed, which only then fuses into MatMulNBits.
    assert "untranspose_gemm_weights" in ort.prepare(True).name and "untranspose" not in ort.prepare(False).name


def test_every_run_of_a_model_opens_the_targets_session(monkeypatch):
    # Calibration, the analysis, the search's candidates, the latency pairs, the refine stage's algorithms and the
    # evaluation all run on the target's runtime: every ONNX Runtime session of the run but the ones the ORT target's
    # own fusion check and rewrites open to read the optimized graph, and its own profiles (node_times, which the
    # search's costs read), comes from its session factory.
    import onnxruntime as ort

    ort_cpu = TARGETS["ort-cpu"]
    inside, opened, bypassed = [0], [], []
    real = ort.InferenceSession

    def counted(*args, **kwargs):
        options = args[1] if len(args) > 1 else kwargs.get("sess_options")
        if not inside[0] and not (options is not None and (options.optimized_model_filepath or options.enable_profiling)):
            bypassed.append(args[0] if isinstance(args[0], str) else "a model")
        return real(*args, **kwargs)

    def session(model, **kwargs):
        inside[0] += 1
        try:
            opened.append(kwargs)
            return ort_cpu.session(model, **kwargs)
        finally:
            inside[0] -= 1

    monkeypatch.setattr(ort, "InferenceSession", counted)
    monkeypatch.setitem(TARGETS, "ort-cpu", dataclasses.replace(ort_cpu, session=session))
    model, data = conv_batchnorm()
    r = qq.quantize_model(model, None, data, target_sqnr_db=60.0, empirical_bias_correction=True).report
    assert r.promotions is not None and r.latency_ms and "empirical_bias_correction" in r.algorithms  # they all ran
    assert bypassed == [] and len(opened) >= 6
    assert {"arena": False} in opened  # calibration's and the analysis' sessions keep no arena


def test_an_unknown_target_is_refused_naming_the_choices():
    with pytest.raises(QuantizationError, match=r"target must be one of ort-cpu, openvino, got 'tensorrt'"):
        qq.QuantizeOptions(target="tensorrt")
    with pytest.raises(QuantizationError, match="target must be one of ort-cpu, openvino"):
        target("tensorrt")


def test_a_sequence_of_passes_runs_in_order_and_says_whether_it_changed_the_model():
    seen = []

    def first(model):
        seen.append("first")
        model.append(1)
        return True

    def second(model):
        seen.append("second")
        return False

    after = []
    model: list = []
    result = Sequential(FunctionPass(first, after=after.append), FunctionPass(second, after=after.append))(model)
    assert seen == ["first", "second"] and result.model is model and result.modified
    assert after == [model]  # only the pass that changed the model ran its follow-up
    assert not Sequential(FunctionPass(second))(model).modified


def test_a_pass_checks_before_and_after_and_lets_user_errors_through():
    class Positive(Pass):
        def requires(self, model):
            if not model:
                raise QuantizationError("quantize: the model is empty")

        def call(self, model):
            model[0] = -model[0]
            return PassResult(model, True)

        def ensures(self, model):
            if model[0] < 0:
                raise ValueError("Positive: negative after the pass")

    with pytest.raises(QuantizationError, match="the model is empty"):
        Sequential(Positive())([])
    with pytest.raises(ValueError, match="negative after the pass"):
        Positive()([3])

    class Copies(Pass):
        def call(self, model):
            return PassResult(list(model), False)

    with pytest.raises(TypeError, match="the model it was given"):
        Copies()([1])
