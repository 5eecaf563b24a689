"""The plan pass: which tensors are quantized, and how, in the layout ONNX Runtime fuses.

The rules follow ONNX Runtime's QDQ selectors (its graph transformer turns
``DQ -> op -> Q`` groups into integer kernels):

- Conv and ConvTranspose: the input activation, the weight (per output
  channel by default) and the bias (int32) through DequantizeLinear, and the
  output through QuantizeLinear, which QLinearConv needs (a target whose
  int8 Conv dequantizes its own result quantizes the output only where a
  reader takes it quantized: ``Placement.quantized_conv_outputs``); a Relu or Clip
  right after the Conv is folded in by the runtime when the Q's range starts
  at zero, so the Q goes after it.
- MatMul and Gemm: the inputs through DequantizeLinear and no Q on the
  output: ONNX Runtime runs these as MatMulIntegerToFloat / QGemm with a
  float result, so the output keeps full precision for whatever follows.
  With blocked weights the activations stay float: that runs as
  MatMulNBits. Integer activations go only with 8- and 4-bit integer
  weights: with 2-bit, float8 or float4 weights a node keeps float
  activations (ONNX Runtime fuses such pairs into integer kernels that
  then reject the weight type).
- Gather on a constant table (embeddings): the table only.
- GlobalAveragePool and AveragePool whose output is quantized at uint8
  (it feeds a quantized node, as a squeeze-and-excitation block's pooled
  features feed its Conv): the input is quantized too, at uint8, so
  ``DQ -> pool -> Q`` runs as QLinearGlobalAveragePool or
  QLinearAveragePool (ONNX Runtime fuses no int8 or 16-bit form). Left
  float, the pool made a float copy of its whole input; and an input that
  also feeds a gate (``a * HardSigmoid(b)``) had no Q, so the gate ran in
  float.
- Data movement (Reshape, Transpose, MaxPool, Pad, a nearest Resize, ...)
  on a quantized tensor: its output shares the input's scale and zero
  point, so the pair around it is exact and the runtime drops it; no
  requantization appears.
- The joins of uint8 tensors the target runs on integer kernels (on
  ONNX Runtime: Add, Mul, Concat), a squeeze-and-excitation gate's Mul
  included, where their output reaches a quantized reader: the output is
  quantized too, so a feature pyramid runs integer from one convolution to
  the next: see :mod:`._joins`.
  A constant Pad's value is rounded to that grid (and saturates at its
  ends) as the QuantizeLinear after it rounds it.
- A compute node whose output reaches a Log without passing another
  compute node (through element-wise arithmetic, data movement, joins and
  sums, however many), and a front-end node (one reading a graph input
  that way) whose output reaches a Sqrt or a fractional Pow, stays float,
  weight and activations: see :mod:`._float_regions`.
- Everything else stays float: other element-wise arithmetic (a LayerNorm
  written as ReduceMean/Sub/Mul, an attention mask of -3.4e38 added to scores),
  normalizations, Softmax, reductions, Concat; graph outputs are never
  quantized (a Concat of box coordinates and class scores keeps both).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import onnx

from qlinear.dtypes import element_type
from qlinear.quantize._exclusion import excluded_nodes
from qlinear.quantize._float_regions import float_regions
from qlinear.quantize._joins import quantize_joins
from qlinear.quantize._model import FloatModel, attribute
from qlinear.quantize._node_placement import COMPUTE_OPS, DATA_MOVEMENT_OPS, NodePlan, node_plan
from qlinear.quantize._precision import NodePrecision, wider_activation
from qlinear.quantize.targets import target

if TYPE_CHECKING:  # the options compose every algorithm's fields, and algorithms import this module
    from qlinear.quantize._options import QuantizeOptions


__all__ = [
    "COMPUTE_OPS", "DATA_MOVEMENT_OPS", "PROMOTED_TO_FLOAT", "Plan", "left_float_text", "listed", "moves_data", "plan",
]  # fmt: skip


def moves_data(node: onnx.NodeProto) -> bool:
    """Whether ``node`` only moves its input's values: a data-movement op, or a Resize that picks the nearest value."""
    if node.op_type == "Resize":
        return attribute(node, "mode", b"nearest") == b"nearest"
    return node.op_type in DATA_MOVEMENT_OPS


# The reason given for a node the promotion search put back in float (the report shows those apart).
PROMOTED_TO_FLOAT = "promoted to float"


