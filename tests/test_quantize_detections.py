"""A detector's boxes and class scores judged by the detections they select: the layout, the F1 against an oracle, the target."""

from __future__ import annotations

import io

import numpy as np
import onnxruntime as ort
import pytest

import qlinear.onnx as qo
import qlinear.quantize as qq
from qlinear.quantize._data import load_dataset
from qlinear.quantize._decisions import FEWEST_DECISIONS
from qlinear.quantize._detections import MAX_DETECTIONS, detected, detection_layout, detections_f1, float_detections
from qlinear.quantize._evaluate import Reference
from qlinear.quantize._model import load_float_model
from qlinear.quantize.targets import target
from quantize_models import detection_head, yolo_head


def _reference(model, data) -> Reference:
    return Reference(model, load_dataset(data, load_float_model(model), what="data"), batch_size=16, runtime=target("ort-cpu"))


def _box_iou(a, b) -> float:
    """Two boxes' IoU, each (centre x, centre y, width, height), written out."""
    ax0, ay0, ax1, ay1 = a[0] - abs(a[2]) / 2, a[1] - abs(a[3]) / 2, a[0] + abs(a[2]) / 2, a[1] + abs(a[3]) / 2
    bx0, by0, bx1, by1 = b[0] - abs(b[2]) / 2, b[1] - abs(b[3]) / 2, b[0] + abs(b[2]) / 2, b[1] + abs(b[3]) / 2
    inter = max(0.0, min(ax1, bx1) - max(ax0, bx0)) * max(0.0, min(ay1, by1) - max(ay0, by0))
    union = (ax1 - ax0) * (ay1 - ay0) + (bx1 - bx0) * (by1 - by0) - inter
    return inter / union if union > 0 else 0.0


def _detections_by_hand(sample: np.ndarray) -> list[tuple[int, float, list[float]]]:
    """``(class, score, box)`` of one ``(4 + C, A)`` sample: each anchor's best class above 0.25, then suppression."""
    found = []
    for a in range(sample.shape[1]):
        scores = [float(v) for v in sample[4:, a]]
        c = max(range(len(scores)), key=lambda k: (scores[k], -k))
        if scores[c] > 0.25:
            found.append((c, scores[c], [float(v) for v in sample[:4, a]]))
    found.sort(key=lambda d: -d[1])
    kept = []
    for d in found:
        if all(k[0] != d[0] or _box_iou(k[2], d[2]) <= 0.7 for k in kept):
            kept.append(d)
    return kept[:300]


def _f1_by_hand(wants: np.ndarray, gots: np.ndarray) -> float:
    """The detections' F1 over samples (each ``(4 + C, A)``): a float detection, best first, takes the free one it overlaps most."""
    shared = total = 0
    for want_sample, got_sample in zip(wants, gots, strict=True):
        want, got = _detections_by_hand(want_sample), _detections_by_hand(got_sample)
        free = list(range(len(got)))
        for c, _, box in want:
            overlaps = [(_box_iou(box, got[j][2]), j) for j in free if got[j][0] == c]
            if overlaps and max(overlaps)[0] >= 0.5:
                free.remove(max(overlaps)[1])
                shared += 1
        total += len(want) + len(got)
    return 1.0 if total == 0 else 2 * shared / total


@pytest.mark.parametrize("seed", range(6))
def test_the_detections_f1_is_the_oracles(seed):
    rng = np.random.default_rng(seed)
    n, classes, anchors = 6, 4, 40
    wants = np.empty((n, 4 + classes, anchors), np.float32)
    wants[:, :2] = rng.uniform(0, 32, (n, 2, anchors))  # centres: crowded, so boxes overlap and suppression acts
    wants[:, 2:4] = rng.uniform(2, 14, (n, 2, anchors)) * rng.choice([-1, 1], (n, 2, anchors))  # a negative size too
    wants[:, 4:] = rng.uniform(0, 0.6, (n, classes, anchors))
    gots = wants + rng.normal(0, [[0.8], [0.8], [0.8], [0.8]] + [[0.05]] * classes, wants.shape).astype(np.float32)
    gots[0] = wants[0]  # one sample unchanged
    gots[1, 4:] = 0.0  # one sample with no detection left
    gots[2, 4:, :5] = np.nan  # scores a broken kernel left NaN: no detection
    gots[3, :4, :5] = np.nan  # boxes left NaN: no overlap with anything
    f1 = detections_f1(wants, gots)
    assert f1 == pytest.approx(_f1_by_hand(wants, gots), abs=1e-12)
    assert 0.2 < f1 < 1.0
    assert detections_f1(wants, wants) == 1.0
    assert detections_f1(wants[:, :, :0], wants[:, :, :0]) == 1.0  # neither keeps any: nothing changed


