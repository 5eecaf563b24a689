"""The fusion check's verdicts: nodes ONNX Runtime runs in float by design are named as such, the rest warned of."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
from rich.console import Console

import qlinear.onnx as qo
import qlinear.quantize as qq
from qlinear.quantize._fusion import float_by_design
from qlinear.quantize._report_print import print_report
from qlinear.quantize.targets import TARGETS
from qlinear.quantize.targets.ort_cpu import ORT_CPU
from quantize_models import conv_batchnorm, layernorm_attention


def test_float_by_design_names_the_types_onnx_runtime_has_no_integer_kernel_for():
    assert float_by_design("MatMul", "int8", "uint8") is None
    assert float_by_design("MatMul", "int8", "uint16").startswith("16-bit activations:")
    assert float_by_design("MatMul", None, "int16").startswith("16-bit activations:")
    assert float_by_design("Gemm", "float8e4m3fn", None).startswith("float codes:")
    assert float_by_design("MatMul", "int8", "float8e4m3fn").startswith("float codes:")
    assert float_by_design("Gather", "int8", None) is None  # gathered as codes (test_quantize_gathered_table.py)
    assert float_by_design("ConvTranspose", "int8", "uint8").startswith("a ConvTranspose:")
    # Weight-only: MatMul and Gemm weights have a kernel, MatMulNBits; Conv weights none.
    assert float_by_design("MatMul", "int4", None) is None
    assert float_by_design("Gemm", "int8", None) is None
    assert float_by_design("Conv", "int4", None).startswith("a weight-only Conv:")
    assert float_by_design("Conv", "int4", "uint8").startswith("4-bit weights with 8-bit activations:")
    assert float_by_design("MatMul", "uint4", "int8").startswith("4-bit weights with 8-bit activations:")


def _summary(report) -> str:
    out = io.StringIO()
    print_report(report, Console(file=out, width=200, color_system=None))
    return out.getvalue()


def test_16_bit_nodes_run_in_float_without_a_warning():
    model, data = layernorm_attention()
    r = qq.quantize_model(model, None, data, activations="uint16", promote=False).report
    unfused, by_design = r.fusion.unfused, r.fusion.float_by_design
    assert {"q_proj", "k_proj", "v_proj", "o_proj"} <= set(unfused)
    assert set(by_design) == set(unfused) and all(why.startswith("16-bit activations") for why in by_design.values())
    assert "embed" not in unfused  # its codes are gathered (an 8-bit table)
    assert not [w for w in r.warnings if "ONNX Runtime runs" in w]
    text = _summary(r)
    assert f"in float by design: {len(unfused)} (16-bit activations)" in text


def test_a_node_onnx_runtime_should_fuse_but_did_not_is_a_warning(monkeypatch):
    check = ORT_CPU.check_fusion

    def missed(model, nodes):  # ONNX Runtime's verdict with the q projection's fusion lost
        found = check(model, nodes)
        return dataclasses.replace(found, runs_as={**found.runs_as, "q_proj": "MatMul"}, fused={**found.fused, "q_proj": False})

    monkeypatch.setitem(TARGETS, "ort-cpu", dataclasses.replace(ORT_CPU, check_fusion=missed))
    model, data = layernorm_attention()
    r = qq.quantize_model(model, None, data, promote=False).report
    assert "q_proj" in r.fusion.unfused and "q_proj" not in r.fusion.float_by_design
    warned = [w for w in r.warnings if "ONNX Runtime runs" in w]
    assert len(warned) == 1 and "where an integer kernel was expected" in warned[0] and "q_proj" in warned[0]
    assert "embed" not in warned[0]


def test_onnx_runtime_has_no_kernel_for_4_bit_weights_with_8_bit_activations_nor_weight_only_convs():
    # Both run in float on its CPU provider, whatever the layout: named, not warned of as a layout fault.
    model, data = conv_batchnorm()
    for kw in ({"weights": "int4"}, {"activations": None}):
        r = qq.quantize_model(model, None, data, promote=False, **kw).report
        by_design = r.fusion.float_by_design
        assert set(by_design) == set(r.fusion.unfused) == ({"conv0", "conv1", "fc"} if kw.get("weights") else {"conv0", "conv1"})
        assert not [w for w in r.warnings if "ONNX Runtime runs" in w and "integer kernel was expected" in w]
    assert all(why.startswith("a weight-only Conv:") for why in by_design.values())
    assert r.fusion.unfused == ["conv0", "conv1"]  # the Gemm runs as MatMulNBits


def test_a_conv_that_writes_a_model_output_is_float_by_design():
    # A segmentation head: the last Conv's output is the model's. qlinear leaves model outputs unrounded,
    # so that Conv has no QuantizeLinear after it, which ONNX Runtime's QLinearConv needs.
    rng = np.random.default_rng(0)
    g = qo.Graph("head", opset=17)
    x = g.input("x", "float", ("N", 4, 8, 8))
    h = g.op("Relu", [g.op("Conv", [x, rng.standard_normal((8, 4, 3, 3)).astype(np.float32)], name="body", pads=[1, 1, 1, 1])])
    g.output(g.op("Conv", [h, rng.standard_normal((2, 8, 1, 1)).astype(np.float32)], name="head", output_names=["mask"]))
    data = {"x": rng.standard_normal((32, 4, 8, 8)).astype(np.float32)}
    r = qq.quantize_model(g.to_model(), None, data, promote=False).report
    assert r.fusion.unfused == ["head"]
    assert r.fusion.float_by_design["head"].startswith("a Conv whose output is a model output:")
    assert not [w for w in r.warnings if "ONNX Runtime runs" in w]


def test_an_8_bit_node_whose_output_onnx_runtime_requantizes_at_16_bits_is_named_with_why():
    # x -> MatMul (8-bit) -> Transpose -> QuantizeLinear (16-bit, for a promoted reader) -> ...: ONNX Runtime moves
    # that QuantizeLinear up through the Transpose, and the 8-bit MatMul then has a 16-bit output.
    from onnx import TensorProto, helper, numpy_helper

    from qlinear.quantize._fusion import OUTPUT_AT_SIXTEEN_BITS, check_fusion

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.integers(-100, 100, (8, 8)).astype(np.int8), "w1"),
        numpy_helper.from_array(rng.integers(-100, 100, (8, 8)).astype(np.int8), "w2"),
        numpy_helper.from_array(np.float32(0.01), "ws"),
        numpy_helper.from_array(np.float32(0.02), "s8"),
        numpy_helper.from_array(np.uint8(128), "z8"),
        numpy_helper.from_array(np.float32(0.001), "s16"),
        numpy_helper.from_array(np.uint16(32768), "z16"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s8", "z8"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s8", "z8"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w1", "ws"], ["w1d"]),
        helper.make_node("MatMul", ["xd", "w1d"], ["h"], name="mm1"),
        helper.make_node("Transpose", ["h"], ["ht"], perm=[0, 2, 1]),
        helper.make_node("QuantizeLinear", ["ht", "s16", "z16"], ["hq"]),
        helper.make_node("DequantizeLinear", ["hq", "s16", "z16"], ["hd"]),
        helper.make_node("DequantizeLinear", ["w2", "ws"], ["w2d"]),
        helper.make_node("MatMul", ["hd", "w2d"], ["y"], name="mm2"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 8])
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits), opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    found = check_fusion(model, ["mm1", "mm2"])
    assert found.unfused == ["mm1", "mm2"]
    assert found.by_layout == {"mm1": OUTPUT_AT_SIXTEEN_BITS}  # mm2 is 16-bit itself: float_by_design names it


def test_a_matmul_onnx_runtime_fuses_with_a_residual_add_is_named_with_why():
    # y = x + MatMul(x, W) on 2-D inputs: ONNX Runtime makes a float Gemm of the MatMul and the Add (its addend x
    # is a valid Gemm C) before its QDQ fusions. Nothing in the QDQ layout prevents it; the report says so.
    from qlinear.quantize._fusion import MATMUL_ADD_FUSED

    rng = np.random.default_rng(0)
    g = qo.Graph("residual", opset=17)
    x = g.input("x", "float", ("N", 16))
    h = g.op("Add", [x, g.op("MatMul", [x, (rng.standard_normal((16, 16)) * 0.3).astype(np.float32)], name="mix")])
    g.output(g.op("MatMul", [h, (rng.standard_normal((16, 4)) * 0.3).astype(np.float32)], name="head", output_names=["y"]))
    data = {"x": rng.standard_normal((40, 16)).astype(np.float32)}
    r = qq.quantize_model(g.to_model(), None, data, promote=False).report
    assert r.fusion.unfused == ["mix"] and r.fusion.float_by_design == {"mix": MATMUL_ADD_FUSED}
    assert not [w for w in r.warnings if "ONNX Runtime runs" in w]


def test_a_matmul_before_a_relu_whose_output_stays_float_gets_a_quantize_linear_after_the_relu():
    # ONNX Runtime groups the Relu with the MatMul as a clamp a QuantizeLinear makes redundant; without one
    # after the Relu (its reader here is a float Add) the MatMul ran in float.
    rng = np.random.default_rng(0)
    g = qo.Graph("mlp", opset=17)
    x = g.input("x", "float", ("batch", 8))
    h = g.op("Relu", [g.op("MatMul", [x, (rng.standard_normal((8, 16)) * 0.4).astype(np.float32)], name="up")], name="act")
    h = g.op("Add", [h, np.float32(0.5)], name="shift")
    g.output(g.op("MatMul", [h, (rng.standard_normal((16, 4)) * 0.4).astype(np.float32)], name="head", output_names=["y"]))
    data = {"x": rng.standard_normal((40, 8)).astype(np.float32)}
    r = qq.quantize_model(g.to_model(), None, data, promote=False)
    assert {n.name: n.runs_as for n in r.report.nodes} == {"up": "QLinearMatMul", "head": "MatMulIntegerToFloat"}
    (relu,) = [n for n in r.model.graph.node if n.name == "act"]
    assert [n.op_type for n in r.model.graph.node if relu.output[0] in n.input] == ["QuantizeLinear"]
