"""Gates between 8-bit tensors (HardSwish, SiLU, x * HardSigmoid(x)) run on ONNX Runtime's integer kernels."""

from __future__ import annotations

import io

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from rich.console import Console

import qlinear.quantize as qq
import qlinear.quantize._build as build
from qlinear.quantize._html import render_html
from qlinear.quantize._integer_gates import integer_gates
from qlinear.quantize._session import optimized_graph, session
from quantize_models import GATES, gated_convs, squeeze_excite

# What each gate is made of in float: none of it may be left once the gate runs on integer kernels.
_FLOAT_GATE_OPS = {"HardSwish", "HardSigmoid", "Sigmoid", "Mul", "Div", "Clip", "Add"}
# The last gate, in float, as ONNX Runtime runs it (it splits HardSwish into HardSigmoid and Mul).
_LAST_GATE_IN_FLOAT = {
    "HardSwish": ["HardSigmoid", "Mul"],
    "hard_swish_written_out": ["Add", "Clip", "Div", "Mul"],
    "hard_sigmoid_product": ["HardSigmoid", "Mul"],
    "SiLU": ["Mul", "Sigmoid"],
}


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def _output_db(model: onnx.ModelProto, float_model: onnx.ModelProto, x: np.ndarray) -> float:
    want = session(float_model).run(None, {"x": x})[0].astype(np.float64)
    got = session(model).run(None, {"x": x})[0]
    return float(10 * np.log10((want**2).sum() / ((want - got) ** 2).sum()))


@pytest.mark.parametrize("gate", GATES)
def test_gates_between_quantized_layers_run_on_integer_kernels(gate):
    model, data = gated_convs(gate)
    r = qq.quantize_model(model, None, data, promote=False)
    optimized = _ops(optimized_graph(r.model))
    # gate0 and gate1 sit between two quantized Convs; gate2 feeds the float ReduceMean, so its output has no Q.
    assert optimized.count("QLinearMul") == 2
    assert optimized.count("QLinearSigmoid" if gate == "SiLU" else "QLinearAdd") == 2
    left = sorted(op for op in optimized if op in _FLOAT_GATE_OPS)
    assert left == _LAST_GATE_IN_FLOAT[gate]
    assert r.report.fusion.unfused == []
    # The written-out HardSwish's division by 6 went into the Conv after it (a constant scale of its input), so its
    # gate ends at its Mul.
    names = ["gate0_mul", "gate1_mul"] if gate == "hard_swish_written_out" else ["gate0", "gate1"]
    assert r.report.fusion.integer_gates == names
    console = Console(file=io.StringIO(), width=200)
    qq.print_report(r.report, console)
    assert "2 gates (HardSwish, SiLU, ...) as integer Add/Mul/Sigmoid" in console.file.getvalue()
    html = render_html(r.report)
    assert "2 gates (HardSwish, SiLU and like products)" in html and f": {names[0]}, {names[1]}." in html


