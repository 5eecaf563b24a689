"""Turn a user's call into a validated plan, or say exactly what is wrong."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from qlinear._errors import QuantizationError
from qlinear.dtypes import ElementType, element_type
from qlinear.spec._plan import DequantizePlan, Granularity, QuantizePlan
from qlinear.spec._versions import OperatorVersion, operator_version

__all__ = ["plan_quantize", "plan_dequantize", "check_array", "from_python"]


def check_array(value: Any, arg: str, caller: str) -> np.ndarray:
    """``value`` as an ndarray; numpy scalars become 0-d arrays."""
    if isinstance(value, np.generic):
        return np.asarray(value)
    if not isinstance(value, np.ndarray):
        raise QuantizationError(f"{caller}: {arg} must be a numpy array, got {type(value).__name__}")
    return value


def from_python(value: Any, arg: str, caller: str, t: ElementType) -> np.ndarray:
    """``value`` as an ndarray; a Python number or (nested) list of numbers becomes an array of type ``t``.

    ``t`` is the type the call's defaults give the argument (docs/semantics.md, "Python numbers and
    lists"). A float rounds to ``t`` once, to nearest even; an integer type takes integers in its range only.
    """
    # numpy scalars keep their type (np.float64 is a Python float too); bool is no number here.
    if not isinstance(value, (int, float, list, tuple)) or isinstance(value, (bool, np.generic)):
        return check_array(value, arg, caller)
    try:
        a = np.asarray(value)
    except ValueError:  # ragged lists
        raise QuantizationError(f"{caller}: {arg} must be a number or a rectangular list of numbers, got {value!r}") from None
    if a.dtype.kind not in "iuf" or (a.dtype.kind == "f" and t.kind == "int" and not np.all(a == np.round(a))):
        what = "integers" if t.kind == "int" else "numbers"
        raise QuantizationError(f"{caller}: {arg} must be {what} (it takes type {t}), got {value!r}")
    if t.kind == "int" and a.size and (a.min() < t.qmin or a.max() > t.qmax):
        raise QuantizationError(f"{caller}: {arg} must be in [{t.qmin}, {t.qmax}] (type {t}), got {value!r}")
    return a.astype(t.dtype)


def _type_of(a: np.ndarray, arg: str, allowed: frozenset[str], version: OperatorVersion, caller: str) -> ElementType:
    try:
        t = element_type(a.dtype)
    except QuantizationError:
        t = None
    if t is None or t.name not in allowed:
        expected = ", ".join(sorted(allowed))
        raise QuantizationError(f"{caller}: {arg} has type {a.dtype}, expected one of {expected} for {version}")
    return t


def _requested_type(value: Any, arg: str, caller: str) -> ElementType | None:
    if value is None or (isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value == 0):
        return None
    return element_type(value, what=f"{caller}: {arg}")


def _granularity(
    x_shape: tuple[int, ...],
    scale_shape: tuple[int, ...],
    axis: Any,
    block_size: Any,
    version: OperatorVersion,
    caller: str,
    scale_arg: str,
) -> Granularity:
    if not isinstance(block_size, (int, np.integer)) or isinstance(block_size, bool):
        raise QuantizationError(f"{caller}: block_size must be an int, got {block_size!r}")
    block_size = int(block_size)
    if block_size and not version.blocked:
        raise QuantizationError(
            f"{caller}: block_size is not an attribute of {version}; blocked quantization needs opset >= 21, got block_size={block_size}"
        )
    if block_size < 0:
        raise QuantizationError(f"{caller}: block_size must be >= 0, got {block_size}")
    # A scalar or a one-element 1-D scale is per-tensor: ONNX Runtime and the
    # onnx reference both read a shape-(1,) scale as a scalar.
    if len(scale_shape) == 0 or (len(scale_shape) == 1 and scale_shape[0] == 1 and not block_size):
        return Granularity("per_tensor")
    rank = len(x_shape)
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise QuantizationError(f"{caller}: axis must be an int, got {axis!r}")
    if not -rank <= axis < rank:
        raise QuantizationError(f"{caller}: axis must be in [{-rank}, {rank - 1}] for x with shape {x_shape}, got axis={axis}")
    axis = int(axis) % rank
    if not block_size:
        if len(scale_shape) == 1 and scale_shape[0] == x_shape[axis]:
            if not version.per_axis:
                raise QuantizationError(
                    f"{caller}: {scale_arg} must be a scalar for {version} (per-tensor only), got shape {scale_shape}"
                )
            return Granularity("per_axis", axis)
        hint = " (set block_size for blocked quantization)" if len(scale_shape) == rank and rank > 1 else ""
        raise QuantizationError(
            f"{caller}: {scale_arg} has shape {scale_shape}, expected () or ({x_shape[axis]},) for axis={axis} of x with shape {x_shape}{hint}"
        )
    # The spec's range rule, block_size in [ceil(D/S), ceil(D/(S-1)) - 1], says
    # exactly that S == ceil(D/block_size): every block but the last is full.
    expected = tuple(-(-d // block_size) if i == axis else d for i, d in enumerate(x_shape))
    if tuple(scale_shape) != expected:
        raise QuantizationError(
            f"{caller}: {scale_arg} has shape {scale_shape}, expected {expected} for block_size={block_size} "
            f"on axis={axis} of x with shape {x_shape}{_fitting_block_sizes(x_shape, scale_shape, axis, scale_arg)}"
        )
    return Granularity("blocked", axis, block_size)


def _fitting_block_sizes(x_shape: tuple[int, ...], scale_shape: tuple[int, ...], axis: int, scale_arg: str) -> str:
    """A hint naming the block sizes that would fit the given scale, if any."""
    others_match = len(scale_shape) == len(x_shape) and all(
        s == d for i, (s, d) in enumerate(zip(scale_shape, x_shape, strict=True)) if i != axis
    )
    d, s = x_shape[axis], scale_shape[axis] if others_match else 0
    if not s:
        return ""
    low, high = -(-d // s), (-(-d // (s - 1)) - 1 if s > 1 else math.inf)
    return f"; block_size in [{low}, {high}] fits this {scale_arg}" if low <= high else ""


def _zero_point_like_scale(
    zero_point: np.ndarray | None, scale: np.ndarray, caller: str, zp_arg: str, scale_arg: str
) -> np.ndarray | None:
    """The zero point in the scale's shape, which every kernel then reads alike."""
    if zero_point is None or zero_point.shape == scale.shape:
        return zero_point
    # A one-element zero point goes with a one-element scale whatever their
    # ranks: ONNX's own backend cases pair a scalar scale with a (1,) zero point.
    if zero_point.size == scale.size == 1:
        return zero_point.reshape(scale.shape)
    raise QuantizationError(f"{caller}: {zp_arg} has shape {zero_point.shape}, expected {scale.shape}, the shape of {scale_arg}")


