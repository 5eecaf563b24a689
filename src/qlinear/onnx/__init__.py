"""ONNX graphs holding QuantizeLinear/DequantizeLinear nodes: build, save, load, inspect, run; and conformance."""

from __future__ import annotations

from qlinear.onnx._conformance import ConformanceReport, backend_cases, run_conformance
from qlinear.onnx._edge_cases import generated_cases
from qlinear.onnx._graph import DEFAULT_OPSET, Graph
from qlinear.onnx._io import DEFAULT_EXTERNAL_THRESHOLD, load, save
from qlinear.onnx._node_case import NodeCase
from qlinear.onnx._run import BACKENDS, run
from qlinear.onnx._tensor_info import TensorInfo

__all__ = [
    "ConformanceReport",
    "NodeCase",
    "backend_cases",
    "generated_cases",
    "run_conformance",
    "BACKENDS",
    "DEFAULT_EXTERNAL_THRESHOLD",
    "DEFAULT_OPSET",
    "Graph",
    "TensorInfo",
    "load",
    "run",
    "save",
]
