"""ONNX's byte layout for sub-byte element types.

ONNX stores 4-bit types two to a byte and 2-bit types four to a byte, the
first element in the lowest bits; 6-bit floats go four to three bytes, again
lowest bits first. The element count is not stored, so ``unpack`` needs the
shape.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from qlinear._errors import QuantizationError
from qlinear.dtypes._table import element_type

__all__ = ["pack", "unpack", "packed_size"]


def packed_size(count: int, bits: int) -> int:
    """Bytes ONNX needs for ``count`` elements of ``bits`` bits each."""
    return -(-count * bits // 8)


def _codes(a: np.ndarray, bits: int) -> np.ndarray:
    """The raw bit patterns of ``a``'s elements as one flat uint8 array."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8) & np.uint8((1 << bits) - 1)


def pack(a: Any) -> np.ndarray:
    """Pack an array of a sub-byte type into ONNX's byte layout.

    Element ``i`` of a 4-bit array goes to bits ``4*(i%2)`` of byte ``i//2``;
    2-bit elements go to bits ``2*(i%4)`` of byte ``i//4``; 6-bit elements go
    four to three bytes, lowest bits first. Types of 8 bits or more are
    returned as their little-endian bytes.

    >>> import ml_dtypes
    >>> pack(np.array([1, -1, 3], dtype=ml_dtypes.int4)).tolist()
    [241, 3]

    Raises:
        QuantizationError: ``a`` is not an array of a type qlinear knows.
    """
    if not isinstance(a, np.ndarray):
        raise QuantizationError(f"pack: a must be a numpy array, got {type(a).__name__}")
    bits = element_type(a.dtype, what="pack: a.dtype").bits
    if bits >= 8:
        return np.ascontiguousarray(a).reshape(-1).view(np.uint8).copy()
    codes = _codes(a, bits)
    per_byte = 8 // bits if bits in (2, 4) else None
    if per_byte is not None:
        padded = np.zeros(packed_size(codes.size, bits) * per_byte, dtype=np.uint8)
        padded[: codes.size] = codes
        lanes = padded.reshape(-1, per_byte)
        out = lanes[:, 0].copy()
        for lane in range(1, per_byte):
            out |= lanes[:, lane] << np.uint8(bits * lane)
        return out
    # 6 bits: four codes make one 24-bit little-endian word.
    groups = np.zeros(math.ceil(codes.size / 4) * 4, dtype=np.uint32)
    groups[: codes.size] = codes
    g = groups.reshape(-1, 4)
    word = g[:, 0] | (g[:, 1] << 6) | (g[:, 2] << 12) | (g[:, 3] << 18)
    out = np.stack([word & 0xFF, (word >> 8) & 0xFF, (word >> 16) & 0xFF], axis=1).astype(np.uint8)
    return out.reshape(-1)[: packed_size(codes.size, bits)]


def unpack(buf: Any, dtype: Any, shape: Any) -> np.ndarray:
    """Unpack ONNX's bytes for ``dtype`` into an array of ``shape``.

    The inverse of :func:`pack`; ``buf`` is a uint8 array or ``bytes``.

    >>> import ml_dtypes
    >>> unpack(np.array([241, 3], np.uint8), "int4", (3,)).astype(int).tolist()
    [1, -1, 3]

    Raises:
        QuantizationError: ``buf`` holds fewer bytes than ``shape`` needs.
    """
    t = element_type(dtype, what="unpack: dtype")
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    count = math.prod(shape)
    data = (
        np.frombuffer(buf, dtype=np.uint8)
        if isinstance(buf, (bytes, bytearray, memoryview))
        else np.asarray(buf).reshape(-1).view(np.uint8)
    )
    need = packed_size(count, t.bits)
    if data.size < need:
        raise QuantizationError(f"unpack: buf has {data.size} bytes, expected at least {need} for {count} {t.name} elements")
    if t.bits >= 8:
        return data[:need].view(t.dtype).reshape(shape).copy()
    if t.bits in (2, 4):
        per_byte = 8 // t.bits
        shifts = (np.arange(per_byte, dtype=np.uint8) * np.uint8(t.bits))[None, :]
        codes = ((data[:need, None] >> shifts) & np.uint8((1 << t.bits) - 1)).reshape(-1)[:count]
    else:
        groups = np.zeros(math.ceil(count / 4) * 3, dtype=np.uint32)
        groups[:need] = data[:need]
        g = groups.reshape(-1, 3)
        word = g[:, 0] | (g[:, 1] << 8) | (g[:, 2] << 16)
        codes = np.stack([(word >> s) & 0x3F for s in (0, 6, 12, 18)], axis=1).astype(np.uint8).reshape(-1)[:count]
    return codes.view(t.dtype).reshape(shape)
