"""Float-exact rewrites that let a runtime fuse the quantized model; a target lists the ones it runs, in order.

- ``MatMul(A, W) + b`` with a constant 2-D ``W``, a constant bias of one
  value per output and a 2-D ``A`` becomes ``Gemm(A, W, b)``. ONNX
  Runtime makes this Gemm itself before its QDQ fusions, and a Gemm with a
  float bias between quantized inputs matches none of them; as a Gemm
  here, the bias is stored as int32 and the whole runs as QGemm. Where
  onnx's shape inference leaves ``A``'s rank open (an exporter's
  ``Reshape`` to a shape computed from ``Shape``, as paddle2onnx writes
  them), ONNX Runtime's basic optimizations of the float model decide: the
  MatMul becomes a Gemm here where it becomes one there. Where ``A`` has a
  fixed shape of rank 3 or more (a transformer exported at a fixed batch
  and sequence length), ONNX Runtime's fusion puts the Gemm between two
  Reshapes; so does this pass, and the Gemm takes its int32 bias. Where
  ``A``'s leading dimensions are open (a dynamic batch or sequence
  length) and the activations are quantized, the same, with the leading
  dimensions read at run time: ONNX Runtime leaves that MatMul a MatMul,
  which ran as MatMulIntegerToFloat with the bias a float Add over the
  whole output.
- For weight-only quantization, ``Gemm(A, B, transB=1)`` with a constant
  ``B`` stores ``B`` transposed with ``transB=0``: only then does a
  DequantizeLinear on ``B`` fuse into MatMulNBits.

- ``BatchNormalization`` (inference) right after a ``Conv`` or ``Gemm``
  with a constant weight is folded into it: ``W * k`` per output channel and
  ``(b - mean) * k + B`` with ``k = scale / sqrt(var + epsilon)``. ONNX
  Runtime folds it the same way when it loads the float model, but not
  once a QuantizeLinear sits between the two: unfolded, each such layer
  would quantize the Conv's output, dequantize it for the normalization
  and quantize again, and the Relu after it would not fold into
  QLinearConv.

- An ``Identity`` goes, its readers reading its input (paddle2onnx puts
  one between a Conv and its Relu or gate). ONNX Runtime drops it too, but
  only after the Q/DQ are placed: the Relu would not fold into QLinearConv
  and the gate would not see the Conv's quantized output.
- A ``Reshape``, ``Squeeze`` or ``Unsqueeze`` of constants (paddle2onnx
  writes each bias added after a Conv as ``Reshape(Constant, Constant)``)
  becomes the constant it computes, so the rewrites below see it.
- Constant scales and shifts after a Conv (a bias written as ``Add``) and
  before one are folded into it: :mod:`._affine_folds`.

The MatMul rewrites keep node names (the Gemm takes the MatMul's name)
and the values the model computes: the products and sums are the same
float operations. The folds compute the new weights and biases in float64 and round them
once to float32, so the model's values move by float32 rounding, as ONNX
Runtime's own folds move them.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qlinear.quantize._gemm_reshapes import gemm_between_open_reshapes, gemm_between_reshapes
from qlinear.quantize._model import FloatModel, attribute, reserve_name
from qlinear.quantize._session import optimized_graph

__all__ = [
    "drop_identities", "fold_batch_norms", "fold_constant_reshapes", "matmul_add_to_gemm", "normalization", "output_channels",
    "remove_nodes", "scale_output_channels", "set_attribute", "store_bias", "untranspose_gemm_weights",
]  # fmt: skip


def matmul_add_to_gemm(fm: FloatModel, *, integer_activations: bool = True) -> bool:
    g = fm.graph
    # An input of open leading dimensions -> its rows (one Reshape, one Q for all its Gemms) and its leading dimensions.
    leading: dict[str, tuple[str, str]] = {}
    outputs = set(fm.output_names)
    replace: dict[str, list[onnx.NodeProto]] = {}
    drop: set[str] = set()
    open_rank: list[tuple[onnx.NodeProto, onnx.NodeProto, onnx.NodeProto]] = []  # A's rank unknown: ask ONNX Runtime
    taken = {t.name for t in g.initializer} | {x for n in g.node for x in (*n.input, *n.output, n.name)}
    for node in g.node:
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
            continue
        a, w = node.input
        users = fm.consumers.get(node.output[0], [])
        if w not in fm.initializers or len(fm.shapes.get(w, ())) != 2:
            continue
        a_shape = fm.shapes.get(a)
        static = a_shape is not None and len(a_shape) > 2 and all(isinstance(d, int) and d > 0 for d in a_shape)
        # Rank 3 or more with open leading dimensions (a batch, a sequence length) and a fixed last one.
        open_leading = (
            integer_activations and a_shape is not None and len(a_shape) > 2 and not static
            and isinstance(a_shape[-1], int) and a_shape[-1] > 0
        )  # fmt: skip
        if a_shape is not None and len(a_shape) != 2 and not static and not open_leading:
            continue
        if len(users) != 1 or users[0].op_type != "Add" or node.output[0] in outputs:
            continue
        add = users[0]
        bias = add.input[1] if add.input[0] == node.output[0] else add.input[0]
        n = fm.shapes[w][1]
        if bias not in fm.initializers or fm.shapes.get(bias) != (n,) or not fm.is_float(bias):
            continue
        if static:
            replace[node.name] = gemm_between_reshapes(g, node, add, bias, a_shape, n, taken)
            drop.add(add.name)
            continue
        if open_leading:
            k = fm.shapes[w][0]
            replace[node.name] = gemm_between_open_reshapes(g, node, add, bias, (k, n), fm.opset, taken, leading)
            drop.add(add.name)
            continue
        gemm = helper.make_node("Gemm", [a, w, bias], [add.output[0]], name=node.name)
        if a_shape is not None:
            replace[node.name] = [gemm]
            drop.add(add.name)
        else:
            open_rank.append((node, add, gemm))
    if open_rank:
        made = _gemm_outputs_onnx_runtime_makes(fm)
        for node, add, gemm in open_rank:
            if add.output[0] in made:
                replace[node.name] = [gemm]
                drop.add(add.name)
    if not replace:
        return False
    nodes = [m for n in g.node if n.name not in drop for m in replace.get(n.name, [n])]
    del g.node[:]
    g.node.extend(nodes)
    return True


def _gemm_outputs_onnx_runtime_makes(fm: FloatModel) -> set[str]:
    """The outputs of the Gemm nodes in ONNX Runtime's basic optimization of the float model (none if it cannot load it)."""
    optimized = optimized_graph(fm.model, basic=True)
    if optimized is None:  # the calibration says why, with the model's own error
        return set()
    return {n.output[0] for n in optimized.graph.node if n.op_type == "Gemm" and n.domain in ("", "ai.onnx")}


