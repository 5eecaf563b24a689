"""Post-training quantization of float ONNX models into standard QDQ models.

:func:`quantize_model` runs the stages (:mod:`._stages`: load and resolve the
configuration, prepare, float rewrites, calibrate, build, meet the accuracy
target, refine, finalize for the target, evaluate, report, write); the
runtime's rules are a target (:mod:`.targets`), each algorithm a module
behind :mod:`.algorithms`; ``qlinear quantize`` is its command line.
docs/explanation/architecture.md draws the whole.
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
from qlinear.quantize._report import report_json
from qlinear.quantize._report_print import print_report
from qlinear.quantize._report_schema import Report
from qlinear.quantize._stats import TensorStats
from qlinear.quantize._stream import StreamResult, quantize_weights_streaming, streaming_choice

__all__ = [
    "quantize_model",
    "quantize_weights_streaming",
    "streaming_choice",
    "StreamResult",
    "QuantizeOptions",
    "QuantizeResult",
    "Report",
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
