"""Kernels by name; a plan is computed by whichever backend the caller picks.

Every backend is a module with ``quantize(plan, x, scale, zero_point)`` and
``dequantize(plan, x, scale, zero_point)``.
"""

from __future__ import annotations

from types import ModuleType

from qlinear._errors import QuantizationError
from qlinear.kernels import reference

__all__ = ["BACKENDS", "backend"]

BACKENDS: dict[str, ModuleType] = {"reference": reference}


def backend(name: str, *, caller: str) -> ModuleType:
    """The kernel module registered as ``name``."""
    try:
        return BACKENDS[name]
    except (KeyError, TypeError):
        raise QuantizationError(f"{caller}: backend must be one of {sorted(BACKENDS)}, got {name!r}") from None
