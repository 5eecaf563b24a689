"""Float where faster: the kinds of node the runtime runs faster in float are kept float, decided by timing.

The decisions are tested with deterministic timers (a model's latency from
which nodes it runs in float); one test marked ``timed`` runs the pass as
shipped, on this machine's timings, and checks what it reports, not what
it decided.
"""

from __future__ import annotations

from importlib import resources

import numpy as np
import pytest

import qlinear.onnx as qo
import qlinear.quantize as qq
import qlinear.quantize._latency as latency_module
import qlinear.quantize._stages as stages_module
from qlinear.quantize._latency import Latency
from qlinear.quantize._model import load_float_model
from qlinear.quantize._precision import FLOAT, NodePrecision
from qlinear.quantize._speed import FASTER_IN_FLOAT, GIVE_UP, MARGIN, float_where_faster, node_kind

DEMO = resources.files("qlinear.quantize") / "_demo"
MODEL, CALIBRATION = str(DEMO / "digits_cnn.onnx"), str(DEMO / "digits_calibration.npz")
A8 = NodePrecision("int8", "uint8")


def _mobile_block():
    """A MobileNet block's shape: a 3x3 depthwise Conv, a 1x1 pointwise Conv, twice, then a Gemm head."""
    rng = np.random.default_rng(0)
    g = qo.Graph("mobile", opset=17)
    h = g.input("x", "float", ("N", 8, 12, 12))
    for k in range(2):
        h = g.op("Conv", [h, (rng.standard_normal((8, 1, 3, 3)) * 0.3).astype(np.float32)], name=f"dw{k}", group=8, pads=[1] * 4)
        h = g.op("Relu", [h], name=f"r{k}")
        h = g.op("Conv", [h, (rng.standard_normal((8, 8, 1, 1)) * 0.3).astype(np.float32)], name=f"pw{k}")
    h = g.op("Flatten", [g.op("GlobalAveragePool", [h], name="gap")], name="flat")
    g.output(g.op("Gemm", [h, (rng.standard_normal((4, 8)) * 0.3).astype(np.float32)], name="head", transB=1, output_names=["y"]))
    data = {"x": rng.standard_normal((40, 8, 12, 12)).astype(np.float32)}
    return g.to_model(), data


def test_a_nodes_kind_is_its_op_grouping_and_kernel():
    model, _ = _mobile_block()
    fm = load_float_model(model)
    assert [node_kind(fm, n) for n in ("dw0", "pw0", "head")] == ["Conv depthwise 3x3", "Conv 1x1", "Gemm"]


def _timer(costs: dict[str, float], noise: list[float] | None = None, grows: dict[str, int] | None = None,
           at_sixteen: dict[str, float] | None = None):  # fmt: skip
    """A latency from the nodes in float: 1.0 plus each float node's cost (negative: float is faster); ``noise`` added in turn.

    The size: 1000 bytes, plus each float node's ``grows`` (its float weights over its quantized ones).
    ``at_sixteen``: the costs at a second batch, of 16, timed beside the first (none: one batch).
    """
    calls = []

    def timed(precision, again=False, give_up_above=None):
        shift = noise[len(calls) % len(noise)] if noise else 0.0
        latencies = []
        for batch, cost in ((1, costs), (16, at_sixteen)):
            if cost is not None:
                ratio = 1.0 + shift + sum(cost.get(n, 0.0) for n, p in precision.items() if not p.quantized)
                latencies.append(Latency(batch, 1.0, ratio, ratio))
        size = 1000 + sum((grows or {}).get(n, 0) for n, p in precision.items() if not p.quantized)
        calls.append((dict(precision), again, give_up_above))
        return tuple(latencies), size

    return timed, calls


