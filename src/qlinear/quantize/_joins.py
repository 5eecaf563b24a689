"""Joins of quantized tensors on the runtime's integer kernels: the Add, Mul and Concat between convolutions.

A feature pyramid (a text detector's neck, a YOLO neck) joins tensors that
are each quantized for the convolutions reading them: a residual ``Add``,
a squeeze-and-excitation gate ``x * HardSigmoid(s)``, an upsampling
``Resize`` and the sum with the lateral branch, a ``Concat`` of the levels.
The plan quantized only the convolutions' inputs, so a join's output was
float, and the whole chain between two convolutions ran in float behind
DequantizeLinear nodes, on the largest tensors of the model: in PP-OCRv4's
text detector at a batch of 16, float Resize, Add and Mul and
DequantizeLinear nodes, most of them in the neck, took 120 ms of the
quantized model's 274 (ONNX Runtime's profile).

This step quantizes the output of each join whose inputs are all
quantized at uint8 (in graph order, so a chain of joins is quantized from its first
one), or are a gate's value computed from a quantized tensor (which
:mod:`._integer_gates` writes as integer), where the output reaches a
quantized reader (a convolution, a pool, another such join, through data
movement): a join that only float nodes read would add a rounding and
save nothing. Every reader of the inputs and of the output then reads them
dequantized, the groups the runtime fuses (on ONNX Runtime: QLinearAdd,
QLinearMul, QLinearConcat, and a nearest Resize on the codes).

Each join adds one rounding of its output, at uint8 like its
inputs; the accuracy search sees it in every model it builds.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx

from qlinear.quantize._model import FloatModel

__all__ = ["quantize_joins"]

# The activation types whose joins run on integer kernels. QLinearAdd and its kind take 8-bit codes only; and int8
# is left as the gates leave it: ONNX Runtime's x86 kernels take an int8 pair only where its QuantizeLinear has one
# reader (see _signed_layout), and a join reads a convolution's output beside the convolution after it.
_INTEGER_TYPES = frozenset({"uint8"})
# The gate values a Mul may take from a quantized tensor: the gates pass writes them as integer.
_GATE_VALUES = frozenset({"Sigmoid", "HardSigmoid"})


def quantize_joins(
    fm: FloatModel,
    calibrated: dict[str, str],
    shared: dict[str, str],
    root: Callable[[str], str],
    dequantized: set[str],
    skipped: Callable[[onnx.NodeProto], bool],
    joins: frozenset[str],
    moves_data: Callable[[onnx.NodeProto], bool],
) -> None:
    """Quantize the outputs of the joins of quantized tensors that reach a quantized reader (in place).

    ``calibrated``: tensor -> activation type, the plan's so far (the join
    outputs are added); ``shared``: tensors quantized with another's
    parameters (a Pad's input takes its output's; a join writing one is
    quantized already, and is not calibrated again); ``root``: the tensor
    whose parameters a shared one takes; ``dequantized``: the
    tensors every reader reads dequantized (the joins' inputs and outputs
    are added); ``skipped``: a node excluded or otherwise left as it is;
    ``joins``: the ops the target runs on quantized inputs and output;
    ``moves_data``: whether a node only moves its input's values (its
    output shares the input's quantization).
    """
    if not joins:
        return
    quantized = dict(calibrated)  # tensor -> type, with what data movement passes on
    quantized.update({t: calibrated[root(t)] for t in shared if root(t) in calibrated})
    already = set(quantized)  # quantized before any join: the readers a join's output must reach
    found: dict[str, tuple[str, list[str]]] = {}  # join node -> (its output, the inputs it reads dequantized)
    for node in fm.graph.node:
        if node.domain not in ("", "ai.onnx") or skipped(node) or not node.input or not node.output:
            continue
        if moves_data(node) and node.input[0] in quantized:
            for o in node.output:
                if o and fm.is_float(o):
                    quantized.setdefault(o, quantized[node.input[0]])
            continue
        if node.op_type not in joins:
            continue
        reads = _quantized_reads(fm, node, quantized)
        y = node.output[0]
        if reads is None or not fm.is_float(y) or y in fm.output_names or y in fm.read_in_subgraphs:
            continue
        types = {quantized[t] for t in reads} | ({quantized[y]} if y in shared and y in quantized else set())
        if len(types) != 1 or not types <= _INTEGER_TYPES:
            continue
        quantized[y] = types.pop()
        found[node.name] = (y, reads)
    kept = _reaching_quantized_readers(fm, found, already, moves_data)
    for name in (n for n in found if n in kept):  # in the graph's order: the model's bytes the same in every process
        y, reads = found[name]
        if y not in shared:
            calibrated.setdefault(y, quantized[y])
        dequantized.update((y, *reads))


def _quantized_reads(fm: FloatModel, node: onnx.NodeProto, quantized: dict[str, str]) -> list[str] | None:
    """The quantized tensors ``node`` reads, where every input is one (or, for a Mul, a gate's value of one); else None."""
    reads = []
    for t in node.input:
        if t in quantized and t not in fm.initializers:
            reads.append(t)
            continue
        gate = fm.producer.get(t)
        if (
            node.op_type == "Mul"
            and gate is not None
            and gate.op_type in _GATE_VALUES
            and gate.input[0] in quantized
            and len(fm.consumers.get(t, [])) == 1
            and t not in fm.output_names
        ):
            reads.append(gate.input[0])
            continue
        return None
    return reads


def _reaching_quantized_readers(
    fm: FloatModel, found: dict[str, tuple[str, list[str]]], already: set[str], moves_data: Callable[[onnx.NodeProto], bool]
) -> set[str]:
    """Of the joins ``found``, those whose output reaches a tensor ``already`` quantized, or a kept join, through data movement."""
    kept: set[str] = set()
    # A tensor's answer is final once computed: the joins reading it come after it, so they were judged before.
    known: dict[str, bool] = {}

    def reaches(tensor: str) -> bool:
        if tensor not in known:
            known[tensor] = tensor in already or any(
                reader.name in kept or (moves_data(reader) and any(reaches(o) for o in reader.output if o))
                for reader in fm.consumers.get(tensor, [])
            )
        return known[tensor]

    for name in reversed(list(found)):  # readers come after their producers: each join is judged after its readers
        if reaches(found[name][0]):
            kept.add(name)
    return kept
