"""Post-training quantization of float ONNX models into standard QDQ models.

A pipeline of small passes (DESIGN.md): load, prepare, plan, calibrate,
choose, convert, check fusion, evaluate, report. :func:`quantize_model`
runs them; ``qlinear quantize`` is its command line.
"""

from __future__ import annotations

from qlinear.quantize._options import (
    ACTIVATION_TYPES,
    DEFAULT_AGREEMENT,
    DEFAULT_SQNR_DB,
    GRANULARITIES,
    METHODS,
    WEIGHT_TYPES,
    QuantizeOptions,
)
from qlinear.quantize._pipeline import QuantizeResult, quantize_model
from qlinear.quantize._report import print_report, report_json
from qlinear.quantize._stats import TensorStats
from qlinear.quantize._stream import StreamResult, quantize_weights_streaming

__all__ = [
    "quantize_model",
    "quantize_weights_streaming",
    "StreamResult",
    "QuantizeOptions",
    "QuantizeResult",
    "TensorStats",
    "print_report",
    "report_json",
    "ACTIVATION_TYPES",
    "DEFAULT_AGREEMENT",
    "DEFAULT_SQNR_DB",
    "GRANULARITIES",
    "METHODS",
    "WEIGHT_TYPES",
]
