"""Run a model: Q/DQ nodes by qlinear's operators, the rest by onnx's reference evaluator.

Backends:

- ``"qlinear"``: ``onnx.reference.ReferenceEvaluator`` with qlinear's
  QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear plugged in as
  custom operators for the ai.onnx and com.microsoft domains, so every type
  and version qlinear knows runs, and every other operator runs as onnx
  defines it.
- ``"onnxruntime"``: ONNX Runtime's CPU provider with graph optimizations
  off, so its Q/DQ kernels run as the graph says instead of fused integer
  kernels.
- ``"onnxruntime+qlinear"``: ONNX Runtime for the graph, and qlinear's
  operators for the Q/DQ nodes whose types ONNX Runtime has no kernel for
  (int2, float4, float6, ...): computed once where their inputs are
  constants (weights), else run between ONNX Runtime segments
  (:mod:`._ort_with_qlinear`). Bit for bit what ``"qlinear"`` gives on Q/DQ graphs,
  at ONNX Runtime's speed for the rest.
- ``"reference"``: onnx's reference evaluator alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from os import PathLike
from typing import Any

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from qlinear._errors import QuantizationError
from qlinear.onnx._analysis import check_model
from qlinear.onnx._io import load
from qlinear.onnx._large import inline
from qlinear.onnx._ort_values import from_ort_value, to_ort_value
from qlinear.onnx._ort_with_qlinear import MixedRunner
from qlinear.onnx._qlinear_nodes import QLINEAR_OPS

__all__ = ["BACKENDS", "run"]

BACKENDS = ("qlinear", "onnxruntime", "onnxruntime+qlinear", "reference")


def run(
    model: onnx.ModelProto | str | PathLike[str],
    feeds: Mapping[str, Any],
    *,
    backend: str = "qlinear",
    output_names: Sequence[str] | None = None,
) -> dict[str, np.ndarray]:
    """Run ``model`` on ``feeds`` and return its outputs by name.

    Args:
        model: a ModelProto or the path of a model file.
        feeds: an array for each graph input (ml_dtypes arrays for int4,
            float8 and the other low-precision types).
        backend: ``"qlinear"``, ``"onnxruntime"``, ``"onnxruntime+qlinear"``
            or ``"reference"``.
        output_names: graph outputs to return; default all.

    Returns:
        ``{name: array}`` in the order asked for; quantized outputs carry
        their ml_dtypes type on every backend.

    Raises:
        QuantizationError: a node the model's opset does not allow, a
            missing input or a type mismatch (the node named), a missing
            feed, or an unknown backend.

    >>> from qlinear.onnx import Graph
    >>> g = Graph(opset=21); x = g.input("x", "float", (3,))
    >>> g.output(g.quantize_linear(x, np.float32(0.5), np.int8(0), output_names=["y"]))
    >>> run(g.to_model(), {"x": np.array([1.0, -2.2, 100.0], np.float32)})["y"].tolist()
    [2, -4, 127]
    """
    if backend not in BACKENDS:
        raise QuantizationError(f"run: backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if not isinstance(model, onnx.ModelProto):
        model = load(model)
    model = inline(model)  # weights a quantizer keeps beside a large model's graph
    check_model(model)
    graph_outputs = [o.name for o in model.graph.output]
    names = list(output_names) if output_names is not None else graph_outputs
    unknown = [n for n in names if n not in graph_outputs]
    if unknown:
        raise QuantizationError(f"run: output_names must be graph outputs ({', '.join(graph_outputs)}), got {unknown}")
    initializers = {t.name for t in model.graph.initializer}
    needed = [i.name for i in model.graph.input if i.name not in initializers]
    missing = [n for n in needed if n not in feeds]
    if missing:
        raise QuantizationError(f"run: feeds must hold every graph input; missing {', '.join(missing)}")
    arrays = {n: np.asarray(feeds[n]) for n in needed}
    if backend == "onnxruntime":
        values = _run_onnxruntime(model, arrays, names)
    elif backend == "onnxruntime+qlinear":
        got = MixedRunner(model)(arrays, names)
        values = [got[n] for n in names]
    else:
        evaluator = ReferenceEvaluator(model, new_ops=QLINEAR_OPS if backend == "qlinear" else None)
        values = evaluator.run(names, arrays)
    return dict(zip(names, values, strict=True))


def _run_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray], names: list[str]) -> list[np.ndarray]:
    try:
        import onnxruntime as ort
    except ImportError:
        raise QuantizationError("run: backend='onnxruntime' needs ONNX Runtime: pip install onnxruntime") from None

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4  # its errors come back as exceptions; no duplicate log lines
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        values = session.run_with_ort_values(names, {n: to_ort_value(a) for n, a in feeds.items()})
    except Exception as e:  # ONNX Runtime raises its own exception types
        raise QuantizationError(f"run: ONNX Runtime failed: {str(e).strip().splitlines()[0]}") from None
    return [from_ort_value(v) for v in values]
