"""QuantizeLinear and DequantizeLinear transcribed from the specification.

One element at a time, in exact rational arithmetic (:class:`fractions.Fraction`)
with every rounding written out: the division rounded once into the
precision type, round half to even, the ONNX cast tables for float8, and
saturation. It shares no arithmetic with qlinear's kernels, so agreement
between the two is evidence, not an echo. It is slow; use it on small arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from qlinear.dtypes import ElementType, element_type
from qlinear.spec import DequantizePlan, QuantizePlan, plan_quantize

__all__ = ["quantize", "dequantize", "dynamic_quantize"]

NAN = float("nan")


@dataclass(frozen=True)
class _Format:
    """A binary float format: significand bits after the point, smallest
    normal exponent, largest finite value."""

    mantissa: int
    emin: int
    max_finite: Fraction


_FORMATS = {
    "float": _Format(23, -126, Fraction((2**24 - 1) * 2**104)),
    "float16": _Format(10, -14, Fraction(65504)),
    "bfloat16": _Format(7, -126, Fraction((2**8 - 1) * 2**120)),
    "float8e4m3fn": _Format(3, -6, Fraction(448)),
    "float8e4m3fnuz": _Format(3, -7, Fraction(240)),
    "float8e5m2": _Format(2, -14, Fraction(57344)),
    "float8e5m2fnuz": _Format(2, -15, Fraction(57344)),
    "float4e2m1": _Format(1, 0, Fraction(6)),
    "float6e2m3": _Format(3, 0, Fraction(15, 2)),
    "float6e3m2": _Format(2, -2, Fraction(28)),
}


def _round_half_even(v: Fraction) -> int:
    floor = math.floor(v)
    rest = v - floor
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and floor % 2):
        return floor + 1
    return floor


def _round_to(v: float | Fraction, fmt: _Format) -> float | Fraction:
    """``v`` rounded to nearest even in ``fmt`` with an unbounded exponent;
    overflow is left to the caller (the result may exceed ``max_finite``)."""
    if not isinstance(v, Fraction):
        return v  # inf, nan, or a signed zero as float
    if v == 0:
        return v
    e = max(math.floor(math.log2(abs(v))), fmt.emin)
    # log2 of a Fraction can be off by one near powers of two; fix it exactly.
    while abs(v) >= Fraction(2) ** (e + 1):
        e += 1
    while e > fmt.emin and abs(v) < Fraction(2) ** e:
        e -= 1
    ulp = Fraction(2) ** (e - fmt.mantissa)
    r = _round_half_even(v / ulp) * ulp
    return r if r != 0 else (0.0 if v > 0 else -0.0)


def _to_ieee(v: float | Fraction, name: str) -> float | Fraction:
    """Round into an IEEE type (float, float16, bfloat16): overflow gives inf."""
    r = _round_to(v, _FORMATS[name])
    if isinstance(r, Fraction) and abs(r) > _FORMATS[name].max_finite:
        return math.copysign(math.inf, r)
    return r


def _value(a: object) -> float | Fraction:
    """An element as an exact Fraction, or a float for zeros, inf and NaN
    (every qlinear type converts to float64 exactly)."""
    f = float(np.asarray(a).astype(np.float64))
    return f if f == 0 or not math.isfinite(f) else Fraction(f)


def _sign(v: float | Fraction) -> float:
    return math.copysign(1.0, v) if isinstance(v, float) else (1.0 if v > 0 else -1.0)


def _divide(a: float | Fraction, b: float | Fraction) -> float | Fraction:
    """IEEE division of exact operands, before rounding."""
    if (isinstance(a, float) and math.isnan(a)) or (isinstance(b, float) and math.isnan(b)):
        return NAN
    a_inf = isinstance(a, float) and math.isinf(a)
    b_inf = isinstance(b, float) and math.isinf(b)
    sign = _sign(a) * _sign(b)
    if a_inf and b_inf:
        return NAN
    if a_inf:
        return sign * math.inf
    if b_inf:
        return sign * 0.0
    if b == 0:
        return NAN if a == 0 else sign * math.inf
    if a == 0:
        return sign * 0.0
    return Fraction(a) / Fraction(b)


def _is_special(v: float | Fraction) -> bool:
    return isinstance(v, float) and not math.isfinite(v)


def _add(a: float | Fraction, b: float | Fraction) -> float | Fraction:
    """IEEE addition of exact operands, before rounding."""
    if _is_special(a) or _is_special(b):
        return float(a) + float(b)  # float arithmetic has the inf/NaN rules
    if a == 0 and b == 0:
        return float(a) + float(b)  # signed zeros: -0 + -0 = -0, else +0
    if a == 0 or b == 0:
        return b if a == 0 else a
    s = Fraction(a) + Fraction(b)
    return s if s != 0 else 0.0


def _cast_float(v: float | Fraction, t: ElementType, saturate: bool) -> float:
    """ONNX's cast of ``v`` to float8/float6/float4 (the Cast tables)."""
    fmt = _FORMATS[t.name]
    fnuz = t.name.endswith("fnuz")
    if isinstance(v, float) and math.isnan(v):
        return NAN
    r = _round_to(v, fmt)
    overflow = (isinstance(r, float) and math.isinf(r)) or (isinstance(r, Fraction) and abs(r) > fmt.max_finite)
    if overflow:
        if saturate or not t.saturate_applies:
            return _sign(r) * float(fmt.max_finite)
        return _sign(r) * math.inf if t.has_inf else NAN
    out = float(r)
    return 0.0 if (fnuz and out == 0) else out


