"""Which types and attributes each operator version allows: one table.

Each row is a version of QuantizeLinear or DequantizeLinear in a domain, with
the types its schema admits and the attributes it defines. ``opset=N`` picks
the newest row whose version is at most N. The ai.onnx rows are checked
against the schemas that the onnx package ships in ``tests/test_spec.py``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from qlinear._errors import QuantizationError

__all__ = ["OperatorVersion", "OPERATOR_VERSIONS", "operator_version", "type_opset", "DOMAINS"]

DOMAINS = ("", "com.microsoft")


@dataclass(frozen=True)
class OperatorVersion:
    """One version of one operator, as its schema defines it.

    Attributes:
        op: ``"QuantizeLinear"`` or ``"DequantizeLinear"``.
        domain: ``""`` (ai.onnx) or ``"com.microsoft"``.
        version: the operator's since-version.
        x_types: types input ``x`` may have.
        scale_types: types the scale may have; ``None`` when the schema ties
            the scale's type to ``x``'s.
        quantized_types: types of the quantized tensor (QuantizeLinear's
            ``y``, DequantizeLinear's ``x``) and so of the zero point.
        output_types: DequantizeLinear's possible outputs (``output_dtype``).
        attributes: attribute names the version defines.
        per_axis: a 1-D scale along ``axis`` is allowed.
    """

    op: str
    domain: str
    version: int
    x_types: frozenset[str]
    scale_types: frozenset[str] | None
    quantized_types: frozenset[str]
    output_types: frozenset[str]
    attributes: frozenset[str]
    per_axis: bool

    @property
    def blocked(self) -> bool:
        return "block_size" in self.attributes

    def __str__(self) -> str:
        domain = self.domain or "ai.onnx"
        return f"{self.op} version {self.version} ({domain})"


def _set(*names: str) -> frozenset[str]:
    return frozenset(names)


_FLOATS = _set("float", "float16", "bfloat16")
_INT8 = _set("int8", "uint8")
_FLOAT8 = _set("float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz")
_Q19 = _INT8 | _FLOAT8
_Q21 = _Q19 | _set("int16", "uint16", "int4", "uint4")
_Q23 = _Q21 | _set("float4e2m1")
_Q25 = _Q23 | _set("int2", "uint2")
_Q28 = _Q25 | _set("float6e2m3", "float6e3m2")
_MS_Q = _set("int8", "uint8", "int16", "uint16", "int4", "uint4")

_NO_ATTRS: frozenset[str] = frozenset()
_Q_ATTRS_21 = _set("axis", "saturate", "block_size", "output_dtype")
_Q_ATTRS_23 = _Q_ATTRS_21 | _set("precision")
_DQ_ATTRS_21 = _set("axis", "block_size")
_DQ_ATTRS_23 = _DQ_ATTRS_21 | _set("output_dtype")


def _q(
    version: int, x: frozenset[str], scale: frozenset[str] | None, q: frozenset[str], attrs: frozenset[str], *, domain: str = ""
) -> OperatorVersion:
    return OperatorVersion(
        "QuantizeLinear", domain, version, x, scale, q, frozenset(), attrs, per_axis=version > 10 or domain != ""
    )


def _dq(
    version: int, q: frozenset[str], scale: frozenset[str], out: frozenset[str], attrs: frozenset[str], *, domain: str = ""
) -> OperatorVersion:
    # DequantizeLinear's x is the quantized tensor: x_types == quantized_types.
    return OperatorVersion("DequantizeLinear", domain, version, q, scale, q, out, attrs, per_axis=version > 10 or domain != "")


_X = _set("float", "int32")
_X19 = _FLOATS | _set("int32")
_S23 = _FLOATS | _set("int32")
_S24 = _S23 | _set("float8e8m0")
_DQS24 = _FLOATS | _set("float8e8m0")
_I32 = _set("int32")

OPERATOR_VERSIONS: tuple[OperatorVersion, ...] = (
    _q(10, _X, _set("float"), _INT8, _NO_ATTRS),
    _q(13, _X, _set("float"), _INT8, _set("axis")),
    _q(19, _X19, None, _Q19, _set("axis", "saturate")),
    _q(21, _X19, None, _Q21, _Q_ATTRS_21),
    _q(23, _X19, _S23, _Q23, _Q_ATTRS_23),
    _q(24, _X19, _S24, _Q23, _Q_ATTRS_23),
    _q(25, _X19, _S24, _Q25, _Q_ATTRS_23),
    _q(28, _X19, _S24, _Q28, _Q_ATTRS_23),
    _q(1, _set("float", "float16"), None, _MS_Q, _set("axis"), domain="com.microsoft"),
    _dq(10, _INT8 | _I32, _set("float"), _set("float"), _NO_ATTRS),
    _dq(13, _INT8 | _I32, _set("float"), _set("float"), _set("axis")),
    _dq(19, _Q19 | _I32, _FLOATS, _FLOATS, _set("axis")),
    _dq(21, _Q21 | _I32, _FLOATS, _FLOATS, _DQ_ATTRS_21),
    _dq(23, _Q23 | _I32, _FLOATS, _FLOATS, _DQ_ATTRS_23),
    _dq(24, _Q23 | _I32, _DQS24, _FLOATS, _DQ_ATTRS_23),
    _dq(25, _Q25 | _I32, _DQS24, _FLOATS, _DQ_ATTRS_23),
    _dq(28, _Q28 | _I32, _DQS24, _FLOATS, _DQ_ATTRS_23),
    _dq(1, _MS_Q | _I32, _set("float", "float16"), _set("float", "float16"), _set("axis"), domain="com.microsoft"),
)

_NEWEST_OPSET = 28


@functools.cache
def _versions_of(op: str, domain: str) -> tuple[OperatorVersion, ...]:
    """``op``'s versions in ``domain``, oldest first (looked up once: every call validates against them)."""
    return tuple(sorted((r for r in OPERATOR_VERSIONS if r.op == op and r.domain == domain), key=lambda r: r.version))


def operator_version(op: str, opset: int | None, domain: str = "", *, caller: str) -> OperatorVersion:
    """The version of ``op`` in force at ``opset`` of ``domain``.

    ``opset=None`` means the newest. For ``domain="com.microsoft"`` the opset
    is that domain's (version 1 is the only one).

    Raises:
        QuantizationError: unknown domain, or an opset before the operator
            existed.
    """
    if domain not in DOMAINS:
        raise QuantizationError(f"{caller}: domain must be one of {DOMAINS!r}, got {domain!r}")
    if opset is not None and (not isinstance(opset, (int,)) or isinstance(opset, bool)):
        raise QuantizationError(f"{caller}: opset must be an int or None, got {opset!r}")
    rows = _versions_of(op, domain)
    if opset is None:
        return rows[-1]
    eligible = [r for r in rows if r.version <= opset]
    if not eligible:
        raise QuantizationError(
            f"{caller}: {op} exists from opset {rows[0].version} of domain {domain or 'ai.onnx'!r}, got opset={opset}"
        )
    if domain == "" and opset > _NEWEST_OPSET:
        raise QuantizationError(f"{caller}: opset must be at most {_NEWEST_OPSET}, the newest qlinear knows, got opset={opset}")
    return eligible[-1]


@functools.cache
def type_opset(type_name: str) -> int:
    """The first ai.onnx opset whose QuantizeLinear or DequantizeLinear takes ``type_name`` as its quantized type.

    Both operators take each type from the same version, but for int32,
    which only DequantizeLinear reads (a quantized bias).

    Raises:
        QuantizationError: neither operator takes the type in any version.

    >>> type_opset("int8"), type_opset("float8e4m3fn"), type_opset("int4")
    (10, 19, 21)
    """
    versions = [r.version for r in OPERATOR_VERSIONS if r.domain == "" and type_name in r.quantized_types]
    if not versions:
        raise QuantizationError(
            f"type_opset: type_name must be a quantized type of QuantizeLinear or DequantizeLinear, got {type_name!r}"
        )
    return min(versions)
