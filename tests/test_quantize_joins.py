"""Joins of quantized tensors (Add, Mul, Concat, a nearest Resize between them) run on ONNX Runtime's integer kernels."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import qlinear.onnx as qo
import qlinear.quantize as qq
from qlinear.quantize._model import load_float_model
from qlinear.quantize._options import QuantizeOptions
from qlinear.quantize._placement import moves_data, plan
from qlinear.quantize._session import optimized_graph, session
from quantize_models import feature_pyramid

# What the neck computes in float: none of it may be left once its joins run on integer kernels.
_FLOAT_JOINS = {"Add", "Mul", "Concat", "HardSigmoid", "Resize"}


def _db(model, float_model, x) -> float:
    want = session(float_model).run(None, {"x": x})[0].astype(np.float64)
    got = session(model).run(None, {"x": x})[0]
    return float(10 * np.log10((want**2).sum() / ((want - got) ** 2).sum()))


def test_a_feature_pyramids_joins_are_quantized_where_a_quantized_node_reads_them():
    model, _ = feature_pyramid()
    fm = load_float_model(model)
    planned = plan(fm, QuantizeOptions())
    quantized = set(planned.calibrate) | set(planned.shared)
    out = {n.name: n.output[0] for n in model.graph.node}
    # The residual Adds, the gates' Muls, the upsampling, the sum and the Concat: from one Conv to the next.
    assert {out[n] for n in ("gate0", "gate1", "res0", "res1", "up", "sum", "levels")} <= quantized
    # The side branch's sum feeds only a float ReduceMean: quantizing it would add a rounding and save nothing.
    assert out["side_sum"] not in quantized


def test_the_joins_run_on_integer_kernels_and_the_output_stays_close():
    model, data = feature_pyramid()
    r = qq.quantize_model(model, None, data, promote=False)
    optimized = optimized_graph(r.model)
    ops = [n.op_type for n in optimized.graph.node]
    # Three joins' Adds, and each gate's HardSigmoid as an Add of its shift (see _integer_gates).
    assert ops.count("QLinearAdd") == 3 + 2 and ops.count("QLinearMul") == 2 and "QLinearConcat" in ops
    # The nearest Resize runs on the codes: no DequantizeLinear reads before it, no float join is left but the side
    # branch's sum.
    left = sorted(op for op in ops if op in _FLOAT_JOINS)
    assert left == ["Add", "Resize"]
    producers = {o: n for n in optimized.graph.node for o in n.output}
    (resize,) = [n for n in optimized.graph.node if n.op_type == "Resize"]
    assert producers[resize.input[0]].op_type == "QLinearAdd"
    assert r.report.fusion.unfused == [] and set(r.report.fusion.integer_gates) == {"gate0", "gate1"}
    assert _db(r.model, model, data["x"][:16]) > 20  # 22.9 dB with the joins in float, 21.6 with them integer


def test_a_linear_resize_is_not_data_movement_and_stays_float():
    assert moves_data(helper.make_node("Resize", ["x", "", "s"], ["y"], mode="nearest"))
    assert moves_data(helper.make_node("Resize", ["x", "", "s"], ["y"]))  # nearest is ONNX's default
    assert not moves_data(helper.make_node("Resize", ["x", "", "s"], ["y"], mode="linear"))
    model, data = feature_pyramid(resize_mode="linear")
    r = qq.quantize_model(model, None, data, promote=False)
    ops = [n.op_type for n in optimized_graph(r.model).graph.node]
    # The linear Resize interpolates, in float: the joins it feeds are float, and so those before it reach no
    # quantized reader and stay float too (no gate, no residual Add on integer kernels).
    assert "Resize" in ops and "QLinearAdd" not in ops and "QLinearMul" not in ops
    assert r.report.fusion.unfused == []


@pytest.mark.parametrize("excluded", [["sum"], ["Add"]])
def test_an_excluded_join_stays_float_by_name_or_op_type(excluded):
    model, _ = feature_pyramid()
    planned = plan(load_float_model(model), QuantizeOptions(exclude=excluded))
    out = {n.name: n.output[0] for n in model.graph.node}
    # The levels reach a quantized reader only through the sum (the Concat reads it too, so it stays float): the
    # joins before it stay float as well.
    assert not {out[n] for n in ("sum", "res0", "res1", "gate0", "gate1")} & set(planned.calibrate)


@pytest.mark.parametrize("activations", ["float8e4m3fn", "int8"])
def test_joins_of_other_activation_types_than_uint8_stay_float(activations):
    # ONNX Runtime's QLinearAdd and its kind take 8-bit integer codes only; its x86 kernels take an int8 pair only
    # where the QuantizeLinear has one reader, and a join would read a Conv's output beside the next Conv.
    model, _ = feature_pyramid()
    weights = "float8e4m3fn" if activations.startswith("float8") else "int8"
    planned = plan(load_float_model(model), QuantizeOptions(activations=activations, weights=weights))
    out = {n.name: n.output[0] for n in model.graph.node}
    assert not {out[n] for n in ("gate0", "res0", "sum")} & set(planned.calibrate)  # the Concat feeds a Conv: its own


def test_a_join_whose_output_a_pad_shares_is_not_calibrated_again():
    # Found by the graph fuzzer (case 336 hung): a Concat before a Pad before a Conv. The Pad's input takes the
    # Pad output's parameters; the join calibrated it as well, and the data-movement pass then made each tensor
    # share the other's, a cycle the plan walked forever.
    rng = np.random.default_rng(0)
    g = qo.Graph("concat_pad", opset=17)
    x = g.input("x", "float", ("N", 3, 8, 8))
    branches = [
        g.op("Conv", [x, (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)], name=f"conv{k}", pads=[1] * 4)
        for k in range(2)
    ]
    joined = g.op("Concat", branches, name="join", axis=1)
    padded = g.op("Pad", [joined, np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)], name="pad")
    head = g.op("Conv", [padded, (rng.standard_normal((2, 8, 3, 3)) * 0.3).astype(np.float32)], name="head")
    g.output(g.op("ReduceMean", [g.op("Relu", [head], name="relu")], name="mean", keepdims=0, output_names=["y"]))
    model = g.to_model()
    data = {"x": rng.standard_normal((32, 3, 8, 8)).astype(np.float32)}
    planned = plan(load_float_model(model), QuantizeOptions())
    joined_name = next(n.output[0] for n in model.graph.node if n.name == "join")
    assert joined_name in planned.shared and joined_name not in planned.calibrate
    r = qq.quantize_model(model, None, data, promote=False)
    ops = [n.op_type for n in optimized_graph(r.model).graph.node]
    assert "QLinearConcat" in ops and ops.count("QLinearConv") == 3 and r.report.fusion.unfused == []


def test_the_model_is_the_same_bytes_in_every_process():
    # The joins were once taken from a set: their parameters' order in the file followed each process's string
    # hashing (PYTHONHASHSEED), so the same decisions wrote different bytes from one run to the next.
    import os
    import subprocess
    import sys

    script = (
        "import hashlib, sys; sys.path.insert(0, 'tests'); from quantize_models import feature_pyramid; "
        "import qlinear.quantize as qq; model, data = feature_pyramid(); "
        "r = qq.quantize_model(model, None, data, promote=False); "
        "print(hashlib.sha256(r.model.SerializeToString(deterministic=True)).hexdigest())"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", script], env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True, text=True, check=True,
        ).stdout.strip()
        for seed in ("1", "2", "3")
    }  # fmt: skip
    assert len(digests) == 1