@dataclass
class Plan:
    """The plan for a whole model.

    Attributes:
        nodes: the compute nodes quantized, in graph order.
        calibrate: activations whose statistics decide their parameters.
        shared: data-movement outputs and the tensor whose parameters each shares.
        all_consumers_dequantize: tensors whose every consumer reads the
            dequantized value (the producer's group needs its output edges
            to go through Q only; a pool's input, see _quantize_pool_inputs).
        left_float: ``(node name, op type, reason)`` for the nodes of
            quantizable type left in float.
        activation_types: each calibrated tensor's type, the widest its
            nodes ask for.
        widened: ``(node name, type asked for, type stored, why)`` for the
            weights stored wider than asked (the target's ``placement.stored_type``).
        symmetric: calibrated tensors whose parameters are symmetric
            whatever the options say (the target's ``signed_matmul_inputs``).
    """

    nodes: list[NodePlan] = field(default_factory=list)
    calibrate: list[str] = field(default_factory=list)
    shared: dict[str, str] = field(default_factory=dict)
    all_consumers_dequantize: set[str] = field(default_factory=set)
    left_float: list[tuple[str, str, str]] = field(default_factory=list)
    activation_types: dict[str, str] = field(default_factory=dict)
    widened: list[tuple[str, str, str, str]] = field(default_factory=list)
    symmetric: set[str] = field(default_factory=set)

    def activation_type(self, tensor: str) -> str:
        """The type ``tensor`` is quantized to (a shared tensor's is its root's)."""
        return self.activation_types[self.root(tensor)]

    def types_used(self) -> set[str]:
        """Every weight and activation type in the plan."""
        return {p.weight_type for p in self.nodes if p.weight_type} | set(self.activation_types.values())

    @property
    def activations(self) -> list[str]:
        """Every tensor that takes a QuantizeLinear: calibrated ones, then shared ones."""
        return [*self.calibrate, *self.shared]

    def root(self, tensor: str) -> str:
        """The calibrated tensor whose parameters ``tensor`` uses."""
        while tensor in self.shared:
            tensor = self.shared[tensor]
        return tensor


def plan(fm: FloatModel, options: QuantizeOptions, precision: dict[str, NodePrecision] | None = None) -> Plan:
    """The plan for ``fm`` under ``options``; ``precision`` gives some nodes other types than the options' (mixed precision)."""
    result = Plan()
    calibrated: dict[str, str] = {}  # tensor -> type, in the order met
    excluded = excluded_nodes(fm, options.exclude)
    requested = NodePrecision(options.weights, options.activations)
    precision = precision or {}
    graph_outputs = set(fm.output_names)
    before_log = float_regions(fm)
    runtime = target(options.target)
    placement = runtime.placement
    for node in fm.graph.node:
        # Listed as left float with what they hold, so a recurrent model's size figure is explained.
        if node.op_type in placement.unfused_weight_ops and node.domain in ("", "ai.onnx"):
            held = sum(int(np.prod(fm.initializers[i].dims)) for i in node.input if i in fm.initializers and fm.is_float(i))
            if held:
                result.left_float.append(
                    (
                        node.name,
                        node.op_type,
                        f"no integer {node.op_type} in {runtime.runtime}; its weights ({held} values) stay float",
                    )
                )
            continue
        if node.op_type not in (*COMPUTE_OPS, "Gather") or node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type == "Gather" and node.input[0] not in fm.initializers:
            continue  # indexing a computed tensor (Shape -> Gather, x[:, 0]): no table, nothing to list as left float
        if node.name in excluded or node.op_type in excluded:
            result.left_float.append((node.name, node.op_type, "excluded"))
            continue
        p = precision.get(node.name, requested)
        if not p.quantized:
            result.left_float.append((node.name, node.op_type, p.why or PROMOTED_TO_FLOAT))
            continue
        act = element_type(p.activations) if p.activations else None
        weights_pair = not (act is not None and act.is_integer) or p.weights in placement.integer_weight_types
        planned = node_plan(
            fm, node, act is not None, options.granularity == "blocked", weights_pair, graph_outputs, before_log, placement,
            p.weights,
        )  # fmt: skip
        if isinstance(planned, str):
            result.left_float.append((node.name, node.op_type, planned))
            continue
        weight_type = p.weights if planned.weight is not None else None
        if weight_type is not None:
            shape = fm.shapes.get(planned.weight.tensor)
            columns = shape[planned.weight.channel_axis] if shape else None
            stored, why = placement.stored_type(node.op_type, weight_type, columns if isinstance(columns, int) else None)
            if why is not None:
                result.widened.append((node.name, weight_type, stored, why))
                weight_type = stored
        planned = replace(
            planned,
            weight_type=weight_type,
            activation_type=p.activations if planned.activations else None,
        )
        result.nodes.append(planned)
        for t in (*planned.activations, *([planned.output] if planned.output else [])):
            calibrated[t] = wider_activation(calibrated[t], p.activations) if t in calibrated else p.activations
        if planned.output is not None:
            result.all_consumers_dequantize.add(planned.output)
    if calibrated:
        _quantize_pool_inputs(fm, result, calibrated, excluded, graph_outputs, placement.fused_pools)
        _quantize_pad_inputs(fm, result, calibrated, excluded, graph_outputs)
        quantize_joins(
            fm, calibrated, result.shared, result.root, result.all_consumers_dequantize,
            lambda n: n.name in excluded or n.op_type in excluded,
            placement.integer_joins, moves_data,
        )  # fmt: skip
        _share_through_data_movement(fm, result, calibrated, excluded, graph_outputs)
        if placement.signed_matmul_inputs:
            _sign_matmul_inputs(result, calibrated)
    result.calibrate = list(calibrated)
    result.activation_types = calibrated
    return result