def _check_attr(name: str, version: OperatorVersion, caller: str, value: Any) -> None:
    if name not in version.attributes:
        raise QuantizationError(f"{caller}: {name} is not an attribute of {version}, got {name}={value!r}")


def _default_precision(scale_type: ElementType) -> np.dtype:
    # float8e8m0 and int32 scales have no division of their own: float32 is
    # exact for every e8m0 power of two and the operator's default type.
    return scale_type.dtype if scale_type.kind == "wide" else np.dtype(np.float32)


def _operator_arrays(op: str, prefix: str, x: Any, scale: Any, zero_point: Any, opset: int | None, domain: str,
                     quantized: ElementType | None = None) -> tuple:  # fmt: skip
    """The version in force and the checked arrays of a Q or DQ call: ``(version, x, scale, zero_point, x_type)``.

    ``prefix`` names the parameters as ONNX does (``y_scale`` for QuantizeLinear, ``x_scale`` for DequantizeLinear).
    Python numbers and lists take the types the call's defaults give (:func:`from_python`): a QuantizeLinear's x
    float32, a scale x's type where x is a float (else float32), a zero point the quantized type (``quantized``:
    QuantizeLinear's output type; DequantizeLinear's x, which must be an array, holds it).
    """
    caller = "quantize_linear" if op == "QuantizeLinear" else "dequantize_linear"
    version = operator_version(op, opset, domain, caller=caller)
    float32 = element_type("float32")
    x = from_python(x, "x", caller, float32) if op == "QuantizeLinear" else check_array(x, "x", caller)
    x_type = _type_of(x, "x", version.x_types, version, caller)
    scale_type = x_type if op == "QuantizeLinear" and x_type.kind == "wide" else float32
    scale = from_python(scale, f"{prefix}_scale", caller, scale_type)
    zero_type = quantized if op == "QuantizeLinear" else x_type
    zero_point = None if zero_point is None else from_python(zero_point, f"{prefix}_zero_point", caller, zero_type)
    return version, x, scale, zero_point, x_type


