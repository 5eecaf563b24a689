"""The QDQ models the quantizer writes: valid, weights stored exactly, outputs close to the float model's.

For every weight type and granularity on Conv, ConvTranspose, Gemm and
MatMul: the model passes ``onnx.checker`` (full check); each weight's
DequantizeLinear, run by ONNX Runtime (or onnx.reference where ONNX Runtime
has no kernel for the type), gives bit for bit what
``qlinear.dequantize_linear`` gives on the stored initializer; and the
model's output is close to the float model's.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import qlinear
import qlinear.onnx as qo
import qlinear.quantize as qq
from quantize_models import single_op

WEIGHT_TYPES = list(qq.WEIGHT_TYPES)
# Output SQNR each weight type must reach on these layers (8-bit 30 dB, 4-bit types about 15; 2-bit per tensor (three or four levels) barely above 0).
MIN_SQNR = {
    "int8": 30,
    "uint8": 30,
    "float8e4m3fn": 25,
    "float8e5m2": 18,
    "int4": 14,
    "uint4": 14,
    "float4e2m1": 12,
    "int2": 0.5,
    "uint2": 0.5,
}


def _weight_dqs(model: onnx.ModelProto):
    inits = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if (
            node.op_type == "DequantizeLinear"
            and node.input[0] in inits
            and inits[node.input[0]].data_type != onnx.TensorProto.INT32
        ):
            yield node, inits


def _run_dq(node: onnx.NodeProto, inits: dict, opset: int, ir_version: int) -> np.ndarray:
    """The DQ node alone, on ONNX Runtime if it takes the type, else on onnx.reference."""
    g = helper.make_graph(
        [node],
        "dq",
        [],
        [helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, None)],
        [inits[i] for i in node.input if i],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)
    try:
        import onnxruntime as ort

        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {})[0]
    except Exception:
        return ReferenceEvaluator(m).run(None, {})[0]


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose", "Gemm", "MatMul"])
@pytest.mark.parametrize("granularity", ["per-tensor", "per-channel", "blocked"])
@pytest.mark.parametrize("weights", WEIGHT_TYPES)
def test_every_weight_type_and_granularity(op, granularity, weights):
    model, data = single_op(op)
    result = qq.quantize_model(
        model,
        None,
        data,
        weights=weights,
        granularity=granularity,
        block_size=16 if granularity == "blocked" else 0,
        promote=False,
    )
    q = result.model
    onnx.checker.check_model(q, full_check=True)
    opset = next(o.version for o in q.opset_import if o.domain == "")
    dqs = list(_weight_dqs(q))
    assert len(dqs) == 1
    node, inits = dqs[0]
    stored = qlinear.from_tensor_proto(inits[node.input[0]])
    scale = numpy_helper.to_array(inits[node.input[1]])
    zp = qlinear.from_tensor_proto(inits[node.input[2]]) if len(node.input) > 2 and node.input[2] else None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    want = qlinear.dequantize_linear(stored, scale, zp, axis=attrs.get("axis", 1), block_size=attrs.get("block_size", 0))
    got = _run_dq(node, inits, opset, q.ir_version)
    assert got.dtype == want.dtype and np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert str(stored.dtype) == {"float8e4m3fn": "float8_e4m3fn", "float8e5m2": "float8_e5m2", "float4e2m1": "float4_e2m1fn"}.get(
        weights, weights
    )
    report = result.report
    assert report.output.sqnr_db is None or report.output.sqnr_db > MIN_SQNR[weights]
    node_report = report.nodes[0]
    # Blocked MatMul/Gemm weights go with float activations (MatMulNBits), so do blocked 8-bit Conv weights
    # (QLinearConv takes no blocked filter scale), and 2-bit and float weights everywhere (ONNX Runtime mis-fuses
    # them with integer activations); the rest with uint8.
    unpaired = weights not in ("int8", "uint8", "int4", "uint4")
    blocked_float = op in ("Gemm", "MatMul") or (op == "Conv" and weights in ("int8", "uint8"))
    float_activations = (granularity == "blocked" and blocked_float) or unpaired
    assert node_report.weight_type == weights and node_report.activation_type == (None if float_activations else "uint8")
    assert node_report.weight_bytes.after < node_report.weight_bytes.before
    # The evaluation ran on ONNX Runtime wherever it loads the model, with qlinear's Q/DQ kernels elsewhere.
    try:
        import onnxruntime as ort

        ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
        loads = True
    except Exception:
        loads = False
    assert report.eval.backend == ("onnxruntime" if loads else "onnxruntime+qlinear")
    # ONNX Runtime 1.31 has DequantizeLinear kernels for every weight type here but float4e2m1.
    assert loads == (weights != "float4e2m1")


@pytest.mark.parametrize("op", ["Conv", "Gemm", "MatMul"])
def test_int8_layers_run_as_integer_kernels(op):
    model, data = single_op(op)
    report = qq.quantize_model(model, None, data, promote=False).report
    assert report.fusion.checked and report.fusion.unfused == []
    assert report.nodes[0].runs_as in ("QLinearConv", "QGemm", "MatMulIntegerToFloat", "QLinearMatMul")


def test_weight_only_int4_blocked_runs_as_matmulnbits():
    model, data = single_op("Gemm")  # transB=1: stored transposed so that MatMulNBits takes it
    report = qq.quantize_model(model, None, data, weights="int4", activations=None, granularity="blocked", promote=False).report
    assert report.nodes[0].runs_as == "MatMulNBits" and report.settings.block_size == 32
    assert report.output.sqnr_db > 14


def test_conv_bias_is_int32_with_the_product_scale():
    model, data = single_op("Conv")
    q = qq.quantize_model(model, None, data, promote=False).model
    inits = {t.name: t for t in q.graph.initializer}
    conv = next(n for n in q.graph.node if n.op_type == "Conv")
    bias_dq = next(n for n in q.graph.node if n.output[0] == conv.input[2])
    assert inits[bias_dq.input[0]].data_type == onnx.TensorProto.INT32
    x_dq = next(n for n in q.graph.node if n.output[0] == conv.input[0])
    w_dq = next(n for n in q.graph.node if n.output[0] == conv.input[1])
    act_scale = numpy_helper.to_array(inits[x_dq.input[1]])
    w_scale = numpy_helper.to_array(inits[w_dq.input[1]])
    np.testing.assert_array_equal(numpy_helper.to_array(inits[bias_dq.input[1]]), (act_scale * w_scale).astype(np.float32))


@pytest.mark.parametrize("op", ["Conv", "MatMul"])
def test_float16_model_keeps_its_type(op):
    # Scales in the tensors' own type (float16), the opset raised to 19 where QuantizeLinear takes float16.
    rng = np.random.default_rng(3)
    g = qo.Graph("half", opset=17)
    if op == "Conv":
        x = g.input("x", "float16", ("N", 4, 6, 6))
        y = g.op(
            "Conv", [g.op("Relu", [x], name="r"), (rng.standard_normal((8, 4, 3, 3)) * 0.2).astype(np.float16)], name="layer"
        )
        data = {"x": rng.standard_normal((40, 4, 6, 6)).astype(np.float16)}
    else:
        x = g.input("x", "float16", ("N", 64))
        y = g.op("MatMul", [g.op("Relu", [x], name="r"), (rng.standard_normal((64, 32)) * 0.2).astype(np.float16)], name="layer")
        data = {"x": rng.standard_normal((40, 64)).astype(np.float16)}
    g.output(g.op("Relu", [y], name="out", output_names=["y"]))
    result = qq.quantize_model(g.to_model(), None, data, promote=False)
    q = result.model
    onnx.checker.check_model(q, full_check=True)
    assert next(o.version for o in q.opset_import if o.domain == "") == 19
    inits = {t.name: t for t in q.graph.initializer}
    scales = [inits[n.input[1]] for n in q.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert scales and all(s.data_type == onnx.TensorProto.FLOAT16 for s in scales)
    assert result.report.output.sqnr_db > 30


def test_sqnr_of_a_non_finite_noise_is_minus_infinity():
    from qlinear.quantize._sqnr import sqnr_db

    # An infinite noise once ended the quantizer in "math domain error", a NaN one gave a NaN figure.
    assert sqnr_db(1.0, math.inf) == -math.inf and sqnr_db(1.0, math.nan) == -math.inf
    assert sqnr_db(1.0, 0.0) is None and sqnr_db(100.0, 1.0) == 20.0


def test_a_calibration_algorithm_rounds_weights_and_corrects_biases_through_its_hooks_alone():
    # What the registry's hooks give the conversion, it writes: the weight as rounded (codes toward zero here,
    # not to nearest) and the bias less the shift, from what was calibrated for the algorithm.
    from qlinear.quantize._choose import QuantParams
    from qlinear.quantize._model import load_float_model
    from qlinear.quantize._placement import plan
    from qlinear.quantize._to_qdq import convert
    from qlinear.quantize.algorithms._registry import Algorithm, Calibrated
    from qlinear.quantize.algorithms.bias_correction import BiasSite

    model, _ = single_op("Gemm")
    fm = load_float_model(model)
    layer = fm.node("layer")
    weight, bias = fm.constant(layer.input[1]), fm.constant(layer.input[2])
    scale = np.float32(np.abs(weight).max() / 127)
    calibrated = Calibrated(means={"marker": np.ones(1)})
    asked = []

    def rounds(fm_, p, w, t, options, got):
        asked.append(("rounds", p.name, t.name, got is calibrated))
        return np.trunc(w / scale) * scale, QuantParams(np.array(scale), None), 0, 0

    def corrects(fm_, p, got):
        asked.append(("corrects", p.name, got is calibrated))
        return lambda error: (np.ones(error.shape[0]), BiasSite(layer.input[2]))

    toward_zero = Algorithm(
        name="toward_zero", summary="a test's", stage="calibration", fields=(("toward_zero", bool, None),),
        rounds=rounds, corrects=corrects,
    )  # fmt: skip
    options = qq.QuantizeOptions(activations=None, granularity="per-tensor", bias_correction=False, gptq=False)
    qmodel, converted = convert(fm, plan(fm, options), options, {}, fm.opset, calibrated=calibrated, algorithms=[toward_zero])
    inits = {t.name: numpy_helper.to_array(t) for t in qmodel.graph.initializer}
    codes = next(v for k, v in inits.items() if k.startswith(layer.input[1]) and k.endswith("_q"))
    np.testing.assert_array_equal(codes, np.trunc(weight / scale).astype(np.int8))
    corrected = next(v for k, v in inits.items() if k.startswith(layer.input[2]) and k.endswith("_corrected"))
    np.testing.assert_array_equal(corrected, (bias.astype(np.float64) - 1).astype(np.float32))
    assert converted["layer"].bias_corrected
    assert asked[0] == ("rounds", "layer", "int8", True) and set(asked[1:]) == {("corrects", "layer", True)}
