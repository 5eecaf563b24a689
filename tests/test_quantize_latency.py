"""Latency as the quantizer measures and optimises it: the batches timed, the budget search, the decision and the trade-off.

Timings on this machine are noise, so the tests that follow the search
replace the runtime's timer with a deterministic one (a model's latency
grows with the compute nodes it runs in float); the timer itself is
checked for what it returns, not for how fast anything is.
"""

from __future__ import annotations

import io
from dataclasses import replace
from importlib import resources

import numpy as np
import pytest

import qlinear.quantize as qq
import qlinear.quantize._latency as latency_module
from qlinear._errors import QuantizationError
from qlinear.cli import main
from qlinear.quantize._data import Dataset
from qlinear.quantize._latency import (
    QUICK_PAIRS,
    Latency,
    PairTimer,
    UserBatchTimer,
    batch_feeds,
    user_batches,
    worst_ratio,
)
from qlinear.quantize._precision import FULL_LADDER, NodePrecision
from qlinear.quantize._promotion import AccuracyTarget, Promotion, search_within
from qlinear.quantize.targets import ORT_CPU, target
from quantize_models import conv_batchnorm

DEMO = resources.files("qlinear.quantize") / "_demo"
MODEL, CALIBRATION = str(DEMO / "digits_cnn.onnx"), str(DEMO / "digits_calibration.npz")
COMPUTE = ("Conv", "Gemm", "MatMul")


def _float_compute_nodes(model) -> int:
    """Compute nodes whose weight is a float initializer (not read through a DequantizeLinear)."""
    weights = {t.name for t in model.graph.initializer if t.data_type == 1}
    return sum(n.op_type in COMPUTE and len(n.input) > 1 and n.input[1] in weights for n in model.graph.node)


def _costs(monkeypatch, base: float, per_float_node: float) -> list[tuple[int, int | None]]:
    """A timer whose ratio is ``base`` plus ``per_float_node`` for each compute node left float, as on the runtime.

    Gives the list it logs each timing in: the float nodes, and the pairs asked (None: the timer's own count).
    """
    log = []

    def fake_time(self, model, session=None, pairs=None):
        log.append((_float_compute_nodes(model), pairs))
        ratio = base + per_float_node * _float_compute_nodes(model)
        return Latency(self.batch, 1.0, ratio, ratio)

    monkeypatch.setattr(latency_module.PairTimer, "time", fake_time)
    return log


@pytest.fixture
def float_costs(monkeypatch):
    _costs(monkeypatch, 0.5, 0.1)


def test_the_batches_timed_are_the_models_fixed_one_else_one_sample_and_the_batch_size():
    assert user_batches(None, 16) == (1, 16)
    assert user_batches(None, 1) == (1,)
    assert user_batches(4, 16) == (4,)
    data = Dataset({"x": np.arange(40.0).reshape(10, 4), "state": np.zeros((2, 10, 3))}, None, "d", {"x": 0, "state": 1})
    feeds = batch_feeds(data, 3)
    assert feeds["x"].shape == (3, 4) and feeds["state"].shape == (2, 3, 3)  # each input along its own batch axis
    assert batch_feeds(data, 64)["x"].shape == (10, 4)  # fewer samples than the batch: what there is
    stream = Dataset(None, [{"x": np.ones((5, 4))}], "stream")
    assert batch_feeds(stream, 2)["x"].shape == (2, 4)  # a stream's first batch, cut down


