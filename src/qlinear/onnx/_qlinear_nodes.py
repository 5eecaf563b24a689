"""Q/DQ nodes of a graph computed by qlinear's operators: one node, and as onnx's reference evaluator's operators.

``backend="qlinear"`` plugs :data:`QLINEAR_OPS` into
``onnx.reference.ReferenceEvaluator``; ``backend="onnxruntime+qlinear"``
runs the nodes ONNX Runtime has no kernel for with :func:`run_node`, and a
segment ONNX Runtime will not load on the evaluator with :data:`QLINEAR_OPS`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.reference.op_run import OpRun

from qlinear._errors import QuantizationError
from qlinear.onnx._node_case import NodeCase, run_qlinear
from qlinear.onnx._qdq_check import QDQ_OPS

__all__ = ["QLINEAR_OPS", "run_node"]

_INPUT_COUNT = {"QuantizeLinear": 3, "DequantizeLinear": 3, "DynamicQuantizeLinear": 1}


def run_node(node: onnx.NodeProto, opset: int, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    """The outputs of the Q/DQ ``node`` of a model at ``opset``, on ``inputs`` (None: an omitted input).

    Raises:
        QuantizationError: what the operator rejects, the node named.
    """
    arrays = list(inputs) + [None] * (_INPUT_COUNT[node.op_type] - len(inputs))
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    case = NodeCase(node.name, node.op_type, opset, arrays, attrs, node.domain)
    try:
        return list(run_qlinear(case))
    except QuantizationError as e:
        raise QuantizationError(f"node {node.name or node.op_type!r}: {e}") from None


class _QDQ(OpRun):
    """A Q/DQ node computed by :func:`run_node`."""

    # No schema: attributes come from the node as written, and the operator
    # version in force at the model's opset supplies the defaults.
    op_schema = None

    def __init__(self, onnx_node: onnx.NodeProto, run_params: dict[str, Any]) -> None:
        super().__init__(onnx_node, run_params)
        self._opset = run_params["opsets"][onnx_node.domain]

    def _run(self, *inputs: np.ndarray | None, **_attributes: Any) -> tuple[np.ndarray, ...]:
        return tuple(run_node(self.onnx_node, self._opset, list(inputs)))


# The evaluator looks custom operators up by (op_domain, class name).
QLINEAR_OPS = [type(op, (_QDQ,), {"op_domain": domain}) for op in QDQ_OPS for domain in ("", "com.microsoft")]
