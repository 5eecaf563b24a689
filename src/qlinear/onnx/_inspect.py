"""What a model's Q/DQ nodes do and cost: one report a model, as data."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx

from qlinear.dtypes import element_type, from_tensor_proto, packed_size
from qlinear.onnx._analysis import analyse
from qlinear.onnx._qdq_check import QDQ_OPS, QDQCheck
from qlinear.onnx._tensor_info import TensorInfo

__all__ = ["ModelReport", "QDQNodeReport", "inspect_model"]

# More distinct zero points than this are summarised by their range.
_LISTED_ZERO_POINTS = 8


@dataclass(frozen=True)
class QDQNodeReport:
    """One Q/DQ node.

    Attributes:
        name, op, domain: the node.
        version: the operator version in force (``"QuantizeLinear version 21 (ai.onnx)"``).
        quantized_type: the type of the quantized tensor (``"int4"``).
        granularity: ``"per_tensor"``, ``"per_axis"`` or ``"blocked"``.
        axis, block_size: normalised axis (None for per-tensor) and block size (0 unless blocked).
        scale_type: the scale's element type.
        scale_min, scale_max: range of a constant scale; None when it is computed.
        zero_points: the distinct constant zero points, or ``[min, max]`` when
            there are many (see ``zero_points_are_range``); None when absent or computed.
        quantized_bytes: bytes the node's constant quantized tensor, scale
            and zero point take in the file; 0 when its quantized input is
            no initializer.
        float_bytes: bytes the same tensor takes in the node's float type.
        problem: why the node is invalid at the model's opset; None when it is valid.
    """

    name: str
    op: str
    domain: str
    version: str | None = None
    quantized_type: str | None = None
    granularity: str | None = None
    axis: int | None = None
    block_size: int = 0
    scale_type: str | None = None
    scale_min: float | None = None
    scale_max: float | None = None
    zero_points: list[float] | None = None
    zero_points_are_range: bool = False
    quantized_bytes: int = 0
    float_bytes: int = 0
    problem: str | None = None


@dataclass(frozen=True)
class ModelReport:
    """A model's opsets, domains, Q/DQ nodes and problems."""

    ir_version: int
    opsets: dict[str, int]
    node_domains: list[str]
    node_count: int
    qdq_nodes: list[QDQNodeReport] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def quantized_bytes(self) -> int:
        return sum(n.quantized_bytes for n in self.qdq_nodes)

    @property
    def float_bytes(self) -> int:
        return sum(n.float_bytes for n in self.qdq_nodes)

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data, totals included."""
        return {**asdict(self), "quantized_bytes": self.quantized_bytes, "float_bytes": self.float_bytes}


def inspect_model(model: onnx.ModelProto) -> ModelReport:
    """Report every Q/DQ node of ``model`` and every node its opset does not allow.

    >>> from qlinear.onnx import Graph
    >>> g = Graph(opset=21)
    >>> g.output(g.dequantize_linear(np.zeros((64, 32), "int4"), np.ones((64, 1), np.float32), axis=1, block_size=32, name="w"))
    >>> r = inspect_model(g.to_model()).qdq_nodes[0]
    >>> (r.quantized_type, r.granularity, r.block_size, r.quantized_bytes, r.float_bytes)
    ('int4', 'blocked', 32, 1280, 8192)
    """
    analysis = analyse(model)
    initializers = {t.name: t for t in model.graph.initializer}
    nodes = []
    for report in analysis.nodes:
        node = report.node
        if node.op_type in QDQ_OPS and node.domain in ("", "com.microsoft"):
            nodes.append(_qdq_report(report.node, report.qdq, report.problem, initializers, analysis.tensors))
    return ModelReport(
        ir_version=model.ir_version,
        opsets=dict(analysis.opsets),
        node_domains=sorted({n.domain or "ai.onnx" for n in model.graph.node}),
        node_count=len(model.graph.node),
        qdq_nodes=nodes,
        problems=analysis.problems,
    )


def _qdq_report(
    node: onnx.NodeProto,
    check: QDQCheck | None,
    problem: str | None,
    initializers: dict[str, onnx.TensorProto],
    tensors: dict[str, TensorInfo],
) -> QDQNodeReport:
    base = {"name": node.name, "op": node.op_type, "domain": node.domain}
    if check is None:
        return QDQNodeReport(**base, problem=problem)
    if check.plan is None:
        # DynamicQuantizeLinear: uint8, one scale and zero point computed from the data.
        return QDQNodeReport(
            **base,
            version="DynamicQuantizeLinear version 11 (ai.onnx)",
            quantized_type="uint8",
            granularity="per_tensor",
            scale_type="float",
        )
    plan = check.plan
    quantized = plan.output_type if node.op_type == "QuantizeLinear" else plan.input_type
    g = plan.granularity
    scale_t = initializers.get(node.input[1])
    zp_t = initializers.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    scale = None if scale_t is None else from_tensor_proto(scale_t).astype(np.float64)
    zero_points, as_range = _zero_points(None if zp_t is None else from_tensor_proto(zp_t))
    stored = initializers.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
    quantized_bytes = float_bytes = 0
    if stored is not None:
        quantized_bytes = sum(_stored_bytes(t) for t in (stored, scale_t, zp_t) if t is not None)
        float_bytes = math.prod(plan.x_shape) * plan.output_dtype.itemsize
    return QDQNodeReport(
        **base,
        version=str(plan.version),
        quantized_type=quantized.name,
        granularity=g.kind,
        axis=None if g.kind == "per_tensor" else g.axis,
        block_size=g.block_size,
        scale_type=tensors[node.input[1]].type_name,
        scale_min=float(scale.min()) if scale is not None and scale.size else None,
        scale_max=float(scale.max()) if scale is not None and scale.size else None,
        zero_points=zero_points,
        zero_points_are_range=as_range,
        quantized_bytes=quantized_bytes,
        float_bytes=float_bytes,
        problem=problem,
    )


def _stored_bytes(t: onnx.TensorProto) -> int:
    return packed_size(math.prod(t.dims), element_type(t.data_type).bits)


def _zero_points(zp: np.ndarray | None) -> tuple[list[float] | None, bool]:
    if zp is None:
        return None, False
    values = np.unique(zp.astype(np.float64))
    if values.size > _LISTED_ZERO_POINTS:
        return [float(values[0]), float(values[-1])], True
    return [float(v) for v in values], False
