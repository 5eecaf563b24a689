"""Export of any model ``torch.onnx.export(..., dynamo=True)`` takes, qlinear's quantizers inside, as standard QDQ.

qlinear's quantizers compute with numpy and numba kernels, which
``torch.export`` cannot trace. While a model is exported they call the
custom operators registered here instead (``torch.library``:
``qlinear::quantize_linear``, ``qlinear::dequantize_linear``,
``qlinear::fake_quantize``), whose eager implementation is qlinear.torch's
own and whose ONNX translation is QuantizeLinear / DequantizeLinear
(onnxscript functions given to the exporter). After the export:

- a Cast of a constant (a zero point to its quantized type) becomes the
  constant;
- a QuantizeLinear of a constant weight becomes the weight's codes,
  computed by qlinear's kernels (the numbers the torch forward used), so
  weights are stored quantized and DequantizeLinear reads them;
- a cast of codes to float and back (qlinear.torch holds codes as float32)
  is removed; initializers nothing reads are dropped.

The exporter needs ``onnxscript`` (``pip install 'qlinear[torch]'``).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

import qlinear
from qlinear._errors import QuantizationError
from qlinear.dtypes import element_type
from qlinear.dtypes._tensor_proto import to_tensor_proto
from qlinear.onnx._graph import nodes_read
from qlinear.onnx._graph import producers as graph_producers

__all__ = ["export_dynamo", "exported_call"]

# The newest ai.onnx opset onnxscript writes; block_size needs 21, float4e2m1 23.
DYNAMO_OPSETS = range(21, 24)


@torch.library.custom_op("qlinear::fake_quantize", mutates_args=())
def _fake_quantize_op(
    x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, axis: int, block_size: int, output_dtype: str, saturate: bool
) -> torch.Tensor:
    from qlinear.torch._functional import fake_quantize

    with torch.no_grad():
        return fake_quantize(x, scale, zero_point, axis=axis, block_size=block_size, output_dtype=output_dtype, saturate=saturate)


@torch.library.custom_op("qlinear::quantize_linear", mutates_args=())
def _quantize_op(
    x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, axis: int, block_size: int, output_dtype: str, saturate: bool
) -> torch.Tensor:
    from qlinear.torch._functional import quantize_linear

    with torch.no_grad():
        return quantize_linear(
            x, scale, zero_point, axis=axis, block_size=block_size, output_dtype=output_dtype, saturate=saturate
        )


@torch.library.custom_op("qlinear::dequantize_linear", mutates_args=())
def _dequantize_op(
    x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, axis: int, block_size: int, input_dtype: str
) -> torch.Tensor:
    from qlinear.torch._functional import dequantize_linear

    with torch.no_grad():
        return dequantize_linear(x, scale, zero_point, axis=axis, block_size=block_size, input_dtype=input_dtype)


@_fake_quantize_op.register_fake
def _(x, scale, zero_point, axis, block_size, output_dtype, saturate):
    return torch.empty_like(x)


@_quantize_op.register_fake
def _(x, scale, zero_point, axis, block_size, output_dtype, saturate):
    return torch.empty_like(x, dtype=torch.float32)


@_dequantize_op.register_fake
def _(x, scale, zero_point, axis, block_size, input_dtype):
    return torch.empty_like(x, dtype=scale.dtype)


def exported_call(kind: str, x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, kwargs: dict) -> torch.Tensor:
    """A quantizer's call while its model is exported: the custom operator for ``kind``."""
    if kwargs.get("precision") is not None:
        raise QuantizationError("export_onnx: a quantizer with a precision cannot be exported through torch.onnx (dynamo)")
    axis, block = int(kwargs["axis"]), int(kwargs["block_size"])
    zero_point = torch.zeros_like(scale) if zero_point is None else zero_point
    if kind == "dequantize":
        return torch.ops.qlinear.dequantize_linear(x, scale, zero_point, axis, block, str(kwargs["input_dtype"]))
    op = torch.ops.qlinear.fake_quantize if kind == "fake" else torch.ops.qlinear.quantize_linear
    return op(x, scale, zero_point, axis, block, str(kwargs["output_dtype"]), bool(kwargs["saturate"]))


