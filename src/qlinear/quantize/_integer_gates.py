"""Gates between 8-bit tensors, written so that ONNX Runtime runs them on its integer kernels.

A gate multiplies a tensor by a value in [0, 1] computed from another
tensor, or from the same one:

- SiLU (YOLO, EfficientNet): ``x * Sigmoid(x)``;
- HardSwish (MobileNetV3, PP-LCNet): the operator, ``x * HardSigmoid(x)``,
  or written out as ``x * Clip(x + 3, 0, 6) / 6``, as exporters write it;
- a squeeze-and-excitation block's ``a * Sigmoid(b)`` or
  ``a * HardSigmoid(b)``.

Left as the convert pass writes them (a DequantizeLinear in front, the
float gate, a QuantizeLinear after), each runs in float: four passes over
float tensors. In a MobileNetV3-style classifier on ONNX Runtime's CPU
provider those took longer than all its integer convolutions together, and
made the quantized model slower than the float one, whose convolutions run
their activation in the same pass.

Where both inputs and the output are quantized to uint8, this rewrite
quantizes the gate's value as well, at 256 levels on ``[0, 1]`` (zero point
0), so that every step is a group ONNX Runtime fuses:

- ``Sigmoid(b)`` -> ``Q`` runs as QLinearSigmoid;
- ``HardSigmoid(b) = alpha * clip(b + beta / alpha, 0, 1 / alpha)``: the
  sum ``b + beta / alpha`` (the constant stored as one code) runs as
  QLinearAdd, and its QuantizeLinear, spanning exactly ``[0, 1 / alpha]``,
  is the clip; the written-out ``Clip(b + c, 0, hi) / d`` is the same with
  ``c``, ``hi`` and ``d`` read from its constants. The DequantizeLinear
  that reads those codes back has the QuantizeLinear's scale divided by
  ``d`` (``1 / alpha``): the division by 6 happens in how the codes are read;
- the product ``Mul(a, g)`` runs as QLinearMul; a division of the product
  by a constant (the written-out HardSwish's ``/ 6``) goes into ``g``'s
  DequantizeLinear too.

int8 activations are left as they are: ONNX Runtime's x86 kernels take an
int8 pair only where its QuantizeLinear has one reader (see
:mod:`._signed_layout`), and a gate reads its input twice, which would cost
the Conv in front of it its integer kernel.

The gate's value is rounded to 1/255 (an error of at most ``|a| / 510`` in
the product, below half a step of the output's codes wherever ``a`` stays
under the output's range), which the model's evaluation sees: this runs
inside every variant the search builds.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qlinear.onnx._graph import nodes_read, producers, readers
from qlinear.quantize._model import attribute, clip_bounds, reserve_name, scalar_constant

__all__ = ["integer_gates"]

# The gate's codes: uint8 on [0, 1], zero point 0.
_LEVELS = 255
# The scale types (the model's float type) a chain is written in.
_SCALE_TYPES = {TensorProto.FLOAT: np.dtype(np.float32), TensorProto.FLOAT16: np.dtype(np.float16)}
# ONNX HardSigmoid's defaults, and HardSwish's fixed coefficients (1/6 and 1/2).
_HARD_SIGMOID_DEFAULTS = (0.2, 0.5)
_HARD_SWISH = (1 / 6, 0.5)


@dataclass(frozen=True)
class _Gate:
    """``y = a * g`` with ``g = clip(b + shift, 0, top) / divisor`` (hard) or ``Sigmoid(b) / divisor``; ``nodes``: those it replaces."""

    a: str
    b: str
    hard: bool
    shift: float
    top: float
    divisor: float
    nodes: tuple[onnx.NodeProto, ...]


def integer_gates(model: onnx.ModelProto) -> list[str]:
    """Rewrite the gates of ``model`` between uint8 tensors (in place) as the module says; the names of the nodes rewritten."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    producer = producers(g)
    reading = readers(g)
    outputs = {o.name for o in g.output}
    taken = set(inits) | {n for node in g.node for n in (*node.input, *node.output, node.name)}
    new_nodes: dict[int, list[onnx.NodeProto]] = {}  # id(the node a gate's chain ends with) -> what replaces the chain
    dropped: set[int] = set()
    rewritten = []
    for q in g.node:
        if q.op_type != "QuantizeLinear" or len(q.input) < 3:
            continue
        y = q.input[0]
        if not _unsigned(q.input[2], inits) or y in outputs or reading.get(y) != [q] or y not in producer:
            continue
        gate = _gate(producer[y], producer, reading, inits, outputs)
        if gate is None or (gate.hard and gate.shift <= 0) or any(id(n) in dropped for n in gate.nodes):
            continue
        reads = [_dequantized(t, producer, inits) for t in (gate.a, gate.b)]
        if any(dq is None or not _unsigned(dq.input[2], inits) for dq in reads):
            continue
        float_type = _SCALE_TYPES.get(inits[reads[1].input[1]].data_type)
        if float_type is None:  # bfloat16: ONNX Runtime's CPU provider has no such Add, Mul or Sigmoid
            continue
        chain, new_inits = _integer_chain(gate, y, reads, float_type, taken)
        new_nodes[id(producer[y])] = chain
        dropped.update(id(n) for n in gate.nodes)
        g.initializer.extend(new_inits)
        rewritten.append(producer[y].name)
    if not rewritten:
        return []
    order = [m for n in g.node for m in new_nodes.get(id(n), [] if id(n) in dropped else [n])]
    read_now = nodes_read(order) | outputs  # a subgraph's reads by name count
    # A DequantizeLinear only the replaced nodes read goes with them (each gate reads its own copies).
    order = [n for n in order if n.op_type != "DequantizeLinear" or n.output[0] in read_now]
    del g.node[:]
    g.node.extend(order)
    return rewritten


