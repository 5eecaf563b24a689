"""A QDQ ONNX model as a torch module whose quantization scales (and, on request, weights) train.

The quantizer's output is read back node by node: each QuantizeLinear and
DequantizeLinear runs as qlinear.torch's operator (exact forward numerics,
straight-through and LSQ gradients), every scale they read is one learnable
parameter (shared where the model shares it), and every other node runs as
the torch operation ONNX defines it as. A weight stored as codes behind a
DequantizeLinear trains as a latent float weight fake-quantized by that
DequantizeLinear's parameters; an int32 bias (whose scale is the product of
its layer's input and weight scales) runs as its float value and is
quantized again when the model is written back. What encodes a fixed
function stays as written: a QuantizeLinear whose codes a DequantizeLinear
reads with another scale (a gate's clip and division, see
``qlinear.quantize._integer_gates``) keeps both scales, and a constant
stored as one code (a gate's shift) is its value.

Operators outside :data:`OPERATORS` raise :class:`UnsupportedOperator`: the
caller keeps the model it has.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from qlinear._errors import QuantizationError
from qlinear.dtypes import element_type
from qlinear.torch._functional import dequantize_linear, fake_quantize, quantize_linear

__all__ = ["OPERATORS", "QDQModule", "UnsupportedOperator"]


class UnsupportedOperator(QuantizationError):
    """A node this module cannot run in torch (its op type named)."""


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _axes(node: onnx.NodeProto, args: list, a: dict) -> list[int] | None:
    if len(args) > 1 and args[1] is not None:
        return [int(v) for v in args[1].reshape(-1).tolist()]
    return a.get("axes")


def _reduce_mean(node, args, a):
    axes = _axes(node, args, a)
    keep = bool(a.get("keepdims", 1))
    return args[0].mean() if axes is None else args[0].mean(dim=tuple(axes), keepdim=keep)


def _conv(node, args, a):
    x, w, b = args[0], args[1], args[2] if len(args) > 2 else None
    dims = w.dim() - 2
    pads = a.get("pads", [0] * 2 * dims)
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") or pads[:dims] != pads[dims:]:
        raise UnsupportedOperator(f"finetune: Conv {node.name!r} with asymmetric or automatic padding")
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[dims]
    return conv(x, w, b, a.get("strides", 1), pads[:dims], a.get("dilations", 1), a.get("group", 1))


def _pool(kind: str) -> Callable:
    def run(node, args, a):
        k = a["kernel_shape"]
        pads = a.get("pads", [0] * 2 * len(k))
        if pads[: len(k)] != pads[len(k) :] or a.get("ceil_mode", 0):
            raise UnsupportedOperator(f"finetune: {node.op_type} {node.name!r} with asymmetric padding or ceil_mode")
        fn = {("max", 1): F.max_pool1d, ("max", 2): F.max_pool2d, ("avg", 1): F.avg_pool1d, ("avg", 2): F.avg_pool2d}[
            (kind, len(k))
        ]
        return fn(args[0], k, a.get("strides", k), pads[: len(k)])

    return run


def _gemm(node, args, a):
    x, w = args[0], args[1]
    x = x.t() if a.get("transA", 0) else x
    w = w.t() if a.get("transB", 0) else w
    y = a.get("alpha", 1.0) * (x @ w)
    return y + a.get("beta", 1.0) * args[2] if len(args) > 2 and args[2] is not None else y


def _reshape(node, args, a):
    shape = [int(v) for v in args[1].tolist()]
    shape = [args[0].shape[i] if s == 0 and not a.get("allowzero", 0) else s for i, s in enumerate(shape)]
    return args[0].reshape(shape)


def _shape(node, args, a):
    """Shape: the dimensions from ``start`` to ``end`` (attributes from opset 15), as int64."""
    dims = list(args[0].shape)
    return torch.tensor(dims[a.get("start", 0) : a.get("end", len(dims))], dtype=torch.int64)


def _slice(node, args, a):
    """Slice: starts, ends, axes and steps as inputs (opset 10 on) or attributes (before); any step, clamped as numpy clamps."""
    x = args[0]
    if len(args) > 1:
        starts, ends = args[1].tolist(), args[2].tolist()
        axes = args[3].tolist() if len(args) > 3 and args[3] is not None else list(range(len(starts)))
        steps = args[4].tolist() if len(args) > 4 and args[4] is not None else [1] * len(starts)
    else:
        starts, ends = a["starts"], a["ends"]
        axes, steps = a.get("axes", list(range(len(starts)))), [1] * len(starts)
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        picked = range(x.shape[axis])[slice(start, end, step)]
        x = torch.index_select(x, axis, torch.tensor(list(picked), dtype=torch.int64, device=x.device))
    return x


def _cast(node, args, a):
    dtype = torch.from_numpy(np.empty(0, onnx.helper.tensor_dtype_to_np_dtype(a["to"]))).dtype
    return args[0].to(dtype)


def _clip(node, args, a):
    """Clip: bounds as inputs (opset 11 on, either may be left out) or as attributes (before)."""
    low = args[1] if len(args) > 1 and args[1] is not None else a.get("min")
    high = args[2] if len(args) > 2 and args[2] is not None else a.get("max")
    return torch.clamp(args[0], low, high)


def _hard_sigmoid(x: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """ONNX HardSigmoid: ``max(0, min(1, alpha x + beta))``."""
    return torch.clamp(alpha * x + beta, 0.0, 1.0)


OPERATORS: dict[str, Callable[[onnx.NodeProto, list, dict], Any]] = {
    "Add": lambda n, x, a: x[0] + x[1],
    "Sub": lambda n, x, a: x[0] - x[1],
    "Mul": lambda n, x, a: x[0] * x[1],
    "Div": lambda n, x, a: x[0] / x[1],
    "Pow": lambda n, x, a: torch.pow(x[0], x[1]),
    "Sqrt": lambda n, x, a: torch.sqrt(x[0]),
    "Erf": lambda n, x, a: torch.erf(x[0]),
    "Tanh": lambda n, x, a: torch.tanh(x[0]),
    "Sigmoid": lambda n, x, a: torch.sigmoid(x[0]),
    "Relu": lambda n, x, a: torch.relu(x[0]),
    "Clip": _clip,
    "HardSigmoid": lambda n, x, a: _hard_sigmoid(x[0], a.get("alpha", 0.2), a.get("beta", 0.5)),
    "HardSwish": lambda n, x, a: x[0] * _hard_sigmoid(x[0], 1 / 6, 0.5),
    "Exp": lambda n, x, a: torch.exp(x[0]),
    "Neg": lambda n, x, a: -x[0],
    "Identity": lambda n, x, a: x[0],
    "Softmax": lambda n, x, a: torch.softmax(x[0], dim=a.get("axis", -1)),
    "MatMul": lambda n, x, a: x[0] @ x[1],
    "Gemm": _gemm,
    "Conv": _conv,
    "MaxPool": _pool("max"),
    "AveragePool": _pool("avg"),
    "GlobalAveragePool": lambda n, x, a: x[0].mean(dim=tuple(range(2, x[0].dim())), keepdim=True),
    "Flatten": lambda n, x, a: x[0].reshape(int(np.prod(x[0].shape[: a.get("axis", 1)])), -1),
    "ReduceMean": _reduce_mean,
    "Transpose": lambda n, x, a: x[0].permute(a["perm"]) if "perm" in a else x[0].permute(*reversed(range(x[0].dim()))),
    "Reshape": _reshape,
    "Gather": lambda n, x, a: torch.index_select(x[0], a.get("axis", 0), x[1].reshape(-1).long()).reshape(
        *x[0].shape[: a.get("axis", 0) % x[0].dim()], *x[1].shape, *x[0].shape[a.get("axis", 0) % x[0].dim() + 1 :]
    ),
    "Concat": lambda n, x, a: torch.cat(x, dim=a["axis"]),
    "Shape": _shape,
    "Slice": _slice,
    "Cast": _cast,
    "Unsqueeze": lambda n, x, a: x[0].reshape(_unsqueezed(tuple(x[0].shape), _axes(n, x, a))),
    "Squeeze": lambda n, x, a: x[0].squeeze(tuple(_axes(n, x, a))) if _axes(n, x, a) else x[0].squeeze(),
}


def _unsqueezed(shape: tuple[int, ...], axes: list[int]) -> list[int]:
    out = list(shape)
    rank = len(shape) + len(axes)
    for axis in sorted(a % rank for a in axes):
        out.insert(axis, 1)
    return out


def _type_name(enum: int) -> str:
    return element_type(helper.tensor_dtype_to_np_dtype(enum), what="finetune: quantized type").name


class QDQModule(nn.Module):
    """``model`` (a QDQ model) in torch: ``forward(feeds)`` returns its outputs as a list of tensors.

    Args:
        model: the QDQ model (QuantizeLinear/DequantizeLinear of the ai.onnx domain).
        float_weights: for a weight stored as codes (by the codes'
            initializer name), the float value to start its latent weight
            from; codes without one start from their dequantized value.
        train_weights: make latent weights parameters too (default: scales only).

    Raises:
        UnsupportedOperator: a node outside :data:`OPERATORS` and Q/DQ.
    """

    def __init__(self, model: onnx.ModelProto, float_weights: dict[str, np.ndarray], *, train_weights: bool = False) -> None:
        super().__init__()
        g = model.graph
        self.nodes = list(g.node)
        self.inputs = [i.name for i in g.input if i.name not in {t.name for t in g.initializer}]
        self.outputs = [o.name for o in g.output]
        unknown = sorted(
            {n.op_type for n in self.nodes if n.op_type not in OPERATORS and n.op_type not in _QDQ and n.op_type != "Constant"}
        )
        if unknown:
            raise UnsupportedOperator(f"finetune: no torch form for {', '.join(unknown)}")
        self.constants: dict[str, torch.Tensor] = {}
        for t in g.initializer:
            try:
                self.constants[t.name] = torch.from_numpy(np.array(numpy_helper.to_array(t)))
            except TypeError:  # 4-bit and float8 codes: read through their DequantizeLinear, never as tensors
                continue
        values = {t.name: t for t in g.initializer}
        self.scale_index: dict[str, int] = {}
        self.scales = nn.ParameterList()
        self.weight_index: dict[str, int] = {}  # DQ output -> index into self.weights
        self.weights = nn.ParameterList()
        self.weight_nodes: dict[str, onnx.NodeProto] = {}
        # DQ output of an int32 bias, or of a constant stored as one code -> its float value
        self.bias_values: dict[str, torch.Tensor] = {}
        self.fixed_scales = {  # the scales of a Q -> DQ pair whose scales differ: a function, not a rounding
            name: torch.from_numpy(np.array(numpy_helper.to_array(values[name]), np.float32))
            for name in _fixed_scales(self.nodes)
        }
        for node in self.nodes:
            if node.op_type not in _QDQ:
                continue
            x = node.input[0]
            eight_bit = x in values and values[x].data_type in (TensorProto.UINT8, TensorProto.INT8)
            one_code = eight_bit and int(np.prod(values[x].dims)) == 1
            if node.op_type == "DequantizeLinear" and x in values and (values[x].data_type == TensorProto.INT32 or one_code):
                codes, scale = numpy_helper.to_array(values[x]), numpy_helper.to_array(values[node.input[1]])
                zp = numpy_helper.to_array(values[node.input[2]]) if len(node.input) > 2 and node.input[2] else 0
                shape = (-1,) if scale.ndim else ()
                self.bias_values[node.output[0]] = torch.from_numpy(
                    np.asarray((codes.astype(np.float64) - zp) * scale.reshape(shape).astype(np.float64), np.float32)
                )
                continue
            s = node.input[1]
            if s not in self.scale_index and s not in self.fixed_scales:
                self.scale_index[s] = len(self.scales)
                self.scales.append(nn.Parameter(torch.from_numpy(np.array(numpy_helper.to_array(values[s]), np.float32))))
            if node.op_type == "DequantizeLinear" and x in values:
                start = float_weights.get(x)
                if start is None:
                    start = _dequantized(node, values)
                self.weight_index[node.output[0]] = len(self.weights)
                self.weight_nodes[node.output[0]] = node
                self.weights.append(nn.Parameter(torch.from_numpy(np.array(start, np.float32)), requires_grad=train_weights))
        self.values = values
        self._prepare()

    def scale(self, name: str) -> torch.Tensor:
        fixed = self.fixed_scales.get(name)
        return fixed if fixed is not None else self.scales[self.scale_index[name]]

    def _zero_point(self, node: onnx.NodeProto) -> tuple[torch.Tensor, str]:
        zp = node.input[2] if len(node.input) > 2 and node.input[2] else None
        if zp is None or zp not in self.values:
            raise UnsupportedOperator(
                f"finetune: {node.op_type} {node.name!r} has no constant zero point (its type is not written)"
            )
        t = self.values[zp]
        return torch.from_numpy(np.asarray(numpy_helper.to_array(t), np.float32)), _type_name(t.data_type)

    def _prepare(self) -> None:
        """What forward reads a step: each node's attributes, Constant values, Q/DQ zero points and types."""
        self.attrs = [_attrs(node) for node in self.nodes]
        self.qdq_params: dict[str, tuple[torch.Tensor, str, dict[str, int]]] = {}
        for node, a in zip(self.nodes, self.attrs, strict=True):
            if node.op_type == "Constant":
                self.constants[node.output[0]] = torch.from_numpy(np.array(numpy_helper.to_array(a["value"])))
            elif node.op_type in _QDQ and node.output[0] not in self.bias_values:
                zp, type_name = self._zero_point(node)
                self.qdq_params[node.output[0]] = (
                    zp,
                    type_name,
                    {"axis": a.get("axis", 1), "block_size": a.get("block_size", 0)},
                )

    def forward(self, feeds: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        env: dict[str, Any] = dict(self.constants)
        env.update(feeds)
        for node, a in zip(self.nodes, self.attrs, strict=True):
            out = node.output[0]
            if node.op_type == "Constant":
                continue
            if out in self.bias_values:
                env[out] = self.bias_values[out]
                continue
            if node.op_type in _QDQ:
                zp, type_name, kw = self.qdq_params[out]
                s = self.scale(node.input[1])
                if out in self.weight_index:
                    w = self.weights[self.weight_index[out]]
                    env[out] = fake_quantize(w, s, zp, output_dtype=type_name, **kw)
                elif node.op_type == "QuantizeLinear":
                    env[out] = quantize_linear(env[node.input[0]], s, zp, output_dtype=type_name, **kw)
                else:
                    env[out] = dequantize_linear(env[node.input[0]], s, zp, input_dtype=type_name, **kw)
                continue
            args = [env[i] if i else None for i in node.input]
            env[out] = OPERATORS[node.op_type](node, args, a)
        return [env[o] for o in self.outputs]


_QDQ = ("QuantizeLinear", "DequantizeLinear")


def _fixed_scales(nodes: list[onnx.NodeProto]) -> set[str]:
    """The scales of each QuantizeLinear -> DequantizeLinear pair that reads its codes with another scale."""
    quantized = {n.output[0]: n.input[1] for n in nodes if n.op_type == "QuantizeLinear"}
    fixed: set[str] = set()
    for n in nodes:
        if n.op_type == "DequantizeLinear" and n.input[0] in quantized and quantized[n.input[0]] != n.input[1]:
            fixed |= {quantized[n.input[0]], n.input[1]}
    return fixed


def _dequantized(node: onnx.NodeProto, values: dict[str, TensorProto]) -> np.ndarray:
    import qlinear

    a = _attrs(node)
    x, scale, *zp = (numpy_helper.to_array(values[n]) for n in node.input if n)
    return qlinear.dequantize_linear(x, scale, zp[0] if zp else None, axis=a.get("axis", 1), block_size=a.get("block_size", 0))
