"""Kernels by name; a plan is computed by whichever backend the caller picks.

Every backend is a module with ``quantize(plan, x, scale, zero_point)`` and
``dequantize(plan, x, scale, zero_point)``. A backend that also writes into a
caller's buffer and reads and writes ONNX's packed bytes itself takes
``out=`` and ``packed=`` keywords and says so with ``FUSED_OUTPUT = True``;
:func:`quantize` and :func:`dequantize` here give every backend those
keywords, doing the packing and copying around the others.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from qlinear._errors import QuantizationError
from qlinear.dtypes import pack, unpack
from qlinear.kernels import cpu, reference
from qlinear.spec import DequantizePlan, QuantizePlan

__all__ = ["BACKENDS", "backend", "quantize", "dequantize"]

BACKENDS: dict[str, ModuleType] = {"cpu": cpu, "reference": reference}


def backend(name: str, *, caller: str) -> ModuleType:
    """The kernel module registered as ``name``."""
    try:
        return BACKENDS[name]
    except (KeyError, TypeError):
        raise QuantizationError(f"{caller}: backend must be one of {sorted(BACKENDS)}, got {name!r}") from None


def _deliver(y: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if out is None:
        return y
    out[...] = y.reshape(out.shape)
    return out


def quantize(name: str, plan: QuantizePlan, x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None, *,
             out: np.ndarray | None, packed: bool, caller: str) -> np.ndarray:
    """QuantizeLinear on backend ``name``, into ``out`` and/or packed if asked."""
    module = backend(name, caller=caller)
    if getattr(module, "FUSED_OUTPUT", False):
        return module.quantize(plan, x, scale, zero_point, out=out, packed=packed)
    y = module.quantize(plan, x, scale, zero_point)
    return _deliver(pack(y) if packed else y, out)


def dequantize(name: str, plan: DequantizePlan, x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None, *,
               out: np.ndarray | None, packed: bool, caller: str) -> np.ndarray:
    """DequantizeLinear on backend ``name``; ``x`` is packed bytes if ``packed``."""
    module = backend(name, caller=caller)
    if getattr(module, "FUSED_OUTPUT", False):
        return module.dequantize(plan, x, scale, zero_point, out=out, packed=packed)
    if packed:
        x = unpack(x, plan.input_type, plan.x_shape)
    return _deliver(module.dequantize(plan, x, scale, zero_point), out)
