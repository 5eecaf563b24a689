"""qlinear: ONNX linear quantization, exact to the specification.

>>> import numpy as np, qlinear
>>> qlinear.quantize_linear(np.array([1.0, -3.5], np.float32), np.float32(0.5), np.int8(0)).tolist()
[2, -7]
"""

from __future__ import annotations

import importlib

import qlinear._builtins  # noqa: F401 - first: the true min/max for numba (see the module)
from qlinear._errors import QuantizationError

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

# Where each function of the package's API lives. They are imported on first use: numpy, ml_dtypes and the kernels
# load then, not when ``qlinear`` does, so the command line is in its own code (where Ctrl-C is one line) within
# milliseconds of starting.
_LAZY = {
    "dequantize_linear": "qlinear.ops",
    "dynamic_quantize_linear": "qlinear.ops",
    "from_tensor_proto": "qlinear.dtypes",
    "pack": "qlinear.dtypes",
    "quantize_linear": "qlinear.ops",
    "to_tensor_proto": "qlinear.dtypes",
    "unpack": "qlinear.dtypes",
}


def __getattr__(name: str) -> object:
    """A function of the API, or a subpackage (``qlinear.kernels``), imported where it is first read."""
    where = _LAZY.get(name)
    if where is not None:
        value = getattr(importlib.import_module(where), name)
        globals()[name] = value  # once: later reads find it without this function
        return value
    if not name.startswith("_"):
        try:
            return importlib.import_module(f"{__name__}.{name}")  # the import sets it on this module too
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":  # a module it imports is missing: that is the error to see
                raise
    raise AttributeError(f"module 'qlinear' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
