"""qlinear.onnx.Graph: every Q/DQ version, type and granularity builds a checked model that runs exactly."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest

import qlinear
from qlinear import QuantizationError
from qlinear.dtypes import element_type
from qlinear.onnx import Graph, run
from qlinear.spec import OPERATOR_VERSIONS

X_SHAPE = (2, 6, 8)
BLOCK = 3
# Types ONNX Runtime 1.31's CPU provider has no QuantizeLinear kernel for, and
# the newest ai.onnx opset it runs.
ORT_MISSING = {"float4e2m1", "float6e2m3", "float6e3m2"}
ORT_MAX_OPSET = 25


def _cases():
    for v in OPERATOR_VERSIONS:
        if v.op != "QuantizeLinear":
            continue
        grans = ["per_tensor"] + (["per_axis"] if v.per_axis else []) + (["blocked"] if v.blocked else [])
        for qtype in sorted(v.quantized_types):
            for gran in grans:
                yield pytest.param(v.version, v.domain, qtype, gran, id=f"{v.domain or 'ai.onnx'}-{v.version}-{qtype}-{gran}")


def _data(qtype: str, gran: str, seed: int):
    """x, scale, zero point and attributes for one case; some values saturate."""
    rng = np.random.default_rng(seed)
    t = element_type(qtype)
    x = (rng.standard_normal(X_SHAPE) * 3).astype(np.float32)
    shape, kw = {
        "per_tensor": ((), {}),
        "per_axis": ((X_SHAPE[1],), {"axis": 1}),
        "blocked": ((*X_SHAPE[:2], -(-X_SHAPE[2] // BLOCK)), {"axis": -1, "block_size": BLOCK}),
    }[gran]
    top = t.qmax if t.is_integer else t.max_finite
    scale = (rng.uniform(0.3, 1.5, shape) * 3 / top).astype(np.float32)
    # Float types take a zero zero point; integers any value in range.
    zp = rng.integers(t.qmin, t.qmax + 1, shape).astype(t.dtype) if t.is_integer else np.zeros(shape, t.dtype)
    return x, scale, zp, kw


def _same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize(("version", "domain", "qtype", "gran"), list(_cases()))
def test_graph_qdq_matches_functions(version, domain, qtype, gran):
    opset = version if not domain else 21
    fn_opset = version
    x, scale, zp, kw = _data(qtype, gran, seed=version * 7 + len(qtype))
    want_q = qlinear.quantize_linear(x, scale, zp, opset=fn_opset, domain=domain, **kw)
    want_dq = qlinear.dequantize_linear(want_q, scale, zp, opset=fn_opset, domain=domain, **kw)

    g = Graph("case", opset=opset)
    xin = g.input("x", "float", ("N", *X_SHAPE[1:]))
    q = g.quantize_linear(xin, scale, zp, domain=domain, name="q", output_names=["y"], **kw)
    g.output(q)
    g.output(g.dequantize_linear(q, "q_input1", "q_input2", domain=domain, name="dq", **kw))
    g.output(g.dequantize_linear(want_q, scale, zp, domain=domain, name="dq_const", **kw))
    model = g.to_model()

    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    for out in inferred.graph.output:
        assert out.type.tensor_type.elem_type and len(out.type.tensor_type.shape.dim) == len(X_SHAPE)
    assert model.graph.output[0].type.tensor_type.elem_type == element_type(qtype).onnx_enum

    got = run(model, {"x": x}, backend="qlinear")
    _same(got["y"], want_q)
    _same(got["dq_output"], want_dq)
    _same(got["dq_const_output"], want_dq)
    if opset <= ORT_MAX_OPSET and qtype not in ORT_MISSING:
        ort = run(model, {"x": x}, backend="onnxruntime")
        _same(ort["y"], want_q)
        _same(ort["dq_output"], want_dq)


@pytest.mark.parametrize("xtype", ["float16", "bfloat16"])
def test_graph_half_precision_x_matches_functions(xtype):
    x = np.linspace(-9, 9, 24, dtype=np.float32).reshape(4, 6).astype(element_type(xtype).dtype)
    scale = np.linspace(0.05, 0.3, 6).astype(x.dtype)
    zp = np.arange(-3, 3, dtype=np.int8)
    g = Graph(opset=23)
    q = g.quantize_linear(g.input("x", xtype, (4, 6)), scale, zp, axis=1, precision="float", output_names=["y"])
    g.output(q)
    g.output(g.dequantize_linear(q, scale, zp, axis=1, output_dtype="float", output_names=["z"]))
    got = run(g.to_model(), {"x": x})
    want = qlinear.quantize_linear(x, scale, zp, axis=1, precision="float", opset=23)
    _same(got["y"], want)
    _same(got["z"], qlinear.dequantize_linear(want, scale, zp, axis=1, output_dtype="float", opset=23))


def test_graph_int32_dequantize_matches_function():
    acc = np.array([[-70000, 5, 1 << 20]], np.int32)
    scale = np.float32(2.0**-10)
    g = Graph(opset=13)
    g.output(g.dequantize_linear(acc, scale, np.int32(0), output_names=["y"]))
    _same(run(g.to_model(), {})["y"], qlinear.dequantize_linear(acc, scale, np.int32(0), opset=13))


def test_graph_dynamic_quantize_linear_matches_function():
    x = np.array([[0, 2, -3], [-2.5, 1.34, 0.5]], np.float32)
    g = Graph(opset=21)
    outs = g.dynamic_quantize_linear(g.input("x", "float", (2, 3)), output_names=["y", "s", "z"])
    for name in outs:
        g.output(name)
    model = g.to_model()
    onnx.checker.check_model(model, full_check=True)
    want = qlinear.dynamic_quantize_linear(x)
    for backend in ("qlinear", "onnxruntime"):
        got = run(model, {"x": x}, backend=backend)
        for name, w in zip(outs, want, strict=True):
            _same(got[name], w)


def test_graph_float4_model_runs_on_qlinear_only():
    x = np.array([[0.3, -7.0, 2.6, 1.2]], np.float32)
    g = Graph(opset=23)
    g.output(g.quantize_linear(g.input("x", "float", (1, 4)), np.float32(1), output_dtype="float4e2m1", output_names=["y"]))
    model = g.to_model()
    _same(run(model, {"x": x})["y"], qlinear.quantize_linear(x, np.float32(1), output_dtype="float4e2m1", opset=23))
    with pytest.raises(QuantizationError, match="ONNX Runtime failed"):
        run(model, {"x": x}, backend="onnxruntime")


def test_graph_op_builds_a_network_with_inferred_shapes():
    g = Graph(opset=21)
    x = g.input("x", "float", ("N", 3, 8, 8))
    w = np.ones((4, 3, 3, 3), np.float32)
    y = g.op("Conv", [x, w, np.zeros(4, np.float32)], pads=[1, 1, 1, 1], name="conv")
    y = g.op("MaxPool", [g.op("Relu", [y])], kernel_shape=[2, 2], strides=[2, 2])
    y = g.op("Reshape", [y, np.array([0, -1], np.int64)])
    assert g.info(y) == qlinear.onnx.TensorInfo(onnx.TensorProto.FLOAT, ("N", 64))
    y = g.op("Gemm", [y, np.ones((64, 10), np.float32)], name="fc", output_names=["logits"])
    g.output(y)
    model = g.to_model()
    onnx.checker.check_model(model, full_check=True)
    out = run(model, {"x": np.ones((2, 3, 8, 8), np.float32)})["logits"]
    np.testing.assert_allclose(
        out, run(model, {"x": np.ones((2, 3, 8, 8), np.float32)}, backend="onnxruntime")["logits"], rtol=1e-6
    )


def test_graph_writes_only_attributes_the_call_sets():
    g = Graph(opset=10)
    g.output(g.quantize_linear(g.input("x", "float", (2,)), np.float32(1), np.uint8(3), name="q"))
    model = g.to_model()
    assert list(model.graph.node[0].attribute) == []
    onnx.checker.check_model(model, full_check=True)
    g = Graph(opset=21)
    q = g.quantize_linear(
        g.input("x", "float", (2, 4)),
        np.ones((2, 2), np.float32),
        axis=1,
        block_size=2,
        output_dtype=ml_dtypes.int4,
        saturate=False,
        name="q",
    )
    g.output(q)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in g.to_model().graph.node[0].attribute}
    assert attrs == {"axis": 1, "block_size": 2, "output_dtype": onnx.TensorProto.INT4, "saturate": 0}


def test_graph_com_microsoft_imports_its_domain():
    g = Graph(opset=21)
    g.output(g.quantize_linear(g.input("x", "float", (3, 2)), np.float32(0.1), np.int16(5), domain="com.microsoft"))
    imports = {o.domain: o.version for o in g.to_model().opset_import}
    assert imports == {"": 21, "com.microsoft": 1}
