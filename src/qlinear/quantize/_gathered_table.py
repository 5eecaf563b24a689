"""Embedding tables gathered as codes: Gather the quantized rows, then dequantize only those.

ONNX Runtime has no integer Gather, so ``DequantizeLinear -> Gather``
dequantizes the whole table on every run: for a 32000 x 512 table, 2.6 ms a
run against 0.01 ms for the float model's Gather, and for a language model's
table a large share of each token's time. This pass, the last rewrite of a
finished QDQ model, gathers the codes instead, with each row's scales and
zero points beside them, and dequantizes only the rows: a DequantizeLinear
where the table has one scale, ``(codes - zero point) * scale`` written out
as Cast, Sub and Mul where it has one (float32 or float16) scale a row, a blocked
DequantizeLinear where it has blocks along the row. The values are the same
bit for bit (dequantization is element-wise) and cost what the rows cost.

``--stream-weights`` builds the same layout in its onnx-ir graph
(:func:`gather_streamed`). Codes must be 8-bit integers (the types qlinear
stores tables in that ONNX Runtime's Gather takes: it takes no 4-bit or
float8 tensors); other tables stay as they are.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qlinear.onnx._graph import names_read, readers
from qlinear.quantize._model import attribute, reserve_name

__all__ = ["gather_streamed", "gather_tables", "gathers_codes"]

_GATHERED_CODES = frozenset({TensorProto.INT8, TensorProto.UINT8})
# The scale types whose rows are dequantized as Cast, Sub and Mul, and the Cast's type. 8-bit codes and their
# differences with a zero point are exact in both, and ONNX Runtime's Mul rounds the product once, as its
# DequantizeLinear does (checked bit for bit in float16 too). Its CPU provider has no bfloat16 Mul.
_CAST_TO = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16}


def gather_tables(model: onnx.ModelProto) -> list[str]:
    """Rewrite every ``DequantizeLinear -> Gather`` of a constant table that can gather codes (in place); the Gathers' names."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    reading = readers(g)
    outputs = {o.name for o in g.output}
    taken = {*inits, *(n for node in g.node for n in (*node.input, *node.output)), *(node.name for node in g.node)}
    after: dict[int, list[onnx.NodeProto]] = {}  # id(a Gather) -> the nodes behind it (names are optional in ONNX)
    gathered, dropped, freed = [], set(), set()
    for dq in g.node:
        table = _table(dq, inits)
        gathers = reading.get(dq.output[0], [])
        if table is None or dq.output[0] in outputs or not gathers or not all(_gathers_rows(n, dq.output[0]) for n in gathers):
            continue
        scale, zero_point, block = table
        if scale.ndim and any(
            _fused_reader(n, gather.output[0]) for gather in gathers for n in reading.get(gather.output[0], [])
        ):
            # Rows dequantized with per-row parameters straight into a MatMul, Gemm or Conv: ONNX Runtime fuses that
            # DequantizeLinear as an integer input, which takes one zero point only, and fails at run time.
            continue
        for gather in gathers:
            after[id(gather)] = _gather_codes(gather, dq.input[0], scale, zero_point, block, g, taken)
            gathered.append(gather.name)
        dropped.add(id(dq))
        freed.update(dq.input[1:])
    if not after:
        return []
    order = []
    for node in g.node:
        if id(node) in dropped:
            continue
        order += [node, *after.get(id(node), [])]
    del g.node[:]
    g.node.extend(order)
    # The whole-table scales and zero points, now unread (the rows' tables replace them).
    used = names_read(g)  # subgraphs may read initializers of this graph by name
    kept = [t for t in g.initializer if t.name in used or t.name not in freed]
    del g.initializer[:]
    g.initializer.extend(kept)
    return gathered


