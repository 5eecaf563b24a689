"""Run a :class:`NodeCase` through the independent implementations.

Each runner returns the outputs, or raises :class:`Unsupported` when that
implementation cannot run the case at all (no kernel, opset too new).
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
from onnx import helper

from qlinear._errors import QuantizationError
from qlinear.conformance import _spec_model
from qlinear.dtypes import element_type
from qlinear.onnx._node_case import NodeCase
from qlinear.spec import plan_dequantize, plan_quantize

__all__ = ["Unsupported", "run_spec_model", "run_onnx_reference", "run_onnxruntime", "same"]


class Unsupported(Exception):
    """The implementation has no way to run this case."""


def run_spec_model(case: NodeCase) -> list[np.ndarray]:
    """The case through qlinear's element-by-element transcription of the spec."""
    if case.op == "DynamicQuantizeLinear":
        return list(_spec_model.dynamic_quantize(case.inputs[0]))
    if case.op == "QuantizeLinear":
        return [_spec_model.quantize(*plan_quantize(*case.inputs, **case.call_arguments()))]
    return [_spec_model.dequantize(*plan_dequantize(*case.inputs, **case.call_arguments()))]


def run_onnx_reference(case: NodeCase) -> list[np.ndarray]:
    """The case through ``onnx.reference.ReferenceEvaluator``."""
    from onnx.reference import ReferenceEvaluator

    if case.domain:
        raise Unsupported("the onnx reference evaluator has no com.microsoft operators")
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return [np.asarray(o) for o in ReferenceEvaluator(case.model()).run(None, case.feeds())]


# ONNX Runtime's newest ai.onnx opset; later cases run at it when the
# operator version in force there admits the case unchanged.
_ORT_NEWEST_OPSET = 25


def _numpy_native(a: np.ndarray) -> bool:
    return a.dtype.kind in "fiu" and a.dtype.type.__module__ == "numpy" and a.dtype != np.float64


def run_onnxruntime(case: NodeCase) -> list[np.ndarray]:
    """The case through ONNX Runtime's CPU provider, if it has a kernel.

    ORT's Python binding takes and returns only numpy's own dtypes, so
    inputs of other types become initializers and an output of another type
    is read through a DequantizeLinear with scale 1, which is exact for
    every quantized type.
    """
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise Unsupported("onnxruntime is not installed") from e
    opset = case.opset
    if not case.domain and opset > _ORT_NEWEST_OPSET:
        older = NodeCase(case.name, case.op, _ORT_NEWEST_OPSET, case.inputs, case.attributes, case.domain)
        try:
            older.call_arguments() and older.model()
        except QuantizationError as e:
            raise Unsupported(f"onnxruntime runs ai.onnx up to opset {_ORT_NEWEST_OPSET}; the case needs {case.opset}") from e
        opset = _ORT_NEWEST_OPSET
    constant = lambda a: not _numpy_native(a)  # noqa: E731
    model = case.model(constant=constant, opset=opset)
    widened = _widen_outputs(model)
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        outputs = session.run(None, case.feeds(constant=constant))
    except Exception as e:  # ORT reports a missing kernel or opset as a generic failure
        raise Unsupported(str(e).splitlines()[0][:160]) from e
    return [np.asarray(o).astype(widened[i]) if i in widened else np.asarray(o) for i, o in enumerate(outputs)]


def _widen_outputs(model: onnx.ModelProto) -> dict[int, np.dtype]:
    """Route outputs numpy cannot hold through DequantizeLinear(scale=1).

    Returns the original dtype of each rerouted output, by position.
    """
    widened = {}
    for i, out in enumerate(model.graph.output):
        dtype = element_type(out.type.tensor_type.elem_type).dtype
        if _numpy_native(np.empty(0, dtype)):
            continue
        widened[i] = dtype
        raw = out.name + "_quantized"
        model.graph.node[0].output[i] = raw
        one = helper.make_tensor(out.name + "_one", onnx.TensorProto.FLOAT, [], [1.0])
        model.graph.initializer.append(one)
        model.graph.node.append(helper.make_node("DequantizeLinear", [raw, one.name], [out.name]))
        out.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    return widened


def same(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal type, shape and bits; any NaN matches any NaN (the spec names
    no NaN payload)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    g, w = got.reshape(-1), want.reshape(-1)
    bits_equal = g.view(np.uint8).reshape(g.size, -1) == w.view(np.uint8).reshape(w.size, -1) if g.size else np.ones((0, 1), bool)
    equal = bits_equal.all(axis=1)
    if got.dtype.kind in "iub" or got.dtype.itemsize == 0:
        return bool(equal.all())
    with np.errstate(all="ignore"):
        both_nan = np.isnan(g.astype(np.float32)) & np.isnan(w.astype(np.float32))
    return bool((equal | both_nan).all())
