"""Constant scales and shifts around convolutions fold into them, so quantized models keep integer kernels end to end."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import qlinear.onnx as qo
import qlinear.quantize as qq
from qlinear._errors import QuantizationError
from qlinear.quantize._affine_folds import fold_affines_into_convs, fold_conv_affines
from qlinear.quantize._model import attribute, index, load_float_model
from qlinear.quantize._session import optimized_graph, session
from qlinear.quantize.targets import target
from quantize_models import learnable_affine_blocks


def _folded(model: onnx.ModelProto, *folds) -> onnx.ModelProto:
    fm = load_float_model(model)
    for fold in folds:
        fold(fm)
        index(fm)
    onnx.checker.check_model(fm.model)
    return fm.model


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return session(model).run(None, {"x": x})[0]


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


@pytest.mark.parametrize("per_channel", [False, True])
def test_the_folded_model_computes_what_the_float_model_does(per_channel):
    model, data = learnable_affine_blocks(per_channel=per_channel)
    folded = _folded(model, fold_conv_affines, fold_affines_into_convs)
    x = data["x"][:8]
    np.testing.assert_allclose(_run(folded, x), _run(model, x), rtol=1e-4, atol=1e-5)
    # Each Conv took the map after it, and conv1 (pads nothing) the one before it.
    names = {n.name for n in folded.graph.node}
    assert not names & {f"lab{i}a_{op}" for i in range(3) for op in ("mul", "add")}
    assert not names & {"lab0b_mul", "lab0b_add"}
    # conv2 pads: scalars go in behind a Pad of the value the map sends to 0; one a channel cannot, and stays.
    if per_channel:
        assert {"lab1b_mul", "lab1b_add"} <= names and "Pad" not in _ops(folded)
    else:
        assert not names & {"lab1b_mul", "lab1b_add"}
        pad = next(n for n in folded.graph.node if n.op_type == "Pad")
        conv2 = next(n for n in folded.graph.node if n.name == "conv2")
        assert conv2.input[0] == pad.output[0] and attribute(conv2, "pads") == [0, 0, 0, 0]


def _conv_then(op: str, constant: np.ndarray, *, second: bool = True, read_twice: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    g = qo.Graph("one", opset=17)
    x = g.input("x", "float32", ("N", 4, 8, 8))
    y = g.op("Conv", [x, rng.standard_normal((6, 4, 3, 3)).astype(np.float32)], name="conv", pads=[1, 1, 1, 1])
    z = g.op(op, [y, constant] if second else [constant, y], name="map")
    g.output(z)
    if read_twice:
        g.output(g.op("Relu", [y], name="relu"))
    return g.to_model()


@pytest.mark.parametrize("op", ["Mul", "Div", "Add", "Sub"])
@pytest.mark.parametrize("shape", [(), (1,), (6, 1, 1), (1, 6, 1, 1)])
def test_a_per_channel_constant_after_a_conv_folds_into_it(op, shape):
    constant = np.random.default_rng(2).uniform(0.5, 2.0, shape).astype(np.float32)
    model = _conv_then(op, constant)
    folded = _folded(model, fold_conv_affines)
    assert _ops(folded) == ["Conv"]
    x = np.random.default_rng(3).standard_normal((2, 4, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(folded, x), _run(model, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize("bias_add", [False, True])
def test_a_bias_add_and_a_normalization_after_a_conv_transpose_fold_into_it(group, bias_add):
    # paddle2onnx writes an upsampling head's bias as an Add after the ConvTranspose, then a BatchNormalization;
    # ONNX Runtime folds neither there, so both ran in float (PP-OCRv4's text detector). The target's prepare folds
    # the normalization alone, or the chain of both.
    rng = np.random.default_rng(0)
    g = qo.Graph("upsample_head", opset=17)
    x = g.input("x", "float", ("N", 4, 6, 6))
    w = (rng.standard_normal((4, 6 // group, 2, 2)) * 0.3).astype(np.float32)
    h = g.op("ConvTranspose", [x, w], name="up", strides=[2, 2], group=group)
    if bias_add:
        h = g.op("Add", [h, rng.standard_normal((1, 6, 1, 1)).astype(np.float32)], name="bias")
    stats = [rng.uniform(0.5, 1.5, 6), rng.uniform(-0.2, 0.2, 6), rng.uniform(-0.5, 0.5, 6), rng.uniform(0.5, 2, 6)]
    bn = g.op("BatchNormalization", [h, *(t.astype(np.float32) for t in stats)], name="bn")
    g.output(g.op("Relu", [bn], name="relu", output_names=["y"]))
    model = g.to_model()
    fm = load_float_model(model)
    target("ort-cpu").prepare(False)(fm)
    assert _ops(fm.model) == ["ConvTranspose", "Relu"] and "bn" in fm.folded
    x = rng.standard_normal((3, 4, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(_run(fm.model, x), _run(model, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "model",
    [
        _conv_then("Sub", np.float32(1.5), second=False),  # 1.5 - conv: a negation too, not a shift
        _conv_then("Div", np.float32(0.0)),
        _conv_then("Mul", np.ones((1, 6, 8, 8), np.float32)),  # a value a pixel: no channel constant
        _conv_then("Mul", np.ones((2, 6, 1, 1), np.float32)),  # broadcasts the batch
        _conv_then("Add", np.float32(1.0), read_twice=True),  # the Relu reads the Conv's output too
    ],
    ids=["constant-minus-conv", "divide-by-zero", "per-pixel", "batch-broadcast", "read-twice"],
)
def test_a_map_that_is_no_per_channel_affine_of_the_conv_alone_stays(model):
    assert _ops(_folded(model, fold_conv_affines)) == _ops(model)


def test_a_shared_weight_keeps_its_values_and_takes_a_shift_into_the_bias():
    rng = np.random.default_rng(4)
    g = qo.Graph("shared", opset=17)
    x = g.input("x", "float32", ("N", 4, 8, 8))
    w = rng.standard_normal((4, 4, 1, 1)).astype(np.float32)
    g.initializer("w", w)
    a = g.op("Add", [g.op("Conv", [x, "w"], name="conv_a"), np.float32(0.25)], name="shift_a")
    b = g.op("Mul", [g.op("Conv", [a, "w"], name="conv_b"), np.float32(2.0)], name="scale_b")
    g.output(b)
    model = g.to_model()
    folded = _folded(model, fold_conv_affines, fold_affines_into_convs)
    assert _ops(folded) == ["Conv", "Conv", "Mul"]
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(next(t for t in folded.graph.initializer if t.name == "w")), w)
    v = rng.standard_normal((2, 4, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(folded, v), _run(model, v), rtol=1e-5, atol=1e-5)


def test_a_map_before_a_grouped_conv_that_pads_nothing_folds_per_group():
    rng = np.random.default_rng(5)
    g = qo.Graph("grouped", opset=17)
    x = g.input("x", "float32", ("N", 6, 8, 8))
    h = g.op("Relu", [x], name="relu")
    scale = rng.uniform(0.5, 2.0, (1, 6, 1, 1)).astype(np.float32)
    shift = rng.uniform(-1, 1, (6, 1, 1)).astype(np.float32)
    z = g.op("Sub", [g.op("Div", [h, scale], name="div"), shift], name="sub")
    g.output(g.op("Conv", [z, rng.standard_normal((4, 3, 2, 2)).astype(np.float32)], name="conv", group=2, strides=[2, 2]))
    model = g.to_model()
    folded = _folded(model, fold_affines_into_convs)
    assert _ops(folded) == ["Relu", "Conv"]
    v = rng.standard_normal((2, 6, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(folded, v), _run(model, v), rtol=1e-5, atol=1e-5)


def test_a_quantized_model_of_affine_blocks_runs_its_gates_and_convs_on_integer_kernels():
    model, data = learnable_affine_blocks()
    r = qq.quantize_model(model, None, data, promote=False)
    optimized = optimized_graph(r.model)
    assert _ops(optimized).count("QLinearConv") == 3
    # Both gates between Convs run on integer kernels: gate0's division by 6 went into conv1 with the map after it;
    # gate1's output is padded as codes for conv2, which pads, behind the map folded into conv2. gate2 feeds the
    # float ReduceMean.
    assert r.report.fusion.integer_gates == ["gate0_mul", "gate1_mul"]
    assert r.report.fusion.unfused == []
    left = [n.name for n in optimized.graph.node if n.op_type in {"Mul", "Add", "Sub", "Div", "Clip"}]
    assert [name for name in left if not name.startswith(("gate2", "gap"))] == []
    pad = next(n for n in optimized.graph.node if n.op_type == "Pad")
    assert next(n for n in optimized.graph.node if pad.input[0] in n.output).op_type == "QLinearMul"
    assert next(n for n in optimized.graph.node if pad.output[0] in n.input).op_type == "QLinearConv"
    x = data["x"][:16]
    want = _run(model, x).astype(np.float64)
    db = 10 * np.log10((want**2).sum() / ((want - _run(r.model, x)) ** 2).sum())
    assert db > 25


def test_an_exclude_pattern_may_name_a_node_the_folds_took_and_a_typo_is_still_refused():
    model, data = learnable_affine_blocks()
    r = qq.quantize_model(model, None, data, promote=False, exclude=["lab0a_mul", "lab1b_*", "re:^lab2a_add$"])
    assert r.report.fusion.integer_gates == ["gate0_mul", "gate1_mul"]  # they were folded: nothing more is float
    with pytest.raises(QuantizationError, match="'lab9a_mul' name no node"):
        qq.quantize_model(model, None, data, promote=False, exclude=["lab9a_mul"])
