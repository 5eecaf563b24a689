"""What a model's Q/DQ nodes do and cost: one report a model, as data."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx

from qlinear.dtypes import element_type, from_tensor_proto, packed_size
from qlinear.onnx._analysis import analyse
from qlinear.onnx._graph import readers as tensor_readers
from qlinear.onnx._qdq_check import QDQ_OPS, QDQCheck
from qlinear.onnx._tensor_info import TensorInfo

__all__ = ["GatheredTableReport", "ModelReport", "QDQNodeReport", "inspect_model"]

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
        subgraph: for a node inside an If, Loop or Scan body, the node and
            attribute holding that body (``"loop_1.body"``); None in the main graph.
        stored: the constant quantized tensor it reads (None: none); a
            weight shared by several layers is counted once in the totals.
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
    subgraph: str | None = None
    stored: str | None = None


@dataclass(frozen=True)
class GatheredTableReport:
    """An embedding table stored as codes that a Gather reads row by row, dequantized after it (as qlinear quantize writes it).

    Attributes:
        name: the Gather node; table: the codes' initializer.
        quantized_type: the codes' type; rows, columns: the table's shape.
        quantized_bytes: the codes and the rows' scales and zero points in the file.
        float_bytes: the table in float32.
    """

    name: str
    table: str
    quantized_type: str
    rows: int
    columns: int
    quantized_bytes: int
    float_bytes: int


@dataclass(frozen=True)
class ModelReport:
    """A model's opsets, domains, Q/DQ nodes and problems."""

    ir_version: int
    opsets: dict[str, int]
    node_domains: list[str]
    node_count: int
    qdq_nodes: list[QDQNodeReport] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # Valid but suspicious: scales that are NaN, infinite, zero, negative or subnormal; declared output
    # types that differ from the zero point's.
    warnings: list[str] = field(default_factory=list)
    gathered_tables: list[GatheredTableReport] = field(default_factory=list)
    # The float constants of the main graph stored as they are (no Q/DQ scale among them): weights left float, and
    # a weight a float node reads beside its quantized copy.
    float_kept_bytes: int = 0

    @property
    def quantized_bytes(self) -> int:
        return sum(n.quantized_bytes for n in self._each_constant_once())

    @property
    def float_bytes(self) -> int:
        return sum(n.float_bytes for n in self._each_constant_once())

    def _each_constant_once(self) -> list:
        """The nodes and tables whose constants the totals count: a constant read by several DequantizeLinear nodes
        (a weight two layers share) once."""
        seen: set[tuple[str | None, str]] = set()
        out = []
        for n in self.qdq_nodes:
            key = (n.subgraph, n.stored or f"node {n.name}")
            if n.stored is None or key not in seen:
                seen.add(key)
                out.append(n)
        return [*out, *self.gathered_tables]

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
    nodes, warnings = [], []
    for report in analysis.nodes:
        node = report.node
        if node.op_type in QDQ_OPS and node.domain in ("", "com.microsoft"):
            nodes.append(_qdq_report(report.node, report.qdq, report.problem, initializers, analysis.tensors))
            scale_t = initializers.get(node.input[1]) if len(node.input) > 1 else None
            scale = None if scale_t is None else from_tensor_proto(scale_t).astype(np.float64)
            warnings += _scale_warnings(node.name, None, scale)
    for r, scale in _subgraph_qdq(model.graph, initializers):
        nodes.append(r)
        warnings += _scale_warnings(r.name, r.subgraph, scale)
    node_count = len(model.graph.node) + sum(len(g.node) for _, _, g in _subgraphs(model.graph))
    warnings += _type_warnings(model.graph, initializers)
    warnings += _whole_table_warnings(model.graph, initializers)
    return ModelReport(
        ir_version=model.ir_version,
        opsets=dict(analysis.opsets),
        node_domains=sorted({n.domain or "ai.onnx" for n in model.graph.node}),
        node_count=node_count,
        qdq_nodes=nodes,
        problems=analysis.problems,
        warnings=warnings,
        gathered_tables=_gathered_tables(model.graph, initializers),
        float_kept_bytes=_float_kept_bytes(model.graph),
    )


