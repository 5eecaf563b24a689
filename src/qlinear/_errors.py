"""The one exception type qlinear raises for bad input."""

from __future__ import annotations

__all__ = ["QuantizationError"]


class QuantizationError(ValueError):
    """Bad input to a qlinear operator, graph or command.

    The message names the function and argument, the expectation, and what
    was given, e.g. ``quantize_linear: y_scale has shape (3,), expected () or
    (4,) for axis=1 of x with shape (2, 4)``.
    """