def test_a_sample_keeps_its_300_best_detections():
    rng = np.random.default_rng(0)
    sample = np.zeros((6, 400), np.float32)  # 400 boxes apart from each other, of two classes
    sample[0], sample[1], sample[2:4] = np.arange(400) * 10.0, 5.0, 4.0
    sample[4 + rng.integers(0, 2, 400), np.arange(400)] = rng.uniform(0.3, 1.0, 400)
    kept = detected(sample)
    assert len(kept.classes) == MAX_DETECTIONS == 300
    assert np.all(np.diff(kept.scores) <= 0) and kept.scores[-1] >= np.sort(sample[4:].max(0))[-300]


def test_a_yolo_output_is_boxes_beside_scores_and_other_concats_are_not():
    model, data = yolo_head()
    reference = _reference(model, data)
    layout = detection_layout(model, reference)
    assert (layout.axis, layout.classes) == (1, 3)
    # The same head with anchors before channels, (N, A, 4 + C): the same detections.
    turned = yolo_head(anchors_first=True)[0]
    turned_reference = _reference(turned, data)
    assert (detection_layout(turned, turned_reference).axis, detection_layout(turned, turned_reference).classes) == (2, 3)
    assert float_detections(turned_reference, detection_layout(turned, turned_reference)) == float_detections(reference, layout)
    head, head_data = detection_head()  # boxes beside a Softmax's scores, one row a sample: not YOLO's layout
    assert detection_layout(head, _reference(head, head_data)) is None
    # Scores that no Sigmoid makes are not detections' scores.
    g = qo.Graph("no_sigmoid", opset=17)
    x = g.input("x", "float", ("N", 6, 10))
    boxes = g.op("Slice", [x, np.array([0], np.int64), np.array([4], np.int64), np.array([1], np.int64)], name="boxes")
    scores = g.op("Slice", [x, np.array([4], np.int64), np.array([6], np.int64), np.array([1], np.int64)], name="scores")
    g.output(g.op("Concat", [boxes, g.op("Relu", [scores], name="relu")], name="cat", axis=1, output_names=["y"]))
    plain = g.to_model()
    assert detection_layout(plain, _reference(plain, {"x": np.ones((4, 6, 10), np.float32)})) is None


def test_a_detector_is_judged_by_its_detections_by_default():
    model, data = yolo_head()
    held_out = {"images": data["images"][96:]}
    r = qq.quantize_model(model, None, {"images": data["images"][:96]}, eval=held_out, max_float=1.0)
    promotions = r.report.promotions
    assert promotions.target.metric == "detections" and promotions.target.value == qq.DEFAULT_AGREEMENT
    assert promotions.target.text == (
        "detections kept >= 99.00% (F1 of the detections scored above 0.25, boxes matched at IoU >= 0.5)"
    )
    want = ort.InferenceSession(model.SerializeToString()).run(None, held_out)[0]
    got = ort.InferenceSession(r.model.SerializeToString()).run(None, held_out)[0]
    kept = r.report.output.detections_kept
    assert kept == pytest.approx(_f1_by_hand(want, got), abs=1e-12)
    # 8 bits alone lose more than 1% of the detections; the search promotes until they hold.
    assert promotions.before < 0.99 <= promotions.after == kept and r.target_met and promotions.steps
    assert "target met (detections kept >= 99.00%" in r.report.decision.line
    assert qq.Report.from_json(r.report.to_json()).output.detections_kept == kept


def test_too_few_detections_to_judge_leave_the_target_to_the_sqnr_and_the_figure_in_the_report():
    model, data = yolo_head(samples=40)  # 8 held out: some 70 detections, under the 100 a 99% target needs
    held_out = _reference(model, {"images": data["images"][32:]})
    assert 0 < float_detections(held_out, detection_layout(model, held_out)) < FEWEST_DECISIONS
    r = qq.quantize_model(model, None, data)
    assert r.report.promotions.target.metric == "sqnr"
    assert r.report.output.detections_kept is not None


def test_the_reports_show_the_detections_kept():
    from rich.console import Console

    from qlinear.quantize._html import render_html
    from qlinear.quantize._report_print import print_report

    model, data = yolo_head()
    report = qq.quantize_model(model, None, data).report
    console = Console(file=io.StringIO(), width=200)
    print_report(report, console)
    kept = f"{100 * report.output.detections_kept:.2f}%"
    row = next(line for line in console.file.getvalue().splitlines() if line.startswith("detections kept"))
    assert row.split()[2:5] == [kept, "(F1", "of"]
    assert "top-1 agreement" not in console.file.getvalue()
    pytest.importorskip("plotly")
    assert f"<th>detections kept</th><td>{kept} (F1 of the detections" in render_html(report)
