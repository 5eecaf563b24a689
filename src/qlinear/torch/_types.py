"""torch dtypes against qlinear's element types, and float formats for rounding.

torch has no dtype for most quantized types, so :mod:`qlinear.torch` holds
quantized values in float32 tensors (every value of every quantized type is a
float32 exactly). These tables say which torch dtype stands for which element
type where one exists, and give the bit layout the float rounding needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import torch

from qlinear._errors import QuantizationError
from qlinear.dtypes import ELEMENT_TYPES, ElementType, element_type

__all__ = ["FloatFormat", "float_format", "numpy_dtype", "quantized_type_of", "resolve_type", "torch_dtype"]

# torch dtypes whose elements are exactly one qlinear element type.
_TORCH_TO_NAME: dict[torch.dtype, str] = {
    torch.float32: "float",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int32: "int32",
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.uint16: "uint16",
    torch.int16: "int16",
    torch.float8_e4m3fn: "float8e4m3fn",
    torch.float8_e4m3fnuz: "float8e4m3fnuz",
    torch.float8_e5m2: "float8e5m2",
    torch.float8_e5m2fnuz: "float8e5m2fnuz",
    torch.float8_e8m0fnu: "float8e8m0",
}
_NAME_TO_TORCH = {name: dt for dt, name in _TORCH_TO_NAME.items()}


def numpy_dtype(dtype: torch.dtype, *, what: str) -> np.dtype:
    """The numpy/ml_dtypes dtype of a torch dtype, for validating through qlinear.spec."""
    name = _TORCH_TO_NAME.get(dtype)
    if name is None:
        known = ", ".join(str(d) for d in _TORCH_TO_NAME)
        raise QuantizationError(f"{what}: expected a tensor of dtype {known}, got {dtype}")
    return element_type(name).dtype


def torch_dtype(t: ElementType) -> torch.dtype | None:
    """The torch dtype holding element type ``t`` exactly, if torch has one."""
    return _NAME_TO_TORCH.get(t.name)


def resolve_type(value: Any, *, what: str) -> ElementType:
    """An element type named by an ONNX name, numpy/ml_dtypes dtype, enum or torch dtype."""
    if isinstance(value, torch.dtype):
        return element_type(numpy_dtype(value, what=what))
    return element_type(value, what=what)


def quantized_type_of(dtype: torch.dtype) -> ElementType | None:
    """The quantized element type a torch dtype stands for; None for wide floats."""
    name = _TORCH_TO_NAME.get(dtype)
    if name is None:
        return None
    t = element_type(name)
    return t if t.kind in ("int", "float") else None


@dataclass(frozen=True)
class FloatFormat:
    """Bit layout of a small float type, for rounding float32 values into it.

    Attributes:
        mantissa_bits: explicit significand bits.
        min_exponent: unbiased exponent of the smallest normal value; values
            below it share its quantum (subnormals).
        max_finite: largest finite value.
        has_inf, has_nan: the encoding's special values.
        signed_zero: ``-0`` exists (false for the ``fnuz`` types, where the
            negative-zero code is NaN).
    """

    mantissa_bits: int
    min_exponent: int
    max_finite: float
    has_inf: bool
    has_nan: bool
    signed_zero: bool


def _format(t: ElementType) -> FloatFormat:
    info = ml_dtypes.finfo(t.dtype)
    # finfo.minexp is the exponent of the smallest normal number.
    return FloatFormat(int(info.nmant), int(info.minexp), float(info.max), t.has_inf, t.has_nan, not t.name.endswith("fnuz"))


_FORMATS = {t.name: _format(t) for t in ELEMENT_TYPES if t.kind == "float"}


def float_format(t: ElementType) -> FloatFormat:
    """The :class:`FloatFormat` of float element type ``t``."""
    return _FORMATS[t.name]


def _check_tables() -> None:
    """Cross-check at import: torch and qlinear agree on each shared dtype."""
    for dt, name in _TORCH_TO_NAME.items():
        t = element_type(name)
        if t.kind == "int" and (torch.iinfo(dt).min, torch.iinfo(dt).max) != (t.qmin, t.qmax):
            raise AssertionError(f"{name}: torch's range disagrees with qlinear's table")
        if t.kind == "float" and float(torch.finfo(dt).max) != t.max_finite:
            raise AssertionError(f"{name}: torch's largest value disagrees with qlinear's table")
    for name, f in _FORMATS.items():
        if f.max_finite != element_type(name).max_finite:
            raise AssertionError(f"{name}: ml_dtypes and qlinear disagree on the largest value")


_check_tables()
