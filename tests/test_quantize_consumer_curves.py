"""Activation ranges chosen by the error left after the function their readers apply (a SiLU, a Sigmoid, a Gelu...)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import qlinear.onnx as qo
import qlinear.quantize as qq
from qlinear.dtypes import element_type
from qlinear.quantize._choose import activation_params
from qlinear.quantize._consumer_curves import _erf, consumer_curves
from qlinear.quantize._model import load_float_model
from qlinear.quantize._stats import TensorStats


def _readers_model():
    """Tensors read by a SiLU, a Sigmoid, a Gelu, a HardSwish, and ones that other ops read too."""
    rng = np.random.default_rng(0)
    g = qo.Graph("readers", opset=20)
    x = g.input("x", "float", ("N", 4, 6, 6))

    def conv(h, name):
        return g.op("Conv", [h, (rng.standard_normal((4, 4, 1, 1)) * 0.5).astype(np.float32)], name=name)

    a = conv(x, "a")  # a SiLU: x * Sigmoid(x)
    silu = g.op("Mul", [a, g.op("Sigmoid", [a], name="a_gate")], name="a_silu")
    b = conv(silu, "b")  # a Sigmoid alone
    c = conv(g.op("Sigmoid", [b], name="b_sig"), "c")  # a Gelu
    d = conv(g.op("Gelu", [c], name="c_gelu"), "d")  # a HardSwish
    e = conv(g.op("HardSwish", [d], name="d_hswish"), "e")  # a SiLU and a residual Add: not one function
    f = g.op("Add", [g.op("Mul", [e, g.op("Sigmoid", [e], name="e_gate")], name="e_silu"), e], name="residual")
    gate = conv(f, "g")  # a Sigmoid whose output a second Mul reads: not a SiLU's gate
    s = g.op("Sigmoid", [gate], name="g_sig")
    g.output(g.op("Add", [g.op("Mul", [gate, s], name="g_mul"), s], name="out", output_names=["y"]))
    return g.to_model(), {"x": rng.standard_normal((32, 4, 6, 6)).astype(np.float32)}


def test_the_tensors_whose_readers_apply_one_function_are_found():
    model, _ = _readers_model()
    fm = load_float_model(model)
    curves = consumer_curves(fm)
    out = {n.name: n.output[0] for n in model.graph.node}
    assert set(curves) == {out["a"], out["b"], out["c"], out["d"]}
    x = np.linspace(-8, 8, 33)
    sigmoid = 1 / (1 + np.exp(-x))
    np.testing.assert_allclose(curves[out["a"]](x), x * sigmoid, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(curves[out["b"]](x), sigmoid, rtol=1e-12, atol=1e-15)
    gelu = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x])
    np.testing.assert_allclose(curves[out["c"]](x), gelu, atol=1e-6)
    np.testing.assert_allclose(curves[out["d"]](x), x * np.clip(x + 3, 0, 6) / 6, atol=1e-15)


def test_reshapes_pass_a_function_on_and_readers_outside_the_graph_keep_the_plain_range():
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    g = qo.Graph("more_readers", opset=20)
    x = g.input("x", "float", ("N", 8))

    def dense(h, name):
        return g.op("MatMul", [h, (rng.standard_normal((8, 8)) * 0.5).astype(np.float32)], name=name)

    a = dense(x, "a")  # reshaped, then a Tanh
    t = g.op("Tanh", [g.op("Reshape", [a, np.array([-1, 2, 4], np.int64)], name="a_shape")], name="a_tanh")
    b = dense(g.op("Reshape", [t, np.array([-1, 8], np.int64)], name="flat"), "b")  # a HardSigmoid of alpha 0.1
    c = dense(g.op("HardSigmoid", [b], name="b_hsig", alpha=0.1, beta=0.6), "c")  # a SiLU whose gate leaves the graph
    gate = g.op("Sigmoid", [c], name="c_gate")
    d = dense(g.op("Mul", [c, gate], name="c_silu"), "d")  # a tanh Gelu, and a graph output
    e = g.op("Gelu", [d], name="d_gelu", approximate="tanh")
    g.output(e)
    g.output(gate)
    model = g.to_model()
    fm = load_float_model(model)
    out = {n.name: n.output[0] for n in model.graph.node}
    curves = consumer_curves(fm)
    assert set(curves) == {out["a"], out["a_shape"], out["b"], out["d"]}  # a: through its reshape
    x = np.linspace(-8, 8, 33)
    np.testing.assert_allclose(curves[out["a"]](x), np.tanh(x), atol=1e-15)
    np.testing.assert_allclose(curves[out["b"]](x), np.clip(0.1 * x + 0.6, 0, 1), atol=1e-7)  # float32 attributes
    gelu = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(curves[out["d"]](x), gelu, atol=1e-12)
    # The same Tanh reader, and an If whose branches read the tensor too (as Silero VAD's read its weights).
    branches = [
        helper.make_graph([helper.make_node("Sigmoid", [out["a"]], [f"{k}_y"])], k, [],
                          [helper.make_tensor_value_info(f"{k}_y", TensorProto.FLOAT, None)])
        for k in ("then", "other")
    ]  # fmt: skip
    model.graph.input.append(helper.make_tensor_value_info("flag", TensorProto.BOOL, []))
    model.graph.node.append(helper.make_node("If", ["flag"], ["picked"], then_branch=branches[0], else_branch=branches[1]))
    model.graph.output.append(helper.make_tensor_value_info("picked", TensorProto.FLOAT, None))
    assert out["a"] not in consumer_curves(load_float_model(model))


def test_the_error_function_is_within_its_published_bound():
    x = np.linspace(-6, 6, 2001)
    assert np.max(np.abs(_erf(x) - np.array([math.erf(v) for v in x]))) < 1.5e-7


def _silu(x):
    return x / (1 + np.exp(-x))


def _silu_error(values: np.ndarray, p) -> float:
    """The squared error after a SiLU of ``values`` rounded with ``p``'s scale and zero point (uint8), written out."""
    scale, zp = float(p.scale), int(p.zero_point)
    codes = np.clip(np.rint(values / scale) + zp, 0, 255)
    return float(np.mean((_silu(values) - _silu((codes - zp) * scale)) ** 2))


