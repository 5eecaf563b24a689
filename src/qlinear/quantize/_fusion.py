"""The fusion check: which quantized nodes ONNX Runtime really runs as integer kernels.

ONNX Runtime's graph optimizations turn ``DQ -> op -> Q`` groups into
integer operators; where the layout does not match a selector the Q/DQ
nodes stay and the op runs in float, and the "quantized" model is no
faster. The check saves the graph ONNX Runtime optimized and looks for
each quantized node there: fused if what took its place is an integer (or
packed-weight) kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx
from onnx import TensorProto

from qlinear.onnx._graph import readers
from qlinear.quantize._session import nbits_level, optimized_graph

__all__ = ["GATHER_CODES", "INTEGER_KERNELS", "FusionCheck", "check_fusion", "float_by_design"]

# The operators ONNX Runtime's QDQ fusions produce on the CPU.
INTEGER_KERNELS = frozenset(
    {
        "QLinearConv",
        "QLinearConvTranspose",
        "QLinearMatMul",
        "QGemm",
        "MatMulIntegerToFloat",
        "MatMulNBits",
        "DynamicQuantizeMatMul",
        "GatherBlockQuantized",
        "QLinearAdd",
        "QLinearMul",
    }
)

GATHER_CODES = "Gather (codes)"  # what a table gathered as codes runs as
_INTEGER_CODES = frozenset({TensorProto.INT8, TensorProto.UINT8})
_SIXTEEN_BIT = frozenset({"uint16", "int16"})
_FOUR_BIT = frozenset({"int4", "uint4"})
_FLOAT_CODES = frozenset({"float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "float4e2m1"})


def float_by_design(op_type: str, weight_type: str | None, activation_type: str | None) -> str | None:
    """Why ONNX Runtime runs a node of these types in float whatever the Q/DQ layout, or None where it has an integer kernel.

    The reason reads "what: why"; summaries show the part before the colon.

    These nodes still gain what their types give (a smaller file, or
    accuracy where a promotion widened them); an unfused node not named
    here is a layout ONNX Runtime's selectors did not match, and a warning.
    """
    if activation_type in _SIXTEEN_BIT:
        return "16-bit activations: ONNX Runtime's CPU kernels are 8-bit"
    if weight_type in _FLOAT_CODES or activation_type in _FLOAT_CODES:
        return "float codes: ONNX Runtime has no float8/float4 kernels on the CPU"
    if op_type == "ConvTranspose":
        return "a ConvTranspose: ONNX Runtime's CPU provider dequantizes its weights and runs it in float"
    if activation_type is None and op_type == "Conv":
        return (
            "a weight-only Conv: ONNX Runtime's CPU provider dequantizes its weights every run (a smaller file, not a "
            "faster model; weight-only MatMul and Gemm weights run as MatMulNBits)"
        )
    if weight_type in _FOUR_BIT and activation_type is not None:
        return (
            "4-bit weights with 8-bit activations: ONNX Runtime's CPU provider has no kernel for them and dequantizes "
            "the weights every run (a smaller file, not a faster model; 4-bit weight-only MatMuls run as MatMulNBits)"
        )
    return None


MATMUL_ADD_FUSED = (
    "a MatMul with a computed addend: ONNX Runtime fuses it with the Add after it (a residual, not a constant "
    "bias) into a float Gemm before its QDQ fusions, which no integer kernel takes"
)
OUTPUT_AT_SIXTEEN_BITS = (
    "a 16-bit output: a promoted reader takes its output at 16 bits through a Transpose or Reshape, whose "
    "QuantizeLinear ONNX Runtime moves up to this node, and no integer kernel has 8-bit inputs and a 16-bit output"
)
# A Conv with quantized inputs and no QuantizeLinear after it (``_output_for_q`` in :mod:`._node_placement`): its output is a
# model output, or a subgraph reads it by name, and ONNX Runtime's QLinearConv needs that QuantizeLinear.
MODEL_OUTPUT_CONV = (
    "a Conv whose output is a model output: qlinear leaves model outputs unrounded (and a subgraph that reads "
    "the output by name gets it float), and ONNX Runtime's QLinearConv needs a QuantizeLinear after the Conv"
)


@dataclass
class FusionCheck:
    """Per quantized node: the operator ONNX Runtime runs in its place, and whether it is an integer kernel."""

    runs_as: dict[str, str]
    fused: dict[str, bool]
    qdq_nodes_left: int
    # Unfused nodes whose layout after ONNX Runtime's own rewrites has no integer kernel, and why.
    by_layout: dict[str, str] = field(default_factory=dict)
    # Nodes the model holds as ONNX Runtime's kernels already (a MatMulNBits form), not fused from Q/DQ by it.
    written: frozenset[str] = frozenset()
    nbits_level: int = 0  # the accuracy level its MatMulNBits were fused at (the model's own: _session.nbits_level)

    @property
    def unfused(self) -> list[str]:
        return [n for n, f in self.fused.items() if not f]


def check_fusion(model: onnx.ModelProto, nodes: list[str]) -> FusionCheck | None:
    """Optimize ``model`` with ONNX Runtime and find each of ``nodes`` in the result; None if ORT cannot load it."""
    optimized = optimized_graph(model)
    if optimized is None:  # no ONNX Runtime kernels for its types: nothing to check
        return None
    # A Gather of a table's codes (:mod:`._gathered_table`) is an integer kernel too: it moves rows, not floats.
    integer_tables = {t.name for t in optimized.graph.initializer if t.data_type in _INTEGER_CODES}
    runs_as: dict[str, str] = {}
    for name in nodes:
        match = [n for n in optimized.graph.node if _descends_from(n.name, name)]
        integer = [n for n in match if n.op_type in INTEGER_KERNELS]
        codes = [n for n in match if n.op_type == "Gather" and n.input[0] in integer_tables]
        runs_as[name] = GATHER_CODES if codes else (integer or match)[0].op_type if match else "removed"
    fused = {n: op in INTEGER_KERNELS or op == GATHER_CODES for n, op in runs_as.items()}
    left = sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in optimized.graph.node)
    written = frozenset(n.name for n in model.graph.node if n.op_type in INTEGER_KERNELS)
    reasons = _layout_reasons(optimized, [n for n, f in fused.items() if not f])
    return FusionCheck(runs_as, fused, left, reasons, written, nbits_level(model))


def _layout_reasons(optimized: onnx.ModelProto, unfused: list[str]) -> dict[str, str]:
    """Unfused nodes that ONNX Runtime's own rewrites left without a kernel, read from its optimized graph.

    - A 16-bit QuantizeLinear on the node's output: ONNX Runtime moves a
      QuantizeLinear up through data movement (a Transpose, a Reshape) to
      the node that makes the tensor, so where a promoted reader took it at
      16 bits an 8-bit node has a 16-bit output, which no kernel takes.
    - A MatMul fused with the Add after it into a float Gemm.
    """
    sixteen = {t.name for t in optimized.graph.initializer if t.data_type in (TensorProto.UINT16, TensorProto.INT16)}
    reading = readers(optimized.graph)
    by_name = {n.name: n for n in optimized.graph.node}
    out = {}
    for name in unfused:
        node = by_name.get(name)
        qs = [] if node is None else [r for o in node.output for r in reading.get(o, []) if r.op_type == "QuantizeLinear"]
        if any(len(q.input) > 2 and q.input[2] in sixteen for q in qs):
            out[name] = OUTPUT_AT_SIXTEEN_BITS
        elif f"{name}/MatMulAddFusion" in by_name:
            out[name] = MATMUL_ADD_FUSED
    return out


def _descends_from(optimized_name: str, name: str) -> bool:
    """Whether ONNX Runtime's node ``optimized_name`` replaced node ``name`` (its fusions keep the name as a stem)."""
    if optimized_name == name:
        return True
    for sep in ("_token", "/", "_quant", " "):
        if optimized_name.startswith(name + sep):
            return True
    return optimized_name.startswith("fused " + name)