def _table(dq: onnx.NodeProto, inits: dict[str, TensorProto]):
    """``(scale, zero_point, block)`` of a DequantizeLinear of a 2-D constant table by rows, or None.

    ``block`` 0: one float32 or float16 scale a row, or one for the whole table where ``scale`` is a scalar.
    """
    if dq.op_type != "DequantizeLinear" or dq.domain not in ("", "ai.onnx") or dq.input[0] not in inits:
        return None
    codes = inits[dq.input[0]]
    if codes.data_type not in _GATHERED_CODES or len(codes.dims) != 2:
        return None
    params = [inits.get(name) for name in dq.input[1:] if name]
    if any(p is None for p in params):
        return None
    scale = numpy_helper.to_array(params[0])
    zero_point = numpy_helper.to_array(params[1]) if len(params) > 1 else None
    axis, block = attribute(dq, "axis", 1) % 2, attribute(dq, "block_size", 0)
    if scale.size == 1 and block == 0:  # one scale for the whole table
        return scale.reshape(()), None if zero_point is None else zero_point.reshape(()), 0
    if block == 0 and scale.ndim == 1 and axis == 0 and scale.dtype in _CAST_TO:
        return scale, zero_point, 0
    if block and scale.ndim == 2 and axis == 1:  # the DequantizeLinear read is blocked already: opset 21
        return scale, zero_point, block
    return None


def _fused_reader(node: onnx.NodeProto, tensor: str) -> bool:
    """Whether ``node`` reads ``tensor`` as an input that ONNX Runtime's QDQ fusions take from a DequantizeLinear."""
    return node.op_type in ("MatMul", "Gemm", "Conv") and tensor in node.input[:2]


def _gathers_rows(node: onnx.NodeProto, table: str) -> bool:
    return node.op_type == "Gather" and node.input[0] == table and table not in node.input[1:] and attribute(node, "axis", 0) == 0


def _gather_codes(gather, codes, scale, zero_point, block, g, taken) -> list[onnx.NodeProto]:
    """Point ``gather`` at ``codes``; return the nodes that go behind it, the last writing its output."""

    fresh = functools.partial(reserve_name, taken=taken)

    def rows_of(values: np.ndarray, what: str) -> str:
        """The rows of a per-row (or per-block) table of ``values`` that the Gather reads."""
        table, rows = fresh(f"{codes}_{what}_rows"), fresh(f"{out}_{what}")
        g.initializer.append(numpy_helper.from_array(np.ascontiguousarray(values), table))
        nodes.append(helper.make_node("Gather", [table, ids], [rows], name=fresh(f"{gather.name}_{what}"), axis=0))
        return rows

    ids, out = gather.input[1], gather.output[0]
    gathered = fresh(f"{out}_codes")
    gather.input[0], gather.output[0] = codes, gathered
    nodes: list[onnx.NodeProto] = []
    if scale.ndim == 0:  # one scale: a plain DequantizeLinear of the rows
        params = []
        for values, what in ((scale, "scale"), (zero_point, "zero_point")):
            if values is not None:
                params.append(fresh(f"{codes}_{what}"))
                g.initializer.append(numpy_helper.from_array(values, params[-1]))
        return [helper.make_node("DequantizeLinear", [gathered, *params], [out], name=fresh(f"{gather.name}_DequantizeLinear"))]
    if block:  # blocks along the row: a blocked DequantizeLinear of the rows
        params = [rows_of(scale, "scale"), *([rows_of(zero_point, "zero_point")] if zero_point is not None else [])]
        dq = helper.make_node(
            "DequantizeLinear",
            [gathered, *params],
            [out],
            name=fresh(f"{gather.name}_DequantizeLinear"),
            axis=-1,
            block_size=block,
        )
        return [*nodes, dq]
    # One scale a row: (codes - zero point) * scale written out (see _CAST_TO), which ONNX Runtime runs 3-4x
    # faster than a blocked DequantizeLinear.
    s_rows = rows_of(scale.reshape(-1, 1), "scale")
    values = fresh(f"{out}_values")
    nodes.append(helper.make_node("Cast", [gathered], [values], name=fresh(f"{gather.name}_Cast"), to=_CAST_TO[scale.dtype]))
    if zero_point is not None and np.any(zero_point):
        z_rows = rows_of(zero_point.astype(scale.dtype).reshape(-1, 1), "zero_point")
        centred = fresh(f"{out}_centred")
        nodes.append(helper.make_node("Sub", [values, z_rows], [centred], name=fresh(f"{gather.name}_Sub")))
        values = centred
    return [*nodes, helper.make_node("Mul", [values, s_rows], [out], name=fresh(f"{gather.name}_Mul"))]


