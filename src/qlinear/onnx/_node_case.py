"""One Q/DQ node with its inputs: the unit every oracle can run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from qlinear.dtypes import element_type, from_tensor_proto, to_tensor_proto
from qlinear.ops import dequantize_linear, dynamic_quantize_linear, quantize_linear
from qlinear.spec import plan_dequantize, plan_quantize

__all__ = ["NodeCase", "node_case_from_model", "run_qlinear"]

_INPUT_NAMES = {
    "QuantizeLinear": ("x", "y_scale", "y_zero_point"),
    "DequantizeLinear": ("x", "x_scale", "x_zero_point"),
    "DynamicQuantizeLinear": ("x",),
}
_OUTPUT_NAMES = {
    "QuantizeLinear": ("y",),
    "DequantizeLinear": ("y",),
    "DynamicQuantizeLinear": ("y", "y_scale", "y_zero_point"),
}


@dataclass
class NodeCase:
    """A single-node model: operator, version, attributes and inputs.

    Attributes:
        name: a label for reports.
        op: ``QuantizeLinear``, ``DequantizeLinear`` or ``DynamicQuantizeLinear``.
        opset: the opset of ``domain`` the model imports.
        domain: ``""`` or ``"com.microsoft"``.
        inputs: the arrays, in the operator's input order (None: omitted).
        attributes: ONNX attributes as Python values (types as enums).
        expected: outputs the case says are right, if it carries them.
    """

    name: str
    op: str
    opset: int
    inputs: list[np.ndarray | None]
    attributes: dict[str, Any] = field(default_factory=dict)
    domain: str = ""
    expected: list[np.ndarray] | None = None

    def __post_init__(self) -> None:
        # numpy scalars become 0-d arrays: runtimes accept only arrays.
        self.inputs = [None if a is None else np.asarray(a) for a in self.inputs]

    def model(self, *, constant: Callable[[np.ndarray], bool] = lambda a: False, opset: int | None = None) -> onnx.ModelProto:
        """The case as an ONNX model.

        Args:
            constant: arrays for which it returns True become initializers
                instead of graph inputs (for runtimes that cannot be fed them).
            opset: import this opset instead of the case's own.
        """
        names = [n if a is not None else "" for n, a in zip(_INPUT_NAMES[self.op], self.inputs, strict=False)]
        while names and names[-1] == "":
            names.pop()
        node = helper.make_node(self.op, names, list(_OUTPUT_NAMES[self.op]), domain=self.domain, **self.attributes)
        present = [(n, a) for n, a in zip(names, self.inputs, strict=False) if n]
        graph_inputs = [
            helper.make_tensor_value_info(n, element_type(a.dtype).onnx_enum, a.shape) for n, a in present if not constant(a)
        ]
        initializers = [to_tensor_proto(a, n) for n, a in present if constant(a)]
        outputs = [
            helper.make_tensor_value_info(n, t, None) for n, t in zip(_OUTPUT_NAMES[self.op], self._output_types(), strict=True)
        ]
        graph = helper.make_graph([node], self.name.replace("/", "_"), graph_inputs, outputs, initializer=initializers)
        imports = [helper.make_opsetid(self.domain, opset or self.opset)]
        if self.domain:
            imports.append(helper.make_opsetid("", 21))
        model = helper.make_model(graph, opset_imports=imports)
        model.ir_version = 10
        return model

    def call_arguments(self) -> dict[str, Any]:
        """Keyword arguments of qlinear's operator functions for this case."""
        if self.op == "DynamicQuantizeLinear":
            return {}
        a = self.attributes
        kwargs = {
            "axis": a.get("axis", 1),
            "block_size": a.get("block_size", 0),
            "output_dtype": a.get("output_dtype"),
            "opset": self.opset,
            "domain": self.domain,
        }
        if self.op == "QuantizeLinear":
            kwargs.update(saturate=bool(a.get("saturate", 1)), precision=a.get("precision"))
        return kwargs

    def _output_types(self) -> list[int]:
        """ONNX element types of the outputs, as qlinear's spec decides them."""
        if self.op == "DynamicQuantizeLinear":
            return [TensorProto.UINT8, TensorProto.FLOAT, TensorProto.UINT8]
        if self.op == "QuantizeLinear":
            return [plan_quantize(*self.inputs, **self.call_arguments())[0].output_type.onnx_enum]
        return [element_type(plan_dequantize(*self.inputs, **self.call_arguments())[0].output_dtype).onnx_enum]

    def feeds(self, *, constant: Callable[[np.ndarray], bool] = lambda a: False) -> dict[str, np.ndarray]:
        """Graph inputs of :meth:`model` with the same ``constant``."""
        return {n: a for n, a in zip(_INPUT_NAMES[self.op], self.inputs, strict=False) if a is not None and not constant(a)}


def node_case_from_model(name: str, model: onnx.ModelProto, inputs: list[Any], outputs: list[Any] | None = None) -> NodeCase:
    """A :class:`NodeCase` from a one-node model and its data (arrays or TensorProtos)."""
    node = model.graph.node[0]
    domain = node.domain
    opset = next(o.version for o in model.opset_import if o.domain == domain)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}

    def array(v: Any) -> np.ndarray:
        return from_tensor_proto(v) if isinstance(v, onnx.TensorProto) else np.asarray(v)

    by_name = dict(zip([i.name for i in model.graph.input], inputs, strict=True))
    arrays = [array(by_name[n]) if n else None for n in node.input]
    arrays += [None] * (len(_INPUT_NAMES[node.op_type]) - len(arrays))
    expected = None if outputs is None else [array(o) for o in outputs]
    return NodeCase(name, node.op_type, opset, arrays, attrs, domain, expected)


def run_qlinear(case: NodeCase, backend: str = "auto") -> list[np.ndarray]:
    """Run ``case`` through qlinear's operator functions (on the operators' default backend unless told)."""
    if case.op == "DynamicQuantizeLinear":
        return list(dynamic_quantize_linear(case.inputs[0], backend=backend))
    function = quantize_linear if case.op == "QuantizeLinear" else dequantize_linear
    return [function(*case.inputs, **case.call_arguments(), backend=backend)]
