"""The choose pass: scales and zero points from statistics (activations) and from the weights.

Activations: a range ``[a, b]`` from the statistics by ``method``, widened
to hold 0 (zero padding and ReLU outputs must be exact), then
``scale = (b - a) / (qmax - qmin)``, ``zero_point = round(qmin - a / scale)``
(asymmetric: unsigned types, and signed ones unless ``symmetric``), or
``scale = max(|a|, |b|) / qmax`` with zero point 0 (``symmetric``, and
always for float8, whose ``qmax`` is its largest finite value). Range methods, all computed from the histogram alone, so they do
not depend on the batch size:

- ``minmax``: the smallest and largest value;
- ``percentile``: the quantiles that keep ``percentile`` % of the values;
- ``mse``: the range, among the min-max range clipped at 128 bounds
  (``+-k/128`` of its largest magnitude), whose quantization of the
  histogram has the least squared error;
- ``entropy``: among the same ranges, the one whose quantized histogram
  has the least Kullback-Leibler divergence from the clipped histogram
  (values beyond the range folded into its end bins).

Scales are never zero or subnormal: an all-zero tensor (or channel) gets
scale 1, and any scale below float32's smallest normal value 2**-126 is
raised to it, so a QuantizeLinear never divides by zero and the model holds
no NaN (docs/reference/calibration.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
from onnx import TensorProto

from qlinear.dtypes import ElementType
from qlinear.quantize._consumer_curves import Curve
from qlinear.quantize._stats import TensorStats
from qlinear.quantize._weight_search import searched_params

__all__ = ["QuantParams", "activation_params", "clipped_range", "in_float_type", "scale_and_zero_point", "weight_params"]

_SMALLEST_NORMAL = np.float32(2.0**-126)  # 1.1754944e-38
_FACTORS = np.arange(128, 0, -1, dtype=np.float64) / 128  # range shrink factors searched by mse and entropy
_MSE_CLIP_FACTORS = np.linspace(1.0, 0.5, 11)
# Each side's clip factors where a reader's function weighs the error (_range_through): 48 x 48 pairs, down to 1/48.
_SIDE_FACTORS = np.arange(48, 0, -1, dtype=np.float64) / 48


@dataclass(frozen=True)
class QuantParams:
    """Scale and zero point arrays (zero point None: none written) and the range they came from."""

    scale: np.ndarray
    zero_point: np.ndarray | None
    low: float = 0.0
    high: float = 0.0


def _qmax(t: ElementType) -> float:
    return float(t.max_finite) if not t.is_integer else float(t.qmax)


def scale_and_zero_point(low: np.ndarray, high: np.ndarray, t: ElementType, symmetric: bool):
    """Vectorized: scale and zero point (float64, before types) for ranges ``[low, high]``."""
    low, high = np.minimum(low, 0.0), np.maximum(high, 0.0)
    if symmetric or not t.is_integer:
        m = np.maximum(-low, high)
        scale = m / _qmax(t)
        zp = np.zeros_like(scale)
    else:
        scale = (high - low) / float(t.qmax - t.qmin)
        with np.errstate(divide="ignore", invalid="ignore"):
            zp = np.clip(np.rint(t.qmin - low / scale), t.qmin, t.qmax)
        zp = np.where(scale > 0, zp, t.qmin if t.qmin >= 0 else 0)
    scale = np.where(scale > 0, scale, 1.0)
    return np.maximum(scale.astype(np.float32), _SMALLEST_NORMAL), zp


def activation_params(stats: TensorStats, t: ElementType, *, method: str, symmetric: bool, percentile: float,
                      curve: Curve | None = None) -> QuantParams:  # fmt: skip
    """Per-tensor scale and zero point of an activation of type ``t`` from its statistics.

    ``curve``: the elementwise function every reader applies to the tensor
    (:mod:`._consumer_curves`); with ``mse`` on an asymmetric integer type,
    the range is the one whose rounding leaves the least squared error after
    that function, each side clipped on its own.
    """
    symmetric = symmetric or not t.is_integer
    if curve is not None and method == "mse" and not symmetric and stats.count and stats.min < stats.max:
        low, high = _range_through(stats, t, curve)
    else:
        low, high = _range(stats, t, method, symmetric, percentile)
    scale, zp = scale_and_zero_point(np.array(low), np.array(high), t, symmetric)
    zero_point = np.asarray(zp).astype(t.dtype) if t.is_integer else np.zeros((), t.dtype)
    return QuantParams(np.asarray(scale, np.float32).reshape(()), zero_point.reshape(()), float(low), float(high))


def _range(stats: TensorStats, t: ElementType, method: str, symmetric: bool, percentile: float) -> tuple[float, float]:
    low, high = min(stats.min, 0.0), max(stats.max, 0.0)
    if stats.count == 0 or low == high or method == "minmax":
        return low, high
    if method == "percentile":
        tail = (100.0 - percentile) / 100.0
        q_low = stats.quantile(tail) if stats.min < 0 else 0.0
        q_high = stats.quantile(1.0 - tail) if stats.max > 0 else 0.0
        if symmetric:
            m = max(-q_low, q_high)
            return -m if stats.min < 0 else 0.0, m
        return min(q_low, 0.0), max(q_high, 0.0)
    lows, highs = _candidates(low, high, symmetric)
    losses = _losses(stats, t, lows, highs, symmetric, method)
    best = int(np.argmin(losses))
    return float(lows[best]), float(highs[best])


def _range_through(stats: TensorStats, t: ElementType, curve: Curve) -> tuple[float, float]:
    """The range whose rounding of the histogram has the least squared error after ``curve``: every pair of side clips."""
    low, high = min(stats.min, 0.0), max(stats.max, 0.0)
    n = len(_SIDE_FACTORS)
    lows, highs = np.repeat(low * _SIDE_FACTORS, n), np.tile(high * _SIDE_FACTORS, n)  # every pair of the sides' clips
    best = int(np.argmin(_losses(stats, t, lows, highs, False, "mse", curve)))
    return float(lows[best]), float(highs[best])


def _candidates(low: float, high: float, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    """Candidate ranges: ``[low, high]`` clipped at ``+-factor * max(|low|, high)``.

    The side of smaller magnitude is clipped only once the bound reaches
    it, so a skewed range (a few large positive outliers over a body around
    zero) keeps its negative side while its positive one shrinks.
    """
    bound = _FACTORS * max(-low, high)
    if symmetric:
        return np.where(low < 0, -bound, 0.0), bound
    return np.maximum(low, -bound), np.minimum(high, bound)


def _losses(stats: TensorStats, t: ElementType, lows: np.ndarray, highs: np.ndarray, symmetric: bool, method: str,
            curve: Curve | None = None) -> np.ndarray:  # fmt: skip
    """The loss of each candidate range ``[lows[i], highs[i]]``, from the histogram (``mse``: after ``curve``, where given)."""
    edges = stats.edges
    centers = (edges[:-1] + edges[1:]) / 2
    counts = stats.counts.astype(np.float64)
    if curve is not None:  # many candidates: the empty bins, which add nothing, left out of the (candidates x bins) arrays
        centers, counts = centers[counts > 0], counts[counts > 0]
    scales, zps = scale_and_zero_point(lows, highs, t, symmetric)
    scales = scales.astype(np.float64)[:, None]
    zps = zps[:, None]
    qmin, qmax = (t.qmin, t.qmax) if t.is_integer else (-_qmax(t), _qmax(t))
    if method == "mse":
        if t.is_integer:
            levels = np.clip(np.rint(centers / scales) + zps, qmin, qmax)
        else:  # float codes: the type's own rounding (its grid is not uniform), saturating, zero point 0
            levels = np.clip(centers / scales, qmin, qmax).astype(t.dtype).astype(np.float64)
        if curve is not None:
            return ((curve(centers) - curve((levels - zps) * scales)) ** 2 * counts).sum(axis=1)
        return ((centers - (levels - zps) * scales) ** 2 * counts).sum(axis=1)
    return np.array(
        [
            _kl(centers, counts, lo, hi, s, z, qmin, qmax)
            for lo, hi, s, z in zip(lows, highs, scales[:, 0], zps[:, 0], strict=True)
        ]
    )


def _kl(centers, counts, low, high, scale, zp, qmin, qmax) -> float:
    """KL divergence of the quantized histogram from the clipped one, as TensorRT's entropy calibration measures it.

    The reference ``p`` is the histogram inside the range with the values
    beyond it folded into the end bins; the candidate ``q`` quantizes the
    inside bins alone (so clipped mass is what ``q`` lacks), spreading each
    level's mass evenly over its non-empty bins.
    """
    inside = (centers >= low) & (centers <= high)
    if inside.sum() < qmax - qmin + 1:  # fewer bins than levels: the histogram cannot show the rounding loss
        return np.inf
    unfolded = counts[inside]
    p = unfolded.copy()
    p[0] += counts[centers < low].sum()
    p[-1] += counts[centers > high].sum()
    level = np.clip(np.rint(centers[inside] / scale) + zp, qmin, qmax).astype(np.int64)
    level -= level.min()
    mass = np.bincount(level, weights=unfolded)
    nonzero = np.bincount(level, weights=(unfolded > 0).astype(np.float64))
    q = np.where(unfolded > 0, mass[level] / np.maximum(nonzero[level], 1), 0.0)
    total_p, total_q = p.sum(), q.sum()
    if total_p == 0 or total_q == 0:
        return np.inf
    p, q = p / total_p, np.maximum(q / total_q, 1e-12)
    m = p > 0
    return float(np.sum(p[m] * np.log(p[m] / q[m])))


def symmetric_weights(t: ElementType, *, weight_only: bool) -> bool:
    """Whether weights of type ``t`` are stored symmetric (zero point 0; float types write none).

    Unsigned integers take a zero point; signed ones are symmetric, as
    ONNX Runtime's integer kernels (QLinearConv, QGemm, QLinearMatMul) take
    a signed weight with zero point 0 only, except narrower ones (int4, int2)
    of a ``weight_only`` node (float activations): of 16 or 4 levels, a
    symmetric range leaves unused the ones on the side a block does not
    reach, and what reads them there (MatMulNBits, or a DequantizeLinear in
    front of a float kernel) takes a zero point at no cost (a decoder's
    layers in blocks of 32: 20.3 dB of weight SQNR against 16.6).
    """
    return not t.is_integer or (t.qmin < 0 and (t.bits >= 8 or not weight_only))


def weight_params(
    w: np.ndarray,
    t: ElementType,
    *,
    granularity: str,
    channel_axis: int,
    reduction_axis: int,
    block_size: int,
    clip: str,
    weight_only: bool = False,
) -> tuple[QuantParams, int, int]:
    """Scale and zero point of weight ``w`` as type ``t``; returns ``(params, axis, block_size)`` for the DQ node.

    Symmetric or not as :func:`symmetric_weights` says (``weight_only``: the
    node's activations stay float). ``clip="mse"`` shrinks
    each channel's or block's range by the factor (1 to 0.5) with the least
    squared error; ``clip="search"`` searches each one's scale and integer
    zero point (:mod:`qlinear.quantize._weight_search`; float types as
    ``mse``).
    """
    w = np.asarray(w, np.float32)
    symmetric = symmetric_weights(t, weight_only=weight_only)
    if granularity == "per-tensor" or w.ndim == 0:
        groups, axis, block = w.reshape(1, -1), 0, 0
        shape = ()
    elif granularity == "per-channel":
        axis, block = channel_axis % w.ndim, 0
        groups = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
        shape = (w.shape[axis],)
    else:
        axis, block = reduction_axis % w.ndim, block_size
        moved = np.moveaxis(w, axis, -1)
        n = w.shape[axis]
        nblocks = -(-n // block)
        padded = np.zeros((*moved.shape[:-1], nblocks * block), np.float32)
        padded[..., :n] = moved
        groups = padded.reshape(-1, block)
        shape = tuple(np.moveaxis(np.empty((*moved.shape[:-1], nblocks), np.uint8), -1, axis).shape)
    if clip == "search" and t.is_integer:
        scale, zp = searched_params(groups, t.qmin, t.qmax, symmetric)
    else:
        low, high = groups.min(axis=1).astype(np.float64), groups.max(axis=1).astype(np.float64)
        if clip in ("mse", "search"):  # a float type's grid has no step to search: its least-error range
            low, high = clipped_range(groups, low, high, t, symmetric)
        scale, zp = scale_and_zero_point(low, high, t, symmetric)
    if granularity == "blocked":
        blocked_shape = (*moved.shape[:-1], nblocks)
        scale = np.moveaxis(scale.reshape(blocked_shape), -1, axis)
        zp = np.moveaxis(zp.reshape(blocked_shape), -1, axis)
    # astype copies into C order and, unlike ascontiguousarray, keeps a 0-d scale 0-d.
    scale = scale.reshape(shape).astype(np.float32)
    zero_point = None
    if t.is_integer:
        zero_point = zp.reshape(shape).astype(t.dtype)
    return QuantParams(scale, zero_point), axis, block


def clipped_range(groups: np.ndarray, low: np.ndarray, high: np.ndarray, t: ElementType, symmetric: bool):
    """Each row of ``groups``' range ``(low, high)`` shrunk by the factor (1 to 0.5) whose rounding has the least squared error."""
    best_err = np.full(groups.shape[0], np.inf)
    best_low, best_high = low.copy(), high.copy()
    qmin, qmax = (t.qmin, t.qmax) if t.is_integer else (-_qmax(t), _qmax(t))
    for f in _MSE_CLIP_FACTORS:
        scale, zp = scale_and_zero_point(low * f, high * f, t, symmetric)
        s, z = scale.astype(np.float64)[:, None], zp[:, None]
        if t.is_integer:
            dq = (np.clip(np.rint(groups / s) + z, qmin, qmax) - z) * s
        else:
            dq = _float_roundtrip(groups, s, t)
        err = ((groups - dq) ** 2).sum(axis=1)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_low, best_high = np.where(better, low * f, best_low), np.where(better, high * f, best_high)
    return best_low, best_high


def _float_roundtrip(groups: np.ndarray, s: np.ndarray, t: ElementType) -> np.ndarray:
    """``groups`` through a float type ``t`` with per-row scales ``s`` (saturating)."""
    with np.errstate(all="ignore"):
        q = np.clip(groups / s, -_qmax(t), _qmax(t)).astype(np.float32).astype(t.dtype)
        return q.astype(np.float64) * s


# The float types a model's tensors come in, and the smallest normal value of each (scales never go below it).
_FLOAT_TYPES = {
    TensorProto.FLOAT: (np.dtype(np.float32), 2.0**-126),
    TensorProto.FLOAT16: (np.dtype(np.float16), 2.0**-14),
    TensorProto.BFLOAT16: (np.dtype(ml_dtypes.bfloat16), 2.0**-126),
}


def in_float_type(scale: np.ndarray, elem_type: int) -> np.ndarray:
    """``scale`` in the float type of the tensor it scales (float32 for any other), never below its smallest normal value."""
    dtype, smallest = _FLOAT_TYPES.get(elem_type, _FLOAT_TYPES[TensorProto.FLOAT])
    return np.asarray(np.maximum(scale.astype(np.float64), smallest), dtype)
