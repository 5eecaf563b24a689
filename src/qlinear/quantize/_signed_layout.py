"""Int8 activations laid out so that ONNX Runtime's x86 integer kernels take them.

Those kernels read 8-bit activations unsigned. ONNX Runtime turns an int8
QuantizeLinear -> DequantizeLinear pair into uint8 (zero point + 128, the
same values), but only where the QuantizeLinear has exactly one reader; and
it drops a Relu or Clip in front of a QuantizeLinear only where the zero
point is the type's minimum, which symmetric int8 activations (zero point
0, ``symmetric``) never have. Left as the convert pass writes them, int8
activations left every reader of a shared activation in float (a
transformer's q, k and v projections), and symmetric ones every Conv or
Gemm followed by a Relu (the digits CNN ran at 3.2x its float latency).

Two rewrites of the finished QDQ model, neither changing a value:

- ``Conv -> Relu -> Q`` (or Gemm, or Clip) becomes
  ``Conv -> Q -> DQ -> Relu -> Q`` with the Relu's own scale and zero point,
  so the Conv has its output QuantizeLinear. Exact: rounding is monotone, so
  ``round(clip(x) / s) = clip(round(x / s))`` at the rounded bounds, and the
  codes ``q`` come back from ``round(q * s / s)`` unchanged.
- A QuantizeLinear with several DequantizeLinear readers gets a copy for
  each reader but its first. Each copy and its reader take a zero point
  initializer of their own: with a shared one, ONNX Runtime's
  common-subexpression pass merges the copies back into one.

Not reachable by layout: a Conv whose int8 output several nodes read (a
SiLU's Sigmoid and Mul). Copies of its QuantizeLinear are readers of the
Conv too, so it loses its fusion; one QuantizeLinear with one shared
DequantizeLinear is split again by ONNX Runtime, which gives every reader
its own DequantizeLinear before it converts int8 pairs. The fusion check
warns of it.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qlinear.onnx._graph import producers, readers
from qlinear.quantize._model import clip_bounds, reserve_name
from qlinear.quantize._qdq_names import CODES, VALUES

__all__ = ["CLAMPS", "lay_out_signed"]

# Element-wise clamps ONNX Runtime drops in front of a QuantizeLinear whose zero point is the type's minimum.
CLAMPS = ("Relu", "Clip")
# Producers whose integer kernel needs a QuantizeLinear of their own output (MatMul has one without).
_NEEDS_OUTPUT_Q = ("Conv", "Gemm")


def lay_out_signed(model: onnx.ModelProto) -> list[str]:
    """Rewrite the int8 activations of ``model`` (in place) as the module says; the names of the QuantizeLinear added."""
    g = model.graph
    signed = {t.name for t in g.initializer if t.data_type == TensorProto.INT8 and not t.dims}
    if not any(n.op_type == "QuantizeLinear" and len(n.input) > 2 and n.input[2] in signed for n in g.node):
        return []
    taken = {t.name for t in g.initializer} | {n for node in g.node for n in (*node.input, *node.output, node.name)}
    added = _quantize_before_clamps(g, signed, taken)
    return added + _dedicate_pairs(g, signed, taken)


def _quantize_before_clamps(g: onnx.GraphProto, signed: set[str], taken: set[str]) -> list[str]:
    inits = {t.name: t for t in g.initializer}
    reading = readers(g)
    producer = producers(g)
    outputs = {o.name for o in g.output}
    before: dict[int, list[onnx.NodeProto]] = {}  # id(a clamp) -> the QuantizeLinear and DequantizeLinear in front
    added = []
    for clamp in g.node:
        if clamp.op_type not in CLAMPS or not clamp.input or clamp.output[0] in outputs:
            continue
        qs = reading.get(clamp.output[0], [])
        if not qs or any(q.op_type != "QuantizeLinear" or len(q.input) < 3 or q.input[2] not in signed for q in qs):
            continue
        if len(qs) == 1 and _dropped_by_onnx_runtime(clamp, qs[0], inits):
            continue
        node = producer.get(clamp.input[0])
        if node is None or node.op_type not in _NEEDS_OUTPUT_Q or len(reading[clamp.input[0]]) != 1:
            continue
        dq_in = producer.get(node.input[0])
        if dq_in is None or dq_in.op_type != "DequantizeLinear":  # the node is not quantized
            continue
        q = qs[0]
        codes = reserve_name(node.output[0] + CODES, taken)
        values = reserve_name(node.output[0] + VALUES, taken)
        before[id(clamp)] = [
            helper.make_node("QuantizeLinear", [clamp.input[0], q.input[1], q.input[2]], [codes], name=codes),
            helper.make_node("DequantizeLinear", [codes, q.input[1], q.input[2]], [values], name=values),
        ]
        clamp.input[0] = values
        added.append(codes)
    if before:
        order = [m for n in g.node for m in (*before.get(id(n), []), n)]
        del g.node[:]
        g.node.extend(order)
    return added


def _dropped_by_onnx_runtime(clamp: onnx.NodeProto, q: onnx.NodeProto, inits: dict[str, TensorProto]) -> bool:
    """Whether ONNX Runtime removes ``clamp`` in front of ``q`` itself: the codes' range lies inside the clamp's.

    A Relu goes where the zero point is the type's minimum; a Clip where
    ``[scale (qmin - zp), scale (qmax - zp)]`` lies within its bounds (its
    ClipQuantFusion, to float32 epsilon).
    """
    scale, zero_point = (numpy_helper.to_array(inits[name]) for name in q.input[1:3])
    low, high = float(scale) * (-128 - int(zero_point)), float(scale) * (127 - int(zero_point))
    if clamp.op_type == "Relu":
        return int(zero_point) == -128
    bound_low, bound_high = clip_bounds(clamp, inits)
    if bound_low is None or bound_high is None:  # a bound computed or left out
        return False
    eps = float(np.finfo(np.float32).eps)
    return bound_low - low <= eps and high - bound_high <= eps


def _dedicate_pairs(g: onnx.GraphProto, signed: set[str], taken: set[str]) -> list[str]:
    inits = {t.name: t for t in g.initializer}
    reading = readers(g)
    order: list[onnx.NodeProto] = []
    added = []
    for n in g.node:
        order.append(n)
        if n.op_type != "QuantizeLinear" or len(n.input) < 3 or n.input[2] not in signed:
            continue
        dqs = [r for r in reading.get(n.output[0], []) if r.op_type == "DequantizeLinear"]
        for dq in dqs[1:]:
            copy = onnx.NodeProto()
            copy.CopyFrom(n)
            copy.name = reserve_name(f"{n.name}_for_{dq.name}", taken)
            copy.output[0] = dq.input[0] = reserve_name(n.output[0], taken)
            zero_point = numpy_helper.from_array(
                numpy_helper.to_array(inits[n.input[2]]).astype(np.int8), reserve_name(n.input[2], taken)
            )
            copy.input[2] = dq.input[2] = zero_point.name
            g.initializer.append(zero_point)
            order.append(copy)
            added.append(copy.name)
    del g.node[:]
    g.node.extend(order)
    return added