# The same layout in an onnx-ir graph, for the streaming path (its tensors stay lazy: nothing here reads them).


def gathers_codes(dq_output: Any, gather: Any) -> bool:
    """Whether ``gather`` (an onnx-ir node reading a table at input 0) can gather the codes ``dq_output`` dequantizes."""
    dq = dq_output.producer()
    codes = dq.inputs[0]
    scale = dq.inputs[1].const_value
    if (
        scale is None
        or gather.attributes.get_int("axis", 0) != 0
        or codes.dtype is None
        or codes.dtype.name not in ("INT8", "UINT8")
    ):
        return False
    # As the in-memory pass takes them: one scale, blocks along the row, or one float32 scale a row.
    if scale.shape.rank() == 0 or dq.attributes.get_int("block_size", 0):
        return True
    return dq.attributes.get_int("axis", 1) == 0 and scale.dtype.name in ("FLOAT", "FLOAT16")


def gather_streamed(ir: Any, graph: Any, gather: Any, dq_output: Any, *, centred: bool) -> None:
    """Replace ``gather`` (reading a table that ``dq_output`` dequantizes) by a Gather of the codes and the rows' dequantization.

    ``centred``: some zero point is not 0 (a Sub is needed).
    """
    dq = dq_output.producer()
    codes, scale = dq.inputs[0], dq.inputs[1]
    zero_point = dq.inputs[2] if len(dq.inputs) > 2 else None
    block = dq.attributes.get_int("block_size", 0)
    ids, out = gather.inputs[1], gather.outputs[0]
    name = gather.name or out.name

    def op(op_type: str, inputs: list, **attributes: Any) -> Any:
        node = ir.node(op_type, inputs, attributes=attributes, name=f"{name}_{op_type}_{len(nodes)}")
        node.outputs[0].name = f"{node.name}_output"
        nodes.append(node)
        return node.outputs[0]

    nodes: list = []
    rows = op("Gather", [codes, ids], axis=0)
    if scale.const_value.shape.rank() == 0:  # one scale: a plain DequantizeLinear of the rows
        result = op("DequantizeLinear", [rows, scale, *([zero_point] if zero_point is not None else [])])
    elif block:  # blocks along the row
        params = [
            op("Gather", [scale, ids], axis=0),
            *([op("Gather", [zero_point, ids], axis=0)] if zero_point is not None else []),
        ]
        result = op("DequantizeLinear", [rows, *params], axis=-1, block_size=block)
    else:  # one scale a row: (codes - zero point) * scale, as the in-memory pass writes it
        last = ir.Value(name=f"{name}_last_axis", const_value=ir.tensor(np.array([-1], np.int64), name=f"{name}_last_axis"))
        graph.register_initializer(last)
        values = op("Cast", [rows], to=scale.dtype)
        if centred and zero_point is not None:
            z = op("Unsqueeze", [op("Cast", [op("Gather", [zero_point, ids], axis=0)], to=scale.dtype), last])
            values = op("Sub", [values, z])
        result = op("Mul", [values, op("Unsqueeze", [op("Gather", [scale, ids], axis=0), last])])
    graph.insert_after(gather, nodes)
    out.replace_all_uses_with(result, replace_graph_outputs=True)
    graph.remove(gather, safe=True)  # safe: the float table it read is no longer read by it
    result.name, result.type, result.shape = out.name, out.type, out.shape
