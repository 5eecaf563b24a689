"""Constant scales and shifts folded into the convolutions beside them, so that nothing float sits between integer kernels.

An exporter may write a per-channel affine map as element-wise ops around
a convolution: a bias as ``Add`` after it, PP-OCRv4's learnable affine
blocks (a ``Mul`` and an ``Add`` by scalars) after each convolution and
after each activation. ONNX Runtime folds the ones after a Conv into it
when it loads the float model, but not once a QuantizeLinear sits between
the two: left apart, each runs in float between a DequantizeLinear and a
QuantizeLinear, and the gate or the convolution after it no longer reads
a quantized tensor. PP-OCRv4's text detector at a batch of 16 spent more
time in those float passes and their Q/DQ than in all its QLinearConvs.

- **After a Conv or a ConvTranspose** (:func:`fold_conv_affines`): a chain
  of ``Mul``, ``Add``, ``Sub`` and ``Div`` by constants of one value per
  output channel (or one value), and inference BatchNormalizations,
  becomes the layer's weights and bias: ``Conv(x, W, b) * a + c`` is
  ``Conv(x, W * a, b * a + c)``. ONNX Runtime folds none after a
  ConvTranspose (paddle2onnx writes its bias as an ``Add``, then a
  BatchNormalization: PP-OCRv4's detector head ran both in float).
- **Before a Conv** (:func:`fold_affines_into_convs`): ``Conv(h * a + c)``
  is ``Conv'(h)`` with each input channel's filters times ``a`` and ``c``
  times their sums added to the bias. Where the Conv pads and ``c`` is not
  0, its zeros would stand for ``-c / a`` before the map: the Conv stops
  padding and a constant ``Pad`` of ``h`` by ``-c / a`` goes in front of it
  (one value for every channel, as PP-OCRv4's scalars are; otherwise no
  fold). The planner passes quantized tensors through a Pad, and the ONNX
  Runtime target pads the codes (:mod:`._padded_codes`), so the gate
  before such a Conv stays on integer kernels too.

The folds compute in float64 and round once to float32, so the model's
values move by float32 rounding, as ONNX Runtime's own folds move them.
A fold needs each tensor on the way read by the next op alone, and the
Conv's bias read by it alone; its weights too, but for a chain of shifts
alone after it (those go into the bias). The cost in accuracy: a
depthwise Conv's input after such a map is the activation itself, which
depthwise equalization cannot scale, where it scaled the map's constants.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qlinear.quantize._model import FloatModel, attribute, reserve_name
from qlinear.quantize._prepare import (
    normalization,
    output_channels,
    remove_nodes,
    scale_output_channels,
    set_attribute,
    store_bias,
)

__all__ = ["fold_affines_into_convs", "fold_conv_affines"]

# Element-wise ops that map a tensor affinely by a constant; Sub and Div only with the constant second.
_AFFINE_OPS = frozenset({"Mul", "Div", "Add", "Sub"})


def fold_conv_affines(fm: FloatModel) -> bool:
    """Fold each chain of constant per-output-channel scales and shifts after a Conv into its weights and bias."""
    outputs = set(fm.output_names)
    folded: set[str] = set()
    for conv in fm.graph.node:
        parts = _conv_parts(fm, conv, ("Conv", "ConvTranspose"))
        if parts is None:
            continue
        weight, bias = parts
        channels = output_channels(conv, weight)
        shared = len(fm.consumers.get(conv.input[1], [])) != 1  # its weights cannot scale; a shift goes into the bias
        scale, shift = np.ones(channels), np.zeros(channels)
        chain, x = [], conv.output[0]
        while x not in outputs and x not in fm.read_in_subgraphs and len(fm.consumers.get(x, [])) == 1:
            op = fm.consumers[x][0]
            found = normalization(fm, op, channels)
            if found is not None and not shared:  # an inference BatchNormalization: (x - mean) * k + its shift
                k, mean, offset = found
                scale, shift = scale * k, (shift - mean) * k + offset
                chain.append(op)
                x = op.output[0]
                continue
            value = _channel_constant(fm, op, x, channels, weight.ndim)
            if value is None or (shared and op.op_type in ("Mul", "Div")):
                break
            if op.op_type in ("Mul", "Div"):
                factor = value if op.op_type == "Mul" else 1.0 / value
                scale, shift = scale * factor, shift * factor
            else:
                shift = shift + (value if op.op_type == "Add" else -value)
            chain.append(op)
            x = op.output[0]
        if not chain:
            continue
        if np.any(scale != 1.0):  # a bias-only chain leaves the weights' bytes as they were
            fm.set_constant(conv.input[1], scale_output_channels(conv, weight, scale).astype(np.float32))
        old = np.zeros(channels) if bias is None else fm.constant(bias).astype(np.float64)
        store_bias(fm, conv, bias, (old * scale + shift).astype(np.float32))
        conv.output[0] = x
        folded.update(op.name for op in chain)
    return remove_nodes(fm, folded)


def fold_affines_into_convs(fm: FloatModel) -> bool:
    """Fold each chain of constant per-input-channel scales and shifts before a Conv into the Conv (see the module's text)."""
    outputs = set(fm.output_names)
    folded: set[str] = set()
    pads: dict[str, onnx.NodeProto] = {}  # Conv name -> the Pad to put in front of it
    taken = {n.name for n in fm.graph.node} | set(fm.producer) | set(fm.consumers) | set(fm.initializers)
    for conv in fm.graph.node:
        parts = _conv_parts(fm, conv)
        if parts is None or len(fm.consumers.get(conv.input[1], [])) != 1:
            continue
        weight, bias = parts
        group = int(attribute(conv, "group", 1))
        inputs = weight.shape[1] * group
        # The Conv reads ``h * scale + shift`` where ``h`` is the tensor before the chain.
        scale, shift = np.ones(inputs), np.zeros(inputs)
        chain, x = [], conv.input[0]
        while x not in outputs and x not in fm.read_in_subgraphs and len(fm.consumers.get(x, [])) == 1:
            op = fm.producer.get(x)
            if op is None or op.op_type not in _AFFINE_OPS:
                break
            before = next((i for i in op.input if i and i not in fm.initializers), None)
            value = None if before is None else _channel_constant(fm, op, before, inputs, weight.ndim)
            if value is None:
                break
            if op.op_type in ("Mul", "Div"):
                scale = scale * (value if op.op_type == "Mul" else 1.0 / value)
            else:
                shift = shift + scale * (value if op.op_type == "Add" else -value)
            chain.append(op)
            x = before
        if not chain or np.any(scale == 0):
            continue
        padding = _padding(conv, weight.ndim - 2)
        if padding is None or (any(padding) and np.any(shift != 0)):
            # Zeros padded after the map are ``-shift / scale`` before it: one value for every channel, or no fold.
            fill = -shift / scale
            if padding is None or fm.opset < 11 or np.any(fill != fill[0]):
                continue
            pads[conv.name] = _pad(x, padding, float(fill[0]), conv.name, taken, fm)
            x = pads[conv.name].output[0]
            set_attribute(conv, "pads", [0] * len(padding))
        # Output channel o of group g reads input channels g * per_group ... (g + 1) * per_group - 1.
        per_group = weight.shape[1]
        rows = (np.arange(weight.shape[0]) // (weight.shape[0] // group))[:, None] * per_group + np.arange(per_group)
        w = weight.astype(np.float64)
        sums = w.reshape(w.shape[0], per_group, -1).sum(axis=2)
        old = np.zeros(weight.shape[0]) if bias is None else fm.constant(bias).astype(np.float64)
        new_bias = old + (sums * shift[rows]).sum(axis=1)
        fm.set_constant(conv.input[1], (w * scale[rows].reshape(rows.shape + (1,) * (weight.ndim - 2))).astype(np.float32))
        store_bias(fm, conv, bias, new_bias.astype(np.float32))
        conv.input[0] = x
        folded.update(op.name for op in chain)
    if pads:
        nodes = [m for n in fm.graph.node for m in ((pads[n.name], n) if n.name in pads else (n,))]
        del fm.graph.node[:]
        fm.graph.node.extend(nodes)
    return remove_nodes(fm, folded) or bool(pads)


def _conv_parts(fm: FloatModel, conv: onnx.NodeProto, ops: tuple[str, ...] = ("Conv",)) -> tuple[np.ndarray, str | None] | None:
    """An ``ops`` node's float constant weight and the name of its bias, a constant it reads alone (or None); else None."""
    if conv.op_type not in ops or conv.domain not in ("", "ai.onnx") or len(conv.input) < 2:
        return None
    w = conv.input[1]
    weight = fm.constant(w)
    if weight is None or fm.elem_types.get(w) != TensorProto.FLOAT or weight.ndim < 3:
        return None
    bias = conv.input[2] if len(conv.input) > 2 and conv.input[2] else None
    if bias is not None and (fm.constant(bias) is None or len(fm.consumers.get(bias, [])) != 1):
        return None
    return weight, bias


def _channel_constant(fm: FloatModel, op: onnx.NodeProto, x: str, channels: int, rank: int) -> np.ndarray | None:
    """``op``'s constant operand as one float64 value per channel (axis 1 of a rank-``rank`` ``x``), or None.

    None where ``op`` is no Mul/Div/Add/Sub of ``x`` by a float constant
    (Sub and Div: the constant second), where the constant would broadcast
    ``x`` to another shape, or where a divisor is zero or not finite.
    """
    if op.op_type not in _AFFINE_OPS or op.domain not in ("", "ai.onnx") or len(op.input) != 2 or x not in op.input:
        return None
    other = op.input[1] if op.input[0] == x else op.input[0]
    if other == x or (op.op_type in ("Sub", "Div") and op.input[1] != other):
        return None
    value = fm.constant(other)
    if value is None or fm.elem_types.get(other) != TensorProto.FLOAT or value.ndim > rank:
        return None
    # Broadcast against (N, C, spatial...): one value, or one a channel on axis 1 and ones elsewhere.
    shape = (1,) * (rank - value.ndim) + value.shape
    if shape[0] != 1 or any(d != 1 for d in shape[2:]) or shape[1] not in (1, channels):
        return None
    per_channel = np.broadcast_to(value.astype(np.float64).reshape(-1), (channels,))
    if not np.all(np.isfinite(per_channel)) or (op.op_type == "Div" and np.any(per_channel == 0)):
        return None
    return per_channel


def _padding(conv: onnx.NodeProto, axes: int) -> list[int] | None:
    """The explicit pads of a Conv over ``axes`` spatial axes (zeros where it pads nothing); None where ``auto_pad`` computes them."""
    auto_pad = attribute(conv, "auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad == "VALID":
        return [0] * (2 * axes)
    if auto_pad != "NOTSET":
        return None
    return [int(p) for p in attribute(conv, "pads", [0] * (2 * axes))]


def _pad(x: str, padding: list[int], fill: float, conv: str, taken: set[str], fm: FloatModel) -> onnx.NodeProto:
    """A constant Pad of ``x`` by a Conv's ``padding`` (begins then ends of its spatial axes) with ``fill``."""
    spatial = len(padding) // 2
    pads = [0, 0, *padding[:spatial], 0, 0, *padding[spatial:]]
    names = [reserve_name(f"{conv}_{part}", taken) for part in ("pads", "fill", "padded", "pad")]
    for name, value in ((names[0], np.array(pads, np.int64)), (names[1], np.array(fill, np.float32))):
        fm.graph.initializer.append(numpy_helper.from_array(value, name))
    return helper.make_node("Pad", [x, names[0], names[1]], [names[2]], name=names[3], mode="constant")
