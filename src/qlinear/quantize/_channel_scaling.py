"""Moving scale between a layer's input channels and its weight's rows: the rewrite SmoothQuant and AWQ share.

``x W = (x / s) (s W)``: a ``Mul`` by ``1 / s`` after the activation (one for
every layer that reads it) and the layers' weight rows times ``s``. The
float function is unchanged up to rounding; what changes is how each side
quantizes.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qlinear.quantize._calibrate import run_batch, session, with_outputs
from qlinear.quantize._data import Dataset
from qlinear.quantize._model import FloatModel, attribute, fresh_name

__all__ = ["observe", "rewrite", "rows_first", "sites"]


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


def observe(fm: FloatModel, tensors: list[str], data: Dataset, batch_size: int, sample_rows: int):
    """``(max |x|, mean |x|, sample)`` of each tensor over the data: per channel (its last axis), and its first ``sample_rows`` rows."""
    sess = session(with_outputs(fm.model, tensors), arena=False)
    absmax: dict[str, np.ndarray] = {}
    abssum: dict[str, np.ndarray] = {}
    count = dict.fromkeys(tensors, 0)
    rows: dict[str, list[np.ndarray]] = {t: [] for t in tensors}
    kept = dict.fromkeys(tensors, 0)
    for k, feeds in enumerate(data.batches(batch_size)):
        for t, v in zip(tensors, run_batch(sess, tensors, feeds, f"smoothing batch {k}"), strict=True):
            flat = np.abs(np.asarray(v, np.float32).reshape(-1, np.shape(v)[-1]))
            m, total = flat.max(axis=0), flat.sum(axis=0, dtype=np.float64)
            absmax[t] = np.maximum(absmax[t], m) if t in absmax else m
            abssum[t] = abssum[t] + total if t in abssum else total
            count[t] += flat.shape[0]
            if kept[t] < sample_rows:
                rows[t].append(np.asarray(v, np.float32).reshape(-1, np.shape(v)[-1])[: sample_rows - kept[t]])
                kept[t] += rows[t][-1].shape[0]
    means = {t: abssum[t] / count[t] for t in abssum if count[t]}
    return absmax, means, {t: np.concatenate(r) for t, r in rows.items() if r}


def rows_first(fm: FloatModel, node: onnx.NodeProto) -> np.ndarray:
    """The layer's weight as (K, N): input channels along the rows."""
    w = fm.constant(node.input[1]).astype(np.float64)
    return w.T if node.op_type == "Gemm" and attribute(node, "transB", 0) else w


def rewrite(fm: FloatModel, tensor: str, nodes: list[onnx.NodeProto], s: np.ndarray, label: str) -> None:
    """``tensor * (1 / s)`` into the layers, their weights' rows times ``s``; ``label`` names the Mul (its method)."""
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
        w = fm.constant(node.input[1])
        rows_scale = s[None, :] if node.op_type == "Gemm" and attribute(node, "transB", 0) else s[:, None]
        fm.set_constant(node.input[1], (w.astype(np.float64) * rows_scale).astype(w.dtype))
