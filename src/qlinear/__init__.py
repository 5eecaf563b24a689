"""qlinear: ONNX linear quantization, exact to the specification.

>>> import numpy as np, qlinear
>>> qlinear.quantize_linear(np.array([1.0, -3.5], np.float32), np.float32(0.5), np.int8(0)).tolist()
[2, -7]
"""

from __future__ import annotations

import qlinear._builtins  # noqa: F401 - first: the true min/max for numba (see the module)
from qlinear._errors import QuantizationError
from qlinear.dtypes import from_tensor_proto, pack, to_tensor_proto, unpack
from qlinear.ops import dequantize_linear, dynamic_quantize_linear, quantize_linear

__all__ = [
    "QuantizationError",
    "dequantize_linear",
    "dynamic_quantize_linear",
    "from_tensor_proto",
    "pack",
    "quantize_linear",
    "to_tensor_proto",
    "unpack",
]

__version__ = "0.1.0"
