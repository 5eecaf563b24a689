"""What a quantized model's first output is judged by: its default target, the figure a target reads, the other measures.

A classifier's output by the top-1 agreement of its classes; a Sigmoid's
probabilities by the decisions they carry (:mod:`._decisions`); a
detector's boxes and class scores by the detections they select
(:mod:`._detections`); an embedding by the cosine similarity of its
vectors (:mod:`._embeddings`); anything else by its SQNR. A measure that
needs decisions to judge needs enough of them in the eval data
(:data:`~qlinear.quantize._decisions.FEWEST_DECISIONS`); otherwise the
output's SQNR is the target.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import onnx

from qlinear.quantize._decisions import FEWEST_DECISIONS, decisions_kept, positive_decisions, sigmoid_scores
from qlinear.quantize._detections import FloatDetections, detection_layout, detections_kept, float_detections
from qlinear.quantize._embeddings import DEFAULT_COSINE, cosine_similarity, embeds
from qlinear.quantize._evaluate import Reference, metric_figure, output_figures
from qlinear.quantize._metric import load_metric, metric_name
from qlinear.quantize._model import FloatModel
from qlinear.quantize._options import DEFAULT_AGREEMENT, DEFAULT_SQNR_DB, QuantizeOptions
from qlinear.quantize._promotion import AccuracyTarget

__all__ = ["default_target", "judge", "measures"]


def default_target(float_model: onnx.ModelProto, reference: Reference) -> AccuracyTarget:
    """The target where the user names none: by what ``reference``'s first output holds, in the module's order."""
    if reference.classifies:
        return AccuracyTarget("agreement", DEFAULT_AGREEMENT)
    if sigmoid_scores(float_model, reference.output) and positive_decisions(reference) >= FEWEST_DECISIONS:
        return AccuracyTarget("decisions", DEFAULT_AGREEMENT)
    boxes = detection_layout(float_model, reference)
    if boxes is not None and float_detections(reference, boxes) >= FEWEST_DECISIONS:
        return AccuracyTarget("detections", DEFAULT_AGREEMENT)
    if embeds(reference):  # one vector a sample: judged by where the vectors point
        return AccuracyTarget("cosine", DEFAULT_COSINE)
    return AccuracyTarget("sqnr", DEFAULT_SQNR_DB)


def judge(goal: AccuracyTarget, options: QuantizeOptions, float_model: onnx.ModelProto,
          reference: Reference) -> Callable[[onnx.ModelProto], float | None]:  # fmt: skip
    """The figure of ``goal``'s metric that a candidate model reaches against ``reference`` (None: an exact SQNR)."""
    if goal.metric == "metric":
        user_metric = load_metric(options.metric)
        return lambda model: metric_figure(model, reference, user_metric, goal.name)
    if goal.metric == "decisions":
        return lambda model: decisions_kept(model, reference)
    if goal.metric == "detections":  # the float model's detections found once, not once a candidate
        return FloatDetections(reference, detection_layout(float_model, reference)).kept
    if goal.metric == "cosine":
        return lambda model: cosine_similarity(model, reference)[0]
    pick = 1 if goal.metric == "agreement" else 0
    return lambda model: output_figures(model, reference)[pick]


def measures(fm: FloatModel, qmodel: onnx.ModelProto, reference: Reference, options: QuantizeOptions) -> dict[str, Any]:
    """The written model's measures beyond SQNR and agreement, on the eval data the target was met on.

    ``metric``: the user's (its name and value), where one was given;
    ``decisions_kept``: where the first output holds probabilities;
    ``detections_kept``: where it holds a detector's boxes and class scores;
    ``cosine_similarity``: its mean and lowest, where it holds an embedding.
    Each is given whether or not the eval data holds enough to make it the target.
    """
    found: dict[str, Any] = {"metric": None, "decisions_kept": None, "detections_kept": None, "cosine_similarity": None}
    if options.metric is not None:
        name = metric_name(options.metric)
        found["metric"] = {"name": name, "value": metric_figure(qmodel, reference, load_metric(options.metric), name)}
    if sigmoid_scores(fm.model, reference.output):
        found["decisions_kept"] = decisions_kept(qmodel, reference)
    elif (boxes := detection_layout(fm.model, reference)) is not None:
        found["detections_kept"] = detections_kept(qmodel, reference, boxes)
    elif not reference.classifies and embeds(reference):  # as the default target takes it
        found["cosine_similarity"] = cosine_similarity(qmodel, reference)
    return found