def test_the_timer_gives_both_medians_and_the_median_ratio():
    model, data = conv_batchnorm()
    timer = PairTimer(model, {"x": data["x"][:2]}, ORT_CPU)
    got = timer.time(model)
    assert got.batch == 2 and got.before > 0 and got.after > 0 and 0.2 < got.ratio < 5
    assert 5 <= timer.pairs <= 25
    # Neither side's idle threads spin: they would take the cores from the other side's turn.
    for session in (timer._float, ORT_CPU.session(model, spinning=False)):
        assert session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_a_model_the_runtime_loads_but_cannot_run_is_one_line():
    # A kernel that refuses its inputs at run time (as ONNX Runtime's QLinearConv refuses a blocked filter scale):
    # the runtime's own exception, which no stage catches, becomes the quantizer's error naming what was timed.
    import qlinear.onnx as qo

    model, data = conv_batchnorm()
    g = qo.Graph("bad_reshape", opset=17)
    x = g.input("x", "float", ("N", *data["x"].shape[1:]))
    g.output(g.op("Reshape", [x, np.array([7, -1], np.int64)], name="reshape", output_names=["y"]))
    timer = PairTimer(model, {"x": data["x"][:2]}, ORT_CPU)
    with pytest.raises(QuantizationError, match=r"^quantize: ONNX Runtime failed on a model timed at a batch of 2: "):
        timer.time(g.to_model())


def test_the_users_batches_are_each_timed():
    model, data = conv_batchnorm()
    dataset = Dataset({"x": data["x"]}, None, "eval", {"x": 0})
    got = UserBatchTimer(model, dataset, (1, 4), ORT_CPU).time(model)
    assert [t.batch for t in got] == [1, 4] and all(0.2 < t.ratio < 5 for t in got)
    assert worst_ratio([Latency(1, 1.0, 0.9, 0.9), Latency(16, 1.0, 1.2, 1.2)]) == 1.2


def test_a_model_is_timed_once_unless_asked_again_and_a_hopeless_one_only_at_a_first_look(monkeypatch):
    model, data = conv_batchnorm()
    dataset = Dataset({"x": data["x"]}, None, "eval", {"x": 0})
    timer = UserBatchTimer(model, dataset, (1, 4), ORT_CPU)
    calls, ratio = [], [1.2]

    def fake_time(self, model, session=None, pairs=None):
        calls.append((self.batch, pairs))
        return Latency(self.batch, 1.0, ratio[0], ratio[0])

    monkeypatch.setattr(latency_module.PairTimer, "time", fake_time)
    first = timer.time(model)
    assert [t.ratio for t in first] == [1.2, 1.2] and calls == [(1, None), (4, None)]
    calls.clear()
    assert timer.time(model) == first and calls == []  # read back: the same model timed before
    ratio[0] = 1.1
    assert [t.ratio for t in timer.time(model, again=True)] == [1.1, 1.1] and calls == [(1, None), (4, None)]
    # Given up on: a first look of QUICK_PAIRS pairs a batch already past the bound is the answer, and not kept.
    calls.clear()
    other = conv_batchnorm(branch=True)[0]
    quick = timer.time(other, give_up_above=1.05)
    assert [t.ratio for t in quick] == [1.1, 1.1] and calls == [(1, QUICK_PAIRS), (4, QUICK_PAIRS)]
    calls.clear()
    timer.time(other)
    assert calls == [(1, None), (4, None)]  # the quick look was not kept as the model's timing
    # Within the bound: the first look, then the whole timing, which is kept.
    calls.clear()
    third = conv_batchnorm(branch=True)[0]
    third.graph.name = "third"
    assert [t.ratio for t in timer.time(third, give_up_above=1.2)] == [1.1, 1.1]
    assert calls == [(1, QUICK_PAIRS), (4, QUICK_PAIRS), (1, None), (4, None)]
    calls.clear()
    timer.time(third)
    assert calls == []
    # A glance (a trade-off row: shown, not decided on): QUICK_PAIRS pairs a batch, not kept; a model timed before is
    # read back instead.
    fourth = conv_batchnorm(branch=True)[0]
    fourth.graph.name = "fourth"
    assert [t.ratio for t in timer.time(fourth, glance=True)] == [1.1, 1.1]
    assert calls == [(1, QUICK_PAIRS), (4, QUICK_PAIRS)]
    calls.clear()
    assert timer.time(third, glance=True) is not None and calls == []
    timer.time(fourth)
    assert calls == [(1, None), (4, None)]


