"""A detector's boxes and class scores judged by the detections its users keep, not by their SQNR.

A YOLOv8-style detector writes one output that concatenates, along its
channel axis, 4 box coordinates (centre x, centre y, width, height) and a
Sigmoid's class scores, for every anchor: ``(N, 4 + C, A)``. Its users keep
the anchors whose best class scores above :data:`CONFIDENCE`, then drop
the boxes that overlap a better one of their class (non-maximum
suppression). Most of the A x C scores are near 0 and nobody reads them,
so an SQNR of 30 dB over them asks for accuracy no detection needs, and
misses the few that flip.

The measure: each sample's detections of the float model and of the
quantized one, matched one to one (same class, IoU at least
:data:`MATCH_IOU`, the float model's best first), and their F1 over all the
eval data (twice the matched ones over the two counts): 1 where both keep
the same detections, and where neither keeps any. The thresholds are
Ultralytics' prediction defaults (a best score above ``conf=0.25``,
``iou=0.7``, ``max_det=300`` in its ``cfg/default.yaml``) and the PASCAL
VOC / COCO AP50 match; the suppression reads a sample's 3000 most
confident boxes (Ultralytics reads 30000), which bounds its square of
overlaps. The default target is the same 99% as a classifier's, where the
float model keeps enough detections on the eval data to judge it
(:data:`~qlinear.quantize._decisions.FEWEST_DECISIONS`); otherwise the
output's SQNR is (the worse of the boxes' and the scores').
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from qlinear.onnx._graph import producers
from qlinear.quantize._decisions import sigmoid_scores
from qlinear.quantize._evaluate import Reference, Runner

__all__ = [
    "CONFIDENCE",
    "RULE",
    "MATCH_IOU",
    "Detections",
    "DetectionLayout",
    "detection_layout",
    "detections_kept",
    "float_detections",
]

CONFIDENCE = 0.25  # a detection's best-class score is above it (Ultralytics' predict default)
NMS_IOU = 0.7  # the overlap with a better box of its class at which a box is dropped (Ultralytics' default)
MAX_DETECTIONS = 300  # a sample's detections kept, best first (Ultralytics' max_det)
MATCH_IOU = 0.5  # the overlap at which a quantized detection is the float one's (AP50's)
# The most confident boxes a sample's suppression reads: its overlaps are a square of them (3000: 72 MB of float32 pairs).
_CANDIDATES = 3000
_BOX = 4  # centre x, centre y, width, height
RULE = f"F1 of the detections scored above {CONFIDENCE:g}, boxes matched at IoU >= {MATCH_IOU:g}"  # what the figure is


@dataclass(frozen=True)
class DetectionLayout:
    """Where the boxes and the scores lie in the output: its channel ``axis`` (1 or 2), boxes first, then ``classes`` scores."""

    axis: int
    classes: int

    def channels_first(self, batch: np.ndarray) -> np.ndarray:
        """``batch`` as ``(N, 4 + C, A)``."""
        batch = np.asarray(batch, np.float32)
        return batch if self.axis == 1 else batch.transpose(0, 2, 1)


@dataclass
class Detections:
    """One sample's detections: boxes as corners ``(n, 4)`` (x0, y0, x1, y1), their classes and scores, best first."""

    corners: np.ndarray
    classes: np.ndarray
    scores: np.ndarray


def detection_layout(model: onnx.ModelProto, reference: Reference) -> DetectionLayout | None:
    """The layout of ``reference``'s first output where it is boxes beside class scores; None otherwise.

    The output must be made by a Concat, of rank 3, along axis 1 or 2, of
    tensors that give 4 channels in all and then a last one made by a
    Sigmoid (through reshapes and casts): the YOLOv8 and YOLO11 exports'
    layout. The boxes' tensors must not be Sigmoids themselves.
    """
    parts = reference.parts.get(reference.output)
    if parts is None:
        return None
    axis, slices = parts
    first = np.asarray(reference.batches[0][1][reference.output])
    concat = producers(model.graph)[reference.output]
    if first.ndim != 3 or axis not in (1, 2) or len(slices) != len(concat.input) or len(slices) < 2:
        return None
    if slices[-1].start != _BOX or not sigmoid_scores(model, concat.input[-1]):
        return None
    if any(sigmoid_scores(model, name) for name in concat.input[:-1]):
        return None
    return DetectionLayout(axis, slices[-1].stop - slices[-1].start)


