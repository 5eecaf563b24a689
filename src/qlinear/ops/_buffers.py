"""Checks for the operators' buffer arguments: ``out=`` and packed bytes."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from qlinear._errors import QuantizationError
from qlinear.dtypes import ElementType, element_type, packed_size

__all__ = ["apart_from_out", "check_out", "check_packable", "packed_input"]


def check_out(out: Any, dtype: np.dtype, shape: tuple[int, ...], caller: str) -> np.ndarray | None:
    """``out`` if it can receive a result of ``dtype`` and ``shape`` in place."""
    if out is None:
        return None
    if not isinstance(out, np.ndarray):
        raise QuantizationError(f"{caller}: out must be a numpy array, got {type(out).__name__}")
    if out.dtype != dtype or out.shape != shape:
        raise QuantizationError(
            f"{caller}: out has dtype {out.dtype} and shape {out.shape}, expected {np.dtype(dtype)} and {shape}"
        )
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise QuantizationError(
            f"{caller}: out must be a writeable C-contiguous array, got a {'read-only' if not out.flags.writeable else 'non-contiguous'} one"
        )
    return out


def apart_from_out(out: np.ndarray | None, *arrays: np.ndarray | None) -> tuple[np.ndarray | None, ...]:
    """``arrays``, each copied if it may share memory with ``out``.

    A kernel writing ``out`` while it still reads an input that overlaps it
    would read its own results; a copy of such an input (only where the
    memory bounds overlap, so ordinary calls pay nothing) gives the result
    of the same call without aliasing.
    """
    if out is None:
        return arrays
    return tuple(a.copy() if a is not None and np.may_share_memory(a, out) else a for a in arrays)


def check_packable(t: ElementType, caller: str) -> None:
    """Only types narrower than a byte have a packed layout."""
    if not t.is_packed:
        raise QuantizationError(f"{caller}: packed=True needs a 2-, 4- or 6-bit output type, got {t}")


def packed_input(x: Any, packed_dtype: Any, shape: Any, caller: str) -> tuple[np.ndarray, np.ndarray, ElementType]:
    """Check packed bytes ``x`` of ``packed_dtype`` elements for ``shape``.

    Returns the flat bytes, a zero-size-in-memory stand-in array of the
    element type and shape (for validating the call without unpacking), and
    the element type.
    """
    t = element_type(packed_dtype, what=f"{caller}: packed_dtype")
    check_packable(t, caller)
    if shape is None:
        raise QuantizationError(f"{caller}: shape is required with packed_dtype={t.name}, got shape=None")
    try:
        shape = tuple(int(d) for d in shape)
    except TypeError:
        raise QuantizationError(f"{caller}: shape must be a sequence of ints, got {shape!r}") from None
    if any(d < 0 for d in shape):
        raise QuantizationError(f"{caller}: shape must have no negative dimension, got {shape}")
    if not isinstance(x, np.ndarray) or x.dtype != np.uint8:
        raise QuantizationError(
            f"{caller}: x must be a uint8 array of packed bytes with packed_dtype, got {getattr(x, 'dtype', type(x).__name__)}"
        )
    need = packed_size(math.prod(shape), t.bits)
    if x.size < need:
        raise QuantizationError(f"{caller}: x has {x.size} bytes, expected at least {need} for shape {shape} of packed {t.name}")
    stand_in = np.broadcast_to(np.zeros((), t.dtype), shape)
    return np.ascontiguousarray(x).reshape(-1)[:need], stand_in, t
