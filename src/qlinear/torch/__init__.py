"""Training through quantization in PyTorch, and exact QDQ export.

Install with ``pip install qlinear[torch]``. Quantized values are float32
tensors holding the exact values of the quantized type; forward results are
bit-identical to :func:`qlinear.quantize_linear` and
:func:`qlinear.dequantize_linear` on CPU and CUDA.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError:
    raise ImportError("qlinear.torch needs PyTorch: pip install 'qlinear[torch]'") from None

from qlinear.torch._export import export_onnx
from qlinear.torch._functional import dequantize_linear, fake_quantize, quantize_linear
from qlinear.torch._modules import DequantizeLinear, FakeQuantize, QuantizeLinear
from qlinear.torch._wrap import QuantConfig, QuantizedModule, QuantSpec, quantize_modules

__all__ = [
    "quantize_linear",
    "dequantize_linear",
    "fake_quantize",
    "QuantizeLinear",
    "DequantizeLinear",
    "FakeQuantize",
    "QuantSpec",
    "QuantConfig",
    "QuantizedModule",
    "quantize_modules",
    "export_onnx",
]