def _unsigned(zero_point: str, inits: dict[str, TensorProto]) -> bool:
    """Whether ``zero_point`` is a scalar uint8 initializer."""
    t = inits.get(zero_point)
    return t is not None and t.data_type == TensorProto.UINT8 and not t.dims


def _dequantized(tensor: str, producer: dict[str, onnx.NodeProto], inits: dict[str, TensorProto]) -> onnx.NodeProto | None:
    """The DequantizeLinear of computed codes that makes ``tensor`` (per tensor, with a zero point), or None."""
    dq = producer.get(tensor)
    if dq is None or dq.op_type != "DequantizeLinear" or len(dq.input) != 3 or dq.input[0] in inits:
        return None
    scale = inits.get(dq.input[1])
    return dq if scale is not None and not scale.dims else None


def _gate(
    last: onnx.NodeProto,
    producer: dict[str, onnx.NodeProto],
    reading: dict[str, list[onnx.NodeProto]],
    inits: dict[str, TensorProto],
    outputs: set[str],
) -> _Gate | None:
    """The gate whose chain ends with ``last``, or None where ``last`` ends none."""

    def only_for(tensor: str, node: onnx.NodeProto) -> onnx.NodeProto | None:
        """The producer of ``tensor`` where ``node`` alone reads it."""
        p = producer.get(tensor)
        return p if p is not None and tensor not in outputs and reading.get(tensor) == [node] else None

    if last.op_type == "HardSwish" and last.domain in ("", "ai.onnx"):
        alpha, beta = _HARD_SWISH
        return _Gate(last.input[0], last.input[0], True, beta / alpha, 1 / alpha, 1 / alpha, (last,))
    nodes: list[onnx.NodeProto] = []
    divisor, product = 1.0, last
    divided = _divided(last, inits)
    if divided is not None:
        product = only_for(divided[0], last)
        divisor, nodes = divided[1], [last]
    if product is None or product.op_type != "Mul" or len(product.input) != 2:
        return None
    for a, value in (product.input, reversed(product.input)):
        value_node = only_for(value, product)
        found = _gate_value(value_node, only_for, inits) if value_node is not None else None
        if found is not None:
            b, hard, shift, top, value_divisor, chain = found
            return _Gate(a, b, hard, shift, top, divisor * value_divisor, (*chain, product, *nodes))
    return None


def _divided(node: onnx.NodeProto, inits: dict[str, TensorProto]) -> tuple[str, float] | None:
    """``(x, d)`` where ``node`` is ``x / d`` or ``x * (1 / d)`` with a positive constant ``d``, else None."""
    if node.op_type == "Div" and len(node.input) == 2:
        d = scalar_constant(node.input[1], inits)
        return (node.input[0], d) if d is not None and d > 0 else None
    if node.op_type == "Mul" and len(node.input) == 2:
        for x, k in (node.input, reversed(node.input)):
            v = scalar_constant(k, inits)
            if v is not None and v > 0 and x not in inits:
                return x, 1 / v
    return None


