"""The prepare pass: float-exact rewrites that let ONNX Runtime fuse the quantized model.

- ``MatMul(A, W) + b`` with a constant 2-D ``W``, a constant bias of one
  value per output and a 2-D ``A`` becomes ``Gemm(A, W, b)``. ONNX
  Runtime makes this Gemm itself before its QDQ fusions, and a Gemm with a
  float bias between quantized inputs matches none of them; as a Gemm
  here, the bias is stored as int32 and the whole runs as QGemm.
- For weight-only quantization, ``Gemm(A, B, transB=1)`` with a constant
  ``B`` stores ``B`` transposed with ``transB=0``: only then does a
  DequantizeLinear on ``B`` fuse into MatMulNBits.

Both rewrites keep node names (the Gemm takes the MatMul's name) and the
values the model computes: the products and sums are the same float
operations.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from qlinear.quantize._model import FloatModel, attribute, index

__all__ = ["prepare"]


def prepare(fm: FloatModel, *, weight_only: bool) -> FloatModel:
    """``fm`` with the rewrites applied (in place), re-indexed."""
    changed = _matmul_add_to_gemm(fm)
    if weight_only:
        changed |= _untranspose_gemm_weights(fm)
    if changed:
        index(fm)
    return fm


def _matmul_add_to_gemm(fm: FloatModel) -> bool:
    g = fm.graph
    outputs = set(fm.output_names)
    replace: dict[str, object] = {}
    drop: set[str] = set()
    for node in g.node:
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
            continue
        a, w = node.input
        users = fm.consumers.get(node.output[0], [])
        if w not in fm.initializers or len(fm.shapes.get(w, ())) != 2 or len(fm.shapes.get(a, ())) != 2:
            continue
        if len(users) != 1 or users[0].op_type != "Add" or node.output[0] in outputs:
            continue
        add = users[0]
        bias = add.input[1] if add.input[0] == node.output[0] else add.input[0]
        n = fm.shapes[w][1]
        if bias not in fm.initializers or fm.shapes.get(bias) != (n,) or not fm.is_float(bias):
            continue
        gemm = helper.make_node("Gemm", [a, w, bias], [add.output[0]], name=node.name)
        replace[node.name] = gemm
        drop.add(add.name)
    if not replace:
        return False
    nodes = [replace.get(n.name, n) for n in g.node if n.name not in drop]
    del g.node[:]
    g.node.extend(nodes)
    return True


def _untranspose_gemm_weights(fm: FloatModel) -> bool:
    changed = False
    for node in fm.graph.node:
        if node.op_type != "Gemm" or attribute(node, "transB", 0) != 1 or attribute(node, "transA", 0) != 0:
            continue
        b = node.input[1]
        if b not in fm.initializers or len(fm.consumers.get(b, [])) != 1 or len(fm.shapes.get(b, ())) != 2:
            continue
        fm.set_constant(b, np.ascontiguousarray(fm.constant(b).T))
        for a in node.attribute:
            if a.name == "transB":
                a.i = 0
        changed = True
    return changed
