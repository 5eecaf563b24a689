"""Validate torch calls through :mod:`qlinear.spec`.

The spec works on numpy arrays but reads only their shapes and dtypes, so
each tensor is stood in for by a zero-strided numpy view of its shape and
numpy dtype: no data is copied, and the rules stay in one place.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from qlinear.dtypes import ElementType
from qlinear.spec import DequantizePlan, QuantizePlan, plan_dequantize, plan_quantize
from qlinear.torch._types import numpy_dtype

__all__ = ["plan_q", "plan_dq", "stand_in"]


def stand_in(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A read-only array of ``shape`` and ``dtype`` that owns one element."""
    return np.broadcast_to(np.zeros((), dtype), shape)


def plan_q(
    x: torch.Tensor,
    scale: torch.Tensor,
    zp_shape: tuple[int, ...] | None,
    out: ElementType,
    *,
    axis: int,
    block_size: int,
    saturate: bool,
    precision: Any,
    opset: int | None,
    caller: str,
) -> QuantizePlan:
    """The validated plan of a QuantizeLinear call on tensors.

    The zero point stands in as an array of the output type ``out`` whatever
    its torch dtype: its values are cast to ``out`` before use.
    """
    zp = None if zp_shape is None else stand_in(zp_shape, out.dtype)
    plan, *_ = plan_quantize(
        stand_in(tuple(x.shape), numpy_dtype(x.dtype, what=f"{caller}: x")),
        stand_in(tuple(scale.shape), numpy_dtype(scale.dtype, what=f"{caller}: y_scale")),
        zp,
        axis=axis,
        block_size=block_size,
        output_dtype=None if zp is not None else out,
        saturate=saturate,
        precision=precision,
        opset=opset,
        domain="",
    )
    return plan


def plan_dq(
    x_shape: tuple[int, ...],
    scale: torch.Tensor,
    zp_shape: tuple[int, ...] | None,
    qtype: ElementType,
    *,
    axis: int,
    block_size: int,
    output_dtype: Any,
    opset: int | None,
    caller: str,
) -> DequantizePlan:
    """The validated plan of a DequantizeLinear call on values of type ``qtype``."""
    zp = None if zp_shape is None else stand_in(zp_shape, qtype.dtype)
    plan, *_ = plan_dequantize(
        stand_in(x_shape, qtype.dtype),
        stand_in(tuple(scale.shape), numpy_dtype(scale.dtype, what=f"{caller}: x_scale")),
        zp,
        axis=axis,
        block_size=block_size,
        output_dtype=output_dtype,
        opset=opset,
        domain="",
    )
    return plan
