"""Per-node analysis and mixed precision to a target: the ladder, the search, and a model with one fragile node."""

from __future__ import annotations

import math

import numpy as np
import pytest

import qlinear.onnx as qo
import qlinear.quantize as qq
from qlinear._errors import QuantizationError
from qlinear.dtypes import element_type
from qlinear.quantize._cheaper_search import COST_FLOOR, cheapest_first, predicted_cost, search_cheaper
from qlinear.quantize._precision import (
    ACTIVATION_PROMOTION,
    FLOAT,
    FULL_LADDER,
    WEIGHT_PROMOTION,
    Ladder,
    NodePrecision,
    candidate_steps,
    next_step,
    reachable,
    wider_activation,
)
from qlinear.quantize._promotion import PRUNE_TRIALS, AccuracyTarget, Promotion, promotion_steps, search
from qlinear.quantize._sensitivity import NodeSensitivity, most_sensitive_first
from quantize_models import outlier_mlp

W2_A8 = NodePrecision("int2", "uint8")


def test_the_ladder_widens_the_worse_side_then_goes_float():
    assert next_step(W2_A8, weight_db=3.0, activation_db=40.0) == NodePrecision("int4", "uint8")
    assert next_step(W2_A8, weight_db=40.0, activation_db=3.0) == NodePrecision("int2", "uint16")
    assert next_step(W2_A8, weight_db=10.0, activation_db=10.0).weights == "int4"  # weights first on a tie
    assert next_step(NodePrecision("int8", "int8"), 50.0, 20.0) == NodePrecision("int8", "int16")
    assert next_step(NodePrecision("int8", "uint16"), 50.0, 60.0) == FLOAT
    assert next_step(FLOAT, None, None) == FLOAT
    # Weight-only: 2 -> 4 -> 8 bits, then float; an exact side (None) is never the one widened first.
    p, seen = NodePrecision("uint2", None), []
    while p.quantized:
        p = next_step(p, 10.0, None)
        seen.append(p.describe())
    assert seen == ["w uint4 / a float", "w uint8 / a float", "float"]
    assert candidate_steps(NodePrecision("float4e2m1", "uint8"), 30.0, None)[0].weights == "float8e4m3fn"
    assert wider_activation("uint8", "uint16") == "uint16" and wider_activation("int16", "uint8") == "int16"
    assert wider_activation("float8e4m3fn", "int8") == "float8e4m3fn"  # a tie: the first


# The bit widths the search and the ladder were written with before they read them from qlinear.dtypes.
LADDER_BITS = {
    "int2": 2, "uint2": 2, "int4": 4, "uint4": 4, "float4e2m1": 4, "float8e4m3fn": 8, "float8e5m2": 8,
    "int8": 8, "uint8": 8, "int16": 16, "uint16": 16,
}  # fmt: skip


def test_ladder_bits_from_dtypes():
    assert {t: element_type(t).bits for t in LADDER_BITS} == LADDER_BITS
    ladders = {**WEIGHT_PROMOTION, **ACTIVATION_PROMOTION}
    assert set(ladders) | set(ladders.values()) <= set(LADDER_BITS)


def test_a_node_without_weight_widens_its_activations_and_a_broken_output_ranks_first():
    p = NodePrecision(None, "uint8")  # an activation x activation MatMul
    assert (
        next_step(p, None, 30.0) == NodePrecision(None, "uint16")
        and next_step(NodePrecision(None, "uint16"), None, 60.0) == FLOAT
    )
    assert NodePrecision(None, "uint16").describe() == "a uint16"
    assert next_step(W2_A8, float("nan"), 3.0).weights == "int4"  # NaN: the worst side
    figures = {n: NodeSensitivity(n, db, None, None) for n, db in (("a", 20.0), ("b", float("nan")), ("c", None), ("d", 5.0))}
    assert most_sensitive_first(figures) == ["b", "d", "a", "c"]


def _figures(dbs):
    return {n: NodeSensitivity(n, db, 10.0, 40.0) for n, db in dbs.items()}