_FLOAT_CONSTANTS = frozenset(
    {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}
)


def _float_kept_bytes(graph: onnx.GraphProto) -> int:
    """Bytes of the graph's float initializers that are no Q/DQ node's scale."""
    scales = {n.input[1] for n in graph.node if n.op_type in QDQ_OPS and len(n.input) > 1}
    return sum(
        math.prod(t.dims) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        for t in graph.initializer
        if t.data_type in _FLOAT_CONSTANTS and t.name not in scales
    )


def _subgraphs(graph: onnx.GraphProto, where: str = ""):
    """``(owner, attribute, body)`` of every If/Loop/Scan body, nested ones too."""
    for node in graph.node:
        for a in node.attribute:
            bodies = (
                [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []
            )
            for body in bodies:
                owner = f"{where}{node.name or node.op_type}"
                yield owner, a.name, body
                yield from _subgraphs(body, f"{owner}.{a.name}/")


def _subgraph_qdq(graph: onnx.GraphProto, outer: dict[str, onnx.TensorProto]):
    """A report of each Q/DQ node inside a subgraph (its types read from constants, where they are)."""
    for owner, attr, body in _subgraphs(graph):
        consts = {**outer, **{t.name: t for t in body.initializer}}
        for node in body.node:
            if node.op_type not in QDQ_OPS or node.domain not in ("", "com.microsoft"):
                continue
            scale_t = consts.get(node.input[1]) if len(node.input) > 1 else None
            zp_t = consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
            scale = None if scale_t is None else from_tensor_proto(scale_t).astype(np.float64)
            zero_points, as_range = _zero_points(None if zp_t is None else from_tensor_proto(zp_t))
            report = QDQNodeReport(
                name=node.name,
                op=node.op_type,
                domain=node.domain,
                quantized_type=None if zp_t is None else element_type(zp_t.data_type).name,
                scale_min=_finite_min(scale),
                scale_max=_finite_max(scale),
                zero_points=zero_points,
                zero_points_are_range=as_range,
                subgraph=f"{owner}.{attr}",
            )
            yield report, scale


def _finite_min(scale: np.ndarray | None) -> float | None:
    return float(np.nanmin(scale)) if scale is not None and scale.size and not np.isnan(scale).all() else None


def _finite_max(scale: np.ndarray | None) -> float | None:
    return float(np.nanmax(scale)) if scale is not None and scale.size and not np.isnan(scale).all() else None


def _scale_warnings(name: str, subgraph: str | None, scale: np.ndarray | None) -> list[str]:
    """What is wrong with a constant scale: NaN, infinite, zero, negative or subnormal values, counted."""
    if scale is None or not scale.size:
        return []
    where = f"node {name!r}" + (f" (in {subgraph})" if subgraph else "")
    finite = np.isfinite(scale)
    tiny = np.finfo(np.float32).tiny
    counts = {
        "NaN": int(np.isnan(scale).sum()),
        "infinite": int(np.isinf(scale).sum()),
        "zero": int((scale == 0).sum()),
        "negative": int((finite & (scale < 0)).sum()),
        "subnormal (below float32's smallest normal, 1.2e-38)": int((finite & (scale > 0) & (scale < tiny)).sum()),
    }
    return [f"{where}: {n} of {scale.size} scale(s) {what}" for what, n in counts.items() if n]


def _type_warnings(graph: onnx.GraphProto, initializers: dict[str, onnx.TensorProto]) -> list[str]:
    """QuantizeLinear outputs whose declared type differs from their zero point's (onnx.checker rejects them)."""
    declared = {
        vi.name: vi.type.tensor_type.elem_type for vi in [*graph.value_info, *graph.output] if vi.type.HasField("tensor_type")
    }
    out = []
    for node in graph.node:
        if node.op_type != "QuantizeLinear" or len(node.input) < 3 or node.input[2] not in initializers:
            continue
        zp_type, said = initializers[node.input[2]].data_type, declared.get(node.output[0], 0)
        if said and said != zp_type:
            out.append(
                f"node {node.name!r}: output {node.output[0]!r} is declared {onnx.TensorProto.DataType.Name(said)}, "
                f"its zero point is {onnx.TensorProto.DataType.Name(zp_type)}"
            )
    return out


def _whole_table_warnings(graph: onnx.GraphProto, initializers: dict[str, onnx.TensorProto]) -> list[str]:
    """A DequantizeLinear of a constant 2-D table that only Gathers read: ONNX Runtime dequantizes all of it every run."""
    readers = tensor_readers(graph)
    out = []
    for node in graph.node:
        table = initializers.get(node.input[0]) if node.op_type == "DequantizeLinear" and node.input else None
        gathers = readers.get(node.output[0], []) if table is not None and len(table.dims) == 2 else []
        if gathers and all(n.op_type == "Gather" and n.input[0] == node.output[0] for n in gathers):
            out.append(
                f"node {node.name!r}: dequantizes all of table {table.name!r} ({table.dims[0]} x {table.dims[1]}) on every "
                f"run for {', '.join(repr(n.name) for n in gathers)}: ONNX Runtime has no integer Gather; gathering the "
                "codes and dequantizing only the rows costs what the rows cost (qlinear quantize writes tables so)"
            )
    return out


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
        scale_min=_finite_min(scale),
        scale_max=_finite_max(scale),
        zero_points=zero_points,
        zero_points_are_range=as_range,
        quantized_bytes=quantized_bytes,
        float_bytes=float_bytes,
        problem=problem,
        stored=None if stored is None else stored.name,
    )


