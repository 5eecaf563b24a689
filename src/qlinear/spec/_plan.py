"""Validated plans: what a kernel is told to compute, nothing to re-check."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qlinear.dtypes import ElementType
from qlinear.spec._versions import OperatorVersion

__all__ = ["Granularity", "QuantizePlan", "DequantizePlan"]


@dataclass(frozen=True)
class Granularity:
    """How scales map onto elements of ``x``.

    Attributes:
        kind: ``"per_tensor"``, ``"per_axis"`` or ``"blocked"``.
        axis: the quantization axis, normalised to ``[0, rank)``; 0 for
            per-tensor.
        block_size: elements of ``x`` along ``axis`` sharing one scale; 0
            unless blocked. The last block may be shorter.
    """

    kind: str
    axis: int = 0
    block_size: int = 0

    def __str__(self) -> str:
        if self.kind == "per_tensor":
            return "per-tensor"
        if self.kind == "per_axis":
            return f"per-axis(axis={self.axis})"
        return f"blocked(axis={self.axis}, block_size={self.block_size})"


@dataclass(frozen=True)
class QuantizePlan:
    """A validated QuantizeLinear call.

    ``y = saturate(round(x / scale) + zero_point)`` with the division done in
    ``precision`` (both operands converted to it first) and, for float
    outputs, ``round`` being the conversion to ``output_type``.
    """

    version: OperatorVersion
    x_shape: tuple[int, ...]
    granularity: Granularity
    output_type: ElementType
    precision: np.dtype
    saturate: bool


@dataclass(frozen=True)
class DequantizePlan:
    """A validated DequantizeLinear call.

    ``y = (x - zero_point) * scale``, the difference exact, the product
    rounded once in float32, then rounded to ``output_dtype``.
    """

    version: OperatorVersion
    x_shape: tuple[int, ...]
    granularity: Granularity
    input_type: ElementType
    output_dtype: np.dtype
