"""Moving scale between a layer's input channels and its weight's rows: the rewrite SmoothQuant and AWQ share.

``x W = (x / s) (s W)``: the layers' weight rows times ``s``, and the
activation divided by ``s`` in the nodes that compute it where a channel
scale passes through them (a Conv's or a LayerNorm's output channels,
through a Relu or a pool), else by a ``Mul`` after it (one for every layer
that reads it). The
float function is unchanged up to rounding; what changes is how each side
quantizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qlinear.quantize._data import Dataset
from qlinear.quantize._model import FloatModel, attribute, fresh_name
from qlinear.quantize._session import only_outputs, run_batch

if TYPE_CHECKING:
    from qlinear.quantize.targets import Target

__all__ = ["ScaledActivation", "fold_into_producer", "observe", "rewrite", "rows_first", "sites"]


@dataclass(frozen=True)
class ScaledActivation:
    """One activation whose channels SmoothQuant or AWQ scaled: the layers that read it, the alpha chosen, the sample error before and after."""

    tensor: str
    nodes: tuple[str, ...]
    alpha: float | None  # None: no smoothing was better on the sample
    sample_error_before: float  # the layers' output error on the sample, before and after
    sample_error_after: float


def sites(fm: FloatModel, excluded: set[str]) -> dict[str, list[onnx.NodeProto]]:
    """Float activations and the layers (2-D constant weight of their own, rows along the activation's last axis) reading them."""
    found: dict[str, list[onnx.NodeProto]] = {}
    for node in fm.graph.node:
        if node.name in excluded or node.op_type in excluded or node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
            continue
        x, w = node.input[0], node.input[1]
        if x in fm.initializers or w not in fm.initializers or len(fm.shapes.get(w, ())) != 2 or not fm.is_float(x):
            continue
        if node.op_type == "Gemm" and attribute(node, "transA", 0):
            continue
        if len(fm.consumers.get(w, [])) != 1:  # a weight shared with other layers cannot take this input's scales
            continue
        found.setdefault(x, []).append(node)
    return found


def observe(
    fm: FloatModel, tensors: list[str], data: Dataset, batch_size: int, sample_rows: int, runtime: Target, *, axis: int = -1
):
    """``(max |x|, mean |x|, sample)`` of each tensor over the data, run on ``runtime``.

    Per channel (along ``axis``: the last, or 1 for a Conv's channels), and
    its first ``sample_rows`` rows (the channels last).
    """
    sess = runtime.session(only_outputs(fm.model, tensors), arena=False)  # no node past the last of them runs
    absmax: dict[str, np.ndarray] = {}
    abssum: dict[str, np.ndarray] = {}
    count = dict.fromkeys(tensors, 0)
    rows: dict[str, list[np.ndarray]] = {t: [] for t in tensors}
    kept = dict.fromkeys(tensors, 0)
    for k, feeds in enumerate(data.batches(batch_size)):
        for t, v in zip(tensors, run_batch(sess, tensors, feeds, f"smoothing batch {k}"), strict=True):
            v = np.moveaxis(np.asarray(v, np.float32), axis, -1)
            flat = np.abs(v.reshape(-1, v.shape[-1]))
            m, total = flat.max(axis=0), flat.sum(axis=0, dtype=np.float64)
            absmax[t] = np.maximum(absmax[t], m) if t in absmax else m
            abssum[t] = abssum[t] + total if t in abssum else total
            count[t] += flat.shape[0]
            if kept[t] < sample_rows:
                rows[t].append(v.reshape(-1, v.shape[-1])[: sample_rows - kept[t]])
                kept[t] += rows[t][-1].shape[0]
    means = {t: abssum[t] / count[t] for t in abssum if count[t]}
    return absmax, means, {t: np.concatenate(r) for t, r in rows.items() if r}


def rows_first(fm: FloatModel, node: onnx.NodeProto) -> np.ndarray:
    """The layer's weight as (K, N): input channels along the rows."""
    w = fm.constant(node.input[1]).astype(np.float64)
    return w.T if node.op_type == "Gemm" and attribute(node, "transB", 0) else w


def rewrite(
    fm: FloatModel, tensor: str, nodes: list[onnx.NodeProto], s: np.ndarray, label: str, *, into_weights: bool = True
) -> None:
    """``tensor * (1 / s)`` into the layers, their weights' rows times ``s``; ``label`` names the Mul (its method).

    The division goes into the nodes computing ``tensor`` where a positive
    channel scale passes through them (:func:`fold_into_producer`), and
    only elsewhere into a Mul of its own: a float Mul between two quantized
    layers is one more pass over the activation, and one that keeps a pool
    before it from fusing.
    """
    for node in nodes:
        w = fm.constant(node.input[1])
        rows_scale = s[None, :] if node.op_type == "Gemm" and attribute(node, "transB", 0) else s[:, None]
        fm.set_constant(node.input[1], (w.astype(np.float64) * rows_scale).astype(w.dtype))
    if fm.elem_types.get(tensor) == onnx.TensorProto.FLOAT and fold_into_producer(
        fm, tensor, nodes, 1.0 / s.astype(np.float64), into_weights=into_weights
    ):
        return
    g = fm.graph
    taken = {t.name for t in g.initializer} | {n for node in g.node for n in (*node.input, *node.output)}
    smoothed, inverse = fresh_name(f"{tensor}_smoothed", taken), fresh_name(f"{tensor}_smoothing", taken)
    dtype = helper.tensor_dtype_to_np_dtype(fm.elem_types.get(tensor, onnx.TensorProto.FLOAT))
    g.initializer.append(numpy_helper.from_array((1.0 / s).astype(dtype), inverse))
    mul = helper.make_node("Mul", [tensor, inverse], [smoothed], name=fresh_name(f"{tensor}_{label}", {n.name for n in g.node}))
    first = min(list(g.node).index(n) for n in nodes)
    g.node.insert(first, mul)
    for node in nodes:
        node.input[0] = smoothed


# Ops through which a positive per-channel scale passes unchanged: f(x / s) = f(x) / s channel by channel.
_SCALE_COMMUTING = frozenset({"Relu", "LeakyRelu", "MaxPool", "AveragePool", "GlobalAveragePool"})


def fold_into_producer(
    fm: FloatModel, tensor: str, nodes: list[onnx.NodeProto], inverse: np.ndarray, *, into_weights: bool, axis: int = -1
) -> bool:
    """Put ``tensor * inverse`` (one positive value a channel, along ``axis``: -1 or 1) into the nodes computing ``tensor``.

    Walks back through nodes that a positive channel scale passes through
    (Relu, pools, a Flatten or Reshape that keeps the channels, an Add of a
    constant, whose constant takes the scale too) to one that takes it into
    its constants: a Conv's or Gemm's or MatMul's output channels (weight
    and bias), a Mul by a constant (a LayerNorm's ``gamma``, written out), a
    LayerNormalization's scale and bias. Every tensor on the way must be read
    by the next node alone, so nothing else sees the scaled values. A layer's
    weight takes it only ``into_weights`` (per-channel or blocked weights,
    whose scales absorb it). Returns False, changing nothing, where the walk
    finds no such node.
    """
    kept = set(fm.output_names) | fm.read_in_subgraphs
    if {n.name for n in fm.consumers.get(tensor, [])} != {n.name for n in nodes} or tensor in kept:
        return False
    edits: list[tuple[str, np.ndarray]] = []  # (constant, its new value), made only once the walk succeeds
    t = tensor  # axis: the channel axis of t, -1 (last) or 1 (channels first)
    while True:
        node = fm.producer.get(t)
        shape = fm.shapes.get(t)
        if node is None or node.domain not in ("", "ai.onnx") or shape is None or fm.elem_types.get(t) != onnx.TensorProto.FLOAT:
            return False
        # A Shape reads no values (the Gemms of an input of open shape read its leading dimensions with one).
        if t != tensor and (len([c for c in fm.consumers.get(t, []) if c.op_type != "Shape"]) != 1 or t in kept):
            return False
        rank = len(shape)
        op = node.op_type
        source = node.input[0]
        if op in _SCALE_COMMUTING:
            if op not in ("Relu", "LeakyRelu") and axis % rank != 1:
                return False  # pools keep the channels on axis 1
            t = source
            continue
        if op in ("Flatten", "Reshape", "Squeeze", "Unsqueeze"):
            src = fm.shapes.get(source)
            if src is None or axis % rank != rank - 1 or shape[-1] != len(inverse):
                return False
            if src[-1] == len(inverse):
                axis = -1  # the last axis stays the channels
            elif len(src) > 2 and src[1] == len(inverse) and all(d == 1 for d in src[2:]):
                axis = 1  # (N, C, 1, ..., 1) to (N, C)
            else:
                return False
            t = source
            continue
        if op in ("Add", "Mul") and len(node.input) == 2:
            # x + c passes the scale on, c taking it too; x * c takes it into c (a LayerNorm's gamma, written out).
            held = [i for i in node.input if i in fm.initializers]
            if len(held) != 1 or len(fm.consumers.get(held[0], [])) != 1:
                return False
            if fm.shapes.get(next(i for i in node.input if i != held[0])) != shape:
                return False  # the tensor itself broadcast along the channels: it has none to scale
            scaled = _scaled_constant(fm.constant(held[0]), inverse, axis, rank)
            if scaled is None:
                return False
            edits.append((held[0], scaled))
            if op == "Mul":
                break
            t = next(i for i in node.input if i != held[0])
            continue
        if op not in ("LayerNormalization", "Conv", "MatMul", "Gemm"):
            return False
        if op != "LayerNormalization" and not into_weights:
            return False  # per-tensor weights: output channels scaled apart would share one weight scale
        # Each constant read once (a weight may be mapped from a large model's file).
        constants = {c: fm.constant(c) for c in node.input[1:] if c}
        if any(v is None or len(fm.consumers.get(c, [])) != 1 for c, v in constants.items()):
            return False
        held = list(constants.items())
        if op == "LayerNormalization" and axis % rank == rank - 1 and attribute(node, "axis", -1) % rank == rank - 1:
            edits += [(c, v * inverse) for c, v in held]
            break
        if op == "Conv" and axis % rank == 1 and held and held[0][1].shape[0] == len(inverse):
            (name, w), *rest = held
            edits.append((name, w * inverse.reshape(-1, *([1] * (w.ndim - 1)))))
            edits += [(c, v * inverse) for c, v in rest]
            break
        if op in ("MatMul", "Gemm") and axis % rank == rank - 1 and node.input[1] in constants:
            w = constants[node.input[1]]
            trans = op == "Gemm" and attribute(node, "transB", 0)
            if w.ndim != 2 or w.shape[0 if trans else 1] != len(inverse) or (op == "Gemm" and attribute(node, "transA", 0)):
                return False
            edits.append((node.input[1], w * (inverse[:, None] if trans else inverse[None, :])))
            if op == "Gemm" and len(held) > 1:
                c = held[1][1]
                if c.ndim and c.shape[-1] not in (1, len(inverse)):
                    return False
                edits.append(
                    (held[1][0], np.broadcast_to(c, (*c.shape[:-1], len(inverse)) if c.ndim else (len(inverse),)) * inverse)
                )
            break
        return False
    for name, value in edits:
        fm.set_constant(name, np.asarray(value, np.float64).astype(np.float32))
    return True


def _scaled_constant(c: np.ndarray, inverse: np.ndarray, axis: int, rank: int) -> np.ndarray | None:
    """A constant that broadcasts against a rank-``rank`` tensor, times ``inverse`` along ``axis``; None if it spans other axes."""
    if c.ndim > rank:
        return None
    full = (1,) * (rank - c.ndim) + c.shape
    ax = axis % rank
    if any(d != 1 for k, d in enumerate(full) if k != ax) or full[ax] not in (1, len(inverse)):
        return None
    shape = [1] * rank
    shape[ax] = len(inverse)
    # Keep no more leading ones than the constant had, so the output's rank is unchanged.
    value = np.broadcast_to(c.reshape(full), shape) * inverse.reshape(shape)
    return value.reshape(value.shape[rank - max(c.ndim, rank - ax) :])
