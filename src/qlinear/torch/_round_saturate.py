"""Rounding and saturation of quotients into each quantized type, in torch.

The same steps as :mod:`qlinear.kernels.reference._convert`, in pure torch
ops so they run on any device. Results are float32 tensors holding the exact
quantized values. Float types are rounded with exact float32 arithmetic:
dividing by a power of two, rounding half to even and multiplying back are
all exact, so the result is the correctly rounded value, as ml_dtypes gives.
"""

from __future__ import annotations

import torch

from qlinear.dtypes import ElementType
from qlinear.torch._types import FloatFormat, float_format

__all__ = ["cast_zero_point", "round_to_float", "to_float", "to_integer"]


def to_integer(quotient: torch.Tensor, zero_point: torch.Tensor | None, t: ElementType) -> torch.Tensor:
    """``clip(round(quotient) + zero_point, qmin, qmax)`` as float32 values.

    float32 is enough where the reference uses float64: a rounded quotient
    above 2**24 may absorb the zero point inexactly, but it stays beyond
    every qmax (at most 65535), so it saturates to the same value. NaN
    quantizes to the zero point (docs/semantics.md).
    """
    rounded = torch.round(quotient.to(torch.float32))
    rounded = torch.where(torch.isnan(rounded), torch.zeros_like(rounded), rounded)
    if zero_point is not None:
        rounded = rounded + zero_point.to(torch.float32)
    # Adding +0 turns -0 (from rounding small negatives) into the integer 0.
    return torch.clamp(rounded, float(t.qmin), float(t.qmax)) + 0.0


def to_float(quotient: torch.Tensor, zero_point: torch.Tensor | None, t: ElementType, saturate: bool) -> torch.Tensor:
    """``quotient + zero_point`` rounded to float type ``t`` as float32 values.

    The sum is taken in the quotient's dtype (as numpy and ml_dtypes do:
    through float32, rounded once, which is the correctly rounded 16-bit sum);
    NaN becomes the zero point where ``t`` has no NaN; with ``saturate`` (or
    for types without NaN or infinity) values are clipped to the largest
    finite value before rounding to nearest even.
    """
    q = quotient
    if zero_point is not None:
        q = (q.to(torch.float32) + zero_point.to(torch.float32)).to(quotient.dtype)
    q = q.to(torch.float32)
    if not t.has_nan:
        fill = zero_point.to(torch.float32) if zero_point is not None else torch.zeros_like(q)
        q = torch.where(torch.isnan(q), fill, q)
    if saturate or not t.saturate_applies:
        q = torch.clamp(q, -t.max_finite, t.max_finite)
    return round_to_float(q, float_format(t))


def _power_of_two(exponent: torch.Tensor) -> torch.Tensor:
    """``2.0 ** exponent`` built from its bits: exact on every device."""
    return ((exponent + 127) << 23).to(torch.int32).view(torch.float32)


def round_to_float(w: torch.Tensor, f: FloatFormat) -> torch.Tensor:
    """float32 ``w`` rounded to nearest even in format ``f``, as float32 values.

    The quantum of ``|w|`` is ``2**(max(e, min_exponent) - mantissa_bits)``
    with ``e`` its binary exponent; ``round(|w| / quantum) * quantum`` is the
    rounded magnitude (a carry into the next binade is still exact). Beyond
    the largest finite value the result overflows to infinity, or to NaN
    where the format has no infinity.
    """
    a = w.abs()
    _, e = torch.frexp(a)  # a = m * 2**e with m in [0.5, 1): the leading bit is 2**(e - 1)
    exponent = torch.clamp(e.to(torch.int32) - 1, min=f.min_exponent, max=127)
    quantum = _power_of_two(exponent - f.mantissa_bits)
    r = torch.round(a / quantum) * quantum
    overflow = torch.full_like(r, float("inf") if f.has_inf else float("nan"))
    r = torch.where(r > f.max_finite, overflow, r)
    r = torch.copysign(r, w)
    if not f.signed_zero:
        r = torch.where(r == 0, torch.zeros_like(r), r)
    return r


def cast_zero_point(zero_point: torch.Tensor, t: ElementType) -> torch.Tensor:
    """A zero point's values as type ``t`` (float32 holding them).

    Zero points of type ``t`` pass unchanged; others (a learnable float zero
    point) are rounded half to even and saturated, as storing them in ONNX
    would.
    """
    z = zero_point.to(torch.float32)
    if t.is_integer:
        return torch.clamp(torch.round(z), float(t.qmin), float(t.qmax)) + 0.0
    return round_to_float(torch.clamp(z, -t.max_finite, t.max_finite), float_format(t))
