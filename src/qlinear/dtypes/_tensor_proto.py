"""numpy/ml_dtypes arrays to and from ``onnx.TensorProto``, every type.

Writing always uses ``raw_data`` (ONNX's packed layout for sub-byte types);
reading accepts ``raw_data`` and the typed fields that onnx and other
producers write (``int32_data`` carries one 8-bit float, or one packed byte of
a 2/4-bit type, or the 16 bits of a float16/bfloat16 per entry).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from onnx import TensorProto

from qlinear._errors import QuantizationError
from qlinear.dtypes._packing import pack, packed_size, unpack
from qlinear.dtypes._table import ElementType, element_type

__all__ = ["to_tensor_proto", "from_tensor_proto"]


def to_tensor_proto(a: Any, name: str = "") -> TensorProto:
    """An ``onnx.TensorProto`` holding array ``a`` in ``raw_data``.

    >>> import ml_dtypes
    >>> t = to_tensor_proto(np.array([1, -2, 3], dtype=ml_dtypes.int4), "w")
    >>> (t.data_type, t.raw_data)
    (22, b'\\xe1\\x03')

    Raises:
        QuantizationError: ``a`` is not a numpy array of a type qlinear knows.
    """
    if not isinstance(a, np.ndarray):
        raise QuantizationError(f"to_tensor_proto: a must be a numpy array, got {type(a).__name__}")
    t = element_type(a.dtype, what="to_tensor_proto: a.dtype")
    proto = TensorProto()
    proto.name = name
    proto.data_type = t.onnx_enum
    proto.dims.extend(a.shape)
    data = pack(a) if t.is_packed else np.ascontiguousarray(a).reshape(-1)
    if data.dtype.byteorder == ">":
        data = data.byteswap()
    proto.raw_data = data.view(np.uint8).tobytes()
    return proto


def from_tensor_proto(t: TensorProto) -> np.ndarray:
    """The array a ``TensorProto`` holds, with its ml_dtypes/numpy dtype.

    Reads ``raw_data`` or the typed fields. External data must already be
    loaded (``onnx.load`` does that by default).

    Raises:
        QuantizationError: unknown element type, data of the wrong size, or
            data stored externally and not loaded.
    """
    if not isinstance(t, TensorProto):
        raise QuantizationError(f"from_tensor_proto: t must be an onnx.TensorProto, got {type(t).__name__}")
    et = element_type(t.data_type, what=f"from_tensor_proto: tensor {t.name!r} data_type")
    shape = tuple(t.dims)
    count = math.prod(shape)
    if t.data_location == TensorProto.EXTERNAL:
        raise QuantizationError(
            f"from_tensor_proto: tensor {t.name!r} has external data that is not loaded; load the model with its data first"
        )
    if t.HasField("raw_data"):
        raw = np.frombuffer(t.raw_data, dtype=np.uint8)
        need = packed_size(count, et.bits)
        if raw.size != need:
            raise QuantizationError(
                f"from_tensor_proto: tensor {t.name!r} raw_data has {raw.size} bytes, expected {need} for shape {shape} of {et.name}"
            )
        if et.is_packed:
            return unpack(raw, et, shape)
        return raw.view(et.dtype.newbyteorder("<")).astype(et.dtype).reshape(shape)
    return _from_typed_fields(t, et, shape, count)


def _from_typed_fields(t: TensorProto, et: ElementType, shape: tuple[int, ...], count: int) -> np.ndarray:
    field = "float_data" if et.onnx_enum == TensorProto.FLOAT else "int32_data"
    entries = np.asarray(getattr(t, field))
    # 2/4-bit types keep one packed byte per entry; every other type one element.
    expected = packed_size(count, et.bits) if et.bits in (2, 4) else count
    if entries.size != expected:
        raise QuantizationError(
            f"from_tensor_proto: tensor {t.name!r} {field} has {entries.size} entries, expected {expected} for shape {shape} of {et.name}"
        )
    if field == "float_data":
        return entries.astype(np.float32).reshape(shape)
    entries = entries.astype(np.int64)
    if et.bits in (2, 4):
        return unpack((entries & 0xFF).astype(np.uint8), et, shape)
    if et.kind != "int":
        # float8/float6/float16/bfloat16 entries carry the element's bits.
        mask, carrier = (0xFFFF, np.uint16) if et.bits == 16 else ((1 << et.bits) - 1, np.uint8)
        return (entries & mask).astype(carrier).view(et.dtype).reshape(shape)
    return entries.astype(et.dtype).reshape(shape)
