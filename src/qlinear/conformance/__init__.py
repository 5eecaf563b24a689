"""Conformance: a backend's QuantizeLinear/DequantizeLinear checked against the ONNX specification.

ONNX's own backend cases and generated edge cases, run on qlinear's
backends, onnx.reference and ONNX Runtime, each compared with an
independent model of the specification (``_spec_model``, exact rationals).
"""

from __future__ import annotations

from qlinear.conformance._edge_cases import generated_cases
from qlinear.conformance._run import ConformanceReport, backend_cases, run_conformance

__all__ = ["ConformanceReport", "backend_cases", "generated_cases", "run_conformance"]