def test_onnx_runtimes_ladder_offers_no_dominated_step():
    # Its CPU provider runs a 16-bit activation in float plus its Q/DQ: slower than float and no more accurate.
    ladder = target("ort-cpu").ladder
    assert ladder.activations == {} and ladder.weights == FULL_LADDER.weights
    r = qq.quantize_model(MODEL, None, CALIBRATION, target_sqnr_db=200, max_float=0.5).report
    held = {n.activation_type for n in r.nodes}
    assert held == {"uint8"} and r.promotions.steps
    assert all(s.to == "float" for s in r.promotions.steps)


def _steps(n: int) -> list[Promotion]:
    return [Promotion(f"n{k}", NodePrecision("int8", "uint8"), NodePrecision(None, None, quantized=False)) for k in range(n)]


def test_the_budget_search_takes_the_longest_prefix_within_the_budget():
    steps, asked = _steps(20), []

    def ratio(precision):
        asked.append(len(precision))
        return 0.5 + 0.05 * len(precision)

    def measure(precision):
        return 10.0 + len(precision)  # each step adds accuracy

    found = search_within(steps, 10.0, AccuracyTarget("sqnr", 30.0), 0.71, ratio, measure, binding=False)
    assert len(found.promotions) == 4 and found.figure == 14.0 and found.met and found.budget == 0.71
    assert len(asked) <= 2 * 5 + 1  # doubling then halving: about 2 log2(20) timings
    # A target given beside the budget must hold too.
    missed = search_within(steps, 10.0, AccuracyTarget("sqnr", 30.0), 0.71, ratio, measure, binding=True)
    assert not missed.met and len(missed.promotions) == 4
    # Even the types asked for run over the budget: they are the result, and it is not met.
    over = search_within(steps, 10.0, AccuracyTarget("sqnr", 30.0), 0.4, ratio, measure, binding=False)
    assert over.promotions == [] and not over.met and over.figure == 10.0
    # Every step within the budget: all of them.
    assert len(search_within(steps, 10.0, AccuracyTarget("sqnr", 30.0), 9.0, ratio, measure, binding=False).promotions) == 20


def test_latency_budget_gives_the_most_accurate_model_within_it(float_costs):
    r = qq.quantize_model(MODEL, None, CALIBRATION, target_sqnr_db=200, max_float=1.0, latency_budget=0.75)
    report = r.report
    # 0.5 + 0.1 a float compute node: two of them fit in 0.75, three do not.
    assert len(report.promotions.steps) == 2 and _float_compute_nodes(r.model) == 2
    assert [t.ratio for t in report.latency_ms] == pytest.approx([0.7, 0.7])
    assert not r.target_met and report.decision.target_met is False  # 200 dB was asked for beside the budget
    assert "the most accurate model within 0.75x" in report.decision.line
    written = [c for c in report.tradeoff if c.chosen]
    assert len(written) == 1 and [t.ratio for t in written[0].latency] == pytest.approx([0.7, 0.7])  # at 1 and 16
    # Without a target beside it, the budget alone decides, and the run succeeds.
    alone = qq.quantize_model(MODEL, None, CALIBRATION, max_float=1.0, latency_budget=0.75)
    assert alone.target_met and len(alone.report.promotions.steps) <= 2


def test_a_model_that_meets_its_target_faster_than_float_times_no_other_row(float_costs):
    # 0.5 + 0.1 a float compute node: the target met with promotions, every model faster than float.
    r = qq.quantize_model(MODEL, None, CALIBRATION, target_sqnr_db=45, max_float=1.0)
    assert r.target_met and r.report.promotions.steps and r.report.decision.faster
    (row,) = r.report.tradeoff  # nothing to trade: only the model written is timed
    assert row.chosen and row.promotions == len(r.report.promotions.steps)


