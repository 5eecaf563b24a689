"""From a precision assignment to a QDQ model: plan, parameters, opset, convert, as one step.

The analysis and the mixed-precision search build many variants of one
model (only one node quantized; the most sensitive nodes promoted). Each
variant reuses the calibration statistics, the activation parameters
already chosen for a tensor and type, and the float model already raised
to an opset: nothing is calibrated twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import onnx

from qlinear._errors import QuantizationError
from qlinear.dtypes import element_type
from qlinear.quantize._calibrate import CalibrationRun
from qlinear.quantize._choose import QuantParams, activation_params
from qlinear.quantize._consumer_curves import consumer_curves
from qlinear.quantize._integer_gates import integer_gates
from qlinear.quantize._model import FloatModel
from qlinear.quantize._opset import at_opset, required_opset
from qlinear.quantize._placement import Plan, plan
from qlinear.quantize._precision import NodePrecision
from qlinear.quantize._stats import TensorStats
from qlinear.quantize._to_qdq import ConvertedNode, convert
from qlinear.quantize.algorithms import at_stage
from qlinear.quantize.algorithms._registry import Calibrated
from qlinear.spec import type_opset

if TYPE_CHECKING:  # the options compose every algorithm's fields, and algorithms import this module
    from qlinear.quantize._options import QuantizeOptions


__all__ = ["Built", "ModelBuilder"]

_SIXTEEN_BIT_FLOATS = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


@dataclass
class Built:
    """One variant: its plan, the QDQ model, what was done to each node, its opset, and its gates on integer kernels."""

    plan: Plan
    model: onnx.ModelProto
    converted: dict[str, ConvertedNode]
    opset: int
    gates: list[str]  # the nodes that ended a gate written for integer kernels (:mod:`._integer_gates`)


class ModelBuilder:
    """Builds QDQ variants of ``fm`` under ``options`` from a calibration run (None: nothing calibrated).

    The run's statistics give activation parameters; what it measured for
    the stage-``calibration`` algorithms goes to them as weights are
    converted.
    """

    def __init__(self, fm: FloatModel, options: QuantizeOptions, run: CalibrationRun | None) -> None:
        self.fm, self.options = fm, options
        self.stats: dict[str, TensorStats] = run.stats if run is not None else {}
        self.calibrated = Calibrated(run.means, run.grams, run.gram_rows) if run is not None else Calibrated()
        self._params: dict[tuple[str, str], QuantParams] = {}
        self.curves = consumer_curves(fm)  # the function each tensor's readers apply, where they all apply one
        self._raised: dict[int, onnx.ModelProto] = {}  # the float model at each opset asked for
        # GPTQ's rounding of each weight at each type, computed at the first build that asks: the search and the
        # trade-off build a model a candidate (a decoder's 2048-wide layers: seconds a layer each time). It holds a
        # rounded float copy of each weight at each type GPTQ rounded it at (4 bits, then 8 where promoted).
        self._rounded: dict[tuple, tuple] = {}

    def allows(self, type_name: str) -> bool:
        """Whether a type fits the opset the user fixed (any type does when none was fixed)."""
        return self.options.opset is None or type_opset(type_name) <= self.options.opset

    def params(self, tensor: str, type_name: str, symmetric: bool = False) -> QuantParams:
        """The activation parameters of ``tensor`` as ``type_name``, chosen once from its statistics.

        ``symmetric``: zero point 0 whatever the options say (the plan's ``symmetric``).
        """
        key = (tensor, type_name, symmetric)
        if key not in self._params:
            o = self.options
            self._params[key] = activation_params(
                self.stats[tensor], element_type(type_name), method=o.method, symmetric=o.symmetric or symmetric,
                percentile=o.percentile, curve=self.curves.get(tensor),
            )  # fmt: skip
        return self._params[key]

    def float_at(self, opset: int) -> onnx.ModelProto:
        """The float model at ``opset``, as the variants of that opset were built from it."""
        if opset not in self._raised:
            self._raised[opset] = at_opset(self.fm.model, opset)
        return self._raised[opset]

    def plan(self, precision: dict[str, NodePrecision] | None = None) -> Plan:
        return plan(self.fm, self.options, precision)

    def build(self, precision: dict[str, NodePrecision] | None = None) -> Built:
        """The QDQ model with ``precision``'s nodes at their types (the rest at the options')."""
        planned = self.plan(precision)
        missing = [t for t in planned.calibrate if t not in self.stats]
        if missing:
            raise QuantizationError(f"quantize: no calibration statistics for {missing[:3]}; calibrate again")
        params = {t: self.params(t, planned.activation_types[t], t in planned.symmetric) for t in planned.calibrate}
        quantized = [*planned.activations, *(p.weight.tensor for p in planned.nodes if p.weight is not None)]
        sixteen_bit = any(self.fm.elem_types.get(t) in _SIXTEEN_BIT_FLOATS for t in quantized)
        need = required_opset(planned, self.options, sixteen_bit_floats=sixteen_bit)
        if self.options.opset is not None and self.options.opset < need:
            raise QuantizationError(
                f"quantize: opset {self.options.opset} cannot hold the chosen types; they need opset >= {need}"
            )
        opset = max(self.fm.opset, self.options.opset or 0, need)
        model, converted = convert(
            self.fm,
            planned,
            self.options,
            params,
            opset,
            source=self.float_at(opset),
            calibrated=self.calibrated,
            algorithms=at_stage("calibration", self.options),
            rounded=self._rounded,
        )
        return Built(planned, model, converted, opset, integer_gates(model))
