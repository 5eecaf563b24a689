"""The ai.onnx opset a quantized model is written at: the lowest its types and granularity need, the float model raised to it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx
from onnx import helper

from qlinear._errors import QuantizationError
from qlinear.quantize._placement import Plan
from qlinear.spec import type_opset

if TYPE_CHECKING:  # the options compose every algorithm's fields, and algorithms import this module
    from qlinear.quantize._options import QuantizeOptions

__all__ = ["at_opset", "required_opset"]


def required_opset(plan: Plan, options: QuantizeOptions, *, sixteen_bit_floats: bool = False) -> int:
    """The lowest ai.onnx opset whose QuantizeLinear/DequantizeLinear hold the plan's types and the granularity.

    ``sixteen_bit_floats``: some quantized tensor is float16 or bfloat16,
    which QuantizeLinear takes from version 19.
    """
    need = max([19 if sixteen_bit_floats else 13, *(type_opset(t) for t in plan.types_used())])  # 13: per-channel (axis)
    if options.granularity == "blocked" and any(p.weight_type for p in plan.nodes):
        need = max(need, 21)
    return need


def at_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """A copy of ``model`` whose ai.onnx opset is ``opset`` (converted by onnx's version converter when raised)."""
    current = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < current:
        raise QuantizationError(f"quantize: opset must be at least the model's opset {current}, got {opset}")
    if opset == current:
        out = onnx.ModelProto()
        out.CopyFrom(model)
    else:
        try:
            out = onnx.version_converter.convert_version(model, opset)
        except Exception as e:  # the converter raises many types; the user needs the one line
            raise QuantizationError(
                f"quantize: the chosen types need opset {opset}, and converting the model from opset {current} failed: "
                f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
            ) from None
    out.ir_version = max(out.ir_version, helper.find_min_ir_version_for([helper.make_opsetid("", opset)], ignore_unknown=True))
    return out
