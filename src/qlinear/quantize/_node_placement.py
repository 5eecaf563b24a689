"""How one compute node is quantized: its weight, the activations it reads quantized, its bias, where its Q goes.

The rules are the plan's (:mod:`._placement`); this is the part that looks at
one node and its neighbours.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import onnx

from qlinear.quantize._model import FloatModel
from qlinear.quantize._precision import NodePrecision

__all__ = ["COMPUTE_OPS", "DATA_MOVEMENT_OPS", "NodePlan", "WeightPlan", "node_plan"]

# The operators quantized by default: the ones that do the arithmetic.
COMPUTE_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
# Ops whose output values are a subset or rearrangement of the input's: they
# can run on quantized values with the input's parameters, exactly.
DATA_MOVEMENT_OPS = frozenset(
    {"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "MaxPool", "Slice", "Split", "DepthToSpace", "SpaceToDepth",
     "Pad"}
)  # fmt: skip


@dataclass(frozen=True)
class WeightPlan:
    """A constant input stored quantized: initializer ``tensor`` (input ``index`` of its node).

    ``channel_axis`` is the output-channel axis (per-channel scales);
    ``reduction_axis`` the axis blocks run along.
    """

    tensor: str
    index: int
    channel_axis: int
    reduction_axis: int


@dataclass(frozen=True)
class NodePlan:
    """How one compute node is quantized."""

    name: str
    op_type: str
    weight: WeightPlan | None
    activations: tuple[str, ...]  # inputs quantized as activations
    bias: str | None = None  # Conv/Gemm bias initializer, stored as int32 when activations are quantized
    output: str | None = None  # the tensor that takes the Q after the node (its output, or a folded Relu's)
    weight_type: str | None = None  # the weight's type (None: no weight)
    activation_type: str | None = None  # the type this node asks for its activations (None: float)

    @property
    def precision(self) -> NodePrecision:
        """The types the node is quantized with: a side it does not quantize (an embedding's activations) is None."""
        return NodePrecision(self.weight_type, self.activation_type)


def node_plan(
    fm: FloatModel,
    node: onnx.NodeProto,
    quantize_activations: bool,
    blocked: bool,
    weights_pair: bool,
    graph_outputs: set[str],
    before_log: dict[str, str],
    placement: Any,
    weight_type: str | None = None,
) -> NodePlan | str:
    """The node's plan, or the reason it stays float; ``placement``: what the target's runtime fuses (its Placement)."""
    inputs = list(node.input)
    op = node.op_type
    const = [bool(i) and i in fm.initializers for i in inputs]
    if op == "Gather":
        if not const[0] or not fm.is_float(inputs[0]) or len(fm.shapes.get(inputs[0], ())) != 2:
            return "not a 2-D float table"
        return NodePlan(node.name, op, WeightPlan(inputs[0], 0, 0, 1), ())
    if len(inputs) < 2 or not fm.is_float(inputs[0]):
        return "not a float operation"
    if node.output[0] in before_log:  # why it stays float (see _float_regions)
        return before_log[node.output[0]]
    weight = None
    if const[1] and fm.is_float(inputs[1]):
        weight = _weight(fm, node, 1)
    elif op == "MatMul" and const[0] and fm.is_float(inputs[0]) and len(fm.shapes.get(inputs[0], ())) == 2:
        weight = WeightPlan(inputs[0], 0, 0, 1)
    # Blocked weights go with float activations where the runtime's integer kernels take none (ONNX Runtime runs
    # a blocked MatMul as MatMulNBits; a blocked DQ fused into its integer kernels fails at run time).
    float_types = placement.blocked_float_ops.get(op, ())
    blocked_matmul = blocked and weight is not None and (float_types is None or weight_type in float_types)
    # Integer activations pair only with 8- and 4-bit integer weights: ONNX Runtime fuses the other
    # weight types (2-bit, float8, float4) into QLinearConv or MatMulIntegerToFloat all the same, which
    # then reject them and the model does not load.
    unpaired = not weights_pair and weight is not None
    quantize_activations = quantize_activations and not blocked_matmul and not unpaired
    activations = (
        tuple(i for k, i in enumerate(inputs[:2]) if i and not const[k] and fm.is_float(i)) if quantize_activations else ()
    )
    if weight is None and not activations:
        return "no constant weight"
    if op in ("Conv", "ConvTranspose") and weight is None:
        return "weight is not a constant"
    bias = None
    if op in ("Conv", "ConvTranspose", "Gemm") and len(inputs) > 2 and const[2] and weight is not None and activations:
        bias = _usable_bias(fm, node, weight)
    output = None
    if quantize_activations and op in ("Conv", "ConvTranspose") and activations and placement.quantized_conv_outputs:
        output = _output_for_q(fm, node, graph_outputs, placement.clamps_folded)
    elif quantize_activations and op in ("MatMul", "Gemm") and activations:
        output = _output_for_q(fm, node, graph_outputs, placement.clamps_folded, clamp_only=True)
    return NodePlan(node.name, op, weight, activations, bias, output)


def _weight(fm: FloatModel, node: onnx.NodeProto, index: int) -> WeightPlan:
    name = node.input[index]
    rank = len(fm.shapes.get(name, ()))
    op = node.op_type
    if op == "Conv":
        return WeightPlan(name, index, 0, 1)
    if op == "ConvTranspose":
        return WeightPlan(name, index, 1, 0)
    if op == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return WeightPlan(name, index, 0, 1) if trans_b else WeightPlan(name, index, 1, 0)
    # MatMul: (..., K, N) times the activation's (..., M, K).
    return WeightPlan(name, index, rank - 1, rank - 2) if rank >= 2 else WeightPlan(name, index, 0, 0)


def _usable_bias(fm: FloatModel, node: onnx.NodeProto, weight: WeightPlan) -> str | None:
    """The bias, if it is a 1-D float constant with one value per output channel (then storable as int32)."""
    name = node.input[2]
    shape = fm.shapes.get(name, ())
    channels = fm.shapes.get(weight.tensor, ())[weight.channel_axis] if fm.shapes.get(weight.tensor) else None
    if not fm.is_float(name) or len(shape) != 1 or shape[0] != channels:
        return None
    if node.op_type == "Gemm" and any(a.name == "beta" and a.f != 1.0 for a in node.attribute):
        return None
    if node.op_type == "ConvTranspose" and any(a.name == "group" and a.i != 1 for a in node.attribute):
        return None  # its weight scales run over M/group channels, not the bias's M
    return name


def _output_for_q(
    fm: FloatModel, node: onnx.NodeProto, graph_outputs: set[str], clamps_folded: frozenset[str], *, clamp_only: bool = False
) -> str | None:
    """Where the Q after a compute node goes: past a Relu or Clip that alone reads its output, else its output.

    None where a reader no Q reaches (a model output, a subgraph's read by
    name) would keep the tensor float beside it. ``clamp_only`` (MatMul,
    Gemm): a Q only past such a clamp. ONNX Runtime groups the clamp with
    the node as one its output QuantizeLinear makes redundant, and without
    that QuantizeLinear the group matched no integer kernel (the MatMul ran
    in float); with it the node runs as QLinearMatMul or QGemm. A Conv needs
    the Q either way (QLinearConv).
    """
    out = node.output[0]
    if out in graph_outputs or out in fm.read_in_subgraphs:
        return None
    users = fm.consumers.get(out, [])
    if len(users) == 1 and users[0].op_type in clamps_folded:
        after = users[0].output[0]
        if after not in graph_outputs and after not in fm.read_in_subgraphs:
            return after
    return None if clamp_only else out
