"""The runtime's settings chosen by speed: MatMulNBits' accuracy level, kept where faster with the target still met."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import qlinear.quantize as qq
from qlinear.quantize._latency import Latency
from qlinear.quantize._run_settings import settings_where_faster
from qlinear.quantize._session import MATMUL_NBITS_ACCURACY_LEVEL, NBITS_LEVEL_KEY, nbits_level, session


def _layers(k: int = 256, n: int = 256) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"), helper.make_node("Relu", ["h"], ["y"], name="relu")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])],
        [numpy_helper.from_array((rng.standard_normal((k, n)) * k**-0.5).astype(np.float32), "w")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def _timings(*ratios: float):
    """A ``timed`` that gives these latency ratios over float, one a call, and the models it was called with."""
    calls, left = [], list(ratios)

    def timed(model: onnx.ModelProto, again: bool):
        calls.append((nbits_level(model), again))
        return (Latency(1, 1.0, left[0], left.pop(0)),)

    return timed, calls


def _level_4(model: onnx.ModelProto) -> None:
    model.metadata_props.add(key=NBITS_LEVEL_KEY, value="4")


def test_a_setting_is_kept_only_where_faster_twice_and_the_target_holds():
    model, trials = _layers(), [("level 4", _level_4)]
    timed, calls = _timings(1.0, 0.5, 0.52, 1.0)  # without, with, with again, without again
    writes, tried = settings_where_faster(model, trials, timed, lambda m: True)
    assert writes == [_level_4] and tried[0].kept and tried[0].before == 1.0 and tried[0].after == 0.5
    assert calls == [(0, False), (4, False), (4, True), (0, True)]
    timed, _ = _timings(1.0, 0.5, 0.99, 1.0)  # the second look is within the noise: not kept
    assert settings_where_faster(model, trials, timed, lambda m: True)[0] == []
    timed, _ = _timings(1.0, 0.5, 0.5, 1.0)
    writes, tried = settings_where_faster(model, trials, timed, lambda m: nbits_level(m) == 0)  # the target fails with it
    assert writes == [] and not tried[0].kept
    timed, calls = _timings(1.0, 0.99)  # no faster at the first look: not timed again
    assert settings_where_faster(model, trials, timed, lambda m: True)[0] == [] and len(calls) == 2


def test_sessions_run_a_model_at_the_level_its_metadata_says():
    q = qq.quantize_model(_layers(), None, weights="int4", activations=None, granularity="blocked").model
    x = {"x": np.random.default_rng(1).standard_normal((4, 256)).astype(np.float32)}
    marked = onnx.ModelProto()
    marked.CopyFrom(q)
    _level_4(marked)

    def ort_at(level: str) -> np.ndarray:
        so = ort.SessionOptions()
        so.add_session_config_entry(MATMUL_NBITS_ACCURACY_LEVEL, level)
        return ort.InferenceSession(q.SerializeToString(), so).run(None, x)[0]

    assert np.array_equal(session(q).run(None, x)[0], ort_at("0"))
    assert np.array_equal(session(marked).run(None, x)[0], ort_at("4"))
    assert not np.array_equal(ort_at("0"), ort_at("4"))  # level 4 quantizes the input: not the same bits


def test_a_weight_only_run_with_data_tries_level_4_and_the_model_says_what_it_was_measured_at(tmp_path):
    x = np.random.default_rng(2).standard_normal((32, 256)).astype(np.float32)
    for form in ("qdq", "matmulnbits"):
        r = qq.quantize_model(_layers(), None, {"x": x}, weights="int4", activations=None, granularity="blocked", format=form)
        (trial,) = r.report.run_settings
        assert trial.setting == "MatMulNBits accuracy level 4" and trial.after is not None
        level = nbits_level(r.model)
        assert level == (4 if trial.kept else 0)
        noted = any(MATMUL_NBITS_ACCURACY_LEVEL in w for w in r.report.warnings)
        assert noted == (form == "qdq" and level == 0)  # set level 0 where the model was measured there
        if form == "matmulnbits":
            node = next(n for n in r.model.graph.node if n.op_type == "MatMulNBits")
            assert next(a.i for a in node.attribute if a.name == "accuracy_level") == level
    r = qq.quantize_model(_layers(), None, {"x": x}, weights="int8", activations="uint8")
    assert r.report.run_settings == []  # nothing for it to set


def test_the_level_4_trial_runs_the_matmulnbits_form_at_level_4_and_keeps_the_models_metadata():
    from qlinear.quantize.targets import ORT_CPU

    model = _layers()
    model.metadata_props.add(key="author", value="them")
    q = qq.quantize_model(model, None, weights="int4", activations=None, granularity="blocked", format="matmulnbits").model
    ((setting, write),) = ORT_CPU.setting_trials(q)
    assert setting == "MatMulNBits accuracy level 4"
    trial = onnx.ModelProto()
    trial.CopyFrom(q)
    write(trial)
    node = next(n for n in trial.graph.node if n.op_type == "MatMulNBits")
    assert next(a.i for a in node.attribute if a.name == "accuracy_level") == 4  # the node's own, not only the session's
    assert ("author", "them") in [(p.key, p.value) for p in trial.metadata_props] and nbits_level(trial) == 4
    x = {"x": np.random.default_rng(3).standard_normal((4, 256)).astype(np.float32)}
    assert not np.array_equal(session(q).run(None, x)[0], session(trial).run(None, x)[0])  # timed as it differs
    assert ORT_CPU.setting_trials(trial) == []  # nothing left to try


def test_a_run_given_no_data_leaves_the_level_to_the_user_and_says_so():
    r = qq.quantize_model(_layers(), None, weights="int4", activations=None, granularity="blocked")
    (note,) = [w for w in r.report.warnings if MATMUL_NBITS_ACCURACY_LEVEL in w]
    assert "neither was measured" in note and "give data" in note
    assert nbits_level(r.model) == 0 and r.report.run_settings == []
