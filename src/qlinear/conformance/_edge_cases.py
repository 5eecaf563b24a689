"""A generated matrix of edge cases: every version x type x granularity.

Each case is small (a few dozen elements) and packed with the values where
implementations differ: signed zeros, NaN, infinities, exact ties, values
beyond int32, subnormals, saturation edges, ragged blocks, negative axes,
16-bit precisions and float8e8m0 scales.
"""

from __future__ import annotations

import numpy as np

from qlinear.dtypes import ElementType, element_type
from qlinear.onnx._node_case import NodeCase
from qlinear.spec import OPERATOR_VERSIONS, OperatorVersion

__all__ = ["generated_cases"]

_SHAPE = (4, 6)
# (kind, attributes, scale shape) for a (4, 6) input.
_GRANULARITIES = (
    ("per_tensor", {}, ()),
    ("per_axis", {"axis": 1}, (6,)),
    ("per_axis", {"axis": -2}, (4,)),
    ("blocked", {"axis": 1, "block_size": 4}, (4, 2)),
    ("blocked", {"axis": 0, "block_size": 3}, (2, 6)),
)
# Powers of two keep ties exact; 0.1 and 3 make the division round.
_SCALES = np.array([0.5, 0.25, 2.0, 1.0, 0.1, 3.0], dtype=np.float64)


def _x_values(t: ElementType, rng: np.random.Generator) -> np.ndarray:
    """24 float64 values probing ``t``'s rounding and saturation."""
    span = (t.qmax - t.qmin) if t.is_integer else t.max_finite
    # Exact ties, then values a hair off a tie: those round differently when
    # the division is done in a 16-bit precision instead of float32.
    special = [0.0, -0.0, np.nan, np.inf, -np.inf, 3e38, -3e38, 1e10, -1e10, 1e-45, 0.5, 2.5, -2.5, 3.5, 2.5004, -0.5002]
    near = [span * 0.5 + 0.5, span + 0.5, -span - 0.5, span * 1.0625]
    rest = rng.normal(0, span / 4 + 1, size=24 - len(special) - len(near))
    return np.array(special + near + list(rest), dtype=np.float64)