def test_steps_go_in_rounds_most_sensitive_first_with_a_cap_on_float():
    figures = _figures({"a": 30.0, "b": 5.0, "c": 12.0})
    ranking = most_sensitive_first(figures)
    assert ranking == ["b", "c", "a"]
    start = dict.fromkeys(ranking, W2_A8)
    steps = promotion_steps(ranking, start, figures, max_float=1)
    # Round one widens each node's weights (their SQNR is the lower), most sensitive first.
    assert [(s.node, s.after.weights) for s in steps[:3]] == [("b", "int4"), ("c", "int4"), ("a", "int4")]
    assert sum(not s.after.quantized for s in steps) == 1 and next(s for s in steps if not s.after.quantized).node == "b"
    # Each step starts where the node's previous one ended.
    last = dict(start)
    for s in steps:
        assert s.before == last[s.node]
        last[s.node] = s.after
    # A type the opset cannot hold is passed over.
    no16 = promotion_steps(ranking, start, figures, max_float=0, allows=lambda t: t != "uint16")
    assert all(s.after.activations != "uint16" for s in no16) and all(s.after.quantized for s in no16)


def test_steps_climb_only_the_ladder_given():
    # A target whose runtime gains nothing from 16-bit activations gives a ladder without them: an activation that
    # must widen sends its node to float instead.
    figures = {"a": NodeSensitivity("a", 5.0, 40.0, 5.0)}  # the activation side is the weak one
    start = {"a": NodePrecision("int8", "uint8")}
    full = promotion_steps(["a"], start, figures, max_float=1)
    assert [s.after for s in full] == [NodePrecision("int8", "uint16"), FLOAT]
    no16 = Ladder(weights=FULL_LADDER.weights, activations={})
    assert [s.after for s in promotion_steps(["a"], start, figures, max_float=1, ladder=no16)] == [FLOAT]
    assert candidate_steps(NodePrecision("int4", "uint8"), 5.0, 3.0, no16) == [NodePrecision("int8", "uint8"), FLOAT]


def test_reachable_is_every_pair_of_types_the_two_sides_climb_to_widest_first():
    # Calibration observes the tensors of each of these, so no promotion meets a tensor without statistics.
    w2 = NodePrecision("int2", "uint8")
    assert reachable(w2, FULL_LADDER) == [NodePrecision(w, a) for w in ("int8", "int4", "int2") for a in ("uint16", "uint8")]
    no16 = Ladder(weights=FULL_LADDER.weights, activations={})
    assert reachable(w2, no16) == [NodePrecision("int8", "uint8"), NodePrecision("int4", "uint8"), w2]
    assert reachable(NodePrecision("int4", None), no16) == [NodePrecision("int8", None), NodePrecision("int4", None)]
    assert reachable(NodePrecision("float4e2m1", "float8e4m3fn"), FULL_LADDER)[0] == NodePrecision("int8", "int16")
    assert reachable(NodePrecision("int8", "uint16"), FULL_LADDER) == [NodePrecision("int8", "uint16")]


def _steps(nodes):
    return [Promotion(n, NodePrecision("int8", "uint8"), NodePrecision("int8", "uint16")) for n in nodes]


def test_search_takes_the_shortest_prefix_in_few_evaluations():
    steps = _steps([f"n{k}" for k in range(40)])
    calls = []

    def measure(precision):  # a figure that grows with the number of nodes promoted
        calls.append(frozenset(precision.items()))
        return len(precision) / 40

    found = search(steps, 0.0, AccuracyTarget("agreement", 0.55), measure)
    assert found.met and len(found.promotions) == 22 and math.isclose(found.figure, 22 / 40)
    # Doubling then halving, then one trial a promoted node (none can go here), at most PRUNE_TRIALS.
    assert found.evaluations == len(calls) <= 2 * math.ceil(math.log2(40)) + 2 + PRUNE_TRIALS
    # No assignment is evaluated twice: dropping the last node is the prefix one short, already judged.
    assert len(set(calls)) == len(calls) == len(found.tried) - 1 + PRUNE_TRIALS - 1
    assert found.promotions[-1].measured and found.promotions[-1].figure == found.figure
    # Met at the requested types: nothing promoted, nothing evaluated.
    assert search(steps, 0.9, AccuracyTarget("agreement", 0.55), measure).promotions == []


def test_search_drops_promotions_the_target_holds_without():
    steps = _steps(["fragile", "b", "c", "d"])

    def measure(precision):  # only the fragile node matters
        return 0.999 if "fragile" in precision else 0.5

    found = search(steps, 0.5, AccuracyTarget("agreement", 0.99), measure)
    assert found.met and [p.node for p in found.promotions] == ["fragile"]
    # Every assignment evaluated, prefixes and prune trials alike, is kept for a later search to read.
    assert len(found.judged) == found.evaluations + 1 and found.judged[frozenset(found.precision.items())] == 0.999


