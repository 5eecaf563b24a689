"""SmoothQuant: move the outlier channels of a MatMul's or Gemm's input into its weight before quantizing both.

An activation with a few channels far larger than the rest loses the rest
under one per-tensor 8-bit scale. Dividing input channel ``j`` by ``s_j``
and multiplying the weight's row ``j`` by it leaves the product unchanged
(``x W = (x / s) (s W)``) and evens out the activation, while per-channel
weight scales absorb the larger rows (Xiao et al., "SmoothQuant", 2022):
``s_j = max|x_j|^alpha / max|W_j|^(1 - alpha)``.

Here the division is a ``Mul`` by ``1 / s`` inserted after the activation
(one for all the layers that read it, whose weights all take ``s``), and
Only activations with outlier channels are smoothed (a channel's maximum
at least :data:`OUTLIER_RATIO` times the median channel's), and ``alpha``
is searched per activation: among 0.3-0.8 and no smoothing, the
one whose quantization (activation per tensor, weights per output channel,
at the types asked for) of the layers' output has the least squared error
on a sample of the calibration inputs, the activation's range taken from
one half of the sample and the error from the other. It rewrites the float model before the plan, from
a first pass over the calibration data that keeps each activation's
per-channel maximum and its first rows; the model's function is unchanged
up to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qlinear.dtypes import element_type
from qlinear.quantize._calibrate import run_batch, session, with_outputs
from qlinear.quantize._choose import scale_and_zero_point
from qlinear.quantize._data import Dataset
from qlinear.quantize._model import FloatModel, index

__all__ = ["ALPHAS", "Smoothed", "smooth"]

ALPHAS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
SAMPLE_ROWS = 1024  # calibration rows each activation keeps for the alpha search
# Smoothed only where some channel's largest value is this many times the median channel's: elsewhere the
# channels are alike, smoothing gains little, and its range rests on each channel's maximum, which a small
# calibration set estimates badly (held-out values then clip).
OUTLIER_RATIO = 4.0
_U8, _I8 = element_type("uint8"), element_type("int8")


@dataclass(frozen=True)
class Smoothed:
    """One activation smoothed: the layers that read it, the alpha chosen, and the sample error before and after."""

    tensor: str
    nodes: tuple[str, ...]
    alpha: float | None  # None: no smoothing was better on the sample
    error_before: float
    error_after: float


def smooth(
    fm: FloatModel, data: Dataset, *, batch_size: int, excluded: set[str], weights: str = "int8", activations: str = "uint8"
) -> list[Smoothed]:
    """Smooth every activation read by MatMul/Gemm layers with constant weights (``fm`` rewritten in place).

    ``weights``/``activations``: the types the search simulates (integer
    weights per output channel, the activation per tensor).
    """
    wt, at = element_type(weights), element_type(activations)
    if not (wt.is_integer and at.is_integer):
        wt, at = _I8, _U8
    sites = _sites(fm, excluded)
    if not sites:
        return []
    absmax, rows = _observe(fm, list(sites), data, batch_size)
    done = []
    for tensor, nodes in sites.items():
        if tensor not in absmax or absmax[tensor].max() < OUTLIER_RATIO * max(float(np.median(absmax[tensor])), 1e-30):
            continue
        weights = [_rows_first(fm, n) for n in nodes]
        best = _search(rows[tensor], absmax[tensor], weights, wt, at)
        done.append(Smoothed(tensor, tuple(n.name for n in nodes), *best))
        if best[0] is not None:
            _rewrite(fm, tensor, nodes, _scales(absmax[tensor], weights, best[0]))
    index(fm)
    return done


def _sites(fm: FloatModel, excluded: set[str]) -> dict[str, list[onnx.NodeProto]]:
    """Float activations and the layers (2-D constant weight of their own, rows along the activation's last axis) reading them."""
    sites: dict[str, list[onnx.NodeProto]] = {}
    for node in fm.graph.node:
        if node.name in excluded or node.op_type in excluded or node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
            continue
        x, w = node.input[0], node.input[1]
        if x in fm.initializers or w not in fm.initializers or len(fm.shapes.get(w, ())) != 2 or not fm.is_float(x):
            continue
        if node.op_type == "Gemm" and _attr(node, "transA", 0):
            continue
        if len(fm.consumers.get(w, [])) != 1:  # a weight shared with other layers cannot take this input's scales
            continue
        sites.setdefault(x, []).append(node)
    return sites


def _observe(fm: FloatModel, tensors: list[str], data: Dataset, batch_size: int):
    """Per-channel max |x| over the data, and the first SAMPLE_ROWS rows (last axis) of each tensor."""
    sess = session(with_outputs(fm.model, tensors))
    absmax: dict[str, np.ndarray] = {}
    rows: dict[str, list[np.ndarray]] = {t: [] for t in tensors}
    kept = dict.fromkeys(tensors, 0)
    for k, feeds in enumerate(data.batches(batch_size)):
        for t, v in zip(tensors, run_batch(sess, tensors, feeds, f"smoothing batch {k}"), strict=True):
            flat = np.asarray(v, np.float32).reshape(-1, np.shape(v)[-1])
            m = np.abs(flat).max(axis=0)
            absmax[t] = np.maximum(absmax[t], m) if t in absmax else m
            if kept[t] < SAMPLE_ROWS:
                rows[t].append(flat[: SAMPLE_ROWS - kept[t]])
                kept[t] += rows[t][-1].shape[0]
    return absmax, {t: np.concatenate(r) for t, r in rows.items() if r}


def _rows_first(fm: FloatModel, node: onnx.NodeProto) -> np.ndarray:
    """The layer's weight as (K, N): input channels along the rows."""
    w = fm.constant(node.input[1]).astype(np.float64)
    return w.T if node.op_type == "Gemm" and _attr(node, "transB", 0) else w


def _scales(absmax: np.ndarray, weights: list[np.ndarray], alpha: float) -> np.ndarray:
    wmax = np.max([np.abs(w).max(axis=1) for w in weights], axis=0)
    s = np.power(np.maximum(absmax.astype(np.float64), 1e-5), alpha) / np.power(np.maximum(wmax, 1e-5), 1 - alpha)
    return np.where(np.isfinite(s) & (s > 0), s, 1.0)


def _search(x: np.ndarray, absmax: np.ndarray, weights: list[np.ndarray], wt, at) -> tuple[float | None, float, float]:
    """``(alpha, error without, error with)``: the alpha of least simulated output error (None: none beats no smoothing)."""
    x = x.astype(np.float64)
    refs = [x @ w for w in weights]
    plain = _error(x, weights, refs, np.ones(x.shape[1]), wt, at)
    best_alpha, best = None, plain
    for alpha in ALPHAS:
        err = _error(x, weights, refs, _scales(absmax, weights, alpha), wt, at)
        if err < best:
            best_alpha, best = alpha, err
    return best_alpha, plain, best


def _error(x: np.ndarray, weights: list[np.ndarray], refs: list[np.ndarray], s: np.ndarray, wt, at) -> float:
    """Squared output error of the layers with ``x / s`` quantized as ``at`` and ``s W`` as ``wt``.

    Two-fold: the activation's range comes from the even rows and the error
    from the odd ones, then the other way round, so an alpha whose range
    holds only for the rows it was taken from (a smoothed activation's
    maximum rests on fewer values) pays for its clipping.
    """
    xs = x / s
    wq = []
    for w in weights:
        ws = w * s[:, None]
        wscale, wzp = scale_and_zero_point(ws.min(axis=0), ws.max(axis=0), wt, wt.qmin < 0)
        wq.append((np.clip(np.rint(ws / wscale) + wzp, wt.qmin, wt.qmax) - wzp) * wscale)
    folds = (slice(0, None, 2), slice(1, None, 2)) if xs.shape[0] > 1 else (slice(None), slice(None))
    total = 0.0
    for fit, test in (folds, folds[::-1]):
        scale, zp = scale_and_zero_point(np.array([xs[fit].min()]), np.array([xs[fit].max()]), at, at.qmin < 0)
        xq = (np.clip(np.rint(xs[test] / scale[0]) + zp[0], at.qmin, at.qmax) - zp[0]) * scale[0]
        for q, ref in zip(wq, refs, strict=True):
            total += float(((xq @ q - ref[test]) ** 2).sum())
    return total


def _rewrite(fm: FloatModel, tensor: str, nodes: list[onnx.NodeProto], s: np.ndarray) -> None:
    """``tensor * (1 / s)`` into the layers, their weights' rows times ``s``."""
    g = fm.graph
    taken = {t.name for t in g.initializer} | {n for node in g.node for n in (*node.input, *node.output)}
    smoothed, inverse = _fresh(f"{tensor}_smoothed", taken), _fresh(f"{tensor}_smoothing", taken)
    dtype = helper.tensor_dtype_to_np_dtype(fm.elem_types.get(tensor, onnx.TensorProto.FLOAT))
    g.initializer.append(numpy_helper.from_array((1.0 / s).astype(dtype), inverse))
    mul = helper.make_node("Mul", [tensor, inverse], [smoothed], name=_fresh(f"{tensor}_SmoothQuant", {n.name for n in g.node}))
    first = min(list(g.node).index(n) for n in nodes)
    g.node.insert(first, mul)
    inits = {t.name: t for t in g.initializer}
    for node in nodes:
        node.input[0] = smoothed
        w = numpy_helper.to_array(inits[node.input[1]])
        rows_scale = s[None, :] if node.op_type == "Gemm" and _attr(node, "transB", 0) else s[:, None]
        inits[node.input[1]].CopyFrom(numpy_helper.from_array((w.astype(np.float64) * rows_scale).astype(w.dtype), node.input[1]))


def _fresh(base: str, taken: set[str]) -> str:
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    return name


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default