def _translations(opset: int) -> dict:
    """The ONNX translation of each custom operator, as onnxscript functions at ``opset``."""
    import onnxscript

    op = getattr(onnxscript, f"opset{opset}")

    def attrs(name: str, axis: int, block_size: int, saturate: bool | None) -> tuple[int, dict[str, Any]]:
        t = element_type(name, what="export_onnx: dtype")
        kw: dict[str, Any] = {"axis": axis, "block_size": block_size}
        if saturate is not None and t.kind == "float" and t.bits == 8:
            kw["saturate"] = int(saturate)
        return t.onnx_enum, kw

    def fake_quantize(x, scale, zero_point, axis: int, block_size: int, output_dtype: str, saturate: bool):
        enum, kw = attrs(output_dtype, axis, block_size, saturate)
        zp = op.Cast(zero_point, to=enum)
        q = op.QuantizeLinear(x, scale, zp, **kw)
        return op.DequantizeLinear(q, scale, zp, axis=axis, block_size=block_size)

    def quantize(x, scale, zero_point, axis: int, block_size: int, output_dtype: str, saturate: bool):
        enum, kw = attrs(output_dtype, axis, block_size, saturate)
        q = op.QuantizeLinear(x, scale, op.Cast(zero_point, to=enum), **kw)
        return op.Cast(q, to=TensorProto.FLOAT)  # qlinear.torch holds codes as float32

    def dequantize(x, scale, zero_point, axis: int, block_size: int, input_dtype: str):
        enum, _ = attrs(input_dtype, axis, block_size, None)
        return op.DequantizeLinear(op.Cast(x, to=enum), scale, op.Cast(zero_point, to=enum), axis=axis, block_size=block_size)

    return {
        torch.ops.qlinear.fake_quantize.default: fake_quantize,
        torch.ops.qlinear.quantize_linear.default: quantize,
        torch.ops.qlinear.dequantize_linear.default: dequantize,
    }


def export_dynamo(
    model: torch.nn.Module,
    example_inputs: tuple[Any, ...],
    *,
    opset: int = 21,
    dynamic_shapes: Any = None,
    input_names: list[str] | None = None,
    output_names: list[str] | None = None,
) -> onnx.ModelProto:
    """``model`` (in eval mode) through ``torch.onnx.export(dynamo=True)``, its quantizers as standard Q/DQ.

    Raises:
        QuantizationError: onnxscript is missing, an opset outside 21-23,
            or the exporter failed (its first line).
    """
    if not isinstance(opset, int) or opset not in DYNAMO_OPSETS:
        raise QuantizationError(
            f"export_onnx: opset must be in [{DYNAMO_OPSETS.start}, {DYNAMO_OPSETS.stop - 1}] for a model exported "
            f"through torch.onnx (onnxscript writes up to {DYNAMO_OPSETS.stop - 1}), got {opset!r}"
        )
    try:
        import onnxscript  # noqa: F401
    except ImportError:
        raise QuantizationError("export_onnx: exporting this model needs onnxscript: pip install 'qlinear[torch]'") from None
    # The exporter's deprecation warnings and its registry's notes (torchvision missing) say nothing to the user.
    registry = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registry.level
    registry.setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            program = torch.onnx.export(
                model, example_inputs, dynamo=True, opset_version=opset, optimize=True, verbose=False,
                custom_translation_table=_translations(opset), dynamic_shapes=dynamic_shapes,
                input_names=input_names, output_names=output_names,
            )  # fmt: skip
        except Exception as e:  # the exporter raises many types; the user needs the first line
            text = str(e).strip().splitlines()
            raise QuantizationError(f"export_onnx: torch.onnx.export failed: {text[0] if text else type(e).__name__}") from None
        finally:
            registry.setLevel(level)
    proto = program.model_proto
    fold_constants(proto)
    return proto


