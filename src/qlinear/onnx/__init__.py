"""ONNX graphs holding QuantizeLinear/DequantizeLinear nodes: build, save, load, inspect, run.

Conformance checks live in :mod:`qlinear.conformance`; ``run_conformance``,
``backend_cases``, ``generated_cases`` and ``ConformanceReport`` are still
read from here (loaded when first used).
"""

from __future__ import annotations

from qlinear.onnx._graph import DEFAULT_OPSET, Graph
from qlinear.onnx._io import DEFAULT_EXTERNAL_THRESHOLD, load, save
from qlinear.onnx._node_case import NodeCase
from qlinear.onnx._run import BACKENDS, run
from qlinear.onnx._tensor_info import TensorInfo

__all__ = [
    "NodeCase",
    "BACKENDS",
    "DEFAULT_EXTERNAL_THRESHOLD",
    "DEFAULT_OPSET",
    "Graph",
    "TensorInfo",
    "load",
    "run",
    "save",
]

_MOVED = {"ConformanceReport", "backend_cases", "generated_cases", "run_conformance"}


def __getattr__(name: str):
    if name in _MOVED:  # the older spelling, qlinear.onnx.run_conformance
        import qlinear.conformance

        return getattr(qlinear.conformance, name)
    raise AttributeError(f"module 'qlinear.onnx' has no attribute {name!r}")
