"""An embedding judged by the direction of its vectors, not by its SQNR.

A model that maps each sample to one vector (a sentence embedder's pooled
output, an audio embedding that a wake-word head reads) is used through
the direction of that vector: nearest neighbours, a similarity threshold,
a small head trained on it. What a user asks of its quantized model is
vectors pointing where the float model's point, sample by sample: the mean
cosine similarity between each sample's float and quantized vector. The
output's SQNR over all samples is ruled by the samples with the longest
vectors, and a 30 dB target there asks more than the decisions downstream
need: openWakeWord's audio embedding quantized at the types asked for has
a mean cosine similarity of 0.9989 (26.4 dB), and its wake-word model's
decisions downstream agree with the float pipeline's on 99.7% of clips,
where the 30 dB target took five promotions and ran at 0.70-0.80x the
float model's latency at one window instead of 0.57-0.62x
(benchmarks/audio_embedding.py).

An output is taken for an embedding where, in the float model's values on
the eval data, each sample holds one vector (one axis past the batch
wider than 1, :data:`NARROWEST` to :data:`WIDEST` values) and the vectors
are centred (their mean over the vector is small beside their spread,
:data:`CENTRED`): vectors of positive coordinates, as a regressor of
landmarks in pixels writes, keep a cosine near 1 under any error, and
stay judged by their SQNR.
"""

from __future__ import annotations

import numpy as np
import onnx

from qlinear.quantize._evaluate import Reference, Runner

__all__ = ["CENTRED", "DEFAULT_COSINE", "NARROWEST", "WIDEST", "cosine_similarity", "embeds"]

# The mean cosine similarity the default target asks of an embedding: 0.998 is about 24 dB of SQNR a sample
# (1 - cos ~ 1 / (2 SNR)); 0.9989 on openWakeWord's embedding kept 99.7% of the decisions downstream.
DEFAULT_COSINE = 0.998
NARROWEST, WIDEST = 16, 4096  # the widths of embedding vectors (a waveform or a feature map is wider)
# The median over the samples of |mean| / standard deviation of a vector's values, at most, for a centred vector.
CENTRED = 0.5


def embeds(reference: Reference) -> bool:
    """Whether the reference's one judged output holds one centred vector a sample (module text).

    A model judged on several outputs keeps the SQNR of the worst: a
    cosine on the first would leave the others unguarded.
    """
    if len(reference.outputs) != 1:
        return False
    values = [np.asarray(ref[reference.output]) for _, ref in reference.batches]
    first = values[0]
    if first.dtype.kind != "f" or first.ndim < 2 or any(v.shape[1:] != first.shape[1:] for v in values):
        return False  # not float, or not one width in every batch (a sequence's length)
    wide = [d for d in first.shape[1:] if d != 1]
    if len(wide) != 1 or not NARROWEST <= wide[0] <= WIDEST:
        return False
    x = np.concatenate([v.reshape(len(v), -1) for v in values]).astype(np.float64)
    finite = np.isfinite(x).all(axis=1)
    spread = x[finite].std(axis=1)
    live = spread > 0
    if not live.any():
        return False
    return float(np.median(np.abs(x[finite].mean(axis=1)[live]) / spread[live])) < CENTRED


def cosine_similarity(model: onnx.ModelProto, reference: Reference) -> tuple[float, float]:
    """The mean and the lowest cosine similarity of ``model``'s first-output vectors to the float model's, sample by sample.

    Two zero vectors agree (1); a zero vector beside another, or a
    non-finite quantized one, does not (0). A sample whose float vector is
    not finite is left out, as the SQNR leaves out non-finite float values.
    """
    runner = Runner(model, [reference.output], reference.runtime)
    total, lowest, samples = 0.0, 1.0, 0
    for feeds, ref in reference.batches:
        want = np.asarray(ref[reference.output], np.float64)
        want = want.reshape(len(want), -1)
        got = np.asarray(runner(feeds)[reference.output], np.float64).reshape(want.shape)
        finite = np.isfinite(want).all(axis=1)
        if not finite.any():
            continue
        cos = _cosines(want[finite], got[finite])
        total, lowest, samples = total + float(cos.sum()), min(lowest, float(cos.min())), samples + len(cos)
    return (total / samples if samples else 1.0), lowest


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    norm_a, norm_b = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.einsum("ij,ij->i", a, b) / (norm_a * norm_b)
    both_zero = (norm_a == 0) & (norm_b == 0)
    return np.where(both_zero, 1.0, np.where(np.isfinite(cos), np.clip(cos, -1.0, 1.0), 0.0))