def listed(texts: list[str], most: int, sep: str = ", ") -> str:
    """The first ``most`` of ``texts`` joined by ``sep``, and how many more."""
    return sep.join(texts[:most]) + (f"{sep}and {len(texts) - most} more" if len(texts) > most else "")


def left_float_text(left_float: list[tuple[str, str, str]], most: int) -> str:
    """``name (op): reason; ...`` for the first ``most`` entries of a plan's ``left_float``, and how many more."""
    return listed([f"{name} ({op}): {why}" for name, op, why in left_float], most, "; ")


def _sign_matmul_inputs(result: Plan, calibrated: dict[str, str]) -> None:
    """The first input of each 8-bit MatMul of two activations as int8 of zero point 0 (with every tensor sharing it)."""
    for p in result.nodes:
        if p.op_type == "MatMul" and p.weight is None and len(p.activations) == 2 and p.activation_type in ("uint8", "int8"):
            root = result.root(p.activations[0])
            calibrated[root] = "int8"
            result.symmetric.add(root)


def _quantize_pool_inputs(
    fm: FloatModel, result: Plan, calibrated: dict[str, str], excluded: set[str], graph_outputs: set[str],
    fused_pools: frozenset[str],
) -> None:  # fmt: skip
    """Quantize the input of each pool whose output is quantized at uint8 (directly or through one data-movement node).

    Every reader of the input reads it dequantized, the pool's other readers
    too: a gate's ``a`` in ``a * HardSigmoid(b)`` then has the uint8 codes
    the gate's integer form (:mod:`._integer_gates`) needs, and the node
    producing it a QuantizeLinear on every edge.
    """
    for node in fm.graph.node:
        if (
            node.op_type not in fused_pools
            or node.domain not in ("", "ai.onnx")
            or node.name in excluded
            or node.op_type in excluded
        ):
            continue
        x, y = node.input[0], node.output[0]
        if not fm.is_float(x) or {x, y} & (graph_outputs | fm.read_in_subgraphs) or calibrated.get(x, "uint8") != "uint8":
            continue
        readers = fm.consumers.get(y, [])
        moved = readers[0].output[0] if len(readers) == 1 and moves_data(readers[0]) else None
        if calibrated.get(y, calibrated.get(moved)) != "uint8" or (y not in calibrated and moved in graph_outputs):
            continue
        # The pooled output gets its own range (a mean spans less than its input); data movement after it shares it.
        calibrated.setdefault(y, "uint8")
        calibrated.setdefault(x, "uint8")
        result.all_consumers_dequantize.add(x)


def _quantize_pad_inputs(
    fm: FloatModel, result: Plan, calibrated: dict[str, str], excluded: set[str], graph_outputs: set[str]
) -> None:
    """The input of each Pad whose output is quantized takes the output's parameters (whose range holds the pad value).

    The Pad then reads codes and writes codes of one scale and zero point,
    which a target can pad as codes, and the node before it (a gate in front
    of a convolution that pads) has its output quantized, as in front of a
    convolution that reads it directly.
    """
    for node in fm.graph.node:
        if node.op_type != "Pad" or node.name in excluded or node.op_type in excluded or not node.input:
            continue
        x, y = node.input[0], node.output[0]
        if y not in calibrated or x in calibrated or x in result.shared or not fm.is_float(x):
            continue
        if x in graph_outputs or x in fm.read_in_subgraphs or len(fm.consumers.get(x, [])) != 1:
            continue
        result.shared[x] = y
        result.all_consumers_dequantize.add(x)


def _share_through_data_movement(
    fm: FloatModel, result: Plan, calibrated: dict[str, str], excluded: set[str], graph_outputs: set[str]
) -> None:
    """Data-movement nodes on a quantized tensor pass its parameters to their outputs."""
    quantized = set(calibrated)
    for node in fm.graph.node:
        if not moves_data(node) or node.name in excluded or node.op_type in excluded:
            continue
        source = node.input[0] if node.input else ""
        if source not in quantized or not fm.is_float(source):
            continue
        outputs = [o for o in node.output if o]
        if any(o in graph_outputs for o in outputs):
            continue
        for o in outputs:
            # An output that a compute node reads as its activation takes the shared parameters
            # instead of its own: no requantization between the two.
            asked = calibrated.pop(o, None)
            result.shared[o] = source
            if asked is not None:  # the shared parameters take the widest type either side asks for
                root = result.root(source)
                calibrated[root] = wider_activation(calibrated[root], asked)
            result.all_consumers_dequantize.add(o)
            quantized.add(o)