def test_a_model_slower_than_float_says_so_first_with_the_tradeoff_measured(monkeypatch, tmp_path, capsys):
    # Each compute node float costs 0.15 over 0.8: a target that needs several gives a model slower than float.
    log = _costs(monkeypatch, 0.8, 0.15)
    argv = ["quantize", MODEL, "-o", str(tmp_path / "q.onnx"), "--calibration", CALIBRATION, "--target-sqnr", "200",
            "--max-float", "1.0", "--json"]  # fmt: skip
    assert main(argv) == 0
    report = qq.Report.from_json(capsys.readouterr().out)  # the JSON reads back as the typed report
    floats = len(report.promotions.steps)
    assert floats >= 2 and report.decision.faster is False
    ratio = 0.8 + 0.15 * floats
    assert report.decision.line.startswith(f"SLOWER than the float model: {ratio:.2f}x at a batch of 1")
    rows = report.tradeoff
    assert rows[0].promotions == 0 and rows[0].flags == "--no-promote" and worst_ratio(rows[0].latency) == pytest.approx(0.8)
    assert rows[-1].chosen and worst_ratio(rows[-1].latency) == pytest.approx(ratio)
    # Each row between: a prefix the search evaluated, its figure, and the budget that writes it.
    for row in rows[1:-1]:
        assert row.figure is not None and row.flags == f"--latency-budget {0.8 + 0.15 * row.promotions:.2f}"
    # The rows a user picks a flag by are a first look; the model written, the verdict's, is timed in full.
    assert {pairs for floated, pairs in log if floated == 0} == {QUICK_PAIRS}
    assert {pairs for floated, pairs in log if floated == floats} == {None}
    # Printed: the decision first, then the table.
    assert main(argv[:-1]) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines()[0].startswith("SLOWER than the float model")
    assert "the trade-off measured" in out and "--no-promote" in out


def test_the_decision_line_leads_the_printed_report_when_the_model_is_slower(monkeypatch, tmp_path, capsys):
    def slower(self, model, session=None, pairs=None):
        return Latency(self.batch, 1.0, 1.3, 1.3)

    monkeypatch.setattr(latency_module.PairTimer, "time", slower)
    argv = ["quantize", MODEL, "-o", str(tmp_path / "q.onnx"), "--calibration", CALIBRATION, "--target-sqnr", "45"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    first = out.strip().splitlines()[0]
    assert first.startswith("SLOWER than the float model: 1.30x at a batch of 1")  # the decision leads, folded at 80
    words = " ".join(out.split())
    assert words.startswith("SLOWER than the float model: 1.30x at a batch of 1, 1.30x at a batch of 16; target met")
    assert "the trade-off measured" in out


def test_latency_budget_is_checked():
    for bad in (0, -0.5, True, "fast"):
        with pytest.raises(QuantizationError, match=r"latency_budget must be a ratio > 0 of the float model's latency"):
            qq.QuantizeOptions(latency_budget=bad)
    with pytest.raises(QuantizationError, match="latency_budget needs promotion"):
        qq.QuantizeOptions(latency_budget=0.8, promote=False)


def test_latency_budget_flag_rejects_a_non_positive_ratio(tmp_path, capsys):
    argv = ["quantize", MODEL, "-o", str(tmp_path / "q.onnx"), "--calibration", CALIBRATION, "--latency-budget", "0"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--latency-budget must be a ratio > 0" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "q.onnx").exists()


def test_the_html_page_leads_with_the_decision_and_shows_the_tradeoff(float_costs):
    pytest.importorskip("plotly")
    from qlinear.quantize._html import render_html

    r = qq.quantize_model(MODEL, None, CALIBRATION, target_sqnr_db=200, max_float=1.0, latency_budget=0.75).report
    page = render_html(r)
    assert page.index(r.decision.line[:40]) < page.index("<table")
    assert "The trade-off measured" in page and "--latency-budget" in page


def test_printing_is_robust_to_a_report_without_timings():
    from rich.console import Console

    from qlinear.quantize._report_print import print_report

    r = qq.quantize_model(MODEL, None, CALIBRATION, promote=False).report
    r = replace(r, latency_ms=[], decision=replace(r.decision, faster=None))
    buf = io.StringIO()
    print_report(r, Console(file=buf, width=120))
    assert "latency (ORT)" not in buf.getvalue()
