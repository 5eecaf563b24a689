"""One Q/DQ node with its inputs: the unit every oracle can run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper

from qlinear.dtypes import element_type, from_tensor_proto, to_tensor_proto
from qlinear.ops import dequantize_linear, dynamic_quantize_linear, quantize_linear

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

    def model(self) -> onnx.ModelProto:
        """The case as an ONNX model with graph inputs for every array."""
        names = [n if a is not None else "" for n, a in zip(_INPUT_NAMES[self.op], self.inputs)]
        while names and names[-1] == "":
            names.pop()
        node = helper.make_node(self.op, names, list(_OUTPUT_NAMES[self.op]), domain=self.domain, **self.attributes)
        graph_inputs = [
            helper.make_tensor_value_info(n, element_type(a.dtype).onnx_enum, a.shape)
            for n, a in zip(names, self.inputs) if n
        ]
        outputs = [helper.make_tensor_value_info(n, 0, None) for n in _OUTPUT_NAMES[self.op]]
        graph = helper.make_graph([node], self.name, graph_inputs, outputs)
        imports = [helper.make_opsetid(self.domain, self.opset)]
        if self.domain:
            imports.append(helper.make_opsetid("", 21))
        model = helper.make_model(graph, opset_imports=imports)
        model.ir_version = 10
        return model

    def feeds(self) -> dict[str, np.ndarray]:
        return {n: a for n, a in zip(_INPUT_NAMES[self.op], self.inputs) if a is not None}


def node_case_from_model(name: str, model: onnx.ModelProto, inputs: list[Any], outputs: list[Any] | None = None) -> NodeCase:
    """A :class:`NodeCase` from a one-node model and its data (arrays or TensorProtos)."""
    node = model.graph.node[0]
    domain = node.domain
    opset = next(o.version for o in model.opset_import if o.domain == domain)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}

    def array(v: Any) -> np.ndarray:
        return from_tensor_proto(v) if isinstance(v, onnx.TensorProto) else np.asarray(v)

    by_name = dict(zip([i.name for i in model.graph.input], inputs))
    arrays = [array(by_name[n]) if n else None for n in node.input]
    arrays += [None] * (len(_INPUT_NAMES[node.op_type]) - len(arrays))
    expected = None if outputs is None else [array(o) for o in outputs]
    return NodeCase(name, node.op_type, opset, arrays, attrs, domain, expected)


def run_qlinear(case: NodeCase, backend: str = "reference") -> list[np.ndarray]:
    """Run ``case`` through qlinear's operator functions."""
    a = dict(case.attributes)
    common = {"opset": case.opset, "domain": case.domain, "backend": backend}
    if case.op == "DynamicQuantizeLinear":
        return list(dynamic_quantize_linear(case.inputs[0], backend=backend))
    if "axis" in a:
        common["axis"] = a.pop("axis")
    if "block_size" in a:
        common["block_size"] = a.pop("block_size")
    if "output_dtype" in a:
        common["output_dtype"] = a.pop("output_dtype")
    if case.op == "QuantizeLinear":
        if "saturate" in a:
            common["saturate"] = bool(a.pop("saturate"))
        if "precision" in a:
            common["precision"] = a.pop("precision")
        return [quantize_linear(*case.inputs, **common)]
    return [dequantize_linear(*case.inputs, **common)]
