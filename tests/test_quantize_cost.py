"""What a run costs follows the model's compute, not its node count: a graph of hundreds of data-movement nodes."""

from __future__ import annotations

import time

import onnxruntime as ort

import qlinear.quantize as qq
from quantize_models import data_movement


def _run(nodes: int, monkeypatch) -> tuple[qq.QuantizeResult, int, float]:
    """The default run on ``data_movement(nodes)``, with the analysis: its result, the runtime sessions it opened, its seconds."""
    opened = []
    real = ort.InferenceSession.__init__

    def counted(self, *args, **kwargs):
        opened.append(1)
        real(self, *args, **kwargs)

    monkeypatch.setattr(ort.InferenceSession, "__init__", counted)
    model, data = data_movement(nodes)
    start = time.perf_counter()
    result = qq.quantize_model(model, None, data, analyze=True)
    return result, len(opened), time.perf_counter() - start


def test_hundreds_of_data_movement_nodes_cost_what_the_compute_costs(monkeypatch):
    few, few_sessions, few_seconds = _run(12, monkeypatch)
    many, many_sessions, many_seconds = _run(504, monkeypatch)
    # The analysis measures the compute nodes alone, and every stage opens as many sessions as for 12 such nodes.
    assert [n.name for n in many.report.analysis] == [n.name for n in few.report.analysis] == ["conv0", "conv1", "fc"]
    assert many_sessions == few_sessions > 0
    # The same work: no pass over the graph grows with its node count past a small constant (a run took 0.8 s
    # against 0.5 s on the test machine; a pass quadratic in the nodes would take minutes).
    assert many_seconds < 5 * few_seconds + 5.0
    assert many.report.output.top1_agreement >= few.report.output.top1_agreement - 0.05
