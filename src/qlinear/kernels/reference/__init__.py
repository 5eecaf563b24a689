"""Readable numpy kernels: the oracle every fast kernel is tested against."""

from __future__ import annotations

from qlinear.kernels.reference._dequantize import dequantize
from qlinear.kernels.reference._quantize import quantize

__all__ = ["dequantize", "quantize"]