def _gate_value(node: onnx.NodeProto, only_for, inits: dict[str, TensorProto]):
    """``(b, hard, shift, top, divisor, nodes)`` where ``node`` computes a gate's value from ``b``, else None."""
    if node.op_type == "Sigmoid":
        return node.input[0], False, 0.0, 1.0, 1.0, [node]
    if node.op_type == "HardSigmoid":
        default_alpha, default_beta = _HARD_SIGMOID_DEFAULTS
        alpha, beta = attribute(node, "alpha", default_alpha), attribute(node, "beta", default_beta)
        if alpha <= 0:
            return None
        return node.input[0], True, beta / alpha, 1 / alpha, 1 / alpha, [node]
    divisor, nodes = 1.0, []
    divided = _divided(node, inits)
    if divided is not None:
        clip = only_for(divided[0], node)
        divisor, nodes = divided[1], [node]
    else:
        clip = node
    if clip is None or clip.op_type != "Clip":
        return None
    low, high = clip_bounds(clip, inits)
    add = only_for(clip.input[0], clip)
    if low != 0 or high is None or high <= 0 or add is None or add.op_type != "Add" or len(add.input) != 2:
        return None
    for b, c in (add.input, reversed(add.input)):
        shift = scalar_constant(c, inits)
        if shift is not None and b not in inits:
            return b, True, shift, high, divisor, [add, clip, *nodes]
    return None


def _integer_chain(
    gate: _Gate, y: str, reads: list[onnx.NodeProto], float_type: np.dtype, taken: set[str]
) -> tuple[list[onnx.NodeProto], list[TensorProto]]:
    """The nodes that compute ``y`` from the gate's codes in fusable groups, and the initializers they add.

    ``float_type``: the type of the inputs' scales, so of every value in the chain (float16 in a half-precision model).
    """

    fresh = functools.partial(reserve_name, taken=taken)

    def scalar(value, dtype, base: str) -> TensorProto:
        return numpy_helper.from_array(np.array(value, dtype), fresh(base))

    def copy_of(dq: onnx.NodeProto) -> tuple[onnx.NodeProto, str]:
        out = fresh(dq.output[0])
        return helper.make_node("DequantizeLinear", list(dq.input), [out], name=fresh(dq.name)), out

    base = gate.nodes[-1].name or y
    dq_a, a = copy_of(reads[0])
    dq_b, b = copy_of(reads[1])
    nodes = [dq_a, dq_b]
    gate_zero_point = scalar(0, np.uint8, f"{base}_gate_zero_point")
    inits = [gate_zero_point]
    if gate.hard:
        # The shift as one code (1) with the shift as its scale: exact, and an input QLinearAdd takes.
        one, zero = scalar(1, np.uint8, f"{base}_shift_code"), scalar(0, np.uint8, f"{base}_shift_zero_point")
        shift_scale = scalar(gate.shift, float_type, f"{base}_shift_scale")
        inits += [one, zero, shift_scale]
        shift, before = fresh(f"{base}_shift"), fresh(f"{base}_shifted")
        nodes += [
            helper.make_node("DequantizeLinear", [one.name, shift_scale.name, zero.name], [shift], name=fresh(f"{base}_shift")),
            helper.make_node("Add", [b, shift], [before], name=fresh(f"{base}_Add")),
        ]
    else:
        before = fresh(f"{base}_sigmoid")
        nodes.append(helper.make_node("Sigmoid", [b], [before], name=fresh(f"{base}_Sigmoid")))
    codes_scale = scalar(gate.top / _LEVELS, float_type, f"{base}_gate_scale")
    # Reading the codes with the scale divided by the divisor is the division.
    value_scale = scalar(gate.top / _LEVELS / gate.divisor, float_type, f"{base}_gate_value_scale")
    inits += [codes_scale, value_scale]
    codes, value = fresh(f"{base}_gate_quantized"), fresh(f"{base}_gate")
    nodes += [
        helper.make_node(
            "QuantizeLinear", [before, codes_scale.name, gate_zero_point.name], [codes], name=fresh(f"{base}_gate_Q")
        ),
        helper.make_node(
            "DequantizeLinear", [codes, value_scale.name, gate_zero_point.name], [value], name=fresh(f"{base}_gate_DQ")
        ),
        helper.make_node("Mul", [a, value], [y], name=fresh(f"{base}_Mul")),
    ]
    return nodes, inits
