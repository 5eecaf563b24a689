"""The convert pass: the float model rewritten as a QDQ model.

Every quantized activation gets one QuantizeLinear right after its producer
and a DequantizeLinear of its own in front of each consumer that reads it
quantized (ONNX Runtime then groups each DQ with exactly one node). Weights
are stored quantized (2/4/6-bit types packed, as ONNX stores them) behind a
DequantizeLinear; Conv and Gemm biases as int32 with scale
``activation scale x weight scale`` where the activation is quantized. The
weights' codes come from :func:`qlinear.quantize_linear`, so the model's
DequantizeLinear of each weight is bit for bit ``qlinear.dequantize_linear``
of what is stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import qlinear
from qlinear.dtypes import ElementType, element_type, from_tensor_proto, to_tensor_proto
from qlinear.onnx import _large as large
from qlinear.onnx._graph import names_read
from qlinear.quantize._choose import QuantParams, in_float_type, weight_params
from qlinear.quantize._model import FloatModel, reserve_name
from qlinear.quantize._node_placement import NodePlan
from qlinear.quantize._opset import at_opset
from qlinear.quantize._placement import Plan, moves_data
from qlinear.quantize._qdq_names import CODES, SCALE, VALUES, ZERO_POINT
from qlinear.quantize._sqnr import difference, weight_error
from qlinear.quantize.algorithms._registry import Algorithm, Calibrated

if TYPE_CHECKING:  # the options compose every algorithm's fields, and algorithms import this module
    from qlinear.quantize._options import QuantizeOptions


__all__ = ["ConvertedNode", "convert"]

_INT32 = np.iinfo(np.int32)


@dataclass
class ConvertedNode:
    """What the convert pass did to one node."""

    name: str
    op_type: str
    weight_type: str | None
    activation_type: str | None
    weight_sqnr_db: float | None
    weight_bytes_before: int
    weight_bytes_after: int
    bias_int32: bool
    bias_corrected: bool = False


def convert(
    fm: FloatModel,
    plan: Plan,
    options: QuantizeOptions,
    activation_params: dict[str, QuantParams],
    opset: int,
    *,
    source: onnx.ModelProto | None = None,
    calibrated: Calibrated | None = None,
    algorithms: Sequence[Algorithm] = (),
    rounded: dict[tuple, tuple] | None = None,
) -> tuple[onnx.ModelProto, dict[str, ConvertedNode]]:
    """The QDQ model for ``plan``, at ``opset``, and what was done to each quantized node.

    ``source``: the float model already at ``opset`` (copied, not changed);
    default: ``fm``'s, raised here. ``algorithms``: those of stage
    ``calibration`` that are on, which may round a weight (GPTQ) or correct
    a bias (bias correction) from what the calibration measured for them,
    ``calibrated``. ``rounded``: where the algorithms' roundings are kept
    for the next conversion of the same run (a weight's depends only on
    the weight, its type and the calibration).
    """
    if source is None:
        model = at_opset(fm.model, opset)
    else:
        model = onnx.ModelProto()
        model.CopyFrom(source)
    g = model.graph
    names = _Names(
        {t.name for t in g.initializer} | {n for node in g.node for n in (*node.input, *node.output)} | {n.name for n in g.node}
    )
    new_inits: list[TensorProto] = []
    # Activation parameters: one scale/zero point pair for each calibrated tensor, shared ones point to it.
    param_names: dict[str, tuple[str, str]] = {}
    for t in plan.calibrate:
        p = activation_params[t]
        scale_name, zp_name = names.fresh(t + SCALE), names.fresh(t + ZERO_POINT)
        scale = in_float_type(p.scale, fm.elem_types.get(t, TensorProto.FLOAT))
        new_inits += [to_tensor_proto(scale, scale_name), to_tensor_proto(p.zero_point, zp_name)]
        param_names[t] = (scale_name, zp_name)
    quantized_name = {t: names.fresh(t + CODES) for t in plan.activations}
    node_plans = {p.name: p for p in plan.nodes}
    reads_quantized = _quantized_reads(plan, g)
    converted: dict[str, ConvertedNode] = {}
    nodes: list[onnx.NodeProto] = []
    ctx = _Context(
        fm, options, plan, param_names, activation_params, names, nodes, new_inits,
        nodes_by_name={n.name: n for n in g.node}, calibrated=calibrated or Calibrated(),
        algorithms=list(algorithms), rounded={} if rounded is None else rounded,
    )  # fmt: skip

    def emit_q(t: str) -> None:
        scale_name, zp_name = param_names[plan.root(t)]
        nodes.append(helper.make_node("QuantizeLinear", [t, scale_name, zp_name], [quantized_name[t]], name=quantized_name[t]))

    def emit_dq(t: str, consumer: str) -> str:
        scale_name, zp_name = param_names[plan.root(t)]
        out = names.fresh(t + VALUES)
        nodes.append(helper.make_node("DequantizeLinear", [quantized_name[t], scale_name, zp_name], [out], name=out))
        return out

    activations = set(plan.activations)
    for t in fm.input_names:
        if t in activations:
            emit_q(t)
    for node in g.node:
        np_ = node_plans.get(node.name)
        for k, t in enumerate(node.input):
            if t in activations and (t in plan.all_consumers_dequantize or (node.name, t) in reads_quantized):
                node.input[k] = emit_dq(t, node.name)
        if np_ is not None:
            converted[node.name] = _convert_node(node, np_, ctx)
        nodes.append(node)
        for o in node.output:
            if o in activations:
                emit_q(o)
    del g.node[:]
    g.node.extend(nodes)
    used = names_read(g)  # subgraphs may read initializers of this graph by name
    kept = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(kept + new_inits)
    # Inferred intermediate types of the float model may no longer hold (a weight's name now names codes).
    del g.value_info[:]
    return model, converted


def _quantized_reads(plan: Plan, g: onnx.GraphProto) -> set[tuple[str, str]]:
    """``(node, tensor)`` pairs where the node reads the tensor quantized: compute nodes and data movement."""
    reads = {(p.name, t) for p in plan.nodes for t in p.activations}
    for node in g.node:
        if moves_data(node) and node.output and node.output[0] in plan.shared:
            reads.add((node.name, plan.shared[node.output[0]]))
    return reads


@dataclass
class _Context:
    """What converting one node needs from the whole conversion."""

    fm: FloatModel
    options: QuantizeOptions
    plan: Plan
    param_names: dict[str, tuple[str, str]]
    activation_params: dict[str, QuantParams]
    names: _Names
    nodes: list[onnx.NodeProto]  # the new graph's nodes so far
    new_inits: list[TensorProto]
    nodes_by_name: dict[str, onnx.NodeProto]  # the model's nodes being rewritten
    calibrated: Calibrated
    algorithms: list[Algorithm]  # those of stage calibration that are on
    # A weight quantized once for every node that shares it: (tensor, axes, type) -> what was stored.
    weights: dict[tuple[str, int, int, str], _StoredWeight] = field(default_factory=dict)
    # An algorithm's rounding of a weight, kept across the builds of one run (the caller's): (tensor, axes, type) -> it.
    rounded: dict[tuple, tuple] = field(default_factory=dict)


_NOT_ROUNDED = object()  # no algorithm asked yet (None: asked, and none rounds it)


@dataclass
class _StoredWeight:
    q_name: str
    s_name: str
    z_name: str | None
    axis: int
    block: int
    params: QuantParams
    sqnr: float | None
    nbytes: int
    codes: TensorProto  # the codes' initializer as made (a large model's: a marker of its store)
    with_error: bool = False  # the node that stored it took its error: nodes after it that share it take it only then


def _convert_node(node: onnx.NodeProto, p: NodePlan, ctx: _Context) -> ConvertedNode:
    fm, plan = ctx.fm, ctx.plan
    acts = plan.activation_type(p.activations[0]) if p.activations else None
    result = ConvertedNode(p.name, p.op_type, None, acts, None, 0, 0, False)
    if p.weight is None or p.weight_type is None:
        return result
    w = fm.constant(p.weight.tensor)
    stored, error = _store_weight(p, w, ctx)
    dq_out = ctx.names.fresh(p.weight.tensor + VALUES)
    attrs = {"axis": stored.axis} if stored.params.scale.ndim else {}
    if stored.block:
        attrs["block_size"] = stored.block
    ctx.nodes.append(
        helper.make_node(
            "DequantizeLinear",
            [stored.q_name, stored.s_name, *([stored.z_name] if stored.z_name else [])],
            [dq_out],
            name=dq_out,
            **attrs,
        )
    )
    node.input[p.weight.index] = dq_out
    result.weight_type, result.weight_sqnr_db = p.weight_type, stored.sqnr
    result.weight_bytes_before, result.weight_bytes_after = w.size * 4, stored.nbytes  # as float32
    bias_name, bias = p.bias, (fm.constant(p.bias) if p.bias else None)
    shift, where = _bias_shift(p, error, ctx)
    if shift is not None and where.add is None:
        # A layer without a bias gets one of its weight's float type (float16 in a float16 model).
        layer_type = helper.tensor_dtype_to_np_dtype(fm.elem_types.get(p.weight.tensor, TensorProto.FLOAT))
        base = fm.constant(where.tensor) if where.tensor is not None else np.zeros(shift.shape, layer_type)
        bias = (base.astype(np.float64) - shift).astype(base.dtype)
        bias_name = where.tensor or ctx.names.fresh(f"{p.name}_bias")
        result.bias_corrected = True
    elif shift is not None:
        add = ctx.nodes_by_name[where.add]
        vector = fm.constant(where.tensor)
        corrected = ctx.names.fresh(f"{where.tensor}_corrected")
        ctx.new_inits.append(to_tensor_proto((vector.astype(np.float64) - shift).astype(vector.dtype), corrected))
        add.input[where.index] = corrected
        result.bias_corrected = True
    if bias is None:
        return result
    if stored.block or not p.activations or (p.bias is None and not _bias_fits(node, p)):
        if bias_name != p.bias or result.bias_corrected:  # a corrected float bias
            name = ctx.names.fresh(f"{bias_name}_corrected")
            ctx.new_inits.append(to_tensor_proto(bias, name))
            _set_bias(node, name)
        return result
    act_scale = ctx.activation_params[plan.root(p.activations[0])].scale
    bias_type = fm.elem_types.get(p.bias, TensorProto.FLOAT) if p.bias else fm.elem_types.get(p.weight.tensor, TensorProto.FLOAT)
    bias_scale = in_float_type((np.float32(act_scale) * stored.params.scale.astype(np.float32)).astype(np.float32), bias_type)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.clip(np.rint(bias.astype(np.float64) / bias_scale.astype(np.float64)), _INT32.min, _INT32.max)
    q = np.where(np.isfinite(q), q, 0).astype(np.int32)
    bq, bs = ctx.names.fresh(bias_name + CODES), ctx.names.fresh(bias_name + SCALE)
    ctx.new_inits += [numpy_helper.from_array(q, bq), to_tensor_proto(bias_scale, bs)]
    b_out = ctx.names.fresh(bias_name + VALUES)
    battrs = {"axis": 0} if bias_scale.ndim else {}
    ctx.nodes.append(helper.make_node("DequantizeLinear", [bq, bs], [b_out], name=b_out, **battrs))
    _set_bias(node, b_out)
    result.bias_int32 = True
    return result


def _codes_initializer(codes: np.ndarray, name: str, store: large.TensorStore | None) -> TensorProto:
    """A weight's codes as an initializer: a marker of a large model's store where they are big, so copies of the
    quantized graph (the search's candidates, the sessions' models) cost the graph alone; else inline. Packed
    (4-bit, 2-bit) codes stay inline: the store holds arrays of one element a byte or more."""
    if store is None or codes.nbytes < large.MOVED_THRESHOLD or element_type(codes.dtype).is_packed:
        return to_tensor_proto(codes, name)
    return store.marker(name, codes)


def _store_weight(p: NodePlan, w: np.ndarray, ctx: _Context) -> tuple[_StoredWeight, np.ndarray | None]:
    """The weight's codes, scales and zero points as initializers (once for every node sharing it at these axes and type).

    And its error (dequantized minus float, float64) where an algorithm
    corrects the node's bias by it: made for the node, never kept (a large
    model's errors together are twice its weights).
    """
    wt = element_type(p.weight_type)
    weight_only = p.activation_type is None  # a narrow signed weight beside float activations takes a zero point
    key = (p.weight.tensor, p.weight.channel_axis, p.weight.reduction_axis, wt.name, weight_only)
    if key in ctx.weights:
        stored = ctx.weights[key]
        return stored, (_error(w, stored) if stored.with_error and _corrector(p, ctx) is not None else None)
    o, names = ctx.options, ctx.names
    # A large model's codes are in its store: an earlier build of the run that stored this weight alike gives them.
    again = ("stored", *key, o.granularity, o.block_size, o.weight_clip) if ctx.fm.store is not None else None
    if again in ctx.rounded:
        stored = _named_again(ctx.rounded[again], p, ctx, with_error=_corrector(p, ctx) is not None)
        ctx.weights[key] = stored
        return stored, (_error(w, stored) if stored.with_error else None)
    rounded = ctx.rounded.get(key, _NOT_ROUNDED)
    if rounded is _NOT_ROUNDED:  # GPTQ's rounding of a wide layer takes seconds: once a run, not once a candidate
        found = next(
            (r for a in ctx.algorithms if a.rounds and (r := a.rounds(ctx.fm, p, w, wt, o, ctx.calibrated)) is not None),
            None,
        )
        # Its codes are kept, not the float weight it rounded: a quarter of the bytes of a float32 copy, or less.
        rounded = None if found is None else _codes(found[0], found[1], found[2], found[3], wt, p, ctx)
        ctx.rounded[key] = rounded
    if rounded is not None:  # the codes of the weight as an algorithm rounded it
        codes, params, axis, block = rounded
    else:
        params, axis, block = weight_params(
            w, wt, granularity=o.granularity, channel_axis=p.weight.channel_axis, reduction_axis=p.weight.reduction_axis,
            block_size=o.block_size, clip=o.weight_clip, weight_only=weight_only,
        )  # fmt: skip
        codes, params, axis, block = _codes(w, params, axis, block, wt, p, ctx)
    back = qlinear.dequantize_linear(codes, params.scale, params.zero_point, axis=axis, block_size=block)
    # A float64 copy of the weight's error only where an algorithm corrects the layer's bias by it.
    with_error = _corrector(p, ctx) is not None
    sqnr, error = weight_error(w, back, keep=with_error)
    del back
    q_name = names.fresh(p.weight.tensor + CODES)
    s_name = names.fresh(p.weight.tensor + SCALE)
    z_name = names.fresh(p.weight.tensor + ZERO_POINT) if params.zero_point is not None else None
    q_proto = _codes_initializer(codes, q_name, ctx.fm.store)
    ctx.new_inits += [q_proto, to_tensor_proto(params.scale, s_name)]
    if z_name:
        ctx.new_inits.append(to_tensor_proto(params.zero_point, z_name))
    code_bytes = large.value_of(q_proto).nbytes if large.is_marker(q_proto) else len(q_proto.raw_data)
    nbytes = code_bytes + params.scale.nbytes + (params.zero_point.nbytes if params.zero_point is not None else 0)
    stored = _StoredWeight(q_name, s_name, z_name, axis, block, params, sqnr, nbytes, q_proto, with_error)
    ctx.weights[key] = stored
    if again is not None:
        ctx.rounded[again] = stored
    return stored, error


def _named_again(earlier: _StoredWeight, p: NodePlan, ctx: _Context, *, with_error: bool) -> _StoredWeight:
    """A weight stored by an earlier build of the run, under this model's names: its codes' marker names the same value."""
    q_name = ctx.names.fresh(p.weight.tensor + CODES)
    s_name = ctx.names.fresh(p.weight.tensor + SCALE)
    z_name = ctx.names.fresh(p.weight.tensor + ZERO_POINT) if earlier.z_name else None
    q_proto = TensorProto()
    q_proto.CopyFrom(earlier.codes)
    q_proto.name = q_name
    ctx.new_inits += [q_proto, to_tensor_proto(earlier.params.scale, s_name)]
    if z_name:
        ctx.new_inits.append(to_tensor_proto(earlier.params.zero_point, z_name))
    return replace(earlier, q_name=q_name, s_name=s_name, z_name=z_name, codes=q_proto, with_error=with_error)


def _error(w: np.ndarray, stored: _StoredWeight) -> np.ndarray:
    """The error of a weight stored before (another node reads it), dequantized again from its codes."""
    t = stored.codes
    codes = large.value_of(t) if large.is_marker(t) else from_tensor_proto(t)
    back = qlinear.dequantize_linear(
        codes, stored.params.scale, stored.params.zero_point, axis=stored.axis, block_size=stored.block
    )
    return difference(back, w)


def _codes(
    x: np.ndarray, params: QuantParams, axis: int, block: int, wt: ElementType, p: NodePlan, ctx: _Context
) -> tuple[np.ndarray, QuantParams, int, int]:
    """``x`` quantized with ``params`` (their scale in the weight's own float type), and the parameters as stored.

    In the weight's own float type: a float16 model's DequantizeLinear
    gives float16 (the scale's type).
    """
    params = QuantParams(
        in_float_type(params.scale, ctx.fm.elem_types.get(p.weight.tensor, TensorProto.FLOAT)), params.zero_point
    )
    x = x if params.scale.dtype != np.float32 else x.astype(np.float32, copy=False)
    codes = qlinear.quantize_linear(x, params.scale, params.zero_point, axis=axis, block_size=block, output_dtype=wt.name)
    return codes, params, axis, block


def _corrector(p: NodePlan, ctx: _Context):
    """The first algorithm's correction of the node's bias, as a function of its weight's error; or None."""
    return next((c for a in ctx.algorithms if a.corrects and (c := a.corrects(ctx.fm, p, ctx.calibrated)) is not None), None)


def _bias_shift(p: NodePlan, error: np.ndarray | None, ctx: _Context):
    """``(shift, site)`` of the node's bias correction by the weight's ``error``, or ``(None, None)``."""
    correct = _corrector(p, ctx) if error is not None else None
    found = correct(error) if correct is not None else None
    return (None, None) if found is None else found


def _bias_fits(node: onnx.NodeProto, p: NodePlan) -> bool:
    """Whether a bias added to ``node`` can be stored as int32 like an existing one (Conv, and Gemm with beta 1)."""
    if node.op_type == "Conv":
        return True
    return node.op_type == "Gemm" and all(not (a.name == "beta" and a.f != 1.0) for a in node.attribute)


def _set_bias(node: onnx.NodeProto, name: str) -> None:
    if len(node.input) > 2:
        node.input[2] = name
    else:
        node.input.append(name)


class _Names:
    """Fresh tensor and node names, none clashing with the model's."""

    def __init__(self, taken: set[str]) -> None:
        self._taken = set(taken)

    def fresh(self, base: str) -> str:
        return reserve_name(base, self._taken)
