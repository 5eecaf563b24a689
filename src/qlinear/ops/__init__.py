"""The operators: validate a call into a plan, then run a kernel."""

from __future__ import annotations

from qlinear.ops._dequantize_linear import dequantize_linear
from qlinear.ops._dynamic_quantize_linear import dynamic_quantize_linear
from qlinear.ops._quantize_linear import quantize_linear

__all__ = ["dequantize_linear", "dynamic_quantize_linear", "quantize_linear"]