@pytest.mark.parametrize("seed", range(4))
def test_a_silu_input_range_leaves_less_error_after_the_silu(seed):
    rng = np.random.default_rng(seed)
    # A pre-activation: a body around -1 and a long negative tail the SiLU flattens.
    values = np.concatenate([rng.normal(-1.0, 2.0, 200_000), -rng.exponential(8.0, 20_000)]).astype(np.float32)
    stats, uint8 = TensorStats.of(values), element_type("uint8")
    plain = activation_params(stats, uint8, method="mse", symmetric=False, percentile=99.99)
    through = activation_params(stats, uint8, method="mse", symmetric=False, percentile=99.99, curve=_silu)
    assert through.low > plain.low  # the tail the SiLU flattens is clipped
    assert through.high >= np.percentile(values, 99.9)  # the side the SiLU passes keeps its body
    assert _silu_error(values, through) < 0.7 * _silu_error(values, plain)
    # The other methods, and symmetric ranges, are the plain ones: the function weighs only mse's asymmetric search.
    for method, symmetric in (("minmax", False), ("percentile", False), ("mse", True)):
        a = activation_params(stats, uint8, method=method, symmetric=symmetric, percentile=99.99)
        b = activation_params(stats, uint8, method=method, symmetric=symmetric, percentile=99.99, curve=_silu)
        assert (a.low, a.high) == (b.low, b.high)


def test_a_silu_network_quantizes_more_accurately_with_ranges_through_the_silu(monkeypatch):
    model, data = _readers_model()
    before = qq.quantize_model(model, None, data, promote=False).report.output.sqnr_db
    monkeypatch.setattr("qlinear.quantize._build.consumer_curves", lambda fm: {})  # every range by its own error
    plain = qq.quantize_model(model, None, data, promote=False).report.output.sqnr_db
    assert before > plain
