"""The elementwise function an activation's readers apply to it, so its range is chosen by the error it leaves after it.

A Conv's output that only a SiLU reads (``x * Sigmoid(x)``, YOLO's
activation) is used only through that function: below about -6 the SiLU is
0 whatever x is, so rounding or clipping x there costs nothing, while the
plain squared error of ``--method mse`` spends its range on that tail. The
same holds for a Sigmoid's logits (a detector's class scores, a voice
detector's speech probability), a Tanh, a Gelu, a HardSigmoid and a
HardSwish. For such a tensor the range is chosen by the squared error of
the function's output (:func:`qlinear.quantize._choose.activation_params`),
measured exactly on the histogram's bins, not by its derivative.

Only tensors every reader of which is the function count: a tensor that a
residual Add also reads needs its own error kept small.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx

from qlinear.quantize._model import FloatModel, attribute

__all__ = ["Curve", "consumer_curves"]

Curve = Callable[[np.ndarray], np.ndarray]  # float64 values in, the readers' function of them out


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # overflow-free


def _silu(x: np.ndarray) -> np.ndarray:
    return x * _sigmoid(x)


def _erf(x: np.ndarray) -> np.ndarray:
    """The error function to 1.5e-7 (Abramowitz and Stegun 7.1.26): enough to compare ranges, with numpy alone."""
    t = 1.0 / (1.0 + 0.3275911 * np.abs(x))
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return np.sign(x) * (1.0 - poly * np.exp(-(x**2)))


def _gelu(node: onnx.NodeProto) -> Curve:
    if attribute(node, "approximate", "none") in (b"tanh", "tanh"):
        return lambda x: 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))
    return lambda x: 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))


def _hard_sigmoid(node: onnx.NodeProto) -> Curve:
    alpha, beta = float(attribute(node, "alpha", 0.2)), float(attribute(node, "beta", 0.5))
    return lambda x: np.clip(alpha * x + beta, 0.0, 1.0)


# The one-reader functions: op type -> the function of its node.
_UNARY: dict[str, Callable[[onnx.NodeProto], Curve]] = {
    "Sigmoid": lambda node: _sigmoid,
    "Tanh": lambda node: np.tanh,
    "Gelu": _gelu,
    "HardSigmoid": _hard_sigmoid,
    "HardSwish": lambda node: lambda x: x * np.clip(x / 6.0 + 0.5, 0.0, 1.0),
}


def consumer_curves(fm: FloatModel) -> dict[str, Curve]:
    """Each float tensor of the main graph whose readers all apply one elementwise function to it: that function."""
    curves: dict[str, Curve] = {}
    for tensor, readers in fm.consumers.items():
        curve = _curve(fm, tensor, readers)
        if curve is not None:
            curves[tensor] = curve
    return curves


def _curve(fm: FloatModel, tensor: str, readers: list[onnx.NodeProto]) -> Curve | None:
    if tensor in fm.output_names or not all(r.domain in ("", "ai.onnx") for r in readers):
        return None
    if len(readers) == 1 and readers[0].op_type in _UNARY:
        return _UNARY[readers[0].op_type](readers[0])
    if len(readers) == 2 and _is_silu(fm, tensor, readers):
        return _silu
    return None


def _is_silu(fm: FloatModel, tensor: str, readers: list[onnx.NodeProto]) -> bool:
    """``readers`` are a Sigmoid of ``tensor`` and a Mul of ``tensor`` by that Sigmoid, which nothing else reads."""
    kinds = {r.op_type: r for r in readers}
    sigmoid, mul = kinds.get("Sigmoid"), kinds.get("Mul")
    if sigmoid is None or mul is None:
        return False
    gate = sigmoid.output[0]
    return sorted(mul.input) == sorted([tensor, gate]) and len(fm.consumers.get(gate, [])) == 1 and gate not in fm.output_names
