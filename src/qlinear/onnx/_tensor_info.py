"""What a graph knows about a tensor before it runs: element type and shape."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from qlinear._errors import QuantizationError
from qlinear.dtypes import element_type

__all__ = ["Dim", "TensorInfo", "onnx_type_enum"]

# A dimension is a size, a symbolic name, or None when nothing is known.
Dim = int | str | None


@dataclass(frozen=True)
class TensorInfo:
    """Element type and (symbolic) shape of one tensor in a graph.

    Attributes:
        elem_type: the ``onnx.TensorProto`` enum; 0 when unknown.
        shape: sizes or symbolic names per dimension; ``None`` when even the
            rank is unknown.
    """

    elem_type: int
    shape: tuple[Dim, ...] | None

    @classmethod
    def from_type_proto(cls, t: onnx.TypeProto) -> TensorInfo:
        """The info a ``TypeProto`` (from a value_info or inference) carries."""
        if not t.HasField("tensor_type"):
            return cls(0, None)
        tensor = t.tensor_type
        if not tensor.HasField("shape"):
            return cls(tensor.elem_type, None)
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim)
        return cls(tensor.elem_type, dims)

    @classmethod
    def of_array(cls, a: np.ndarray) -> TensorInfo:
        return cls(onnx_type_enum(a.dtype, what="array dtype"), tuple(a.shape))

    def type_proto(self) -> onnx.TypeProto:
        return helper.make_tensor_type_proto(self.elem_type, self.shape)

    def value_info(self, name: str) -> onnx.ValueInfoProto:
        return helper.make_value_info(name, self.type_proto())

    @property
    def type_name(self) -> str:
        """ONNX's name for the element type (``"float"``, ``"int4"``)."""
        if not self.elem_type:
            return "unknown"
        return helper.tensor_dtype_to_string(self.elem_type).removeprefix("TensorProto.").lower().replace("_", "")


def onnx_type_enum(dtype: object, *, what: str) -> int:
    """The TensorProto enum for a qlinear type or any type numpy and onnx share."""
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        if int(dtype) not in onnx.TensorProto.DataType.values():
            raise QuantizationError(f"{what}: expected a TensorProto data type, got {dtype!r}")
        return int(dtype)
    try:
        return element_type(dtype, what=what).onnx_enum
    except QuantizationError:
        try:
            return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        except (TypeError, KeyError):
            raise QuantizationError(f"{what}: expected an ONNX type name, TensorProto enum or dtype, got {dtype!r}") from None