def _scale(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    size = int(np.prod(shape))
    return np.resize(_SCALES, size).reshape(shape).astype(dtype)


def _zero_point(t: ElementType, shape: tuple[int, ...], rng: np.random.Generator, *, nonzero_float: bool = False) -> np.ndarray:
    size = int(np.prod(shape))
    if t.is_integer:
        low, high = (t.qmin, t.qmax) if t.name != "int32" else (-1000, 1000)
        values = rng.integers(low, high + 1, size=size)
    else:
        values = np.where(np.arange(size) % 2, 1.0, 0.5) if nonzero_float else np.zeros(size)
    return values.reshape(shape).astype(t.dtype)


def _codes(t: ElementType, rng: np.random.Generator) -> np.ndarray:
    """Every bit pattern of ``t`` first (NaN and inf codes included), then random ones."""
    n = int(np.prod(_SHAPE))
    if t.bits <= 8:
        codes = np.resize(np.arange(1 << t.bits, dtype=np.uint8), n)
        rng.shuffle(codes)
        return codes.view(t.dtype).reshape(_SHAPE) if t.bits == 8 else codes.astype(np.uint8).view(t.dtype).reshape(_SHAPE)
    info = np.iinfo(t.dtype)
    edges = np.array([info.min, info.max, 0, -1 if info.min < 0 else 1], dtype=np.int64)
    values = np.concatenate([edges, rng.integers(info.min, info.max, size=n - edges.size, endpoint=True)])
    return values.astype(t.dtype).reshape(_SHAPE)


def _quantize_cases(row: OperatorVersion, rng: np.random.Generator) -> list[NodeCase]:
    cases = []
    domain_tag = f"{row.domain}." if row.domain else ""
    x_types = sorted(row.x_types - {"int32"})
    for qname in sorted(row.quantized_types):
        t = element_type(qname)
        for kind, attrs, sshape in _GRANULARITIES:
            if (kind == "per_axis" and not row.per_axis) or (kind == "blocked" and not row.blocked):
                continue
            for x_name in x_types if kind == "per_tensor" else ["float"]:
                x_dtype = element_type(x_name).dtype
                scale_dtype = x_dtype if row.scale_types is None else np.dtype(np.float32)
                x = _x_values(t, rng).astype(x_dtype).reshape(_SHAPE) * np.resize(_SCALES, _SHAPE).astype(x_dtype)
                inputs = [x, _scale(sshape, scale_dtype), _zero_point(t, sshape, rng)]
                name = f"{domain_tag}QuantizeLinear-{row.version}/{qname}/{kind}{attrs.get('axis', '')}/x={x_name}"
                cases.append(NodeCase(name, "QuantizeLinear", row.version, inputs, dict(attrs), row.domain))
                if t.saturate_applies and "saturate" in row.attributes and kind == "per_tensor" and x_name == "float":
                    cases.append(
                        NodeCase(name + "/saturate=0", "QuantizeLinear", row.version, inputs, {"saturate": 0}, row.domain)
                    )
        if row.scale_types and "float16" in row.scale_types and row.scale_types != row.x_types and row.op == "QuantizeLinear":
            # Scale type differs from x's: the division happens in the scale's type, or in `precision`.
            x = _x_values(t, rng).astype(np.float32).reshape(_SHAPE)
            for sname, extra in (("float16", {}), ("bfloat16", {}), ("float16", {"precision": 1})):
                inputs = [x, _scale((), element_type(sname).dtype), None]
                attrs = {"output_dtype": t.onnx_enum, **extra}
                cases.append(
                    NodeCase(
                        f"QuantizeLinear-{row.version}/{qname}/scale={sname}/{extra or 'precision=scale'}",
                        "QuantizeLinear",
                        row.version,
                        inputs,
                        attrs,
                    )
                )
    if "int32" in row.x_types:
        x = (np.array([0, 1, -1, 3, 5, -5, 2**24 + 1, -(2**31), 2**31 - 1, 7, 1000, -1000]).astype(np.int32)).reshape(3, 4)
        scale_dtype = np.int32 if row.scale_types is None else np.float32
        scale = np.asarray(2, dtype=scale_dtype)
        cases.append(
            NodeCase(
                f"{domain_tag}QuantizeLinear-{row.version}/int8/x=int32",
                "QuantizeLinear",
                row.version,
                [x, scale, np.asarray(3, np.int8)],
                {},
                row.domain,
            )
        )
    if row.scale_types and "float8e8m0" in row.scale_types:
        x = _x_values(element_type("int8"), rng).astype(np.float32).reshape(_SHAPE)
        scale = np.array([0.25, 1, 4, 2**-20, 2**20, 0.5], dtype=np.float32).astype(element_type("float8e8m0").dtype)
        cases.append(
            NodeCase(
                f"QuantizeLinear-{row.version}/int8/scale=float8e8m0",
                "QuantizeLinear",
                row.version,
                [x, scale, np.zeros(6, np.int8)],
                {"axis": 1},
            )
        )
    return cases


def _dequantize_cases(row: OperatorVersion, rng: np.random.Generator) -> list[NodeCase]:
    cases = []
    domain_tag = f"{row.domain}." if row.domain else ""
    for qname in sorted(row.quantized_types):
        t = element_type(qname)
        for kind, attrs, sshape in _GRANULARITIES:
            if (kind == "per_axis" and not row.per_axis) or (kind == "blocked" and not row.blocked):
                continue
            for sname in sorted(row.scale_types) if kind == "per_tensor" else ["float"]:
                scale = _scale(sshape, element_type(sname).dtype)
                inputs = [_codes(t, rng), scale, _zero_point(t, sshape, rng)]
                name = f"{domain_tag}DequantizeLinear-{row.version}/{qname}/{kind}{attrs.get('axis', '')}/scale={sname}"
                cases.append(NodeCase(name, "DequantizeLinear", row.version, inputs, dict(attrs), row.domain))
        if "output_dtype" in row.attributes:
            for out in sorted(row.output_types - {"float"}):
                inputs = [_codes(t, rng), _scale((), np.dtype(np.float32)), None]
                cases.append(
                    NodeCase(
                        f"DequantizeLinear-{row.version}/{qname}/output_dtype={out}",
                        "DequantizeLinear",
                        row.version,
                        inputs,
                        {"output_dtype": element_type(out).onnx_enum},
                    )
                )
    return cases


def _nonzero_float_zero_points(rng: np.random.Generator) -> list[NodeCase]:
    """Float zero points that are not zero: the formula still applies."""
    cases = []
    for qname in ("float8e4m3fn", "float8e5m2", "float4e2m1"):
        t = element_type(qname)
        zp = _zero_point(t, (6,), rng, nonzero_float=True)
        x = _x_values(t, rng).astype(np.float32).reshape(_SHAPE)
        cases.append(
            NodeCase(
                f"QuantizeLinear-25/{qname}/nonzero-zero-point",
                "QuantizeLinear",
                25,
                [x, _scale((6,), np.dtype(np.float32)), zp],
                {"axis": 1},
            )
        )
        cases.append(
            NodeCase(
                f"DequantizeLinear-25/{qname}/nonzero-zero-point",
                "DequantizeLinear",
                25,
                [_codes(t, rng), _scale((6,), np.dtype(np.float32)), zp],
                {"axis": 1},
            )
        )
    return cases


def _dynamic_cases() -> list[NodeCase]:
    inputs = {
        "all-zero": np.zeros((2, 3), np.float32),
        "positive": np.array([0.5, 1.0, 7.25, 3.0], np.float32),
        "negative": np.array([-0.5, -1.0, -7.25, -3.0], np.float32),
        "mixed-ties": np.array([-1.0, 0.0, 1.0, 2.5, -2.5, 254 / 255], np.float32),
        "nan": np.array([np.nan, 1.0, -2.0, 0.5], np.float32),
        "empty": np.zeros((0,), np.float32),
    }
    return [NodeCase(f"DynamicQuantizeLinear-11/{k}", "DynamicQuantizeLinear", 11, [v]) for k, v in inputs.items()]


def generated_cases(seed: int = 0) -> list[NodeCase]:
    """The whole generated matrix, deterministic for a seed."""
    rng = np.random.default_rng(seed)
    cases: list[NodeCase] = []
    with np.errstate(all="ignore"):  # edge values overflow 16-bit types on purpose
        for row in OPERATOR_VERSIONS:
            cases += _quantize_cases(row, rng) if row.op == "QuantizeLinear" else _dequantize_cases(row, rng)
        return cases + _nonzero_float_zero_points(rng) + _dynamic_cases()
