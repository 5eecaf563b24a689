"""Check a node of any ONNX operator against the schema the onnx package ships."""

from __future__ import annotations

from collections.abc import Mapping

import onnx
from onnx import helper

from qlinear._errors import QuantizationError
from qlinear.onnx._tensor_info import TensorInfo

__all__ = ["check_schema_node"]


def check_schema_node(
    node: onnx.NodeProto,
    opset: int,
    inputs: Mapping[str, TensorInfo],
    constants: Mapping[str, onnx.TensorProto],
    *,
    label: str | None = None,
) -> tuple[TensorInfo, ...]:
    """Validate ``node`` against its operator's schema at ``opset``; infer its outputs.

    Args:
        node: the node, inputs and outputs named, attributes set.
        opset: the version the model imports for the node's domain.
        inputs: info of each (non-empty) input name.
        constants: values of small initializers among the inputs, which
            shape inference of Reshape, Slice and the like reads.
        label: how messages name the node; default its name.

    Returns:
        The info of each output; ``TensorInfo(0, None)`` where inference
        found nothing.

    Raises:
        QuantizationError: naming the node: no schema at this opset, an
            unknown or missing attribute, a wrong input or output count, or
            a type or shape the schema's inference rejects.
    """
    where = f"node {(label or node.name)!r} ({node.op_type})"
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    except onnx.defs.SchemaError:
        raise QuantizationError(
            f"{where}: onnx has no operator {node.op_type!r} in domain {node.domain or 'ai.onnx'!r} at opset {opset}"
        ) from None
    given = {a.name for a in node.attribute}
    unknown = sorted(given - set(schema.attributes))
    if unknown:
        raise QuantizationError(
            f"{where}: {', '.join(unknown)} is not an attribute of {node.op_type} version {schema.since_version}; "
            f"expected some of {sorted(schema.attributes)}"
        )
    missing = sorted(n for n, a in schema.attributes.items() if a.required and n not in given)
    if missing:
        raise QuantizationError(
            f"{where}: attribute {', '.join(missing)} is required by {node.op_type} version {schema.since_version}"
        )
    if not schema.min_input <= len(node.input) <= schema.max_input:
        raise QuantizationError(f"{where}: expected {schema.min_input} to {schema.max_input} inputs, got {len(node.input)}")
    if not schema.min_output <= len(node.output) <= schema.max_output:
        raise QuantizationError(f"{where}: expected {schema.min_output} to {schema.max_output} outputs, got {len(node.output)}")
    types = {n: inputs[n].type_proto() for n in node.input if n}
    try:
        inferred = onnx.shape_inference.infer_node_outputs(
            schema, node, types, dict(constants), opset_imports=[helper.make_opsetid(node.domain, opset)]
        )
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as e:
        raise QuantizationError(f"{where}: {str(e).strip()}") from None
    return tuple(TensorInfo.from_type_proto(inferred[o]) if o in inferred else TensorInfo(0, None) for o in node.output)