def fold_constants(model: onnx.ModelProto) -> None:
    """Cast and QuantizeLinear of constants become constants; code round-trip casts go; unread initializers are dropped."""
    g = model.graph
    values = {t.name: t for t in g.initializer}
    producers = graph_producers(g)
    keep: list[onnx.NodeProto] = []
    renamed: dict[str, str] = {}
    taken = set(values) | {n for node in g.node for n in (*node.input, *node.output)}
    for node in g.node:
        for i, name in enumerate(node.input):
            if name in renamed:
                node.input[i] = renamed[name]
        if node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name == "value":
            values[node.output[0]] = _add(g, numpy_helper.from_array(numpy_helper.to_array(node.attribute[0].t), node.output[0]))
            continue
        if node.op_type == "Cast" and node.input[0] in values:
            to = _cast_to(node)
            value = _cast(numpy_helper.to_array(values[node.input[0]]), to)
            name = _fresh(f"{node.input[0]}_{helper.tensor_dtype_to_string(to).split('.')[-1].lower()}", taken)
            renamed[node.output[0]] = name
            values[name] = _add(g, to_tensor_proto(value, name))
            continue
        if node.op_type == "Cast" and node.input[0] in producers:
            # Cast(Cast(q, FLOAT), T) where q already is of type T: the codes themselves.
            inner = producers[node.input[0]]
            to = _cast_to(node)
            if inner.op_type == "Cast" and inner.input[0] in producers and _cast_to(inner) == TensorProto.FLOAT:
                source = producers[inner.input[0]]
                if source.op_type == "QuantizeLinear" and _quantized_enum(source, values) == to:
                    renamed[node.output[0]] = inner.input[0]
                    continue
        if node.op_type == "QuantizeLinear" and all(n in values for n in node.input if n):
            name = _fresh(f"{node.input[0]}_quantized", taken)
            renamed[node.output[0]] = name
            values[name] = _add(g, to_tensor_proto(_quantize(node, values), name))
            continue
        keep.append(node)
    read = nodes_read(keep) | {o.name for o in g.output}  # subgraphs read outer initializers by name
    del g.node[:]
    g.node.extend(keep)
    live = [t for t in g.initializer if t.name in read]
    del g.initializer[:]
    g.initializer.extend(live)
    graph_outputs = {o.name for o in g.output}
    used = {n for node in keep for n in (*node.input, *node.output)} | graph_outputs
    kept_info = [vi for vi in g.value_info if vi.name in used and vi.name not in values]
    del g.value_info[:]
    g.value_info.extend(kept_info)
    # Nodes left without a reader (a float weight's Cast chain) go too.
    while True:
        read = {n for node in g.node for n in node.input} | graph_outputs
        dead = [node for node in g.node if not any(o in read for o in node.output)]
        if not dead:
            break
        for node in dead:
            g.node.remove(node)


def _fresh(base: str, taken: set[str]) -> str:
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


def _add(g: onnx.GraphProto, t: TensorProto) -> TensorProto:
    g.initializer.append(t)
    return g.initializer[-1]


def _cast_to(node: onnx.NodeProto) -> int:
    return next(a.i for a in node.attribute if a.name == "to")


def _quantized_enum(node: onnx.NodeProto, values: dict[str, TensorProto]) -> int | None:
    """The element type a QuantizeLinear writes (its zero point's), or None where it is not known here."""
    if len(node.input) > 2 and node.input[2] in values:
        return values[node.input[2]].data_type
    return None


def _cast(value: np.ndarray, to: int) -> np.ndarray:
    return value.astype(helper.tensor_dtype_to_np_dtype(to))


def _quantize(node: onnx.NodeProto, values: dict[str, TensorProto]) -> np.ndarray:
    """The codes of a QuantizeLinear whose inputs are all constants, by qlinear's kernels."""
    x, scale, *zp = (numpy_helper.to_array(values[n]) for n in node.input if n)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    kwargs: dict[str, Any] = {"axis": attrs.get("axis", 1), "block_size": attrs.get("block_size", 0)}
    if "saturate" in attrs:
        kwargs["saturate"] = bool(attrs["saturate"])
    return qlinear.quantize_linear(x, scale, zp[0] if zp else None, **kwargs)