def test_a_kind_faster_in_float_is_kept_float_and_one_slower_is_not():
    model, _ = _mobile_block()
    fm = load_float_model(model)
    nodes = dict.fromkeys(["dw0", "pw0", "dw1", "pw1", "head"], A8)
    timed, calls = _timer({"dw0": -0.1, "dw1": -0.1, "pw0": 0.05, "pw1": 0.05, "head": 0.01})
    precision, trials = float_where_faster(fm, nodes, {}, timed)
    assert precision == {"dw0": FASTER_IN_FLOAT, "dw1": FASTER_IN_FLOAT}
    assert precision["dw0"].why.startswith("faster in float")
    by_kind = {t.kind: t for t in trials}
    assert by_kind["Conv depthwise 3x3"].kept and by_kind["Conv depthwise 3x3"].after == pytest.approx(0.8)
    assert not by_kind["Conv 1x1"].kept and not by_kind["Gemm"].kept
    assert by_kind["Conv 1x1"].before == pytest.approx(0.8)  # tried on the model with the depthwise kind float
    assert len(calls) == 1 + 3 + 2  # the start, a trial a kind, a confirmation and the current model again for the kept one
    # The confirmation and the current model are timed anew, not read back from their first timings.
    assert [again for _, again, _ in calls] == [False, False, True, True, False, False]
    # A trial's first timing may stop at a first look 5% slower than the model as it stands; nothing else may.
    assert [bound for _, _, bound in calls] == pytest.approx(
        [None, 1 + GIVE_UP, None, None, 0.8 * (1 + GIVE_UP), 0.8 * (1 + GIVE_UP)]
    )


def test_a_gain_within_the_noise_or_not_confirmed_is_not_kept():
    model, _ = _mobile_block()
    fm = load_float_model(model)
    small = _timer({"dw0": -0.01, "dw1": -0.01})[0]  # 2% faster: inside the margin
    assert float_where_faster(fm, dict.fromkeys(["dw0", "dw1"], A8), {}, small)[0] == {}
    # Faster on the first timing only: noise of -0.2 on the trial, then none on its confirmation.
    lucky, _ = _timer({}, noise=[0.0, -0.2, 0.0, 0.0])
    precision, trials = float_where_faster(fm, dict.fromkeys(["dw0", "dw1"], A8), {}, lucky)
    assert precision == {} and trials[0].after < 1 - MARGIN and not trials[0].kept


def test_a_kind_whose_float_weights_grow_the_file_more_than_it_saves_is_not_kept():
    # 10% faster in float, but its float weights make the file 30% larger: size is what quantizing also buys.
    model, _ = _mobile_block()
    fm = load_float_model(model)
    timed, _ = _timer({"pw0": -0.05, "pw1": -0.05}, grows={"pw0": 150, "pw1": 150})
    precision, trials = float_where_faster(fm, dict.fromkeys(["pw0", "pw1"], A8), {}, timed)
    assert precision == {} and trials[0].after == pytest.approx(0.9) and not trials[0].kept
    # The same saving for a kind of small weights (+4%): kept.
    timed, _ = _timer({"pw0": -0.05, "pw1": -0.05}, grows={"pw0": 20, "pw1": 20})
    assert float_where_faster(fm, dict.fromkeys(["pw0", "pw1"], A8), {}, timed)[0] == dict.fromkeys(
        ["pw0", "pw1"], FASTER_IN_FLOAT
    )


def test_a_kind_is_judged_at_every_batch_the_users_run():
    # ONNX Runtime's int8 5x5 depthwise Conv: on par with float at one sample, far slower at 16 (the direction
    # classifier's 1.3 ms against 0.16 ms a node). Float a little slower at 1 and much faster at 16: kept.
    model, _ = _mobile_block()
    fm = load_float_model(model)
    nodes = dict.fromkeys(["dw0", "dw1", "pw0", "pw1"], A8)
    timed, _ = _timer({"dw0": 0.02, "dw1": 0.02, "pw0": -0.04, "pw1": -0.04},
                      at_sixteen={"dw0": -0.2, "dw1": -0.2, "pw0": 0.1, "pw1": 0.1})  # fmt: skip
    precision, trials = float_where_faster(fm, nodes, {}, timed)
    assert precision == {"dw0": FASTER_IN_FLOAT, "dw1": FASTER_IN_FLOAT}
    by_kind = {t.kind: t for t in trials}
    # The ratios the trials give are the geometric means over the batches: 1.04 at 1 and 0.6 at 16.
    assert by_kind["Conv depthwise 3x3"].after == pytest.approx((1.04 * 0.6) ** 0.5)
    # Faster at one sample, much slower at 16: not kept, though the first batch alone would have kept it.
    assert not by_kind["Conv 1x1"].kept
    one_batch, _ = _timer({"pw0": -0.04, "pw1": -0.04})
    assert float_where_faster(fm, dict.fromkeys(["pw0", "pw1"], A8), {}, one_batch)[0] == dict.fromkeys(
        ["pw0", "pw1"], FASTER_IN_FLOAT
    )


