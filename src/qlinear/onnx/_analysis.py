"""Walk a loaded model node by node: what each tensor is, what each Q/DQ node does, what is wrong.

The walk uses the same checks the graph builder does (qlinear.spec for Q/DQ
nodes, onnx's schemas for the rest), so a model that :class:`Graph` would
refuse is reported here with the same message, naming the node.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import helper

from qlinear._errors import QuantizationError
from qlinear.onnx._qdq_check import QDQ_OPS, QDQCheck, check_qdq_node
from qlinear.onnx._schema_check import check_schema_node
from qlinear.onnx._tensor_info import TensorInfo

__all__ = ["Analysis", "NodeReport", "analyse", "check_model"]

_QDQ_DOMAINS = ("", "com.microsoft")
# Domains whose schemas the onnx package ships; other nodes keep declared types.
_ONNX_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")


@dataclass(frozen=True)
class NodeReport:
    """One node of the model as the walk saw it.

    Attributes:
        node: the node.
        qdq: the plan and outputs of a Q/DQ node that passed its checks.
        problem: what is wrong with the node, naming it; None when nothing.
    """

    node: onnx.NodeProto
    qdq: QDQCheck | None
    problem: str | None


@dataclass(frozen=True)
class Analysis:
    """Every tensor's info and every node's report, in graph order."""

    opsets: dict[str, int]
    tensors: dict[str, TensorInfo]
    nodes: tuple[NodeReport, ...]

    @property
    def problems(self) -> list[str]:
        return [r.problem for r in self.nodes if r.problem]


def _node_label(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"#{index} {node.op_type}"


def analyse(model: onnx.ModelProto) -> Analysis:
    """Check every node of ``model`` in order and collect what it finds.

    Initializer data is not read, only types and dims.
    """
    graph = model.graph
    opsets = {o.domain: o.version for o in model.opset_import}
    declared = {v.name: TensorInfo.from_type_proto(v.type) for v in (*graph.input, *graph.value_info, *graph.output)}
    tensors = {v.name: TensorInfo.from_type_proto(v.type) for v in graph.input}
    constants: dict[str, onnx.TensorProto] = {}
    for t in graph.initializer:
        tensors[t.name] = TensorInfo(t.data_type, tuple(t.dims))
        if t.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) and t.ByteSize() <= 1024:
            constants[t.name] = t
    reports = []
    for index, node in enumerate(graph.node):
        label = _node_label(node, index)
        qdq, problem, outputs = None, None, None
        try:
            outputs, qdq = _check_node(node, label, opsets, tensors, constants)
        except QuantizationError as e:
            problem = str(e)
        for i, out in enumerate(node.output):
            info = outputs[i] if outputs is not None and i < len(outputs) else TensorInfo(0, None)
            if not info.elem_type and out in declared:
                info = declared[out]
            tensors[out] = info
        reports.append(NodeReport(node, qdq, problem))
    return Analysis(opsets, tensors, tuple(reports))


def _check_node(
    node: onnx.NodeProto,
    label: str,
    opsets: dict[str, int],
    tensors: dict[str, TensorInfo],
    constants: dict[str, onnx.TensorProto],
) -> tuple[tuple[TensorInfo, ...] | None, QDQCheck | None]:
    missing = [n for n in node.input if n and n not in tensors]
    if missing:
        raise QuantizationError(
            f"node {label!r} ({node.op_type}): input {missing[0]!r} is no graph input, initializer or output of an earlier node"
        )
    if node.domain not in opsets:
        raise QuantizationError(f"node {label!r} ({node.op_type}): the model imports no opset of domain {node.domain!r}")
    opset = opsets[node.domain]
    if node.op_type in QDQ_OPS and node.domain in _QDQ_DOMAINS:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        check = check_qdq_node(node.op_type, opset, node.domain, attrs, [tensors[n] if n else None for n in node.input], label)
        return check.outputs, check
    if node.domain not in _ONNX_DOMAINS:
        return None, None
    infos = {n: tensors[n] for n in node.input if n}
    return check_schema_node(node, opset, infos, {n: constants[n] for n in node.input if n in constants}, label=label), None


def check_model(model: onnx.ModelProto) -> Analysis:
    """:func:`analyse` ``model`` and raise its first problem.

    Raises:
        QuantizationError: the first node with a problem, named.
    """
    analysis = analyse(model)
    if analysis.problems:
        raise QuantizationError(analysis.problems[0])
    return analysis
