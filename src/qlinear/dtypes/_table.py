"""One table of facts about every element type qlinear handles.

Each row is an :class:`ElementType`; lookups by ONNX name, ONNX enum or
numpy/ml_dtypes dtype all go through the indexes built here, and the rows are
checked against ml_dtypes and onnx at import so a wrong number cannot hide.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
from onnx import TensorProto

from qlinear._errors import QuantizationError

__all__ = ["ElementType", "ELEMENT_TYPES", "element_type", "ONNX_ALIASES"]


@dataclass(frozen=True)
class ElementType:
    """Facts about one element type.

    Attributes:
        name: ONNX's lower-case type name as written in operator schemas
            (``"int4"``, ``"float8e4m3fn"``).
        onnx_enum: the ``onnx.TensorProto.DataType`` value.
        dtype: the numpy or ml_dtypes dtype holding one element per value.
        bits: bit width of one element in ONNX storage.
        kind: ``"int"`` for integers, ``"float"`` for IEEE-like floats that
            quantized values may have (float8/6/4), ``"wide"`` for the
            full-precision types x and scales use, ``"scale"`` for float8e8m0.
        qmin, qmax: the saturation range for integer types.
        max_finite: largest finite value for float types.
        has_inf, has_nan: whether the encoding has infinities / NaN.
        saturate_applies: the ``saturate`` attribute changes conversion to
            this type (float8 with NaN or inf encodings).
    """

    name: str
    onnx_enum: int
    dtype: np.dtype
    bits: int
    kind: str
    qmin: int | None = None
    qmax: int | None = None
    max_finite: float | None = None
    has_inf: bool = False
    has_nan: bool = True
    saturate_applies: bool = False

    @property
    def is_integer(self) -> bool:
        return self.kind == "int"

    @property
    def is_packed(self) -> bool:
        """ONNX stores several elements of this type in one byte."""
        return self.bits < 8

    def __str__(self) -> str:
        return self.name


def _int(name: str, enum: int, dtype: Any, bits: int, qmin: int, qmax: int) -> ElementType:
    return ElementType(name, enum, np.dtype(dtype), bits, "int", qmin=qmin, qmax=qmax, has_nan=False)


def _float(
    name: str, enum: int, dtype: Any, bits: int, max_finite: float, *, inf: bool, nan: bool, saturate: bool
) -> ElementType:
    return ElementType(
        name, enum, np.dtype(dtype), bits, "float", max_finite=max_finite, has_inf=inf, has_nan=nan, saturate_applies=saturate
    )


def _wide(name: str, enum: int, dtype: Any, bits: int, max_finite: float) -> ElementType:
    return ElementType(name, enum, np.dtype(dtype), bits, "wide", max_finite=max_finite, has_inf=True)


T = TensorProto
ELEMENT_TYPES: tuple[ElementType, ...] = (
    _int("uint8", T.UINT8, np.uint8, 8, 0, 255),
    _int("int8", T.INT8, np.int8, 8, -128, 127),
    _int("uint16", T.UINT16, np.uint16, 16, 0, 65535),
    _int("int16", T.INT16, np.int16, 16, -32768, 32767),
    _int("uint4", T.UINT4, ml_dtypes.uint4, 4, 0, 15),
    _int("int4", T.INT4, ml_dtypes.int4, 4, -8, 7),
    _int("uint2", T.UINT2, ml_dtypes.uint2, 2, 0, 3),
    _int("int2", T.INT2, ml_dtypes.int2, 2, -2, 1),
    _int("int32", T.INT32, np.int32, 32, -(2**31), 2**31 - 1),
    _float(
        "float8e4m3fn", T.FLOAT8E4M3FN, ml_dtypes.float8_e4m3fn, 8, float.fromhex("0x1.cp8"), inf=False, nan=True, saturate=True
    ),  # 448
    _float(
        "float8e4m3fnuz",
        T.FLOAT8E4M3FNUZ,
        ml_dtypes.float8_e4m3fnuz,
        8,
        float.fromhex("0x1.ep7"),
        inf=False,
        nan=True,
        saturate=True,
    ),  # 240
    _float(
        "float8e5m2", T.FLOAT8E5M2, ml_dtypes.float8_e5m2, 8, float.fromhex("0x1.cp15"), inf=True, nan=True, saturate=True
    ),  # 57344
    _float(
        "float8e5m2fnuz",
        T.FLOAT8E5M2FNUZ,
        ml_dtypes.float8_e5m2fnuz,
        8,
        float.fromhex("0x1.cp15"),
        inf=False,
        nan=True,
        saturate=True,
    ),  # 57344
    _float(
        "float4e2m1", T.FLOAT4E2M1, ml_dtypes.float4_e2m1fn, 4, float.fromhex("0x1.8p2"), inf=False, nan=False, saturate=False
    ),  # 6
    _float(
        "float6e2m3", T.FLOAT6E2M3, ml_dtypes.float6_e2m3fn, 6, float.fromhex("0x1.ep2"), inf=False, nan=False, saturate=False
    ),  # 7.5
    _float(
        "float6e3m2", T.FLOAT6E3M2, ml_dtypes.float6_e3m2fn, 6, float.fromhex("0x1.cp4"), inf=False, nan=False, saturate=False
    ),  # 28
    ElementType(
        "float8e8m0",
        T.FLOAT8E8M0,
        np.dtype(ml_dtypes.float8_e8m0fnu),
        8,
        "scale",
        max_finite=float.fromhex("0x1p127"),
        has_inf=False,
    ),  # 2**127
    _wide("float", T.FLOAT, np.float32, 32, float(np.finfo(np.float32).max)),
    _wide("float16", T.FLOAT16, np.float16, 16, float.fromhex("0x1.ffcp15")),  # 65504
    _wide("bfloat16", T.BFLOAT16, ml_dtypes.bfloat16, 16, float.fromhex("0x1.fep127")),
)

# Spellings users type besides ONNX's own names.
ONNX_ALIASES = {
    "float32": "float",
    "float4e2m1fn": "float4e2m1",
    "float6e2m3fn": "float6e2m3",
    "float6e3m2fn": "float6e3m2",
    "float8e8m0fnu": "float8e8m0",
}

_BY_NAME = {t.name: t for t in ELEMENT_TYPES}
_BY_ENUM = {t.onnx_enum: t for t in ELEMENT_TYPES}
_BY_DTYPE = {t.dtype: t for t in ELEMENT_TYPES}


def _normalise_name(name: str) -> str:
    key = name.lower().replace("_", "").replace("tensor(", "").rstrip(")")
    return ONNX_ALIASES.get(key, key)


def element_type(value: Any, *, what: str = "dtype") -> ElementType:
    """The :class:`ElementType` for an ONNX name, ONNX enum, or dtype.

    >>> element_type("int4").qmax
    7
    >>> element_type(17).name  # onnx.TensorProto.FLOAT8E4M3FN
    'float8e4m3fn'

    Raises:
        QuantizationError: ``value`` names no type qlinear knows.
    """
    if isinstance(value, ElementType):
        return value
    found = None
    if isinstance(value, str):
        found = _BY_NAME.get(_normalise_name(value))
        if found is None:
            try:
                found = _BY_DTYPE.get(np.dtype(value))
            except TypeError:
                found = None
    elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        found = _BY_ENUM.get(int(value))
    else:
        try:
            found = _BY_DTYPE.get(np.dtype(value))
        except TypeError:
            found = None
    if found is None:
        known = ", ".join(t.name for t in ELEMENT_TYPES)
        raise QuantizationError(f"{what}: expected one of {known} (ONNX name, TensorProto enum or dtype), got {value!r}")
    return found


def _check_table() -> None:
    """Cross-check every row against ml_dtypes and onnx at import."""
    from onnx.helper import tensor_dtype_to_np_dtype

    for t in ELEMENT_TYPES:
        if tensor_dtype_to_np_dtype(t.onnx_enum) != t.dtype:
            raise AssertionError(f"{t.name}: onnx maps enum {t.onnx_enum} to another dtype")
        if t.kind == "int":
            info = ml_dtypes.iinfo(t.dtype)
            if (info.min, info.max) != (t.qmin, t.qmax) or info.bits != t.bits:
                raise AssertionError(f"{t.name}: range or width disagrees with ml_dtypes")
        else:
            info = ml_dtypes.finfo(t.dtype)
            if float(info.max) != t.max_finite or info.bits != t.bits:
                raise AssertionError(f"{t.name}: largest value or width disagrees with ml_dtypes")


_check_table()