def untranspose_gemm_weights(fm: FloatModel) -> bool:
    changed = False
    for node in fm.graph.node:
        if node.op_type != "Gemm" or attribute(node, "transB", 0) != 1 or attribute(node, "transA", 0) != 0:
            continue
        b = node.input[1]
        if b not in fm.initializers or len(fm.consumers.get(b, [])) != 1 or len(fm.shapes.get(b, ())) != 2:
            continue
        fm.set_constant(b, np.ascontiguousarray(fm.constant(b).T))
        set_attribute(node, "transB", 0)
        changed = True
    return changed


def output_channels(layer: onnx.NodeProto, weight: np.ndarray) -> int:
    """The output channels of a Conv, ConvTranspose or Gemm with weight ``weight``."""
    if layer.op_type == "ConvTranspose":  # [C_in, C_out / group, ...]
        return weight.shape[1] * int(attribute(layer, "group", 1))
    return weight.shape[0 if layer.op_type == "Conv" or attribute(layer, "transB", 0) else 1]


def scale_output_channels(layer: onnx.NodeProto, weight: np.ndarray, k: np.ndarray) -> np.ndarray:
    """``weight`` (float64) times ``k``, one factor an output channel of ``layer`` (a Conv, ConvTranspose or Gemm).

    The output-channel axis: a Conv's first; a Gemm's columns of B, or its
    rows where transB; a ConvTranspose's second, within each group (group
    g's rows of input channels write output channels ``g * C_out / group``
    onwards).
    """
    w = weight.astype(np.float64)
    if layer.op_type == "ConvTranspose":
        groups = int(attribute(layer, "group", 1))
        per_group = w.reshape(groups, w.shape[0] // groups, *w.shape[1:])
        return (per_group * k.reshape(groups, 1, -1, *[1] * (w.ndim - 2))).reshape(w.shape)
    shape = [1] * w.ndim
    shape[0 if layer.op_type == "Conv" or attribute(layer, "transB", 0) else 1] = k.size
    return w * k.reshape(shape)


def normalization(fm: FloatModel, bn: onnx.NodeProto, channels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(k, mean, shift)`` (float64, one a channel) of an inference BatchNormalization of constants, else None.

    It computes ``(x - mean) * k + shift`` with ``k = scale / sqrt(var + epsilon)``.
    """
    if bn.op_type != "BatchNormalization" or bn.domain not in ("", "ai.onnx") or attribute(bn, "training_mode", 0):
        return None
    if len(bn.input) != 5 or len([o for o in bn.output if o]) != 1:
        return None
    params = [fm.constant(n) for n in bn.input[1:]]
    if any(p is None or p.shape != (channels,) for p in params):
        return None
    scale, shift, mean, var = (p.astype(np.float64) for p in params)
    k = scale / np.sqrt(var + attribute(bn, "epsilon", 1e-5))
    return (k, mean, shift) if np.all(np.isfinite(k)) else None


def fold_batch_norms(fm: FloatModel) -> bool:
    """Fold each inference BatchNormalization into the Conv, ConvTranspose or Gemm before it, where that node's output and
    weights are its alone.

    ONNX Runtime folds one after a Conv when it loads the float model, not one
    after a ConvTranspose (a text detector's upsampling head), which it then
    runs as its own pass in the float model and in the quantized one.
    """
    g = fm.graph
    outputs = set(fm.output_names)
    folded: set[str] = set()
    for bn in g.node:
        if bn.op_type != "BatchNormalization" or bn.domain not in ("", "ai.onnx"):
            continue
        x = bn.input[0]
        layer = fm.producer.get(x)
        if layer is None or layer.op_type not in ("Conv", "ConvTranspose", "Gemm") or layer.domain not in ("", "ai.onnx"):
            continue
        if x in outputs or len(fm.consumers.get(x, [])) != 1:
            continue
        w = layer.input[1]
        bias = layer.input[2] if len(layer.input) > 2 and layer.input[2] else None
        weight = fm.constant(w)
        if weight is None or fm.elem_types.get(w) != TensorProto.FLOAT:
            continue
        old_bias = None if bias is None else fm.constant(bias)
        if len(fm.consumers.get(w, [])) != 1 or (bias is not None and (old_bias is None or len(fm.consumers[bias]) != 1)):
            continue
        channels = output_channels(layer, weight)
        found = normalization(fm, bn, channels)
        if found is None:
            continue
        k, mean, shift = found
        old_bias = np.zeros(channels) if old_bias is None else old_bias.astype(np.float64)
        if layer.op_type == "Gemm":
            # Y = alpha A B + beta C: C must be one value per column to fold into; beta goes into it.
            if old_bias.size not in (1, channels) or old_bias.shape not in ((), (1,), (channels,), (1, channels)):
                continue
            old_bias = np.broadcast_to(old_bias.reshape(-1), (channels,)) * attribute(layer, "beta", 1.0)
            set_attribute(layer, "beta", 1.0)
        fm.set_constant(w, scale_output_channels(layer, weight, k).astype(np.float32))
        store_bias(fm, layer, bias, ((old_bias - mean) * k + shift).astype(np.float32))
        layer.output[0] = bn.output[0]
        folded.add(bn.name)
    return remove_nodes(fm, folded)


def drop_identities(fm: FloatModel) -> bool:
    """Remove each Identity whose output no graph output or subgraph names, its readers reading its input instead."""
    g = fm.graph
    kept_names = set(fm.output_names) | fm.read_in_subgraphs
    renamed: dict[str, str] = {}
    dropped: set[str] = set()
    for node in g.node:
        if node.op_type == "Identity" and node.domain in ("", "ai.onnx") and node.output[0] not in kept_names:
            renamed[node.output[0]] = node.input[0]
            dropped.add(node.name)
    for node in g.node:
        for k, name in enumerate(node.input):
            while name in renamed:  # an Identity of an Identity
                name = renamed[name]
            node.input[k] = name
    return remove_nodes(fm, dropped)


# Constants a reshape is folded into at most (elements): bias vectors and small tables; a weight reshaped at
# load would be held a second time beside the store it is mapped from.
_FOLDED_ELEMENTS = 1 << 20


def fold_constant_reshapes(fm: FloatModel) -> bool:
    """Replace each Reshape, Squeeze or Unsqueeze whose inputs are all constants with the constant it computes."""
    g = fm.graph
    outputs = set(fm.output_names)
    folded: set[str] = set()
    for node in g.node:
        if node.op_type not in ("Reshape", "Squeeze", "Unsqueeze") or node.domain not in ("", "ai.onnx"):
            continue
        inputs = [i for i in node.input if i]
        if not inputs or any(i not in fm.initializers for i in inputs) or node.output[0] in outputs:
            continue
        data = fm.constant(inputs[0])
        if data.size > _FOLDED_ELEMENTS:
            continue
        value = _reshaped(node, data, fm.constant(inputs[1]) if len(inputs) > 1 else None)
        if value is None:
            continue
        g.initializer.append(numpy_helper.from_array(value, node.output[0]))
        fm.initializers[node.output[0]] = g.initializer[-1]
        folded.add(node.name)
    return remove_nodes(fm, folded)


def _reshaped(node: onnx.NodeProto, data: np.ndarray, second: np.ndarray | None) -> np.ndarray | None:
    """What ``node`` (Reshape, Squeeze, Unsqueeze) computes from constant ``data``; None where it would fail."""
    try:
        if node.op_type == "Reshape":
            target = second if second is not None else attribute(node, "shape")  # an attribute in opset 1
            if target is None:
                return None
            shape = [int(d) for d in np.reshape(target, -1)]
            if not attribute(node, "allowzero", 0):  # a 0 copies the input's dimension
                shape = [data.shape[k] if d == 0 and k < data.ndim else d for k, d in enumerate(shape)]
            return data.reshape(shape)
        axes = second if second is not None else attribute(node, "axes")  # an input from opset 13, an attribute before
        if node.op_type == "Squeeze":
            return np.squeeze(data) if axes is None else np.squeeze(data, tuple(int(a) for a in np.reshape(axes, -1)))
        if axes is None:
            return None
        return np.expand_dims(data, tuple(int(a) for a in np.reshape(axes, -1)))
    except (ValueError, IndexError):  # numpy's AxisError is both
        return None  # the model is wrong here; ONNX Runtime says so when it runs it


def store_bias(fm: FloatModel, layer: onnx.NodeProto, bias: str | None, value: np.ndarray) -> None:
    """Give ``layer`` the bias ``value``: into ``bias``, its own initializer (which may take the per-channel shape), or a new one.

    A new one goes in as input 2, also where the layer holds an empty name there (an omitted optional input).
    """
    if bias is not None:
        fm.set_constant(bias, value)
        return
    bias = reserve_name(f"{layer.name}_bias", {*fm.initializers, *fm.producer, *fm.consumers})
    fm.graph.initializer.append(numpy_helper.from_array(value, bias))
    fm.initializers[bias] = fm.graph.initializer[-1]
    if len(layer.input) > 2:
        layer.input[2] = bias
    else:
        layer.input.append(bias)


def remove_nodes(fm: FloatModel, names: set[str]) -> bool:
    """Remove the nodes named ``names`` from ``fm``'s graph, folded into others (``fm.folded`` keeps their names); whether there were any."""
    if not names:
        return False
    kept = [n for n in fm.graph.node if n.name not in names]
    del fm.graph.node[:]
    fm.graph.node.extend(kept)
    fm.folded |= names
    return True


def set_attribute(node: onnx.NodeProto, name: str, value: int | float) -> None:
    """Give ``node`` attribute ``name`` = ``value`` (its type from the value's), replacing any it has."""
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute(name, value)])