def plan_quantize(
    x: Any,
    y_scale: Any,
    y_zero_point: Any,
    *,
    axis: Any,
    block_size: Any,
    output_dtype: Any,
    saturate: Any,
    precision: Any,
    opset: int | None,
    domain: str,
) -> tuple[QuantizePlan, np.ndarray, np.ndarray, np.ndarray | None]:
    """Validate a QuantizeLinear call; return the plan and the arrays."""
    caller = "quantize_linear"
    requested = _requested_type(output_dtype, "output_dtype", caller)
    version, x, y_scale, y_zero_point, x_type = _operator_arrays(
        "QuantizeLinear", "y", x, y_scale, y_zero_point, opset, domain, quantized=requested or element_type("uint8")
    )
    if version.scale_types is None and y_scale.dtype != x.dtype:
        raise QuantizationError(f"{caller}: y_scale has type {y_scale.dtype}, expected {x_type} (the type of x) for {version}")
    scale_type = _type_of(y_scale, "y_scale", version.scale_types or frozenset({x_type.name}), version, caller)
    if requested is not None:
        _check_attr("output_dtype", version, caller, requested.name)
    if y_zero_point is not None:
        out_type = _type_of(y_zero_point, "y_zero_point", version.quantized_types, version, caller)
        if requested is not None and requested != out_type:
            raise QuantizationError(f"{caller}: y_zero_point has type {out_type}, expected {requested} to match output_dtype")
    else:
        out_type = requested or element_type("uint8")
        if out_type.name not in version.quantized_types:
            raise QuantizationError(
                f"{caller}: output_dtype must be one of {', '.join(sorted(version.quantized_types))} for {version}, got {out_type}"
            )
    if not isinstance(saturate, (bool, np.bool_, int)):
        raise QuantizationError(f"{caller}: saturate must be a bool, got {saturate!r}")
    if not saturate:
        _check_attr("saturate", version, caller, False)
    prec = _requested_type(precision, "precision", caller)
    if prec is not None:
        _check_attr("precision", version, caller, prec.name)
        if prec.kind != "wide":
            raise QuantizationError(f"{caller}: precision must be one of bfloat16, float, float16, got {prec}")
    y_zero_point = _zero_point_like_scale(y_zero_point, y_scale, caller, "y_zero_point", "y_scale")
    granularity = _granularity(x.shape, y_scale.shape, axis, block_size, version, caller, "y_scale")
    plan = QuantizePlan(
        version=version,
        x_shape=x.shape,
        granularity=granularity,
        output_type=out_type,
        precision=prec.dtype if prec is not None else _default_precision(scale_type),
        saturate=bool(saturate),
    )
    return plan, x, y_scale, y_zero_point


def plan_dequantize(
    x: Any, x_scale: Any, x_zero_point: Any, *, axis: Any, block_size: Any, output_dtype: Any, opset: int | None, domain: str
) -> tuple[DequantizePlan, np.ndarray, np.ndarray, np.ndarray | None]:
    """Validate a DequantizeLinear call; return the plan and the arrays."""
    caller = "dequantize_linear"
    version, x, x_scale, x_zero_point, x_type = _operator_arrays("DequantizeLinear", "x", x, x_scale, x_zero_point, opset, domain)
    scale_type = _type_of(x_scale, "x_scale", version.scale_types, version, caller)
    if x_zero_point is not None:
        zp_type = _type_of(x_zero_point, "x_zero_point", version.quantized_types, version, caller)
        if zp_type != x_type:
            raise QuantizationError(f"{caller}: x_zero_point has type {zp_type}, expected {x_type} (the type of x)")
    requested = _requested_type(output_dtype, "output_dtype", caller)
    if requested is not None:
        _check_attr("output_dtype", version, caller, requested.name)
        if requested.name not in version.output_types:
            raise QuantizationError(
                f"{caller}: output_dtype must be one of {', '.join(sorted(version.output_types))} for {version}, got {requested}"
            )
        out = requested.dtype
    else:
        # An e8m0 scale is no output type; float32 holds every e8m0 value.
        out = scale_type.dtype if scale_type.kind == "wide" else np.dtype(np.float32)
    x_zero_point = _zero_point_like_scale(x_zero_point, x_scale, caller, "x_zero_point", "x_scale")
    granularity = _granularity(x.shape, x_scale.shape, axis, block_size, version, caller, "x_scale")
    plan = DequantizePlan(version=version, x_shape=x.shape, granularity=granularity, input_type=x_type, output_dtype=out)
    return plan, x, x_scale, x_zero_point
