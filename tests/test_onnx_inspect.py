"""``qlinear inspect`` and qlinear.onnx's model report."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qlinear import to_tensor_proto
from qlinear.cli import main
from qlinear.onnx import Graph, save
from qlinear.onnx._inspect import inspect_model


def _model():
    g = Graph("demo", opset=21)
    x = g.input("x", "float", ("N", 64))
    dx = g.dequantize_linear(
        g.quantize_linear(x, np.float32(0.05), np.uint8(128), name="act_q"), np.float32(0.05), np.uint8(128), name="act_dq"
    )
    w = np.arange(64 * 32).reshape(64, 32) % 16 - 8
    scales = np.linspace(0.01, 0.02, 64).astype(np.float32).reshape(2, 32)
    wq = g.dequantize_linear(w.astype(ml_dtypes.int4), scales, axis=0, block_size=32, name="w_dq")
    g.output(g.op("MatMul", [dx, wq], name="mm"))
    g.output(
        g.dequantize_linear(
            np.arange(-5, 5, dtype=np.int8),
            np.linspace(0.1, 1, 10).astype(np.float32),
            np.arange(10, dtype=np.int8),
            axis=0,
            name="pc",
        )
    )
    g.output(g.quantize_linear(x, np.float32(0.1), np.int16(3), domain="com.microsoft", name="ms_q"))
    return g.to_model()


def test_inspect_reports_each_qdq_node():
    report = inspect_model(_model())
    assert report.opsets == {"": 21, "com.microsoft": 1}
    assert report.node_domains == ["ai.onnx", "com.microsoft"]
    nodes = {n.name: n for n in report.qdq_nodes}
    assert sorted(nodes) == ["act_dq", "act_q", "ms_q", "pc", "w_dq"]
    w = nodes["w_dq"]
    assert (w.quantized_type, w.granularity, w.axis, w.block_size) == ("int4", "blocked", 0, 32)
    assert (w.scale_min, w.scale_max) == (float(np.float32(0.01)), float(np.float32(0.02)))
    # 64*32 int4 codes in 1024 bytes plus 64 float32 scales, against 64*32 float32.
    assert (w.quantized_bytes, w.float_bytes) == (1024 + 256, 8192)
    pc = nodes["pc"]
    assert (pc.granularity, pc.axis, pc.zero_points, pc.zero_points_are_range) == ("per_axis", 0, [0.0, 9.0], True)
    q = nodes["act_q"]
    assert (q.version, q.quantized_type, q.granularity, q.zero_points, q.quantized_bytes) == (
        "QuantizeLinear version 21 (ai.onnx)",
        "uint8",
        "per_tensor",
        [128.0],
        0,
    )
    assert (nodes["ms_q"].domain, nodes["ms_q"].quantized_type) == ("com.microsoft", "int16")
    assert report.problems == []


def test_inspect_reports_nodes_the_opset_does_not_allow():
    node = helper.make_node("DequantizeLinear", ["w", "s"], ["y"], name="dq_blocked", axis=1, block_size=2)
    graph = helper.make_graph(
        [node],
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[to_tensor_proto(np.zeros((2, 4), np.int8), "w"), to_tensor_proto(np.ones((2, 2), np.float32), "s")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    report = inspect_model(model)
    assert report.qdq_nodes[0].problem == report.problems[0]
    assert report.problems[0].startswith(
        "node 'dq_blocked': dequantize_linear: block_size is not an attribute of DequantizeLinear version 19"
    )


def test_cli_inspect_prints_tables_and_json(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    save(_model(), path)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "5 Q/DQ nodes" in out and "w_dq" in out and "blocked" in out
    assert main(["inspect", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["quantized_bytes"] == sum(n["quantized_bytes"] for n in data["qdq_nodes"]) > 0
    assert {n["name"]: n["granularity"] for n in data["qdq_nodes"]}["pc"] == "per_axis"


def test_cli_inspect_exit_status_for_problems_and_unreadable_files(tmp_path, capsys):
    node = helper.make_node("QuantizeLinear", ["x", "s"], ["y"], name="q10", axis=0)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [2])],
        initializer=[to_tensor_proto(np.ones(2, np.float32), "s")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)])
    path = tmp_path / "bad.onnx"
    path.write_bytes(model.SerializeToString())
    assert main(["inspect", str(path)]) == 1
    assert "q10" in capsys.readouterr().out
    path.write_bytes(path.read_bytes()[:-9])
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert "truncated or corrupt" in err


def _dq_model(scale: np.ndarray, *, in_if: bool = False) -> onnx.ModelProto:
    """y = DequantizeLinear(int8 codes, scale), in the main graph or inside an If's branches."""
    from onnx import numpy_helper

    codes = numpy_helper.from_array(np.arange(4, dtype=np.int8), "codes")
    s = numpy_helper.from_array(scale.astype(np.float32), "scale")
    dq = helper.make_node("DequantizeLinear", ["codes", "scale"], ["y"], name="dq")
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    if not in_if:
        graph = helper.make_graph([dq], "g", [], [out], initializer=[codes, s])
    else:
        branch = helper.make_graph([dq], "branch", [], [out])
        cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
        node = helper.make_node("If", ["cond"], ["y"], name="choose", then_branch=branch, else_branch=branch)
        graph = helper.make_graph([node], "g", [cond], [out], initializer=[codes, s])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def test_qdq_nodes_inside_subgraphs_are_reported(tmp_path, capsys):
    report = inspect_model(_dq_model(np.float32(0.5), in_if=True))
    inner = [n for n in report.qdq_nodes if n.subgraph]
    assert sorted(n.subgraph for n in inner) == ["choose.else_branch", "choose.then_branch"]
    assert inner[0].scale_min == 0.5 and report.node_count == 3
    save(_dq_model(np.float32(0.5), in_if=True), tmp_path / "if.onnx")
    assert main(["inspect", str(tmp_path / "if.onnx")]) == 0
    assert "2 Q/DQ nodes" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("scale", "said"),
    [
        (np.float32(np.nan), "1 of 1 scale(s) NaN"),
        (np.float32(0.0), "1 of 1 scale(s) zero"),
        (np.float32(-0.5), "1 of 1 scale(s) negative"),
        (np.float32(1e-40), "1 of 1 scale(s) subnormal"),
        (np.float32(np.inf), "1 of 1 scale(s) infinite"),
    ],
)
def test_bad_scales_are_warnings_and_exit_1(tmp_path, capsys, scale, said):
    report = inspect_model(_dq_model(scale))
    assert any(said in w for w in report.warnings), report.warnings
    if np.isnan(scale):
        assert report.qdq_nodes[0].scale_min is None  # no "nan .. nan" range
    save(_dq_model(scale), tmp_path / "m.onnx")
    assert main(["inspect", str(tmp_path / "m.onnx")]) == 1
    assert said in capsys.readouterr().out