def test_a_kind_that_takes_less_of_a_run_than_a_trial_must_save_is_not_timed():
    # The profile says the depthwise Convs and their Q/DQ take 2% of a run: floating them cannot save the 3% margin,
    # whatever a timing would say, so they are not timed; the pointwise ones take 40% and are.
    model, _ = _mobile_block()
    fm = load_float_model(model)
    nodes = dict.fromkeys(["dw0", "pw0", "dw1", "pw1"], A8)
    timed, calls = _timer({"dw0": -0.1, "dw1": -0.1, "pw0": 0.05, "pw1": 0.05})
    profiled = []

    def shares(precision):  # the runtime's own kernels ("") count once toward every kind's bound
        profiled.append(dict(precision))
        return [
            {"dw0": 0.01, "dw1": 0.005, "pw0": 0.2, "pw1": 0.2, "": 0.005},
            {"dw0": 0.005, "dw1": 0.005, "pw0": 0.3, "pw1": 0.3, "": 0.002},
        ]

    precision, trials = float_where_faster(fm, nodes, {}, timed, shares)
    assert precision == {} and profiled == [{}]  # the model as it stood, profiled once
    by_kind = {t.kind: t for t in trials}
    depthwise, pointwise = by_kind["Conv depthwise 3x3"], by_kind["Conv 1x1"]
    assert depthwise.share == pytest.approx(0.02) and np.isnan(depthwise.after) and not depthwise.kept
    assert pointwise.share == pytest.approx(0.602) and pointwise.after == pytest.approx(1.1)
    assert not any(not p.quantized for precision, _, _ in calls for n, p in precision.items() if n.startswith("dw"))


def test_a_kind_whose_float_kernels_take_what_it_saves_is_not_timed():
    # YOLOv8n's 3x3 Convs: 21% of its quantized run at one sample, their float kernels 60% of its float run. Floating
    # them gives back their quantized share and takes their float kernels' time again: nothing to save, not timed.
    model, _ = _mobile_block()
    fm = load_float_model(model)
    timed, calls = _timer({"dw0": -0.1, "dw1": -0.1, "pw0": 0.05, "pw1": 0.05}, at_sixteen={})  # 1.0 at both batches
    quantized = [{"dw0": 0.1, "dw1": 0.1, "pw0": 0.2, "pw1": 0.2, "": 0.01}, {"dw0": 0.1, "dw1": 0.1, "pw0": 0.3, "pw1": 0.3}]
    in_float = [{"dw0": 0.02, "dw1": 0.02, "pw0": 0.3, "pw1": 0.3}, {"dw0": 0.01, "dw1": 0.01, "pw0": 0.5, "pw1": 0.5}]
    asked = []

    def float_shares():
        asked.append(True)
        return in_float

    precision, trials = float_where_faster(
        fm, dict.fromkeys(["dw0", "pw0", "dw1", "pw1"], A8), {}, timed, lambda p: quantized, float_shares
    )
    by_kind = {t.kind: t for t in trials}
    pointwise, depthwise = by_kind["Conv 1x1"], by_kind["Conv depthwise 3x3"]
    # At one sample 0.41 of the run less 0.6 of the float run at a ratio of 1.0; at 16, 0.6 less 1.0; of a run that
    # the depthwise kind, floated first, shortened to 0.8 at one sample (a geometric mean of 0.8 ** 0.5).
    assert pointwise.share == pytest.approx(max(0.41 - 0.6, 0.6 - 1.0) / 0.8**0.5) and np.isnan(pointwise.after)
    assert depthwise.share == pytest.approx(max(0.21 - 0.04, 0.2 - 0.02)) and depthwise.kept
    assert precision == {"dw0": FASTER_IN_FLOAT, "dw1": FASTER_IN_FLOAT} and asked == [True]  # read once
    assert not any(not p.quantized for precision, _, _ in calls for n, p in precision.items() if n.startswith("pw"))


