"""Values that must reach a Log, a square root or a fractional power unrounded: the compute nodes that make them stay float.

Log turns a rounding error into an error relative to the value, unbounded
for the small values a power spectrum is mostly made of: a mel filterbank
before ``Log(x + eps)`` at 8 bits (and still at 16) rounds its quiet bands
to 0, which come out as ``log(eps)``. A square root or a power below 1 does
the same to a lesser degree (the slope of ``sqrt`` is unbounded at 0), and
is what an audio front end computed in the graph takes a magnitude with: a
constant-Q transform of 26 Conv filters, then Transpose, Reshape, Concat,
Slice, Mul, ReduceSum, Sqrt, Mul, Add and Log; at uint8 that front end
came out at 4.4 dB.

So the compute node whose output reaches such an op without passing
another compute node stays float, however long the way (data movement,
element-wise arithmetic, Concat, sums): for a Log, any such node; for a
square root or a fractional power, a node of the front end, one that reads
a graph input the same way. A LayerNorm's square root of its variance is
no front end's magnitude: the walk back from a root stops at a mean
(a ReduceMean, or a ReduceSum scaled by a constant, as jax2tf writes one),
so a patch embedding before a LayerNorm is quantized as before.

A front end can be a cascade of filters. A constant-Q transform computes
each octave from the one above it, low-passed and halved by a Conv
(basic-pitch's CQT: 8 such Convs between its 18 filters): that Conv's
output is the signal the next octave's filters read, so its rounding
reaches the Log through them. A compute node of the linear front end (one
that takes the raw input through data movement, joins and other such
nodes alone) whose output a float filter reads the same way stays float
too. A learned layer before the front end has an activation between, and
a chain of linear layers inside a network reads no raw input: both stay
quantized.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx

from qlinear.quantize._model import FloatModel
from qlinear.quantize._node_placement import COMPUTE_OPS, DATA_MOVEMENT_OPS

__all__ = ["FLOAT_BEFORE_LOG", "FLOAT_BEFORE_ROOT", "FLOAT_IN_FRONT_END", "float_regions"]

FLOAT_BEFORE_LOG = "output reaches a Log (rounding error would be unbounded relative error)"
FLOAT_BEFORE_ROOT = "a front end on the raw input whose output reaches a Sqrt or fractional Pow (a magnitude of small values)"
FLOAT_IN_FRONT_END = "a filter before a front end's float filters, through data movement alone (one linear front end)"

# The ops that hold weights (a Gather its table, an Einsum its operand): a value made by one of these is that node's,
# and the walk stops there.
_COMPUTE_OPS = frozenset({*COMPUTE_OPS, "Gather", "Einsum"})
# Ops through which a value reaches a Log or a root with its small values still small (or summed, squared, joined).
_PASSING_OPS = frozenset(
    {
        "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "MaxPool", "Slice", "Split", "DepthToSpace",
        "SpaceToDepth", "Concat", "Pad", "Expand", "Tile", "Identity", "Cast", "Add", "Sub", "Mul", "Div", "Max", "Min",
        "Clip", "Relu", "Abs", "Neg", "Sqrt", "Pow", "ReduceSum", "ReduceSumSquare", "ReduceMean", "ReduceL2",
    }
)  # fmt: skip
# A root's input walked back no further than a mean: a normalization's statistic, not a magnitude.
_NOT_PAST_FOR_A_ROOT = frozenset({"ReduceMean"})
# Ops between one front-end filter and the next: values moved or joined, not computed on. A max pool is left out: it
# is no linear map, and the pooling of a learned network.
_BETWEEN_FILTERS = (DATA_MOVEMENT_OPS - {"MaxPool"}) | {"Concat", "Identity", "Cast"}


def float_regions(fm: FloatModel) -> dict[str, str]:
    """Tensor -> why the compute node making it stays float, for every tensor that reaches a Log, Sqrt or fractional Pow.

    One walk back from each such op, so a plan costs one pass however many
    nodes ask; a root's tensors count only where a front-end node makes them.
    """
    logs = [n.input[0] for n in fm.graph.node if n.op_type == "Log" and n.input]
    roots = [n.input[0] for n in fm.graph.node if _is_root(fm, n)]
    found = dict.fromkeys(_reaching(fm, logs, _PASSING_OPS), FLOAT_BEFORE_LOG)
    front = _front_end_outputs(fm)
    for tensor in _reaching(fm, roots, _PASSING_OPS - _NOT_PAST_FOR_A_ROOT, stop=lambda n: _scaled_sum(fm, n)):
        if tensor in front:
            found.setdefault(tensor, FLOAT_BEFORE_ROOT)
    return {**found, **_earlier_filters(fm, found)}


def _earlier_filters(fm: FloatModel, floated: dict[str, str]) -> dict[str, str]:
    """The filters of the linear front end whose outputs ``floated``'s makers read through :data:`_BETWEEN_FILTERS` alone.

    Only the front end's (:func:`_linear_front_end`): a chain of linear
    layers inside a network, ending at a Log, is no filter bank.
    """
    linear = _linear_front_end(fm)
    found: dict[str, str] = {}
    frontier = list(floated)
    while frontier:
        maker = fm.producer.get(frontier.pop())
        if maker is None or maker.op_type not in _COMPUTE_OPS:  # a value on the way, not a filter's output
            continue
        reads = [i for i in maker.input if i and i not in fm.initializers]
        for tensor in _reaching(fm, reads, _BETWEEN_FILTERS):
            if tensor in linear and tensor not in floated and tensor not in found:
                found[tensor] = FLOAT_IN_FRONT_END
                frontier.append(tensor)
    return found


def _linear_front_end(fm: FloatModel) -> set[str]:
    """The outputs of compute nodes that take a graph input as their data through data movement and such nodes alone.

    A filter cascade on the raw input: each node's data input (the first;
    every input of a Concat) made by a graph input, a move or a join of
    one, or another such node. A shape, a table index or an activation on
    the way ends it.
    """
    raw = {i.name for i in fm.graph.input} - set(fm.initializers)
    reached, frontier, outputs = set(raw), list(raw), set()
    while frontier:
        tensor = frontier.pop()
        for n in fm.consumers.get(tensor, []):
            data = n.input if n.op_type == "Concat" else n.input[:1]
            if tensor not in data or (n.op_type not in _BETWEEN_FILTERS and n.op_type not in _COMPUTE_OPS):
                continue
            if n.op_type in _COMPUTE_OPS:
                outputs.update(o for o in n.output if o)
            for o in n.output:
                if o and o not in reached:
                    reached.add(o)
                    frontier.append(o)
    return outputs


def _is_root(fm: FloatModel, node) -> bool:
    """A Sqrt, or a Pow by a constant exponent strictly between 0 and 1."""
    if node.op_type == "Sqrt":
        return bool(node.input)
    exponent = fm.constant(node.input[1]) if node.op_type == "Pow" and len(node.input) > 1 else None
    return exponent is not None and exponent.size == 1 and 0.0 < float(exponent.reshape(-1)[0]) < 1.0


def _scaled_sum(fm: FloatModel, node) -> bool:
    """Whether ``node`` makes a mean of a ReduceSum's output: ``Sum(x) * c`` with a scalar ``c`` in (0, 1), or ``Sum(x) / n``, ``n > 1``.

    A gain or a per-bin weight on a power spectrum is no mean, and leaves the walk going.
    """
    if node.op_type not in ("Mul", "Div") or len(node.input) != 2:
        return False
    summed = [i for i in node.input if (p := fm.producer.get(i)) is not None and p.op_type == "ReduceSum"]
    scale = [i for i in node.input if i in fm.initializers]
    if len(summed) != 1 or len(scale) != 1 or (node.op_type == "Div" and scale[0] != node.input[1]):
        return False
    c = fm.constant(scale[0])
    if c is None or c.size != 1:
        return False
    c = float(c.reshape(-1)[0])
    return 0.0 < c < 1.0 if node.op_type == "Mul" else c > 1.0


def _reaching(
    fm: FloatModel, sinks: list[str], passing: frozenset[str], stop: Callable[[onnx.NodeProto], bool] = lambda n: False
) -> set[str]:
    """The tensors from which a value flows into one of ``sinks`` through ``passing`` ops only (and none that ``stop``s)."""
    found: set[str] = set()
    frontier = list(sinks)
    while frontier:
        tensor = frontier.pop()
        if tensor in found:
            continue
        found.add(tensor)
        producer = fm.producer.get(tensor)
        if producer is not None and producer.op_type in passing and not stop(producer):
            frontier.extend(i for i in producer.input if i and i not in fm.initializers)
    return found


def _front_end_outputs(fm: FloatModel) -> set[str]:
    """The outputs of compute nodes that read a graph input through no other compute node (the model's first layer)."""
    raw = {i.name for i in fm.graph.input} - set(fm.initializers)
    reached, frontier = set(raw), list(raw)
    outputs: set[str] = set()
    while frontier:
        for n in fm.consumers.get(frontier.pop(), []):
            if n.op_type in _COMPUTE_OPS:
                outputs.update(o for o in n.output if o)
                continue
            for o in n.output:
                if o and o not in reached:
                    reached.add(o)
                    frontier.append(o)
    return outputs