def test_a_declared_output_type_unlike_the_zero_point_is_a_warning():
    from onnx import numpy_helper

    q = helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], name="q")
    graph = helper.make_graph(
        [q], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("q", TensorProto.INT8, [4])],
        initializer=[numpy_helper.from_array(np.float32(0.1), "s"), numpy_helper.from_array(np.uint8(128), "zp")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    report = inspect_model(model)
    assert report.warnings == ["node 'q': output 'q' is declared INT8, its zero point is UINT8"]


@pytest.mark.parametrize(("weights", "zero_point_rows"), [("int8", False), ("uint8", True)])
def test_a_table_gathered_as_codes_counts_its_codes_and_rows_parameters(tmp_path, capsys, weights, zero_point_rows):
    import qlinear.quantize as qq
    from quantize_models import layernorm_attention

    model, data = layernorm_attention()
    q = qq.quantize_model(model, None, data, weights=weights, promote=False).model
    report = inspect_model(q)
    (table,) = report.gathered_tables
    rows, columns = 50, 32  # the test model's vocabulary and width
    assert (table.name, table.quantized_type, table.rows, table.columns) == ("embed", weights, rows, columns)
    # The codes, a float32 scale a row and, for unsigned codes, a float32 zero point a row.
    assert table.quantized_bytes == rows * columns + rows * 4 * (2 if zero_point_rows else 1)
    assert table.float_bytes == rows * columns * 4
    assert report.float_bytes == sum(n.float_bytes for n in report.qdq_nodes) + table.float_bytes
    path = tmp_path / "q.onnx"
    onnx.save(q, path)
    main(["inspect", str(path)])
    assert "Table gathered as codes: embed reads" in capsys.readouterr().out


def test_a_table_dequantized_whole_for_a_gather_is_a_warning():
    g = Graph("table", opset=21)
    ids = g.input("ids", "int64", ("N",))
    codes = (np.arange(300 * 16).reshape(300, 16) % 200 - 100).astype(np.int8)
    table = g.dequantize_linear(codes, np.full(300, 0.01, np.float32), axis=0, name="table_dq")
    g.output(g.op("Gather", [table, ids], name="embed"))
    report = inspect_model(g.to_model())
    (warning,) = [w for w in report.warnings if "dequantizes all of table" in w]
    assert "'table_dq'" in warning and "(300 x 16)" in warning and "'embed'" in warning
    # The layout qlinear quantize writes has no such warning.
    import qlinear.quantize as qq
    from quantize_models import layernorm_attention

    model, data = layernorm_attention()
    assert not [w for w in inspect_model(qq.quantize_model(model, None, data, promote=False).model).warnings if "table" in w]


def test_a_weight_two_layers_share_is_counted_once():
    # Two Gemms read one weight: the quantized model stores its codes once, and the totals count them once.
    import qlinear.quantize as qq

    rng = np.random.default_rng(0)
    g = Graph("shared", opset=17)
    x = g.input("x", "float", ("N", 64))
    w = g.initializer("W", rng.standard_normal((64, 64)).astype(np.float32))
    hidden = g.op("Relu", [g.op("Gemm", [x, w], name="fc1")], name="act")
    g.output(g.op("Gemm", [hidden, w], name="fc2"))
    q = qq.quantize_model(g.to_model(), None, {"x": rng.standard_normal((32, 64)).astype(np.float32)}, promote=False).model
    readers = [n for n in q.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == "W_q"]
    report = inspect_model(q)
    weight = [n for n in report.qdq_nodes if n.stored == "W_q"]
    assert len(weight) == len(readers) >= 1
    biases = sum(n.float_bytes for n in report.qdq_nodes if n.stored and n.stored != "W_q")
    assert report.float_bytes == 64 * 64 * 4 + biases  # once, however many layers read it
    assert report.quantized_bytes == weight[0].quantized_bytes + sum(
        n.quantized_bytes for n in report.qdq_nodes if n.stored and n.stored != "W_q"
    )


def test_float_constants_kept_beside_quantized_ones_are_counted():
    # A weight two MatMuls share, one left float: the file holds the quantized copy and the float one. The quantized
    # constants' ratio says nothing of the second, so the report counts it (scales are not among them).
    import qlinear.quantize as qq
    from quantize_models import shared_weight

    model, data = shared_weight(64)
    w_bytes = 64 * 64 * 4
    one_float = inspect_model(qq.quantize_model(model, None, data, exclude=("mm2",), promote=False).model)
    assert one_float.float_kept_bytes == w_bytes and one_float.float_bytes == w_bytes
    both = inspect_model(qq.quantize_model(model, None, data, promote=False).model)
    assert both.float_kept_bytes == 0 and both.float_bytes == w_bytes