_CODES = (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)


def _gathered_tables(graph: onnx.GraphProto, initializers: dict[str, onnx.TensorProto]) -> list[GatheredTableReport]:
    """The Gathers of 2-D 8-bit tables whose rows a DequantizeLinear or a Cast reads (the rows' dequantization).

    The rows' scales and zero points are the tables of fewer columns that
    Gathers of the same indices read (a column a row, or one a block), or
    the DequantizeLinear's own constants.
    """
    readers = tensor_readers(graph)
    found = []
    for node in graph.node:
        codes = initializers.get(node.input[0]) if node.op_type == "Gather" and node.input else None
        if codes is None or codes.data_type not in _CODES or len(codes.dims) != 2:
            continue
        after = readers.get(node.output[0], [])
        if len(after) != 1 or after[0].op_type not in ("DequantizeLinear", "Cast"):
            continue
        rows, columns = codes.dims
        params = [
            initializers[n.input[0]]
            for n in readers.get(node.input[1], [])
            if n is not node and n.op_type == "Gather" and n.input[0] in initializers
            and len(initializers[n.input[0]].dims) == 2 and initializers[n.input[0]].dims[0] == rows
            and initializers[n.input[0]].dims[1] < columns
        ]  # fmt: skip
        if after[0].op_type == "DequantizeLinear":
            params += [initializers[t] for t in after[0].input[1:] if t in initializers]
        stored = sum(_stored_bytes(t) for t in (codes, *params))
        found.append(
            GatheredTableReport(
                node.name, codes.name, element_type(codes.data_type).name, rows, columns, stored, rows * columns * 4
            )
        )
    return found


def _stored_bytes(t: onnx.TensorProto) -> int:
    return packed_size(math.prod(t.dims), element_type(t.data_type).bits)


def _zero_points(zp: np.ndarray | None) -> tuple[list[float] | None, bool]:
    if zp is None:
        return None, False
    values = np.unique(zp.astype(np.float64))
    if values.size > _LISTED_ZERO_POINTS:
        return [float(values[0]), float(values[-1])], True
    return [float(v) for v in values], False
