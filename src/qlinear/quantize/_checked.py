"""The checker's full check of a quantized model: a failure is qlinear's bug, said in one line."""

from __future__ import annotations

from os import PathLike

import onnx

from qlinear._errors import QuantizationError
from qlinear.onnx import _large as large

__all__ = ["check_quantized"]


def check_quantized(model: onnx.ModelProto | str | PathLike[str]) -> None:
    """``onnx.checker.check_model(..., full_check=True)`` of a model or of a written file (the only way past 2 GB).

    A model with weights beside its graph is checked with them as inputs
    (:func:`qlinear.onnx._large.check_model`); check its file when written.

    Raises:
        QuantizationError: the checker's message, as a qlinear bug to report.
    """
    try:
        if isinstance(model, onnx.ModelProto):
            large.check_model(model, full_check=True)
        else:
            onnx.checker.check_model(str(model), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise QuantizationError(
            f"quantize: the quantized model fails onnx.checker (a qlinear bug, please report it): {e}"
        ) from None
