"""Element types: every quantized, scale and input type, and their ONNX storage."""

from __future__ import annotations

from qlinear.dtypes._packing import pack, packed_size, unpack
from qlinear.dtypes._rounding import round_to
from qlinear.dtypes._table import ELEMENT_TYPES, ElementType, element_type
from qlinear.dtypes._tensor_proto import from_tensor_proto, to_tensor_proto

__all__ = [
    "ELEMENT_TYPES",
    "ElementType",
    "element_type",
    "from_tensor_proto",
    "pack",
    "packed_size",
    "round_to",
    "to_tensor_proto",
    "unpack",
]