def test_search_that_cannot_reach_the_target_keeps_the_best_found():
    steps = _steps(["a", "b", "c"])
    figures = {0: 10.0, 1: 14.0, 2: 19.0, 3: 17.0}
    found = search(steps, 10.0, AccuracyTarget("sqnr", 30.0), lambda p: figures[len(p)])
    assert not found.met and len(found.promotions) == 2 and found.figure == 19.0


def test_cheapest_first_ranks_by_the_noise_a_node_adds_over_its_cost_in_float():
    figures = _figures({"conv": 20.0, "dense0": 30.0, "dense1": 26.0, "exact": None, "broken": float("nan")})
    ranking = most_sensitive_first(figures)
    assert ranking == ["broken", "conv", "dense1", "dense0", "exact"]
    # The conv adds the most noise (1e-2 of the output's power) but costs a third of the run in float; the dense
    # layers add 1e-3 and 2.5e-3 for 1% and nothing (the floor). A node that broke the output alone stays first.
    costs = {"conv": 0.34, "dense0": 0.01, "dense1": -0.02, "exact": 0.0, "broken": 0.5}
    assert cheapest_first(ranking, figures, costs) == ["broken", "dense1", "dense0", "conv", "exact"]
    # A cost below the floor, or one the profile did not give, ranks as the floor: the sensitivity decides.
    cheap = {"conv": COST_FLOOR / 10, "dense1": -1.0}
    assert cheapest_first(ranking, figures, cheap) == ranking
    # Equal ratios keep the sensitivity order.
    same = _figures({"a": 20.0, "b": 20.0})
    assert cheapest_first(["b", "a"], same, {}) == ["b", "a"]


def _floats(nodes):
    return [Promotion(n, NodePrecision("int8", "uint8"), FLOAT) for n in nodes]


def _both(cheap, steps, start, target, measure, costs):
    """The search on ``steps``, then :func:`search_cheaper` after it, as the quantizer runs them."""
    return search_cheaper(search(steps, start, target, measure), cheap, steps, target, measure, costs)


def test_search_takes_a_cheaper_set_that_meets_the_target():
    steps, cheap = _floats(["conv", "dense"]), _floats(["dense", "conv"])
    costs = {"conv": 0.3, "dense": 0.01}
    calls = []

    def measure(precision):  # either node in float alone meets the target
        calls.append(frozenset(precision))
        return 0.995 if precision else 0.98

    found, taken = _both(cheap, steps, 0.98, AccuracyTarget("agreement", 0.99), measure, costs)
    assert found.met and found.order == "cost" and taken is cheap and [p.node for p in found.promotions] == ["dense"]
    # The sensitivity order's {conv} first, then the cheap list's {dense}: each judged once, both counted.
    assert found.evaluations == len(calls) == len(set(calls)) == 2
    assert predicted_cost(found.promotions, costs) == 0.01 and predicted_cost(_steps(["conv"]), costs) == 0.0


def test_the_sensitivity_result_stands_where_no_cheaper_set_meets_the_target():
    # Only the conv fixes the output; the cheap list's prefixes that cost less hold the dense layer alone.
    steps, cheap = _floats(["conv", "dense"]), _floats(["dense", "conv"])
    costs = {"conv": 0.3, "dense": 0.01}
    calls = []

    def measure(precision):
        calls.append(frozenset(precision))
        return 0.995 if "conv" in precision else 0.98

    found, taken = _both(cheap, steps, 0.98, AccuracyTarget("agreement", 0.99), measure, costs)
    assert found.met and found.order == "sensitivity" and taken is steps and [p.node for p in found.promotions] == ["conv"]
    assert found.evaluations == len(calls) == 2 and set(calls) == {frozenset({"conv"}), frozenset({"dense"})}
    # No cheaper prefix (each node costs about the same): the sensitivity search alone, no evaluation more.
    calls.clear()
    found, _ = _both(cheap, steps, 0.98, AccuracyTarget("agreement", 0.99), measure, {"conv": 0.01, "dense": 0.01})
    assert found.order == "sensitivity" and found.evaluations == len(calls) == 1
    # A cheap prefix whose nodes together cost less, but whose search ends on the first result's node: that stands.
    calls.clear()
    steps, faster = _floats(["conv", "a", "b"]), {"conv": -0.03, "a": -0.05, "b": 0.01}
    found, taken = _both(_floats(["conv", "a"]), steps, 0.98, AccuracyTarget("agreement", 0.99), measure, faster)
    assert found.order == "sensitivity" and taken is steps and [p.node for p in found.promotions] == ["conv"]
    # The same list both ways: one search.
    calls.clear()
    steps = _floats(["conv", "dense"])
    found, taken = _both(steps, steps, 0.98, AccuracyTarget("agreement", 0.99), measure, costs)
    assert found.order == "sensitivity" and taken is steps and found.evaluations == len(calls) == 1


