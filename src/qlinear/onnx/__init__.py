"""ONNX graphs holding QuantizeLinear/DequantizeLinear nodes, and conformance."""

from __future__ import annotations

from qlinear.onnx._conformance import ConformanceReport, backend_cases, run_conformance
from qlinear.onnx._edge_cases import generated_cases
from qlinear.onnx._node_case import NodeCase

__all__ = [
    "ConformanceReport",
    "NodeCase",
    "backend_cases",
    "generated_cases",
    "run_conformance",
]
