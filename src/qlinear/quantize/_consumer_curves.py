"""The elementwise function an activation's readers apply to it, so its range is chosen by the error it leaves after it.

A Conv's output that only a SiLU reads (``x * Sigmoid(x)``, YOLO's
activation) is used only through that function: below about -6 the SiLU is
0 whatever x is, so rounding or clipping x there costs nothing, while the
plain squared error of ``--method mse`` spends its range on that tail. The
same holds for a Sigmoid's logits (a text detector's probability map, a
voice detector's speech probability), a Tanh, a Gelu, a HardSigmoid and a
HardSwish, also where reshapes lie between. For such a tensor the range is
chosen by the squared error of the function's output at the histogram's
bin centres (:func:`qlinear.quantize._choose.activation_params`), the
function itself applied, not its derivative.

Only tensors every reader of which is the function count: a tensor that a
residual Add also reads, that leaves the graph or that a subgraph reads
needs its own error kept small.
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


# Ops that move or reshape values without changing them: the function of their output's readers is their input's.
_LAYOUT = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity"})


def consumer_curves(fm: FloatModel) -> dict[str, Curve]:
    """Each float tensor of the main graph whose readers all apply one elementwise function to it: that function."""
    curves: dict[str, Curve] = {}
    for tensor in fm.consumers:
        curve = _curve(fm, tensor)
        if curve is not None:
            curves[tensor] = curve
    return curves


def _curve(fm: FloatModel, tensor: str, depth: int = 0) -> Curve | None:
    """The function ``tensor``'s readers apply to it, through reshapes that only one reader makes of it; None if none."""
    readers = fm.consumers.get(tensor, [])
    if not readers or depth > 8 or _read_elsewhere(fm, tensor) or not all(r.domain in ("", "ai.onnx") for r in readers):
        return None
    if len(readers) == 1 and readers[0].op_type in _UNARY:
        return _UNARY[readers[0].op_type](readers[0])
    if len(readers) == 1 and readers[0].op_type in _LAYOUT and readers[0].input[0] == tensor:  # logits reshaped, then a Sigmoid
        return _curve(fm, readers[0].output[0], depth + 1)
    if len(readers) == 2 and _is_silu(fm, tensor, readers):
        return _silu
    return None


def _read_elsewhere(fm: FloatModel, tensor: str) -> bool:
    """Whether ``tensor`` leaves the graph, or a subgraph (an If's branch) reads it: readers ``consumers`` does not list."""
    return tensor in fm.output_names or tensor in fm.read_in_subgraphs


def _is_silu(fm: FloatModel, tensor: str, readers: list[onnx.NodeProto]) -> bool:
    """``readers`` are a Sigmoid of ``tensor`` and a Mul of ``tensor`` by that Sigmoid, which nothing else reads."""
    kinds = {r.op_type: r for r in readers}
    sigmoid, mul = kinds.get("Sigmoid"), kinds.get("Mul")
    if sigmoid is None or mul is None:
        return False
    gate = sigmoid.output[0]
    return sorted(mul.input) == sorted([tensor, gate]) and len(fm.consumers.get(gate, [])) == 1 and not _read_elsewhere(fm, gate)