def test_profiled_kernels_named_by_their_tensor_or_fusion_count_to_their_node():
    # ONNX Runtime names a Conv it moves to its blocked layout by the tensor it writes ("conv0_output") and a SiLU
    # it fuses by the node the fusion started from ("silu0/QuickGeluFusion/"): both are the model's nodes' time.
    from qlinear.quantize.targets._ort_profile import node_times

    rng = np.random.default_rng(0)
    g = qo.Graph("silu", opset=17)
    h = g.input("x", "float", ("N", 8, 16, 16))
    for k in range(2):
        w = (rng.standard_normal((8, 8, 3, 3)) * 0.3).astype(np.float32)
        c = g.op("Conv", [h, w, np.zeros(8, np.float32)], name=f"conv{k}", pads=[1] * 4)
        h = g.op("Mul", [c, g.op("Sigmoid", [c], name=f"sig{k}")], name=f"silu{k}")
    g.output(h)
    model = g.to_model()
    ((times, run),) = node_times(model, [{"x": rng.standard_normal((4, 8, 16, 16)).astype(np.float32)}])
    assert {"conv0", "conv1", "silu0", "silu1"} <= set(times)
    assert set(times) - {n.name for n in model.graph.node} <= {"ReorderInput", "ReorderOutput"}
    assert 0 < sum(times.values()) <= 1.5 * run
    # A float Conv and its Relu run as one kernel named by the Relu: the Conv's time.
    model, data = _mobile_block()
    ((times, run),) = node_times(model, [{"x": data["x"][:16]}])
    assert {"dw0", "dw1", "pw0", "pw1"} <= set(times) and not {"r0", "r1"} & set(times)


def test_node_shares_count_each_nodes_kernels_and_the_qdq_beside_it():
    from qlinear.quantize._node_cost import ADDED, node_shares

    model, data = _mobile_block()
    q = qq.quantize_model(model, None, data, promote=False).model
    by_name = {n.name: n for n in q.graph.node}
    dq_of_dw1 = next(n for n in q.graph.node if n.op_type == "DequantizeLinear" and n.output[0] in by_name["dw1"].input)

    class Runtime:  # a profile: dw1's kernel 1 ms and the DequantizeLinear before it 1 ms of a 10 ms run
        @staticmethod
        def node_times(model, feeds):
            return [({"dw1": 1e-3, dq_of_dw1.name: 1e-3, "pw1": 2e-3, "ReorderInput": 0.5e-3}, 10e-3)]

    shares = node_shares(q, [{"x": data["x"][:1]}], Runtime)
    assert shares[0]["dw1"] == pytest.approx(0.2) and shares[0]["head"] == 0.0
    assert shares[0][ADDED] == pytest.approx(0.05)  # a kernel the runtime added, named by no node: once, apart
    # That DequantizeLinear gives dw1 the codes of pw0's output: floating pw0 could remove it too, so pw0 counts it.
    assert shares[0]["pw0"] == pytest.approx(0.1) and shares[0]["pw1"] == pytest.approx(0.2)
    # ONNX Runtime's own profile of the model: every quantized Conv takes a share, none more than the run.
    real = node_shares(q, [{"x": data["x"][:1]}, {"x": data["x"][:16]}], qq.targets.target("ort-cpu"))
    assert len(real) == 2 and all(batch["pw0"] > 0 and sum(batch.values()) < 3 for batch in real)
    # A model ONNX Runtime cannot load (no float4 DequantizeLinear) has no profile: every kind is then timed.
    unloadable = qq.quantize_model(model, None, data, weights="float4e2m1", activations=None, promote=False).model
    assert node_shares(unloadable, [{"x": data["x"][:1]}], qq.targets.target("ort-cpu")) is None