def test_a_target_the_sensitivity_order_misses_is_searched_in_the_cheap_order_too():
    # With one float node allowed, the sensitivity order floats the conv, which does not reach the target; the
    # cheap order floats the dense layer, which does (as on one draw of magika's files).
    steps, cheap = _floats(["conv"]), _floats(["dense"])
    found, taken = _both(
        cheap, steps, 0.98, AccuracyTarget("agreement", 0.99), lambda p: 0.995 if "dense" in p else 0.985,
        {"conv": 0.3, "dense": 0.0},
    )  # fmt: skip
    assert found.met and taken is cheap and [p.node for p in found.promotions] == ["dense"]
    # Missed both ways: the sensitivity order's best stands.
    found, taken = _both(cheap, steps, 0.98, AccuracyTarget("agreement", 0.99), lambda p: 0.985, {"conv": 0.3})
    assert not found.met and taken is steps and found.order == "sensitivity" and found.evaluations == 2
    # Missed both ways, the cheap order closer: its model is the best found.
    found, taken = _both(
        cheap, steps, 0.98, AccuracyTarget("agreement", 0.99), lambda p: 0.988 if "dense" in p else 0.985, {"conv": 0.3}
    )  # fmt: skip
    assert not found.met and taken is cheap and found.figure == 0.988 and found.order == "cost"


@pytest.fixture(scope="module")
def outliers():
    model, data = outlier_mlp()
    return model, {"x": data["x"][:800]}, {"x": data["x"][800:]}


def test_one_fragile_node_is_promoted_and_no_other(outliers):
    model, cal, ev = outliers
    # SmoothQuant would move the outlier into the weight (tests/test_quantize_smoothquant.py); here promotions alone.
    plain = qq.quantize_model(model, None, cal, eval=ev, promote=False, smoothquant=False).report
    assert plain.output.top1_agreement < 0.8  # the outlier channel wipes out the second MatMul's input
    r = qq.quantize_model(model, None, cal, eval=ev, smoothquant=False).report
    assert r.promotions.met and r.output.top1_agreement >= qq.DEFAULT_AGREEMENT
    assert {s.node for s in r.promotions.steps} == {"down"}
    up = next(n for n in r.nodes if n.name == "up")
    assert (up.weight_type, up.activation_type) == ("int8", "uint8")
    assert r.promotions.before == plain.output.top1_agreement
    ranking = sorted(r.analysis, key=lambda n: n.sensitivity_db)
    assert [n.name for n in ranking] == ["down", "up"] and ranking[0].sensitivity_db < 10 < 30 < ranking[1].sensitivity_db


@pytest.mark.timed
def test_a_slow_result_is_searched_for_a_cheaper_set_and_a_fast_one_is_not(outliers, monkeypatch):
    import qlinear.quantize._node_cost as node_cost
    import qlinear.quantize._stages as stages

    model, cal, ev = outliers
    runs = []
    monkeypatch.setattr(stages, "node_seconds", lambda *a: runs.append(1) or node_cost.node_seconds(*a))
    monkeypatch.setattr(stages, "float_where_faster", lambda fm, q, precision, *a: (precision, []))
    # Slower than FAST_ENOUGH (0 here): what "down" costs in float comes from ONNX Runtime's profiles of three models.
    monkeypatch.setattr(stages, "FAST_ENOUGH", 0.0)
    slow = qq.quantize_model(model, None, cal, eval=ev, smoothquant=False)
    r = slow.report
    assert [s.node for s in r.promotions.steps] == ["down"] and isinstance(r.promotions.steps[0].predicted_cost, float)
    assert r.promotions.order == "sensitivity" and len(runs) == 3  # "up" alone, cheaper or not, misses the target
    assert qq.Report.from_json(r.to_json()).promotions == r.promotions
    # Fast enough: no profile, no second search, the same model.
    runs.clear()
    monkeypatch.setattr(stages, "FAST_ENOUGH", math.inf)
    fast = qq.quantize_model(model, None, cal, eval=ev, smoothquant=False)
    assert runs == [] and fast.report.promotions.steps[0].predicted_cost is None
    assert fast.report.promotions.order == "sensitivity" and fast.report.promotions.evaluations <= r.promotions.evaluations
    assert fast.model.SerializeToString() == slow.model.SerializeToString()