@pytest.mark.parametrize("gate", GATES)
def test_a_float16_models_gates_keep_its_type(gate):
    model, data = gated_convs(gate, dtype=np.float16)
    r = qq.quantize_model(model, None, data, promote=False)
    onnx.checker.check_model(r.model, full_check=True)
    inits = {t.name: t for t in r.model.graph.initializer}
    scales = [inits[n.input[1]] for n in r.model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert all(s.data_type == TensorProto.FLOAT16 for s in scales)  # the gates' scales among them
    assert r.report.fusion.integer_gates == ["gate0", "gate1"] and r.report.output.sqnr_db > 30


def test_gates_between_int8_activations_are_left_and_their_convs_fuse():
    model, data = gated_convs("HardSwish")
    r = qq.quantize_model(model, None, data, activations="int8", promote=False)
    # Rewritten, each gate would read its int8 input twice, and ONNX Runtime would run the Conv in front in float.
    assert "QLinearMul" not in _ops(optimized_graph(r.model))
    assert r.report.fusion.unfused == []


@pytest.mark.parametrize("gate", GATES)
def test_a_gate_on_integer_kernels_costs_little_accuracy(monkeypatch, gate):
    model, data = gated_convs(gate)
    x = data["x"][-16:]
    with_gates = qq.quantize_model(model, None, data, promote=False).model
    monkeypatch.setattr(build, "integer_gates", lambda m: [])
    without = qq.quantize_model(model, None, data, promote=False).model
    assert "QLinearMul" not in _ops(optimized_graph(without))
    # The gate's value is rounded to 1/255: the output keeps within 1.5 dB of the float gate's.
    assert _output_db(with_gates, model, x) > _output_db(without, model, x) - 1.5


def _one_gate(gate: str, scale: float, zero_point: int, out_scale: float, out_zero_point: int):
    """codes -> DequantizeLinear -> ``gate`` -> QuantizeLinear -> codes, with the float gate as the model writes it."""
    t, code_type = np.uint8, TensorProto.UINT8
    inits = [
        numpy_helper.from_array(np.array(scale, np.float32), "s"),
        numpy_helper.from_array(np.array(zero_point, t), "z"),
        numpy_helper.from_array(np.array(out_scale, np.float32), "so"),
        numpy_helper.from_array(np.array(out_zero_point, t), "zo"),
        numpy_helper.from_array(np.array(3, np.float32), "three"),
        numpy_helper.from_array(np.array(0, np.float32), "zero"),
        numpy_helper.from_array(np.array(6, np.float32), "six"),
    ]
    nodes = [helper.make_node("DequantizeLinear", ["q", "s", "z"], ["x"], name="dq")]
    if gate == "HardSwish":
        nodes.append(helper.make_node("HardSwish", ["x"], ["y"], name="gate"))
    elif gate == "hard_swish_written_out":
        nodes += [
            helper.make_node("Add", ["x", "three"], ["a"], name="add"),
            helper.make_node("Clip", ["a", "zero", "six"], ["c"], name="clip"),
            helper.make_node("Mul", ["x", "c"], ["m"], name="mul"),
            helper.make_node("Div", ["m", "six"], ["y"], name="gate"),
        ]
    elif gate == "hard_sigmoid_product":
        nodes += [
            helper.make_node("HardSigmoid", ["x"], ["h"], name="hs", alpha=1 / 6, beta=0.5),
            helper.make_node("Mul", ["h", "x"], ["y"], name="gate"),
        ]
    else:
        nodes += [helper.make_node("Sigmoid", ["x"], ["g"], name="sig"), helper.make_node("Mul", ["x", "g"], ["y"], name="gate")]
    nodes.append(helper.make_node("QuantizeLinear", ["y", "so", "zo"], ["out"], name="q_out"))
    graph = helper.make_graph(
        nodes,
        "one_gate",
        [helper.make_tensor_value_info("q", code_type, [256])],
        [helper.make_tensor_value_info("out", code_type, [256])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _quantize(x: np.ndarray, scale: float, zero_point: int, low: int, high: int) -> np.ndarray:
    """QuantizeLinear in numpy: round half to even in float32, add the zero point, saturate."""
    return np.clip(np.rint(x.astype(np.float32) / np.float32(scale)) + zero_point, low, high)


@pytest.mark.parametrize("gate", GATES)
def test_a_rewritten_gate_computes_its_value_at_256_levels(gate):
    low, high = 0, 255
    scale, zero_point, out_scale, out_zero_point = 0.05, 120, 0.03, 20
    model = _one_gate(gate, scale, zero_point, out_scale, out_zero_point)
    assert integer_gates(model) == ["gate"]
    onnx.checker.check_model(model)
    assert "HardSwish" not in _ops(model) and "Clip" not in _ops(model) and "Div" not in _ops(model)
    codes = np.arange(low, high + 1).astype(np.uint8)
    a = ((codes.astype(np.int64) - zero_point) * np.float32(scale)).astype(np.float32)
    # The oracle, written from the module's text: the gate's value as codes on [0, 1], then the product quantized.
    if gate == "SiLU":
        before, top, divisor = 1 / (1 + np.exp(-a.astype(np.float64))), 1.0, 1.0
    elif gate == "hard_sigmoid_product":  # the attributes are float32: alpha is not quite 1/6
        alpha = float(np.float32(1 / 6))
        before, top, divisor = a + np.float32(0.5 / alpha), 1 / alpha, 1 / alpha
    else:
        before, top, divisor = a + np.float32(3), 6.0, 6.0
    gate_codes = _quantize(np.asarray(before, np.float32), top / 255, low, low, high)
    value = ((gate_codes - low) * np.float32(top / 255 / divisor)).astype(np.float32)
    want = _quantize(a * value, out_scale, out_zero_point, low, high)
    as_written = session(model, optimize=False).run(None, {"q": codes})[0]
    fused = session(model).run(None, {"q": codes})[0]
    if gate != "SiLU":  # ONNX Runtime's Sigmoid is an approximation of its own: its codes may differ by one
        assert np.array_equal(as_written, want)
    assert np.abs(as_written.astype(np.int64) - want).max() <= 1
    assert "QLinearMul" in _ops(optimized_graph(model))
    # Fused kernels requantize in fixed point: a code apart at most.
    assert np.abs(fused.astype(np.int64) - as_written).max() <= 1
    # Against the float gate: half a step of the output, plus the gate's own rounding (|a| / 510).
    exact = a * (1 / (1 + np.exp(-a.astype(np.float64))) if gate == "SiLU" else np.clip(a + 3.0, 0, 6) / 6)
    bound = out_scale / 2 + np.abs(a) / 510 + 1e-6
    got = (as_written.astype(np.int64) - out_zero_point) * out_scale
    inside = np.abs(exact) < out_scale * (high - out_zero_point)  # outside the output's range both saturate
    if gate == "SiLU":
        bound = bound + out_scale  # ONNX Runtime's Sigmoid may move a code (above)
    assert np.all(np.abs(got - exact)[inside] <= bound[inside])


def test_a_gate_whose_output_a_float_node_reads_is_left():
    model = _one_gate("HardSwish", 0.05, 120, 0.03, 20)
    g = model.graph
    g.output.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [256]))  # y is read outside the Q too
    assert integer_gates(model) == []
    assert "HardSwish" in _ops(model)


def test_a_gate_between_different_code_types_is_left():
    model = _one_gate("SiLU", 0.05, 120, 0.03, 20)
    inits = {t.name: t for t in model.graph.initializer}
    inits["zo"].CopyFrom(numpy_helper.from_array(np.array(20, np.uint16), "zo"))  # a 16-bit output: no integer kernel
    assert integer_gates(model) == []
    inits["zo"].CopyFrom(numpy_helper.from_array(np.array(20, np.uint8), "zo"))
    inits["z"].CopyFrom(numpy_helper.from_array(np.array(120, np.int8), "z"))  # int8 input codes: left (above)
    assert integer_gates(model) == []


def test_a_dequantized_input_a_subgraph_also_reads_is_kept():
    model = _one_gate("HardSwish", 0.05, 120, 0.03, 20)
    g = model.graph
    branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["seen"])],
        "branch",
        [],
        [helper.make_tensor_value_info("seen", TensorProto.FLOAT, [256])],
    )  # reads the gate's dequantized input "x" by name alone
    g.input.append(helper.make_tensor_value_info("flag", TensorProto.BOOL, []))
    g.node.append(helper.make_node("If", ["flag"], ["tapped"], then_branch=branch, else_branch=branch))
    g.output.append(helper.make_tensor_value_info("tapped", TensorProto.FLOAT, [256]))
    assert integer_gates(model) == ["gate"]
    onnx.checker.check_model(model)
    assert "x" in {o for n in g.node for o in n.output}  # its DequantizeLinear stays for the branch
    codes = np.arange(256).astype(np.uint8)
    got = session(model, optimize=False).run(["tapped"], {"q": codes, "flag": np.array(True)})[0]
    assert np.array_equal(got, ((codes.astype(np.int64) - 120) * np.float32(0.05)).astype(np.float32))


@pytest.mark.parametrize("paddle", [False, True], ids=["conv_biases", "paddle2onnx"])
def test_a_squeeze_and_excitation_block_runs_on_integer_kernels(paddle):
    model, data = squeeze_excite(paddle=paddle)
    r = qq.quantize_model(model, None, data, promote=False)
    # SmoothQuant evens out the head's pooled features: its division goes through the pool and the Relu into the
    # last Conv, where a Mul would have kept the pool from fusing.
    assert [(m.nodes, m.alpha is not None) for m in r.report.smoothquant] == [(("fc",), True)]
    optimized = _ops(optimized_graph(r.model))
    # Both pools fuse; the HardSwish and the block's gate a * HardSigmoid(b) run as integer Add and Mul.
    assert optimized.count("QLinearGlobalAveragePool") == 2
    hard_swish = [n.name for n in model.graph.node if n.op_type == "HardSwish"]
    assert sorted(r.report.fusion.integer_gates) == sorted([*hard_swish, "excite"])
    assert not [op for op in optimized if op in _FLOAT_GATE_OPS | {"GlobalAveragePool", "DequantizeLinear"}]
    assert r.report.fusion.unfused == [] and r.report.output.sqnr_db > 30
