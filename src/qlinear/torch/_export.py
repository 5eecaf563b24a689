"""Export a quantized Sequential model as a standard QDQ ONNX model.

The model's modules are walked in order and each becomes ONNX nodes built
with ``onnx.helper``: FakeQuantize becomes QuantizeLinear then
DequantizeLinear; a quantized weight is stored quantized (an int4, int8 or
float8 initializer, packed where ONNX packs) behind a DequantizeLinear, so
nothing but standard ai.onnx operators and types appear. Quantized values
are those the torch forward computes, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from os import PathLike
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

import qlinear
from qlinear._errors import QuantizationError
from qlinear.spec import plan_quantize
from qlinear.torch._modules import DequantizeLinear, FakeQuantize, QuantizeLinear
from qlinear.torch._round_saturate import cast_zero_point
from qlinear.torch._spec_check import stand_in
from qlinear.torch._types import resolve_type
from qlinear.torch._wrap import QuantizedModule

__all__ = ["export_onnx"]

OPSETS = range(21, 29)


class _Builder:
    """Nodes and initializers of the graph being written, with fresh names."""

    module_names: dict[int, str]  # id(module) -> its name in the exported model, for errors

    def __init__(self, opset: int) -> None:
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def constant(self, array: np.ndarray, hint: str) -> str:
        name = self.name(hint)
        self.initializers.append(qlinear.to_tensor_proto(np.ascontiguousarray(array), name))
        return name

    def node(self, op: str, inputs: list[str], hint: str, **attrs: Any) -> str:
        out = self.name(hint)
        self.nodes.append(helper.make_node(op, inputs, [out], name=self.name(op), **attrs))
        return out


def _qparam_arrays(
    b: _Builder, module: torch.nn.Module, qtype: Any, scale: torch.Tensor, zero_point: torch.Tensor | None
) -> tuple[np.ndarray, np.ndarray]:
    s = scale.detach().to(torch.float32).cpu().numpy()
    bad = ~(np.isfinite(s) & (s > 0))
    if bad.any():
        where = b.module_names.get(id(module), type(module).__name__)
        raise QuantizationError(
            f"export_onnx: module {where!r} ({type(module).__name__}) has {int(bad.sum())} scale(s) that are not positive "
            f"and finite (first: {s.reshape(-1)[np.argmax(bad.reshape(-1))]!r}); ONNX models must not hold them"
        )
    z = torch.zeros_like(scale) if zero_point is None else cast_zero_point(zero_point.detach(), qtype)
    return s, z.to(torch.float32).cpu().numpy().astype(qtype.dtype)


def _q_attrs(
    quant: QuantizeLinear | FakeQuantize, rank: int, opset: int, x: np.ndarray, s: np.ndarray, z: np.ndarray
) -> dict[str, Any]:
    """QuantizeLinear attributes, validated for ``opset`` by qlinear.spec."""
    axis = 1 if quant.axis is None else quant.axis % rank
    try:
        plan_quantize(
            stand_in(x.shape, x.dtype),
            s,
            z,
            axis=axis,
            block_size=quant.block_size,
            output_dtype=None,
            saturate=quant.saturate,
            precision=quant.precision,
            opset=opset,
            domain="",
        )
    except QuantizationError as e:
        raise QuantizationError(f"export_onnx: {quant!r} at opset {opset}: {e}") from None
    attrs: dict[str, Any] = {"axis": axis}
    if quant.block_size:
        attrs["block_size"] = quant.block_size
    if not quant.saturate and quant.qtype.saturate_applies:
        attrs["saturate"] = 0
    if quant.precision is not None:
        attrs["precision"] = resolve_type(quant.precision, what="export_onnx: precision").onnx_enum
    return attrs


def _dq_attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attrs.items() if k in ("axis", "block_size")}


def _quantizer(b: _Builder, quant: QuantizeLinear | FakeQuantize, inp: str, example: torch.Tensor) -> str:
    s, z = _qparam_arrays(b, quant, quant.qtype, quant.scale, quant.zero_point)
    x = np.zeros((), np.float32)
    attrs = _q_attrs(quant, example.dim(), b.opset, np.broadcast_to(x, tuple(example.shape)), s, z)
    s_name, z_name = b.constant(s, "scale"), b.constant(z, "zero_point")
    q = b.node("QuantizeLinear", [inp, s_name, z_name], "q", **attrs)
    if isinstance(quant, QuantizeLinear):
        return q
    return b.node("DequantizeLinear", [q, s_name, z_name], "dq", **_dq_attrs(attrs))


def _dequantizer(b: _Builder, dq: DequantizeLinear, inp: str, example: torch.Tensor) -> str:
    qtype, scale, zero_point, axis, block_size = dq.qparams()
    s, z = _qparam_arrays(b, dq, qtype, scale, zero_point)
    attrs: dict[str, Any] = {"axis": 1 if axis is None else axis % example.dim()}
    if block_size:
        attrs["block_size"] = block_size
    return b.node("DequantizeLinear", [inp, b.constant(s, "scale"), b.constant(z, "zero_point")], "dq", **attrs)


def _weight(b: _Builder, layer: torch.nn.Module, quant: FakeQuantize | None) -> str:
    """The weight as an initializer: quantized behind a DequantizeLinear, or float."""
    w = layer.weight.detach().to(torch.float32).cpu().numpy()
    if quant is None:
        return b.constant(w, "weight")
    s, z = _qparam_arrays(b, quant, quant.qtype, quant.scale, quant.zero_point)
    attrs = _q_attrs(quant, w.ndim, b.opset, w, s, z)
    wq = qlinear.quantize_linear(
        w,
        s,
        z,
        axis=attrs["axis"],
        block_size=quant.block_size,
        saturate=quant.saturate,
        precision=quant.precision,
        opset=b.opset,
    )
    inputs = [b.constant(wq, "weight_q"), b.constant(s, "weight_scale"), b.constant(z, "weight_zero_point")]
    return b.node("DequantizeLinear", inputs, "weight", **_dq_attrs(attrs))


def _layer(b: _Builder, layer: torch.nn.Module, inp: str, weight: str, example: torch.Tensor) -> str:
    bias = None if layer.bias is None else b.constant(layer.bias.detach().to(torch.float32).cpu().numpy(), "bias")
    if isinstance(layer, torch.nn.Linear):
        if example.dim() == 2:
            return b.node("Gemm", [inp, weight] + ([bias] if bias else []), "linear", transB=1)
        wt = b.node("Transpose", [weight], "weight_t", perm=[1, 0])
        out = b.node("MatMul", [inp, wt], "matmul")
        return b.node("Add", [out, bias], "linear") if bias else out
    if layer.padding_mode != "zeros" or isinstance(layer.padding, str):
        raise QuantizationError(
            f"export_onnx: {type(layer).__name__} needs padding_mode='zeros' and numeric padding, got {layer.padding_mode!r}, {layer.padding!r}"
        )
    pads = list(layer.padding) * 2
    return b.node(
        "Conv",
        [inp, weight] + ([bias] if bias else []),
        "conv",
        kernel_shape=list(layer.kernel_size),
        strides=list(layer.stride),
        pads=pads,
        dilations=list(layer.dilation),
        group=layer.groups,
    )


def _tuple(v: Any, n: int) -> list[int]:
    return list(v) if isinstance(v, (tuple, list)) else [v] * n


def _pool(b: _Builder, m: torch.nn.Module, inp: str, example: torch.Tensor) -> str:
    n = example.dim() - 2
    kernel = _tuple(m.kernel_size, n)
    strides = _tuple(m.stride if m.stride else m.kernel_size, n)
    pads = _tuple(m.padding, n) * 2
    if isinstance(m, (torch.nn.MaxPool1d, torch.nn.MaxPool2d)):
        return b.node(
            "MaxPool",
            [inp],
            "maxpool",
            kernel_shape=kernel,
            strides=strides,
            pads=pads,
            dilations=_tuple(m.dilation, n),
            ceil_mode=int(m.ceil_mode),
        )
    if m.divisor_override is not None:
        raise QuantizationError("export_onnx: AvgPool2d with divisor_override has no ONNX equivalent")
    return b.node(
        "AveragePool",
        [inp],
        "avgpool",
        kernel_shape=kernel,
        strides=strides,
        pads=pads,
        ceil_mode=int(m.ceil_mode),
        count_include_pad=int(m.count_include_pad),
    )


def _flatten(b: _Builder, m: torch.nn.Flatten, inp: str, example: torch.Tensor) -> str:
    if m.end_dim not in (-1, example.dim() - 1):
        raise QuantizationError(f"export_onnx: Flatten must flatten to the last dimension, got end_dim={m.end_dim}")
    return b.node("Flatten", [inp], "flatten", axis=m.start_dim % example.dim())


_ELEMENTWISE = {torch.nn.ReLU: "Relu", torch.nn.Sigmoid: "Sigmoid", torch.nn.Tanh: "Tanh"}
_PASS_THROUGH = (torch.nn.Identity, torch.nn.Dropout)
_POOLS = (torch.nn.MaxPool1d, torch.nn.MaxPool2d, torch.nn.AvgPool1d, torch.nn.AvgPool2d)


def _emit(b: _Builder, m: torch.nn.Module, inp: str, example: torch.Tensor) -> str:
    """Nodes for one module applied to tensor ``inp`` (``example`` is its value)."""
    handlers: list[tuple[Any, Callable[..., str]]] = [
        (
            QuantizedModule,
            lambda: _layer(
                b,
                m.layer,
                inp if m.input_quant is None else _quantizer(b, m.input_quant, inp, example),
                _weight(b, m.layer, m.weight_quant),
                example,
            ),
        ),
        ((torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d), lambda: _layer(b, m, inp, _weight(b, m, None), example)),
        ((FakeQuantize, QuantizeLinear), lambda: _quantizer(b, m, inp, example)),
        (DequantizeLinear, lambda: _dequantizer(b, m, inp, example)),
        (_POOLS, lambda: _pool(b, m, inp, example)),
        (torch.nn.Flatten, lambda: _flatten(b, m, inp, example)),
        (_PASS_THROUGH, lambda: inp),
    ]
    for kinds, handler in handlers:
        if isinstance(m, kinds):
            return handler()
    if type(m) in _ELEMENTWISE:
        return b.node(_ELEMENTWISE[type(m)], [inp], _ELEMENTWISE[type(m)].lower())
    raise QuantizationError(
        f"export_onnx: cannot export module {type(m).__name__}; supported are nn.Sequential of "
        "QuantizedModule, Linear, Conv1d/2d, FakeQuantize, QuantizeLinear, DequantizeLinear, pools, "
        "Flatten, ReLU, Sigmoid, Tanh, Dropout, Identity"
    )


def _emits(m: torch.nn.Module) -> bool:
    """Whether the Sequential path writes module ``m``."""
    kinds = (QuantizedModule, torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, FakeQuantize, QuantizeLinear, DequantizeLinear)
    return isinstance(m, (*kinds, *_POOLS, torch.nn.Flatten, *_PASS_THROUGH)) or type(m) in _ELEMENTWISE


def _export_dynamo(model: torch.nn.Module, example_inputs: Any, path: Any, opset: int, dynamic_shapes: Any) -> onnx.ModelProto:
    from qlinear.torch._dynamo import export_dynamo

    args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    names = {id(m): n or type(model).__name__ for n, m in model.named_modules()}
    for m in model.modules():
        if isinstance(m, (QuantizeLinear, FakeQuantize)):
            where = names[id(m)]
            if not bool(m.initialized):
                raise QuantizationError(
                    f"export_onnx: module {where!r} ({type(m).__name__}) has no qparams yet; run the model on data "
                    "in training mode first, or give scales"
                )
            if m.policy == "learnable":
                m.keep_scale_valid()
            b = _Builder(opset)
            b.module_names = names
            _qparam_arrays(b, m, m.qtype, m.scale, m.zero_point)  # refuses a scale that is not positive and finite
    was_training = model.training
    model.eval()
    try:
        proto = export_dynamo(model, args, opset=opset, dynamic_shapes=dynamic_shapes)
    finally:
        model.train(was_training)
    try:
        proto = onnx.shape_inference.infer_shapes(proto, check_type=True)
        onnx.checker.check_model(proto, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise QuantizationError(
            f"export_onnx: the exported model fails onnx.checker (a qlinear bug, please report it): {e}"
        ) from None
    if path is not None:
        from qlinear.onnx import save

        save(proto, path)
    return proto


def _leaves(model: torch.nn.Module) -> list[torch.nn.Module]:
    if isinstance(model, torch.nn.Sequential):
        return [leaf for child in model for leaf in _leaves(child)]
    return [model]


def _value_info(name: str, value: torch.Tensor, elem_type: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, ["N", *value.shape[1:]])


def export_onnx(
    model: torch.nn.Module,
    example_inputs: torch.Tensor | tuple[Any, ...],
    path: str | PathLike[str] | None,
    opset: int = 21,
    *,
    dynamo: bool | None = None,
    dynamic_shapes: Any = None,
) -> onnx.ModelProto:
    """Write ``model`` as an ONNX model of standard QuantizeLinear/DequantizeLinear nodes.

    Two paths, one result (standard operators and types, weights stored
    quantized, quantized values the torch forward's bit for bit):

    - an ``nn.Sequential`` (nested ones too) of the modules
      :func:`quantize_modules` produces, qlinear.torch's quantizers, and
      Linear, Conv1d/2d, MaxPool/AvgPool, Flatten, ReLU, Sigmoid, Tanh,
      Dropout and Identity is written node by node (no extra dependency;
      the batch dimension is named ``N``);
    - any other model goes through ``torch.onnx.export(..., dynamo=True)``
      with qlinear's quantizers as custom operators translated to Q/DQ
      (needs onnxscript; opset 21-23; ``dynamic_shapes`` as torch.export
      takes them).

    Args:
        model: the (quantized) model; exported in eval mode, left in its mode.
        example_inputs: a tensor or a tuple of the model's inputs (the
            Sequential path takes one float32 tensor).
        path: where to save the model; None only returns it.
        opset: ai.onnx opset, 21 to 28 (21 to 23 through torch.onnx); types
            newer than it (float4 needs 23, int2 25, float6 28) are refused.
        dynamo: force a path (None: the Sequential path where it applies).
        dynamic_shapes: for the torch.onnx path, as ``torch.export`` takes them.

    Returns:
        The checked ``onnx.ModelProto``.

    Raises:
        QuantizationError: an unsupported module, opset or type; a quantizer
            whose qparams are not set, or whose scale is not positive and
            finite (the module named).
    """
    if dynamo is None:
        dynamo = not (isinstance(model, torch.nn.Sequential) and all(_emits(m) for m in _leaves(model)))
    if dynamo:
        return _export_dynamo(model, example_inputs, path, opset, dynamic_shapes)
    if not isinstance(opset, int) or opset not in OPSETS:
        raise QuantizationError(f"export_onnx: opset must be in [{OPSETS.start}, {OPSETS.stop - 1}], got {opset!r}")
    x = example_inputs[0] if isinstance(example_inputs, (tuple, list)) else example_inputs
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        raise QuantizationError(
            f"export_onnx: example_inputs must be a float32 tensor, got {getattr(x, 'dtype', type(x).__name__)}"
        )
    was_training = model.training
    model.eval()
    b = _Builder(opset)
    b.module_names = {id(m): n or type(model).__name__ for n, m in model.named_modules()}
    for m in model.modules():  # a learned scale an optimizer step took to zero or below goes back to the floor
        if isinstance(m, (QuantizeLinear, FakeQuantize)) and m.policy == "learnable" and bool(m.initialized):
            m.keep_scale_valid()
    name, value, elem = "input", x, TensorProto.FLOAT
    graph_input = _value_info(name, x, elem)
    try:
        with torch.no_grad():
            for m in _leaves(model):
                name = _emit(b, m, name, value)
                value = m(value)
                elem = m.qtype.onnx_enum if isinstance(m, QuantizeLinear) else TensorProto.FLOAT
    finally:
        model.train(was_training)
    graph = helper.make_graph(b.nodes, "qlinear_export", [graph_input], [_value_info(name, value, elem)], b.initializers)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="qlinear")
    proto.ir_version = 11 if opset <= 25 else 13
    proto = onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True)
    onnx.checker.check_model(proto, full_check=True)
    if path is not None:
        onnx.save(proto, str(path))
    return proto