def test_a_cheaper_set_found_is_the_model_written_and_its_tradeoff_rows_are_the_cheap_lists(outliers, monkeypatch):
    import qlinear.quantize._stages as stages

    model, cal, ev = outliers

    def is_float(m, name):  # a node whose weight no DequantizeLinear gives
        dq = {o for n in m.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
        return next(n for n in m.graph.node if n.name == name).input[1] not in dq

    # Either node in float meets the target; "down" costs half a run in float, "up" saves a tenth (a fake profile).
    monkeypatch.setattr(stages, "judge", lambda *a: lambda m: 0.995 if is_float(m, "up") or is_float(m, "down") else 0.98)
    seconds = {("up", False): 1e-3, ("up", True): 0.0, ("down", False): 1e-3, ("down", True): 6e-3}
    monkeypatch.setattr(
        stages, "node_seconds", lambda m, feeds, rt: [({n: seconds[n, is_float(m, n)] for n in ("up", "down")}, 0.01)] * len(feeds)
    )  # fmt: skip
    monkeypatch.setattr(stages, "FAST_ENOUGH", 0.0)  # every model slow enough to look for a cheaper one
    monkeypatch.setattr(stages, "cheapest_first", lambda ranking, figures, costs: ranking[::-1])  # "up" first
    r = qq.quantize_model(model, None, cal, eval=ev, smoothquant=False, max_float=1.0).report
    p = r.promotions
    assert p.met and p.order == "cost" and [s.node for s in p.steps] == ["up"]
    assert p.steps[0].predicted_cost == pytest.approx(-0.1) and p.evaluations == 2  # {down}, then {up}
    assert [n.name for n in r.left_float if n.reason == "promoted to float"] == ["up"]
    # The written model is the cheap list's one-step prefix: a trade-off row of it, if any, is the model written.
    assert all(c.promotions <= 1 for c in r.tradeoff) and r.tradeoff[-1].chosen


def test_sensitivity_is_the_output_sqnr_with_only_that_node_quantized(outliers):
    model, cal, ev = outliers
    ev = {"x": ev["x"][:64]}  # the analysis runs on the first 64 eval samples
    r = qq.quantize_model(model, None, cal, eval=ev, promote=False, smoothquant=False, analyze=True).report
    assert [n.name for n in r.analysis] == ["up", "down"]
    for node in r.analysis:
        others = [n.name for n in r.analysis if n.name != node.name]
        alone = qq.quantize_model(model, None, cal, eval=ev, exclude=others, promote=False, smoothquant=False).report
        assert math.isclose(node.sensitivity_db, alone.output.sqnr_db, rel_tol=1e-9)
        assert node.weight_sqnr_db == alone.nodes[0].weight_sqnr_db


def test_the_analysis_runs_where_the_search_needs_its_order_or_where_asked(outliers):
    model, cal, ev = outliers
    asked = dict(eval=ev, smoothquant=False, target_agreement=0.5)  # met at the types asked for
    met = qq.quantize_model(model, None, cal, **asked)
    assert met.report.promotions.met and met.report.promotions.evaluations == 0 and met.report.analysis == []
    assert "analysing nodes" not in {p.name for t in met.report.profile for p in t.parts}
    # Asked for, it is measured and the model is the same to the byte: the analysis orders promotions, none taken.
    analysed = qq.quantize_model(model, None, cal, analyze=True, **asked)
    assert [n.name for n in analysed.report.analysis] == ["up", "down"]
    assert analysed.model.SerializeToString() == met.model.SerializeToString()
    # Missed at the types asked for (the default target here), the search orders its steps by it.
    missed = qq.quantize_model(model, None, cal, eval=ev, smoothquant=False).report
    assert missed.promotions.steps and {n.name for n in missed.analysis} == {"up", "down"}
    # A run given no data measures nothing: asked for, it is refused before any work.
    with pytest.raises(QuantizationError, match="analyze needs data, and none was given"):
        qq.quantize_model(model, None, None, activations=None, analyze=True)


def test_a_missed_target_is_reported_and_the_best_model_kept(outliers):
    model, cal, ev = outliers
    result = qq.quantize_model(model, None, cal, eval=ev, target_sqnr_db=200.0, max_float=0.5, smoothquant=False)
    assert not result.target_met and not result.report.promotions.met
    assert any(w.startswith("target not met (output SQNR >= 200 dB)") for w in result.report.warnings)
    assert result.report.output.sqnr_db > result.report.requested.sqnr_db
    # Half the nodes at most went float (ONNX Runtime's ladder has no 16-bit step), the rest kept their types.
    promoted = [n for n in result.report.left_float if n.reason == "promoted to float"]
    assert 0 < len(promoted) <= len(result.report.analysis) / 2
    assert all(n.activation_type == "uint8" for n in result.report.nodes)
    assert result.report.decision.target_met is False and "target NOT met" in result.report.decision.line


def test_target_options_are_checked():
    for bad, match in (
        (dict(target_agreement=1.5), "target_agreement must be in"),
        (dict(target_agreement=0.9, target_sqnr_db=20.0), "give one target, got target_agreement and target_sqnr_db"),
        (dict(max_float=2.0), "max_float must be in"),
    ):
        with pytest.raises(QuantizationError, match=match):
            qq.QuantizeOptions(**bad)
    # Agreement needs classes along the output's last axis; a sum has none.
    g = qo.Graph("scalar", opset=17)
    x = g.input("x", "float", ("N", 32))
    mm = g.op("MatMul", [x, np.ones((32, 4), np.float32)], name="mm")
    g.output(g.op("ReduceSum", [mm], name="sum", keepdims=0, output_names=["y"]))
    data = {"x": np.random.default_rng(0).standard_normal((40, 32)).astype(np.float32)}
    # Refused before any work: nothing calibrated (one eval batch of the float model run to see its output).
    import qlinear.quantize._stages as stages

    def calibrated(*args, **kwargs):
        raise AssertionError("calibrated before refusing")

    with pytest.MonkeyPatch.context() as m:
        m.setattr(stages, "calibrate", calibrated)
        with pytest.raises(QuantizationError, match="target_agreement needs an output with classes"):
            qq.quantize_model(g.to_model(), None, data, target_agreement=0.9)


def test_promotions_widen_only_the_sides_a_node_quantizes():
    from quantize_models import layernorm_attention

    model, data = layernorm_attention()
    # An unreachable target takes every step; the embedding has no activation to widen, only its table
    # (stored at 8 bits from the start: ONNX Runtime gathers no 4-bit codes).
    r = qq.quantize_model(model, None, data, weights="int4", target_sqnr_db=200.0, max_float=1.0, bias_correction=False).report
    embed = [(s.from_, s.to) for s in r.promotions.steps if s.node == "embed"]
    assert embed == [("w int8 / a float", "float")]
    q_proj = [(s.from_, s.to) for s in r.promotions.steps if s.node == "q_proj"]
    assert q_proj[0][0] == "w int4 / a uint8" and q_proj[-1][1] == "float"
    for s in r.promotions.steps:
        assert s.from_ != s.to


def test_no_promotion_keeps_the_types_asked_and_judges_a_target_given():
    # --no-promote with a target the types asked miss: nothing promoted, the target judged and reported missed.
    model, data = outlier_mlp()
    r = qq.quantize_model(model, None, data, promote=False, target_sqnr_db=80.0)
    assert not r.target_met and r.report.promotions.steps == [] and not r.report.promotions.met
    assert {n.weight_type for n in r.report.nodes} == {"int8"} and r.report.float_where_faster == []
    promoted = qq.quantize_model(model, None, data, target_sqnr_db=80.0).report
    assert promoted.promotions.steps  # the same target, promotion on: it reaches for it