def test_float_costs_are_a_nodes_time_among_quantized_neighbours_less_its_time_as_asked():
    from qlinear.quantize._node_cost import float_costs

    # Two batches of the model as asked (8 ms and 30 ms runs), and of the models with every other node in float.
    asked = [({"dw0": 1e-3, "pw0": 2e-3, "dw1": 2e-3}, 8e-3), ({"dw0": 2e-3, "pw0": 6e-3, "dw1": 4e-3}, 30e-3)]
    odd = [({"dw0": 3e-3, "pw0": 2e-3, "dw1": 1e-3}, 9e-3), ({"dw0": 8e-3, "pw0": 6e-3, "dw1": 4e-3}, 36e-3)]
    even = [({"pw0": 2.4e-3, "dw1": 9e-3}, 9e-3), ({"pw0": 3e-3, "dw1": 9e-3}, 31e-3)]
    costs = float_costs(asked, [(odd, {"dw0", "dw1"}), (even, {"pw0"})])
    # dw0: (3 - 1) / 8 and (8 - 2) / 30: 0.225 on the mean; dw1 (1 - 2) / 8 and 0: faster in float.
    assert costs["dw0"] == pytest.approx(0.225) and costs["dw1"] == pytest.approx(-0.0625)
    # pw0 from the model that has it in float, not from the other: (0.4 / 8 - 3 / 30) / 2.
    assert costs["pw0"] == pytest.approx(-0.025) and set(costs) == {"dw0", "pw0", "dw1"}
    # A model the runtime gave no profile of, or one of other batches: no costs.
    assert float_costs(None, [(odd, {"dw0"})]) is None and float_costs(asked, [(None, {"dw0"})]) is None
    assert float_costs(asked, [(odd[:1], {"dw0"})]) is None


