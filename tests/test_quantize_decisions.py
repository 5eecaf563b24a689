"""Probabilities judged by the decisions they carry: which outputs are, the F1 of the scores above 0.5, the default target."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import qlinear.onnx as qo
import qlinear.quantize as qq
from qlinear.quantize._decisions import FEWEST_DECISIONS, THRESHOLD, sigmoid_scores
from quantize_models import detection_head, layernorm_attention


def _probability_map(*, reshaped: bool = False):
    """A text detector's shape: Conv, Relu, Conv to one channel, Sigmoid: a probability a pixel."""
    rng = np.random.default_rng(0)
    g = qo.Graph("detector", opset=17)
    h = g.input("x", "float", ("N", 3, 16, 16))
    h = g.op("Relu", [g.op("Conv", [h, (rng.standard_normal((8, 3, 3, 3)) * 0.4).astype(np.float32)], name="c0", pads=[1] * 4)])
    h = g.op(
        "Conv", [h, (rng.standard_normal((1, 8, 3, 3)) * 0.4).astype(np.float32), np.float32([-0.5])], name="c1", pads=[1] * 4
    )
    h = g.op("Sigmoid", [h], name="probability")
    if reshaped:
        h = g.op("Reshape", [h, np.array([0, -1], np.int64)], name="flat")
    g.output(g.op("Identity", [h], name="out", output_names=["map"]))
    return g.to_model(), {"x": rng.standard_normal((64, 3, 16, 16)).astype(np.float32)}


def test_probabilities_are_outputs_a_sigmoid_makes():
    model, _ = _probability_map()
    assert sigmoid_scores(model, model.graph.output[0].name)
    model, _ = _probability_map(reshaped=True)
    assert sigmoid_scores(model, model.graph.output[0].name)  # through a reshape
    boxes_and_scores, _ = detection_head()  # a Concat of boxes and scores: judged by its parts' SQNR
    assert not sigmoid_scores(boxes_and_scores, boxes_and_scores.graph.output[0].name)
    classes, _ = layernorm_attention()
    assert not sigmoid_scores(classes, classes.graph.output[0].name)


def _f1_by_hand(float_model, quantized, feeds) -> float:
    want = ort.InferenceSession(float_model.SerializeToString()).run(None, feeds)[0] > THRESHOLD
    got = ort.InferenceSession(quantized.SerializeToString()).run(None, feeds)[0] > THRESHOLD
    return 2 * np.count_nonzero(want & got) / (np.count_nonzero(want) + np.count_nonzero(got))


def test_a_probability_output_is_judged_by_its_decisions_by_default():
    model, data = _probability_map()
    r = qq.quantize_model(model, None, data, eval={"x": data["x"][48:]}, max_float=1.0)
    target = r.report.promotions.target
    assert target.metric == "decisions" and target.value == qq.DEFAULT_AGREEMENT
    assert target.text == "decisions kept >= 99.00% (F1 of the scores above 0.5)"
    kept = r.report.output.decisions_kept
    assert kept == pytest.approx(_f1_by_hand(model, r.model, {"x": data["x"][48:]}), abs=1e-12)
    # 8 bits alone keep fewer than 99% of the decisions; the search promotes until they hold.
    assert r.report.promotions.before < 0.99 <= r.report.promotions.after == kept and r.target_met
    assert "target met (decisions kept >= 99.00%" in r.report.decision.line


def test_an_sqnr_target_given_for_probabilities_is_kept():
    model, data = _probability_map()
    r = qq.quantize_model(model, None, data, target_sqnr_db=20)
    assert r.report.promotions.target.metric == "sqnr" and r.report.output.decisions_kept is not None


def _branches(else_op: str):
    """Silero VAD's shape: a Sigmoid in the main graph, an If whose branches pass it on, then a mean over frames."""
    from onnx import TensorProto, helper, numpy_helper

    def branch(name, op, source):
        node = (
            helper.make_node(op, [source], [f"{name}_out"])
            if op != "Squeeze"
            else helper.make_node("Squeeze", [source, "axis"], [f"{name}_out"])
        )
        return helper.make_graph([node], name, [], [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, None)])

    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["logits"]),
        helper.make_node("Sigmoid", ["logits"], ["p"]),
        helper.make_node("If", ["flag"], ["picked"], then_branch=branch("then", "Identity", "p"),
                         else_branch=branch("else", else_op, "logits")),
        helper.make_node("ReduceMean", ["picked"], ["mean"], axes=[1], keepdims=0),
        helper.make_node("Unsqueeze", ["mean", "axis"], ["output"]),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes, "branches",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]), helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.ones((4, 3), np.float32), "w"), numpy_helper.from_array(np.array([1], np.int64), "axis")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_probabilities_passed_on_by_both_branches_of_an_if_and_averaged():
    assert sigmoid_scores(_branches("Sigmoid"), "output")  # each branch: the outer Sigmoid's, or its own
    assert not sigmoid_scores(_branches("Relu"), "output")  # one branch passes logits on: not probabilities


def test_too_few_positive_decisions_to_judge_99_percent_leave_the_output_to_its_sqnr():
    # Eight samples of 256 pixels, the map's bias pushed down: fewer than 100 scores above 0.5 in all.
    model, data = _probability_map()
    bias = next(t for t in model.graph.initializer if t.dims == [1])
    bias.CopyFrom(onnx.numpy_helper.from_array(np.float32([-6.0]), bias.name))
    few = {"x": data["x"][:8] * 0.5}
    want = ort.InferenceSession(model.SerializeToString()).run(None, few)[0]
    assert 0 < np.count_nonzero(want > THRESHOLD) < FEWEST_DECISIONS
    r = qq.quantize_model(model, None, data, eval=few)
    assert r.report.promotions.target.metric == "sqnr"
    assert r.report.output.decisions_kept is not None  # still reported
