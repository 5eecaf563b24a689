"""The per-version table against the schemas onnx and ONNX Runtime ship."""

from __future__ import annotations

import pytest
from onnx import defs

import qlinear
from qlinear.spec import OPERATOR_VERSIONS, operator_version, type_opset

AI_ONNX = [r for r in OPERATOR_VERSIONS if r.domain == ""]


def schema_types(schema, input_name):
    inp = next(i for i in schema.inputs if i.name == input_name)
    if inp.type_str.startswith("tensor("):
        return {inp.type_str[7:-1]}
    constraint = next(c for c in schema.type_constraints if c.type_param_str == inp.type_str)
    return {t[7:-1] for t in constraint.allowed_type_strs}


def output_types(schema):
    out = schema.outputs[0]
    constraint = next(c for c in schema.type_constraints if c.type_param_str == out.type_str)
    return {t[7:-1] for t in constraint.allowed_type_strs}


@pytest.mark.parametrize("row", AI_ONNX, ids=str)
def test_table_matches_onnx_schema(row):
    schema = defs.get_schema(row.op, row.version, "")
    assert schema.since_version == row.version
    assert set(schema.attributes) == set(row.attributes)
    if row.op == "QuantizeLinear":
        assert schema_types(schema, "x") == set(row.x_types)
        scale = schema_types(schema, "y_scale")
        assert scale == (set(row.scale_types) if row.scale_types else set(row.x_types))
        assert schema_types(schema, "y_zero_point") == set(row.quantized_types)
        # ONNX ties the scale to x's type parameter exactly when the table says so.
        tied = (
            next(i for i in schema.inputs if i.name == "y_scale").type_str
            == next(i for i in schema.inputs if i.name == "x").type_str
        )
        assert tied == (row.scale_types is None)
    else:
        assert schema_types(schema, "x") == set(row.x_types)
        assert schema_types(schema, "x_scale") == set(row.scale_types)
        if "output_dtype" in row.attributes:
            assert output_types(schema) == set(row.output_types)


def test_table_has_every_onnx_version():
    for op in ("QuantizeLinear", "DequantizeLinear"):
        shipped = {s.since_version for s in defs.get_all_schemas_with_history() if s.name == op and s.domain == ""}
        assert shipped == {r.version for r in AI_ONNX if r.op == op}


def test_microsoft_rows_match_onnxruntime_schema():
    ort = pytest.importorskip("onnxruntime")
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    del ort
    schemas = {
        s.name: s
        for s in C.get_all_operator_schema()
        if s.domain == "com.microsoft" and s.name in ("QuantizeLinear", "DequantizeLinear")
    }
    for row in (r for r in OPERATOR_VERSIONS if r.domain == "com.microsoft"):
        s = schemas[row.op]
        types = {c.type_param_str: {t[7:-1] for t in c.allowed_type_strs} for c in s.type_constraints}
        by_input = {i.name: types.get(i.typeStr) for i in s.inputs}
        assert by_input["x"] == set(row.x_types)
        assert set(s.attributes) == set(row.attributes)
        if row.op == "QuantizeLinear":
            assert by_input["y_zero_point"] == set(row.quantized_types)
        else:
            assert by_input["x_scale"] == set(row.scale_types)


@pytest.mark.parametrize(
    ("opset", "version"),
    [
        (10, 10),
        (12, 10),
        (13, 13),
        (18, 13),
        (19, 19),
        (20, 19),
        (21, 21),
        (22, 21),
        (23, 23),
        (24, 24),
        (25, 25),
        (27, 25),
        (28, 28),
        (None, 28),
    ],
)
def test_operator_version_in_force_at_opset(opset, version):
    assert operator_version("QuantizeLinear", opset, caller="t").version == version
    assert operator_version("DequantizeLinear", opset, caller="t").version == version


def test_operator_version_rejects_opset_before_operator_existed():
    with pytest.raises(qlinear.QuantizationError, match="exists from opset 10"):
        operator_version("QuantizeLinear", 9, caller="t")


# The first opset of each type as the quantizer and the benchmark wrote it before reading it from the table.
TYPE_OPSETS = {
    "uint8": 10, "int8": 10, "int32": 10, "float8e4m3fn": 19, "float8e5m2": 19, "float8e4m3fnuz": 19,
    "float8e5m2fnuz": 19, "uint16": 21, "int16": 21, "uint4": 21, "int4": 21, "float4e2m1": 23, "uint2": 25,
    "int2": 25, "float6e2m3": 28, "float6e3m2": 28,
}  # fmt: skip


@pytest.mark.parametrize("type_name", sorted(TYPE_OPSETS))
def test_type_opset_first_version(type_name):
    assert type_opset(type_name) == TYPE_OPSETS[type_name]
    # Both operators take the type from that opset, but int32, which only DequantizeLinear reads.
    for op in ("QuantizeLinear", "DequantizeLinear"):
        takes = type_name in operator_version(op, TYPE_OPSETS[type_name], caller="t").quantized_types
        assert takes == (op == "DequantizeLinear" or type_name != "int32")
        if TYPE_OPSETS[type_name] > 10:
            assert type_name not in operator_version(op, TYPE_OPSETS[type_name] - 1, caller="t").quantized_types


def test_type_opset_rejects_unquantized_type():
    with pytest.raises(qlinear.QuantizationError, match="type_opset: type_name must be"):
        type_opset("float8e8m0")
