"""2-bit MatMul and Gemm weights that ONNX Runtime's CPU provider would compute wrongly are stored at 4 bits."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import qlinear.onnx as qo
import qlinear.quantize as qq
from qlinear.quantize.targets import ORT_CPU


def test_the_target_says_which_weights_it_stores_wider_and_why():
    p = ORT_CPU.placement
    assert p.stored_type("MatMul", "int2", 5) == ("int4", p.column_multiple_why)
    assert p.stored_type("Gemm", "uint2", 33) == ("uint4", p.column_multiple_why)
    for columns in (4, 8, 64, None):  # None: a shape the planner does not know is left as asked
        assert p.stored_type("MatMul", "int2", columns) == ("int2", None)
    assert p.stored_type("MatMul", "int4", 5) == ("int4", None)
    assert p.stored_type("Conv", "int2", 5) == ("int2", None)  # not fused into MatMulNBits
    assert p.stored_type("Gather", "int4", 5) == ("int8", p.widened_table)


def _two_layers():
    """x -> MatMul (64 x 8) -> Relu -> MatMul (8 x 5) -> y: the second layer's 5 columns are not a multiple of 4."""
    rng = np.random.default_rng(0)
    g = qo.Graph("two_layers", opset=21)
    x = g.input("x", "float", ("N", 64))
    h = g.op("Relu", [g.op("MatMul", [x, (rng.standard_normal((64, 8)) * 0.3).astype(np.float32)], name="wide")])
    g.output(g.op("MatMul", [h, (rng.standard_normal((8, 5)) * 0.3).astype(np.float32)], name="narrow", output_names=["y"]))
    return g.to_model(), {"x": rng.standard_normal((64, 64)).astype(np.float32)}


def _weight_types(model: onnx.ModelProto) -> dict[str, int]:
    """Each MatMul's weight's stored element type, by node name."""
    inits = {t.name: t.data_type for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    return {n.name: inits[producer[n.input[1]].input[0]] for n in model.graph.node if n.op_type == "MatMul"}


@pytest.mark.parametrize("weights", ["int2", "uint2"])
def test_a_layer_of_five_columns_is_stored_at_four_bits_and_runs_right_on_onnx_runtime(weights):
    model, data = _two_layers()
    r = qq.quantize_model(model, None, data, weights=weights, activations=None, granularity="per-channel", promote=False)
    wider = weights.replace("2", "4")
    assert [(w.name, w.asked, w.stored) for w in r.report.widened] == [("narrow", weights, wider)]
    assert "multiple of 4" in r.report.widened[0].reason
    types = _weight_types(r.model)
    assert types["wide"] == getattr(onnx.TensorProto, weights.upper())
    assert types["narrow"] == getattr(onnx.TensorProto, wider.upper())
    # ONNX Runtime at its default optimizations gives the values the specification's reference gives, in every session.
    want = qo.run(r.model, data, backend="reference")["y"]
    for _ in range(3):
        got = ort.InferenceSession(r.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, data)[0]
        np.testing.assert_allclose(got, want, rtol=0.02, atol=0.02 * float(np.abs(want).max()))
