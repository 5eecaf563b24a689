"""ml_dtypes arrays in and out of ONNX Runtime, whose Python API knows only numpy's types.

ONNX Runtime holds int4/uint4/float4 tensors packed as ONNX stores them, and
float8 or bfloat16 tensors as their bytes; its ``numpy()`` either refuses
them or returns the raw bytes. These helpers copy the bytes in and out
through the tensor's buffer.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from qlinear._errors import QuantizationError
from qlinear.dtypes import element_type, pack, unpack

__all__ = ["from_ort_value", "to_ort_value"]


def _needs_bytes(dtype: np.dtype) -> bool:
    # ml_dtypes types are user-defined dtypes (isbuiltin 2), which ONNX Runtime does not map.
    return dtype.isbuiltin == 2


def to_ort_value(a: np.ndarray) -> Any:
    """An ``onnxruntime.OrtValue`` holding ``a``; ml_dtypes arrays in ONNX's layout."""
    import onnxruntime as ort

    if not _needs_bytes(a.dtype):
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a))
    t = element_type(a.dtype, what="run: feed dtype")
    data = pack(a) if t.is_packed else np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    value = ort.OrtValue.ortvalue_from_shape_and_type(list(a.shape), t.onnx_enum)
    if value.tensor_size_in_bytes() != data.nbytes:
        raise QuantizationError(
            f"run: ONNX Runtime holds {t.name} of shape {a.shape} in {value.tensor_size_in_bytes()} bytes, expected {data.nbytes}"
        )
    ctypes.memmove(value.data_ptr(), data.ctypes.data, data.nbytes)
    return value


def from_ort_value(value: Any) -> np.ndarray:
    """The array an ``OrtValue`` holds, ml_dtypes for the types numpy lacks."""
    try:
        t = element_type(value.data_type(), what="run: output type")
    except QuantizationError:
        return value.numpy()
    if not _needs_bytes(t.dtype):
        return value.numpy()
    shape = tuple(value.shape())
    raw = np.frombuffer(ctypes.string_at(value.data_ptr(), value.tensor_size_in_bytes()), np.uint8)
    return unpack(raw, t, shape) if t.is_packed else raw.view(t.dtype).reshape(shape).copy()
