"""Check one Q/DQ node against its model's opset, from types and shapes alone.

The rules live in :mod:`qlinear.spec`, which validates arrays. A graph knows
only element types and (perhaps symbolic) shapes, so each input becomes a
placeholder: a broadcast zero of the right dtype and shape that costs no
memory. Symbolic dimensions take the size that fits the scale, so every fact
the graph does know is checked and nothing unknown is held against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from qlinear._errors import QuantizationError
from qlinear.dtypes import element_type
from qlinear.onnx._tensor_info import Dim, TensorInfo
from qlinear.spec import DequantizePlan, QuantizePlan, operator_version, plan_dequantize, plan_quantize

__all__ = ["QDQ_OPS", "QDQCheck", "check_qdq_node"]

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear")
_INPUT_ARGS = {
    "QuantizeLinear": ("x", "y_scale", "y_zero_point"),
    "DequantizeLinear": ("x", "x_scale", "x_zero_point"),
    "DynamicQuantizeLinear": ("x",),
}
_DYNAMIC_SINCE = 11


@dataclass(frozen=True)
class QDQCheck:
    """A Q/DQ node that passed its checks: its plan and its outputs' info.

    ``plan`` is None for DynamicQuantizeLinear, whose parameters come from
    the data.
    """

    plan: QuantizePlan | DequantizePlan | None
    outputs: tuple[TensorInfo, ...]


def _concrete(x_shape: tuple[Dim, ...] | None, scale_shape: tuple[int, ...], axis: int, block_size: int) -> tuple[int, ...]:
    """``x_shape`` with every unknown dimension replaced by the size that fits the scale."""
    blocked_like = block_size and len(scale_shape) > 1
    rank = len(x_shape) if x_shape is not None else max(len(scale_shape), axis + 1 if axis >= 0 else -axis, 1)
    dims = list(x_shape) if x_shape is not None else [None] * rank
    axis_n = axis % rank if -rank <= axis < rank else None
    out = []
    for i, d in enumerate(dims):
        if isinstance(d, int):
            out.append(d)
        elif blocked_like and len(scale_shape) == rank:
            out.append(scale_shape[i] * (block_size if i == axis_n else 1))
        elif i == axis_n and len(scale_shape) == 1:
            out.append(scale_shape[0] * (block_size or 1))
        else:
            out.append(1)
    return tuple(out)


def _placeholder(info: TensorInfo | None, shape: tuple[int, ...], arg: str, where: str) -> np.ndarray | None:
    if info is None:
        return None
    if not info.elem_type:
        raise QuantizationError(f"{where}: {arg} has an unknown element type; declare its type")
    try:
        dtype = element_type(info.elem_type).dtype
    except QuantizationError:
        dtype = helper.tensor_dtype_to_np_dtype(info.elem_type)
    return np.broadcast_to(np.zeros((), dtype), shape)


def _known(shape: tuple[Dim, ...] | None) -> tuple[int, ...]:
    # Scale and zero-point dimensions nobody declared count as one element.
    return () if shape is None else tuple(d if isinstance(d, int) else 1 for d in shape)


def _attribute_names_allowed(op: str, opset: int, domain: str, attrs: dict[str, Any], caller: str) -> None:
    version = operator_version(op, opset, domain, caller=caller)
    for name, value in attrs.items():
        if name not in version.attributes:
            raise QuantizationError(f"{caller}: {name} is not an attribute of {version}, got {name}={value!r}")


def check_qdq_node(
    op: str, opset: int, domain: str, attrs: dict[str, Any], inputs: list[TensorInfo | None], node: str
) -> QDQCheck:
    """Validate a QuantizeLinear, DequantizeLinear or DynamicQuantizeLinear node.

    Args:
        op: the operator type.
        opset: the version the model imports for ``domain``.
        domain: ``""`` or ``"com.microsoft"``.
        attrs: the node's attributes as Python values (types as enums).
        inputs: info for each input in order; None for an omitted optional one.
        node: the node's name, for messages.

    Returns:
        The plan and the output infos (shape of ``x``, symbolic dims kept).

    Raises:
        QuantizationError: ``node 'name': `` then the operator function's
            own message (same wording as ``quantize_linear`` and friends).
    """
    try:
        return _check(op, opset, domain, attrs, inputs, node)
    except QuantizationError as e:
        raise QuantizationError(f"node {node!r}: {e}") from None


def _check(op: str, opset: int, domain: str, attrs: dict[str, Any], inputs: list[TensorInfo | None], node: str) -> QDQCheck:
    args = _INPUT_ARGS[op]
    if len(inputs) > len(args) or not inputs or inputs[0] is None:
        raise QuantizationError(f"{op}: expected 1 to {len(args)} inputs ({', '.join(args)}), got {len(inputs)}")
    inputs = list(inputs) + [None] * (len(args) - len(inputs))
    if op == "DynamicQuantizeLinear":
        return _check_dynamic(opset, domain, attrs, inputs[0])
    caller = "quantize_linear" if op == "QuantizeLinear" else "dequantize_linear"
    x_info, scale_info, zp_info = inputs
    if scale_info is None:
        raise QuantizationError(f"{caller}: {args[1]} is a required input")
    axis = attrs.get("axis", 1)
    block_size = attrs.get("block_size", 0)
    scale_shape = _known(scale_info.shape)
    x = _placeholder(x_info, _concrete(x_info.shape, scale_shape, axis, block_size), "x", caller)
    scale = _placeholder(scale_info, scale_shape, args[1], caller)
    zp = _placeholder(zp_info, _known(zp_info.shape) if zp_info else (), args[2], caller)
    common = {
        "axis": axis,
        "block_size": block_size,
        "output_dtype": attrs.get("output_dtype") or None,
        "opset": opset,
        "domain": domain,
    }
    if op == "QuantizeLinear":
        plan, *_ = plan_quantize(
            x, scale, zp, saturate=bool(attrs.get("saturate", 1)), precision=attrs.get("precision") or None, **common
        )
        out_type = plan.output_type.onnx_enum
    else:
        plan, *_ = plan_dequantize(x, scale, zp, **common)
        out_type = element_type(plan.output_dtype).onnx_enum
    # The plan checked the attributes whose values matter; a node may still
    # carry one its version lacks at a default value (axis on version 10).
    _attribute_names_allowed(op, opset, domain, attrs, caller)
    return QDQCheck(plan, (TensorInfo(out_type, x_info.shape),))


def _check_dynamic(opset: int, domain: str, attrs: dict[str, Any], x: TensorInfo) -> QDQCheck:
    caller = "dynamic_quantize_linear"
    if domain or opset < _DYNAMIC_SINCE:
        raise QuantizationError(
            f"{caller}: DynamicQuantizeLinear exists from opset {_DYNAMIC_SINCE} of domain 'ai.onnx', got opset={opset} of {domain or 'ai.onnx'!r}"
        )
    if attrs:
        raise QuantizationError(f"{caller}: DynamicQuantizeLinear version 11 (ai.onnx) has no attributes, got {sorted(attrs)}")
    if x.elem_type != TensorProto.FLOAT:
        raise QuantizationError(
            f"{caller}: x has type {x.type_name}, expected float32 for DynamicQuantizeLinear version 11 (ai.onnx)"
        )
    return QDQCheck(
        None, (TensorInfo(TensorProto.UINT8, x.shape), TensorInfo(TensorProto.FLOAT, ()), TensorInfo(TensorProto.UINT8, ()))
    )