def test_float_costs_rank_the_nodes_as_their_measured_latency_does():
    from qlinear.quantize._node_cost import alternate, float_costs, node_seconds

    rng = np.random.default_rng(0)
    g = qo.Graph("convs", opset=17)
    h, channels, names = g.input("x", "float", ("N", 32, 32, 32)), 32, []
    for k, (out, size) in enumerate([(128, 3), (32, 1), (64, 3), (16, 1), (32, 3)]):
        w = (rng.standard_normal((out, channels, size, size)) * 0.1).astype(np.float32)
        h = g.op("Relu", [g.op("Conv", [h, w, np.zeros(out, np.float32)], name=f"c{k}", pads=[size // 2] * 4)])
        channels = out
        names.append(f"c{k}")
    g.output(h)
    model, data = g.to_model(), {"x": rng.standard_normal((32, 32, 32, 32)).astype(np.float32)}
    # Each batch three times over: the costs are the mean over the batches, and a noisy machine needs more runs.
    runtime, feeds = qq.targets.target("ort-cpu"), [{"x": data["x"][:1]}, {"x": data["x"][:16]}] * 3

    def run(floated, timed=False):
        eval_data = {"x": data["x"][:16]} if timed else None
        return qq.quantize_model(model, None, data, eval=eval_data, promote=False, exclude=floated, float_where_faster=False)

    floated = [(node_seconds(run(sorted(half)).model, feeds, runtime), half) for half in alternate(names)]
    costs = float_costs(node_seconds(run([]).model, feeds, runtime), floated)
    assert set(costs) == set(names)
    dearest, cheapest = max(costs, key=costs.get), min(costs, key=costs.get)
    # The 128-channel 3x3 Conv on the input costs the most in float, by far (about half a run as asked; the rest 0.04-0.16).
    assert dearest == "c0" and costs["c0"] > costs[cheapest] + 0.05
    # Timed against the float model in pairs, the one predicted dearest slows the model more than the cheapest.
    latency = {n: max(t.ratio for t in run([n], timed=True).report.latency_ms) for n in (dearest, cheapest)}
    assert latency[dearest] > latency[cheapest]


def test_promoted_nodes_are_left_as_the_search_set_them():
    model, _ = _mobile_block()
    fm = load_float_model(model)
    timed, _ = _timer({"dw0": -0.2, "dw1": -0.2})
    start = {"dw0": FLOAT, "pw0": NodePrecision("int8", "uint8")}
    precision, trials = float_where_faster(fm, dict.fromkeys(["dw0", "pw0", "dw1"], NodePrecision("int4", "uint8")), start, timed)
    assert precision["dw0"] is FLOAT and precision["dw1"] == FASTER_IN_FLOAT  # dw0 was the search's already
    assert {t.kind: t.nodes for t in trials} == {"Conv depthwise 3x3": ("dw1",), "Conv 1x1": ("pw0",)}


def test_weight_only_nodes_are_quantized_for_their_size_and_never_tried():
    model, _ = _mobile_block()
    fm = load_float_model(model)
    timed, _ = _timer({"dw0": -0.5, "pw0": -0.5})
    asked = {"dw0": NodePrecision("int4", None), "pw0": NodePrecision("int8", "float8e4m3fn")}
    assert float_where_faster(fm, asked, {}, timed) == ({}, [])


def _fake_runtime(monkeypatch, faster: str):
    """The runtime's timer made deterministic: nodes named ``faster`` save 20% each in float, any other float node costs 10%."""

    def fake_time(self, model, session=None, pairs=None):
        weights = {t.name for t in model.graph.initializer if t.data_type == 1}
        ratio = 0.7
        for n in model.graph.node:
            if n.op_type in ("Conv", "Gemm") and len(n.input) > 1 and n.input[1] in weights:
                ratio += -0.2 if n.name.startswith(faster) else 0.1
        return Latency(self.batch, 1.0, ratio, ratio)

    monkeypatch.setattr(latency_module.PairTimer, "time", fake_time)
    monkeypatch.setattr(stages_module, "node_shares", lambda *args: None)  # no profile: every kind is timed


@pytest.mark.timed
def test_quantize_keeps_float_the_kinds_faster_in_float_and_says_so(monkeypatch):
    _fake_runtime(monkeypatch, "dw")
    model, data = _mobile_block()
    r = qq.quantize_model(model, None, data, target_sqnr_db=10)
    report = r.report
    kept = [f for f in report.float_where_faster if f.kept]
    assert [(f.kind, f.nodes) for f in kept] == [("Conv depthwise 3x3", ("dw0", "dw1"))]
    reasons = {n.name: n.reason for n in report.left_float}
    assert reasons["dw0"].startswith("faster in float") and reasons["dw1"].startswith("faster in float")
    assert {n.name for n in report.nodes} == {"pw0", "pw1", "head"}
    assert report.latency_ms[0].ratio == pytest.approx(0.3)
    off = qq.quantize_model(model, None, data, target_sqnr_db=10, float_where_faster=False).report
    assert off.float_where_faster == [] and {n.name for n in off.nodes} == {"dw0", "dw1", "pw0", "pw1", "head"}


@pytest.mark.timed
def test_the_pass_as_shipped_reports_each_kind_it_timed():
    # This machine's own timings: what it decides may differ from one machine to another; what it reports may not.
    r = qq.quantize_model(MODEL, None, CALIBRATION)
    report = r.report
    tried = report.float_where_faster
    assert sorted(f.kind for f in tried) == ["Conv 3x3", "Gemm"]
    floated = {n for f in tried if f.kept for n in f.nodes}
    quantized = {n.name for n in report.nodes}
    assert floated | quantized == {"conv1", "conv2", "fc1", "fc2"} and not floated & quantized
    # A kind is timed, or its share of a run (ONNX Runtime's profile) was under the margin a trial must save.
    assert all(f.before > 0 and (f.after > 0 or f.share < MARGIN) for f in tried)
    assert all(f.share is not None and 0 <= f.share <= 1 for f in tried)
    assert r.target_met
