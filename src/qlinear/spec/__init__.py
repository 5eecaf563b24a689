"""Per-version rules of the operators, and the plans they validate into."""

from __future__ import annotations

from qlinear.spec._plan import DequantizePlan, Granularity, QuantizePlan
from qlinear.spec._validate import check_array, from_python, plan_dequantize, plan_quantize
from qlinear.spec._versions import DOMAINS, OPERATOR_VERSIONS, OperatorVersion, operator_version, type_opset

__all__ = [
    "DOMAINS",
    "DequantizePlan",
    "Granularity",
    "OPERATOR_VERSIONS",
    "OperatorVersion",
    "QuantizePlan",
    "check_array",
    "from_python",
    "operator_version",
    "plan_dequantize",
    "plan_quantize",
    "type_opset",
]