def detected(sample: np.ndarray) -> Detections:
    """The detections of one sample's ``(4 + C, A)`` output: confident, then suppressed by class, at most :data:`MAX_DETECTIONS`."""
    scores = sample[_BOX:]
    best = np.argmax(scores, axis=0)
    score = scores[best, np.arange(scores.shape[1])]
    kept = np.flatnonzero(score > CONFIDENCE)
    kept = kept[np.argsort(-score[kept], kind="stable")][:_CANDIDATES]
    centre, size = sample[:2, kept].T, np.abs(sample[2:_BOX, kept].T)
    corners = np.concatenate([centre - size / 2, centre + size / 2], axis=1)
    classes = best[kept]
    chosen = _suppressed(corners, classes)[:MAX_DETECTIONS]
    return Detections(corners[chosen], classes[chosen], score[kept][chosen])


def _suppressed(corners: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """Indices of the boxes (best first) that no better box of their class overlaps by more than :data:`NMS_IOU`."""
    overlap = _iou(corners, corners)
    overlap[classes[:, None] != classes[None, :]] = 0.0
    dropped = np.zeros(len(corners), bool)
    for i in range(len(corners)):
        if not dropped[i]:
            dropped[i + 1 :] |= overlap[i, i + 1 :] > NMS_IOU
    return np.flatnonzero(~dropped)


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The intersection over union of every box of ``a`` with every box of ``b`` (corners), ``(len(a), len(b))``."""
    low = np.maximum(a[:, None, :2], b[None, :, :2])
    high = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(high - low, 0.0, None), axis=2)
    area_a = np.prod(a[:, 2:] - a[:, :2], axis=1)
    area_b = np.prod(b[:, 2:] - b[:, :2], axis=1)
    union = area_a[:, None] + area_b[None, :] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(union > 0, inter / union, 0.0)


def matched(want: Detections, got: Detections) -> int:
    """How many of ``want``'s detections (best first) find one of ``got``'s, each used once: same class, IoU >= :data:`MATCH_IOU`."""
    if not len(want.classes) or not len(got.classes):
        return 0
    overlap = _iou(want.corners, got.corners)
    overlap[want.classes[:, None] != got.classes[None, :]] = -1.0
    found = 0
    for row in overlap:
        j = int(np.argmax(row))
        if row[j] >= MATCH_IOU:
            found += 1
            overlap[:, j] = -1.0  # taken
    return found


def count_detections(outputs: np.ndarray) -> int:
    """The detections of every sample of ``outputs`` ``(N, 4 + C, A)``."""
    return sum(len(detected(sample).classes) for sample in outputs)


def detection_counts(wants: np.ndarray, gots: np.ndarray) -> tuple[int, int]:
    """``(matched, both counts)`` of the samples of ``gots`` against ``wants`` (each ``(N, 4 + C, A)``): the F1's sums."""
    return _counts([detected(sample) for sample in wants], gots)


def _counts(wants: list[Detections], gots: np.ndarray) -> tuple[int, int]:
    shared = total = 0
    for want, got_sample in zip(wants, gots, strict=True):
        got = detected(got_sample)
        shared += matched(want, got)
        total += len(want.classes) + len(got.classes)
    return shared, total


def detections_f1(wants: np.ndarray, gots: np.ndarray) -> float:
    """The F1 of the detections of ``gots`` against those of ``wants`` (each ``(N, 4 + C, A)``); 1 where neither has any."""
    return _f1(*detection_counts(wants, gots))


def _f1(shared: int, total: int) -> float:
    return 1.0 if total == 0 else 2 * shared / total


class FloatDetections:
    """The float model's detections on a reference's batches, found once for every model the search judges against them."""

    def __init__(self, reference: Reference, layout: DetectionLayout) -> None:
        self.reference, self.layout = reference, layout
        self.batches = [
            [detected(sample) for sample in layout.channels_first(ref[reference.output])] for _, ref in reference.batches
        ]

    @property
    def count(self) -> int:
        return sum(len(d.classes) for batch in self.batches for d in batch)

    def kept(self, model: onnx.ModelProto) -> float:
        """The F1 of ``model``'s detections against these, over every sample of the reference."""
        r = self.reference
        runner = Runner(model, [r.output], r.runtime)
        shared = total = 0
        for (feeds, _), wants in zip(r.batches, self.batches, strict=True):
            s, t = _counts(wants, self.layout.channels_first(runner(feeds)[r.output]))
            shared, total = shared + s, total + t
        return _f1(shared, total)


def float_detections(reference: Reference, layout: DetectionLayout) -> int:
    """The float model's detections over the reference's batches."""
    return FloatDetections(reference, layout).count


def detections_kept(model: onnx.ModelProto, reference: Reference, layout: DetectionLayout) -> float:
    """The F1 of ``model``'s detections against the float model's, over every sample of ``reference``."""
    return FloatDetections(reference, layout).kept(model)
