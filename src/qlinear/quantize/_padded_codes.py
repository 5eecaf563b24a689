"""Constant Pads of quantized tensors done on the codes, so that ONNX Runtime runs them on 8-bit values.

The planner passes a quantized tensor's parameters through a Pad, as
through any data movement, and the convert pass writes
``DequantizeLinear -> Pad -> QuantizeLinear`` with one scale and zero
point either side. ONNX Runtime drops no such pair around a Pad: it
dequantizes the whole tensor, pads it in float and quantizes it again.
This pass, a rewrite of the finished QDQ model, pads the codes instead,
with the code the QuantizeLinear gives the pad value (computed by
:func:`qlinear.quantize_linear`, ONNX's own rounding and saturation). The
values are the same bit for bit: every other code comes back from its
dequantization unchanged, and the padded ones are that code.

Pads of other modes (``reflect``, ``edge``) copy codes as they are, and are
rewritten too. Left as they are: a Pad whose pads or value are computed,
and a pair with different parameters either side.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

import qlinear
from qlinear.onnx._graph import names_read, producers, readers
from qlinear.quantize._model import attribute, reserve_name

__all__ = ["pad_codes"]

# The codes ONNX Runtime's CPU Pad takes.
_PADDED_CODES = (np.dtype(np.uint8), np.dtype(np.int8))


def pad_codes(model: onnx.ModelProto) -> list[str]:
    """Rewrite each ``DequantizeLinear -> Pad -> QuantizeLinear`` of one scale and zero point as a Pad of the codes; their names."""
    g = model.graph
    if not any(n.op_type == "Pad" for n in g.node):
        return []
    inits = {t.name: t for t in g.initializer}
    made, read = producers(g), readers(g)
    taken = set(inits) | {n for node in g.node for n in (*node.input, *node.output, node.name)}
    graph_outputs = {o.name for o in g.output}
    replaced: dict[str, onnx.NodeProto] = {}  # the QuantizeLinear's name -> the Pad of codes taking its place
    dropped: set[str] = set()
    for pad in g.node:
        if pad.op_type != "Pad" or pad.domain not in ("", "ai.onnx") or len(pad.input) < 2:
            continue
        dq, after = made.get(pad.input[0]), read.get(pad.output[0], [])
        if dq is None or dq.op_type != "DequantizeLinear" or len(after) != 1 or after[0].op_type != "QuantizeLinear":
            continue
        q = after[0]
        params = _same_per_tensor_params(dq, q, inits)
        if params is None or any(i and i not in inits for i in pad.input[1:]):
            continue
        scale, zero_point = params
        # The codes, the pads, the pad value's code (constant mode; none for the others) and the axes (opset 18).
        inputs = [dq.input[0], pad.input[1], "", *pad.input[3:]]
        mode = attribute(pad, "mode", b"constant")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if mode == "constant":
            value = numpy_helper.to_array(inits[pad.input[2]]) if len(pad.input) > 2 and pad.input[2] else np.float32(0)
            code = qlinear.quantize_linear(np.asarray(value, scale.dtype).reshape(()), scale, zero_point)
            inputs[2] = reserve_name(f"{pad.name}_code", taken)
            g.initializer.append(numpy_helper.from_array(np.asarray(code, zero_point.dtype).reshape(()), inputs[2]))
        while not inputs[-1]:  # no empty optional input at the end
            inputs.pop()
        replaced[q.name] = helper.make_node(
            "Pad", inputs, [q.output[0]], name=reserve_name(f"{pad.name}_codes", taken), mode=mode
        )
        dropped.add(pad.name)
        if len(read.get(dq.output[0], [])) == 1 and dq.output[0] not in graph_outputs:
            dropped.add(dq.name)
    if not replaced:
        return []
    nodes = [replaced.get(n.name, n) for n in g.node if n.name not in dropped]
    del g.node[:]
    g.node.extend(nodes)
    used = names_read(g)
    kept = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(kept)
    return [n.name for n in replaced.values()]


def _same_per_tensor_params(dq: onnx.NodeProto, q: onnx.NodeProto, inits: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """The one scale and zero point ``dq`` reads and ``q`` writes, where they are the same constants; else None."""
    if len(dq.input) < 3 or len(q.input) < 3 or attribute(dq, "axis", 1) != attribute(q, "axis", 1):
        return None
    arrays = []
    for node in (dq, q):
        if any(name not in inits for name in node.input[1:3]):
            return None
        arrays.append(tuple(numpy_helper.to_array(inits[name]) for name in node.input[1:3]))
    (s1, z1), (s2, z2) = arrays
    if s1.size != 1 or z1.size != 1 or z1.dtype not in _PADDED_CODES or (s1.dtype, z1.dtype) != (s2.dtype, z2.dtype):
        return None
    if s1.reshape(()) != s2.reshape(()) or z1.reshape(()) != z2.reshape(()):
        return None
    return s1.reshape(()), z1.reshape(())
