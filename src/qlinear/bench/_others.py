"""The same node in ONNX Runtime and in onnx's reference evaluator.

Each case becomes a one-node model (QuantizeLinear or DequantizeLinear) with
the scale and zero point as initializers. Where ONNX Runtime cannot hand the
quantized type to or from numpy (float8, 4- and 2-bit types), the model is
a QuantizeLinear followed by a DequantizeLinear, timed as a pair.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from qlinear.bench._cases import Case
from qlinear.dtypes import to_tensor_proto

__all__ = ["onnx_model", "ort_runner", "reference_runner"]


# ONNX's element type of each x the benchmark takes.
_X_TENSOR_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}


def onnx_model(case: Case, x: np.ndarray, scale: np.ndarray, zp: np.ndarray, *, pair: bool) -> onnx.ModelProto:
    """One-node model for ``case`` (or the Q+DQ pair), opset as old as the type allows; x and y of x's type."""
    t = case.element
    wide = _X_TENSOR_TYPES[x.dtype.name]
    attrs = {"axis": case.axis}
    if case.block_size:
        attrs["block_size"] = case.block_size
    inits = [to_tensor_proto(scale, "scale"), to_tensor_proto(zp, "zp")]
    float_info = helper.make_tensor_value_info
    if case.op == "Q" or pair:
        nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"], **attrs)]
        inputs = [float_info("x", wide, x.shape)]
        if pair:
            nodes.append(helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["y"], **attrs))
            outputs = [float_info("y", wide, x.shape)]
        else:
            outputs = [float_info("q", t.onnx_enum, x.shape)]
    else:
        nodes = [helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["y"], **attrs)]
        inputs = [float_info("q", t.onnx_enum, x.shape)]
        outputs = [float_info("y", wide, x.shape)]
    graph = helper.make_graph(nodes, "bench", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset())])
    model.ir_version = 10
    return model


def ort_runner(
    case: Case, x: np.ndarray, q: np.ndarray, scale: np.ndarray, zp: np.ndarray, threads: int
) -> tuple[Callable[[], object] | None, str]:
    """A call running ``case`` in ONNX Runtime, and how: ``"node"``, ``"Q+DQ pair"`` or why not."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None, "not installed"
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep the pair from being folded away
    reason = "unsupported"
    for pair in (False, True):
        try:
            session = ort.InferenceSession(
                onnx_model(case, x, scale, zp, pair=pair).SerializeToString(), options, providers=["CPUExecutionProvider"]
            )
            feed = {"x": x} if case.op == "Q" or pair else {"q": q}
            session.run(None, feed)
        except Exception as error:  # ORT reports missing kernels and type gaps with several exception types
            reason = "unsupported" if "NOT_IMPLEMENTED" in str(error) or "ONNX Runtime only" in str(error) else reason
            continue
        return (lambda s=session, f=feed: s.run(None, f)), "Q+DQ pair" if pair else "node"
    return None, reason


def reference_runner(case: Case, x: np.ndarray, q: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> Callable[[], object] | None:
    """A call running ``case``'s node in ``onnx.reference.ReferenceEvaluator``, or None if it cannot."""
    from onnx.reference import ReferenceEvaluator

    try:
        evaluator = ReferenceEvaluator(onnx_model(case, x, scale, zp, pair=False))
    except Exception:  # an operator version the installed onnx lacks
        return None
    feed = {"x": x} if case.op == "Q" else {"q": q}
    return lambda: evaluator.run(None, feed)