def _encode(values: list[float | int], t: ElementType | np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    dtype = t.dtype if isinstance(t, ElementType) else t
    return np.array(values, dtype=np.float64).astype(dtype).reshape(shape)


def _param_index(plan_g, index: tuple[int, ...]) -> tuple[int, ...]:
    if plan_g.kind == "per_tensor":
        return ()
    if plan_g.kind == "per_axis":
        return (index[plan_g.axis],)
    return tuple(i // plan_g.block_size if d == plan_g.axis else i for d, i in enumerate(index))


def _param(param: np.ndarray, g, index: tuple[int, ...]):
    return param.reshape(-1)[0] if param.size == 1 and g.kind == "per_tensor" else param[_param_index(g, index)]


def quantize(plan: QuantizePlan, x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None) -> np.ndarray:
    """QuantizeLinear per the spec, element by element."""
    t = plan.output_type
    prec = element_type(plan.precision).name
    out = []
    for index in np.ndindex(*x.shape):
        xv = _to_ieee(_value(x[index]), prec)
        sv = _to_ieee(_value(_param(scale, plan.granularity, index)), prec)
        q = _to_ieee(_divide(xv, sv), prec)
        zp = None if zero_point is None else _value(_param(zero_point, plan.granularity, index))
        if t.is_integer:
            if isinstance(q, float) and math.isnan(q):
                y: float | int = 0  # NaN has no integer: the zero point (docs/semantics.md)
            elif isinstance(q, float):
                y = q  # inf or signed zero
            else:
                y = _round_half_even(q)
            y = y + (int(zp) if zp is not None else 0)
            out.append(min(max(y, t.qmin), t.qmax))
        else:
            v = q if zp is None else _to_ieee(_add(q, zp), prec)
            if not t.has_nan and isinstance(v, float) and math.isnan(v):
                v = zp if zp is not None else 0.0
            out.append(_cast_float(v, t, plan.saturate))
    return _encode(out, t, x.shape)


def dequantize(plan: DequantizePlan, x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None) -> np.ndarray:
    """DequantizeLinear as qlinear reads the spec: the difference rounded to
    float32, the product rounded once in float32, then to the output type."""
    out = []
    for index in np.ndindex(*x.shape):
        xv = _value(x[index])
        zp = _value(_param(zero_point, plan.granularity, index)) if zero_point is not None else 0.0
        neg_zp = -zp if isinstance(zp, Fraction) else -float(zp)
        d = _to_ieee(_add(xv, neg_zp) if zero_point is not None else xv, "float")
        s = _value(_param(scale, plan.granularity, index))
        product = _multiply(d, s)
        out.append(_to_ieee(_to_ieee(product, "float"), element_type(plan.output_dtype).name))
    return _encode([float(v) for v in out], plan.output_dtype, x.shape)


def _multiply(a: float | Fraction, b: float | Fraction) -> float | Fraction:
    if (isinstance(a, float) and math.isnan(a)) or (isinstance(b, float) and math.isnan(b)):
        return NAN
    a_inf = isinstance(a, float) and math.isinf(a)
    b_inf = isinstance(b, float) and math.isinf(b)
    if (a_inf and b == 0) or (b_inf and a == 0):
        return NAN
    sign = _sign(a) * _sign(b)
    if a_inf or b_inf:
        return sign * math.inf
    if a == 0 or b == 0:
        return sign * 0.0
    return Fraction(a) * Fraction(b)


def dynamic_quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """DynamicQuantizeLinear per the spec (NaN elements left out of the range)."""
    values = [_value(v) for v in x.reshape(-1)]
    numbers = [v for v in values if not (isinstance(v, float) and math.isnan(v))]
    high = max([Fraction(0)] + [v for v in numbers if isinstance(v, Fraction) or math.isinf(v)], default=Fraction(0))
    low = min([Fraction(0)] + [v for v in numbers if isinstance(v, Fraction) or math.isinf(v)], default=Fraction(0))
    if high == low:
        scale: float | Fraction = Fraction(1)
    else:
        span = _to_ieee(_add(high, -low), "float")
        scale = _to_ieee(_divide(span, Fraction(255)), "float")
    initial = _to_ieee(_add(Fraction(0), -_to_ieee(_divide(low, scale), "float")), "float")
    zp = 0 if isinstance(initial, float) and math.isnan(initial) else _round_half_even(Fraction(min(max(initial, 0), 255)))
    scale_arr = np.asarray(float(scale), np.float32)
    zp_arr = np.asarray(zp, np.uint8)
    plan, *_ = plan_quantize(
        x, scale_arr, zp_arr, axis=1, block_size=0, output_dtype=None, saturate=True, precision=None, opset=None, domain=""
    )
    return quantize(plan, x, scale_arr, zp_arr), scale_arr, zp_arr
