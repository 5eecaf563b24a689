"""Where Q/DQ goes: compute ops and the data movement between them; the traps of real models stay float."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import qlinear.onnx as qo
import qlinear.quantize as qq
from qlinear._errors import QuantizationError
from qlinear.quantize import QuantizeOptions
from qlinear.quantize._model import load_float_model
from qlinear.quantize._placement import plan
from qlinear.quantize.targets.ort_cpu import prepare
from quantize_models import (
    audio_front_end,
    conv_batchnorm,
    dense_on_sequences,
    detection_head,
    layernorm_attention,
    single_op,
    squeeze_excite,
)


def _plan(model, **options):
    opts = QuantizeOptions(**options)
    fm = prepare(load_float_model(model), weight_only=opts.activations is None)
    return fm, plan(fm, opts)


def test_plan_transformer_keeps_norm_mask_and_softmax_float():
    model, _ = layernorm_attention()
    fm, p = _plan(model)
    planned = {n.name: n for n in p.nodes}
    assert set(planned) == {"embed", "q_proj", "k_proj", "v_proj", "scores", "context", "o_proj", "head"}
    # The LayerNorm's inside, the scaled and masked scores, the residual Add: their outputs take no Q.
    # (The LayerNorm's result and the Softmax's are quantized: they are the inputs of MatMuls.)
    for node in ("ln_sub", "ln_sq", "ln_var", "ln_sqrt", "scale", "add_mask", "residual"):
        assert fm.producer_output(node) not in p.activations, node
    assert fm.producer_output("ln_div") in p.calibrate and fm.producer_output("softmax") in p.calibrate
    # The mask itself (-3.4e38) is never observed for a range.
    assert "mask" not in p.calibrate
    # The embedding table: weights only; the o_proj weight came from a Constant node.
    assert planned["embed"].weight.tensor in fm.initializers and planned["embed"].activations == ()
    assert planned["o_proj"].weight is not None and planned["o_proj"].weight.tensor == "o_weight_output"
    # scores = q @ k^T: both activations, each with its own range (k_proj's output is not quantized itself).
    assert planned["scores"].activations == (fm.producer_output("q_proj"), fm.producer_output("k_t"))
    assert p.shared == {}


def test_plan_audio_filterbank_before_a_log_stays_float():
    model, _ = audio_front_end()
    fm, p = _plan(model)
    assert [n.name for n in p.nodes] == ["conv", "classifier"]
    [(name, op, reason)] = p.left_float
    assert (name, op) == ("mel", fm.node("mel").op_type) and "Log" in reason
    # The power spectrum is the mel node's input only: nothing else quantizes it.
    assert fm.producer_output("power") not in p.activations
    # The log mel features are a Conv input like any other.
    assert fm.producer_output("channels_first") in p.activations


def test_plan_concat_of_boxes_and_scores_stays_float():
    model, _ = detection_head()
    fm, p = _plan(model)
    assert "detections" not in p.activations
    assert {n.name for n in p.nodes} == {"backbone", "box_fc", "cls_fc"}
    for node in ("box_px", "cls_prob"):
        assert fm.producer_output(node) not in p.activations


def test_plan_conv_relu_q_after_the_relu_and_pool_shares():
    model, _ = single_op("Conv")
    fm, p = _plan(model)
    (conv,) = p.nodes
    # Its Relu makes the graph output, which takes no Q: the Q goes on the Conv's own output.
    assert conv.output == fm.producer_output("layer")
    assert conv.bias is not None and conv.weight.channel_axis == 0 and conv.weight.reduction_axis == 1
    g = qo.Graph("conv_relu_pool", opset=17)
    x = g.input("x", "float", ("N", 2, 4, 4))
    h = g.op("Relu", [g.op("Conv", [x, np.ones((3, 2, 1, 1), np.float32)], name="c1")], name="r1")
    h = g.op("MaxPool", [h], name="pool", kernel_shape=[2, 2])
    g.output(g.op("Conv", [h, np.ones((2, 3, 1, 1), np.float32)], name="c2", output_names=["y"]))
    fm, p = _plan(g.to_model())
    c1 = next(n for n in p.nodes if n.name == "c1")
    assert c1.output == fm.producer_output("r1")  # Q after the Relu: ORT folds the Relu into QLinearConv
    assert p.shared[fm.producer_output("pool")] == fm.producer_output("r1")  # MaxPool shares, no requantization
    assert fm.producer_output("pool") not in p.calibrate


def test_plan_exclude_by_name_and_op_type_and_weight_only():
    model, _ = layernorm_attention()
    _, p = _plan(model, exclude=("MatMul", "head"))
    assert {n.name for n in p.nodes} == {"embed"}
    assert ("head", "Gemm", "excluded") in p.left_float
    _, p = _plan(model, activations=None)
    assert p.calibrate == [] and all(n.activations == () for n in p.nodes)
    # Activations times activations (scores, context) have no weight: nothing to do weight-only.
    assert {n.name for n in p.nodes} == {"embed", "q_proj", "k_proj", "v_proj", "o_proj", "head"}


def test_prepare_matmul_add_becomes_gemm_with_the_matmul_name():
    g = qo.Graph("linear", opset=17)
    x = g.input("x", "float", ("N", 4))
    y = g.op(
        "Add",
        [g.op("MatMul", [x, np.ones((4, 3), np.float32)], name="fc"), np.ones(3, np.float32)],
        name="fc_bias",
        output_names=["y"],
    )
    g.output(y)
    fm, p = _plan(g.to_model())
    assert [(n.name, n.op_type) for n in fm.graph.node] == [("fc", "Gemm")]
    assert p.nodes[0].bias is not None
    ref = qo.run(g.to_model(), {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}, backend="onnxruntime")["y"]
    got = qo.run(fm.model, {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}, backend="onnxruntime")["y"]
    np.testing.assert_array_equal(ref, got)


def test_prepare_folds_batch_normalization_into_the_conv_before_it():
    model, data = conv_batchnorm()
    fm, p = _plan(model)
    assert [n.op_type for n in fm.graph.node] == ["Conv", "Relu", "Conv", "Relu", "ReduceMean", "Gemm"]
    assert len(fm.node("conv0").input) == 3  # the Conv without a bias got one
    # The same function (float32 rounding of the folded weights aside), as ONNX Runtime folds it for the float model.
    ref = qo.run(model, data, backend="onnxruntime")["logits"]
    got = qo.run(fm.model, data, backend="onnxruntime")["logits"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))
    # Each Q goes after the Relu, which QLinearConv absorbs: no requantization around a normalization.
    assert [n.output for n in p.nodes if n.op_type == "Conv"] == [fm.producer_output("relu0"), fm.producer_output("relu1")]


def test_prepare_keeps_a_normalization_whose_conv_output_is_read_elsewhere():
    model, _ = conv_batchnorm(branch=True)
    fm, _ = _plan(model)
    assert [n.name for n in fm.graph.node if n.op_type == "BatchNormalization"] == ["bn0"]


def test_prepare_folds_batch_normalization_after_a_gemm_and_after_matmul_plus_bias():
    rng = np.random.default_rng(0)
    g = qo.Graph("dense_bn", opset=17)
    h = g.input("x", "float", ("N", 16))

    def bn(x, name):
        stats = [rng.uniform(0.5, 1.5, 24), rng.uniform(-0.2, 0.2, 24), rng.uniform(-0.5, 0.5, 24), rng.uniform(0.5, 2, 24)]
        return g.op("BatchNormalization", [x, *(s.astype(np.float32) for s in stats)], name=name)

    w = lambda *shape: (rng.standard_normal(shape) * 0.3).astype(np.float32)  # noqa: E731
    h = g.op("Relu", [bn(g.op("Gemm", [h, w(24, 16), w(1, 24)], name="fc1", transB=1, beta=0.5), "bn1")], name="r1")
    h = g.op("Add", [g.op("MatMul", [h, w(24, 24)], name="fc2"), w(24)], name="fc2_bias")
    g.output(g.op("Relu", [bn(h, "bn2")], name="r2", output_names=["y"]))
    model = g.to_model()
    fm, p = _plan(model)
    assert [n.op_type for n in fm.graph.node] == ["Gemm", "Relu", "Gemm", "Relu"]
    x = rng.standard_normal((32, 16)).astype(np.float32)
    ref = qo.run(model, {"x": x}, backend="onnxruntime")["y"]
    got = qo.run(fm.model, {"x": x}, backend="onnxruntime")["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))
    assert all(n.bias is not None for n in p.nodes)  # both biases stored as int32


def test_plan_lists_no_gather_of_a_computed_tensor_as_left_float():
    # An exporter's Shape -> Gather and a first-token pick x[:, 0] index computed tensors: no table to quantize.
    # A constant table that is not 2-D is one the user may expect quantized, so it is listed.
    rng = np.random.default_rng(0)
    g = qo.Graph("picks", opset=17)
    x = g.input("x", "float", ("N", 4, 8))
    dim = g.op("Gather", [g.op("Shape", [x], name="shape"), np.array(0, np.int64)], name="batch_dim", axis=0)
    first = g.op("Gather", [x, np.array(0, np.int64)], name="first_token", axis=1)
    g.output(
        g.op(
            "Reshape",
            [
                first,
                g.op(
                    "Concat",
                    [g.op("Unsqueeze", [dim, np.array([0], np.int64)], name="u"), np.array([8], np.int64)],
                    name="c",
                    axis=0,
                ),
            ],
            name="r",
        )
    )
    g.output(g.op("Gather", [rng.standard_normal((2, 3, 8)).astype(np.float32), np.array([1], np.int64)], name="cube", axis=0))
    _, p = _plan(g.to_model())
    assert p.left_float == [("cube", "Gather", "not a 2-D float table")]


def test_plan_lists_a_recurrent_layer_and_its_weights_as_left_float():
    rng = np.random.default_rng(0)
    g = qo.Graph("recurrent", opset=17)
    x = g.input("x", "float", (5, "N", 8))  # (time, batch, features)
    w, r, b = (rng.standard_normal(s).astype(np.float32) for s in ((1, 64, 8), (1, 64, 16), (1, 128)))
    _, h = g.op("LSTM", [x, w, r, b], name="lstm", hidden_size=16, num_outputs=2)
    flat = g.op("Reshape", [h, np.array([-1, 16], np.int64)], name="flat")
    g.output(g.op("MatMul", [flat, rng.standard_normal((16, 4)).astype(np.float32)], name="head"))
    _, p = _plan(g.to_model())
    assert [n.name for n in p.nodes] == ["head"]
    assert p.left_float == [
        ("lstm", "LSTM", f"no integer LSTM in ONNX Runtime; its weights ({64 * 8 + 64 * 16 + 128} values) stay float")
    ]


def _open_rank_classifier():
    """A classifier head as paddle2onnx writes it (opset 11): the Reshape's target is computed from a Shape
    through Casts and a Slice, so onnx's shape inference leaves the MatMul input's rank open."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def const(name, a):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(a))

    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["pooled"]),
        helper.make_node("Shape", ["pooled"], ["shape"]),
        helper.make_node("Cast", ["shape"], ["shape32"], to=TensorProto.INT32),
        *(const(n, np.array([v], np.int64)) for n, v in (("s0", 0), ("e0", 1), ("a0", 0), ("t0", 1))),
        helper.make_node("Slice", ["shape32", "s0", "e0", "a0", "t0"], ["batch32"]),
        helper.make_node("Cast", ["batch32"], ["batch"], to=TensorProto.INT64),
        const("width32", np.array([16], np.int32)),
        helper.make_node("Cast", ["width32"], ["width"], to=TensorProto.INT64),
        helper.make_node("Concat", ["batch", "width"], ["target"], axis=-1),
        helper.make_node("Reshape", ["pooled", "target"], ["flat"]),
        const("w", (rng.standard_normal((16, 3)) * 0.3).astype(np.float32)),
        helper.make_node("MatMul", ["flat", "w"], ["logits"], name="fc"),
        const("b", rng.standard_normal(3).astype(np.float32)),
        helper.make_node("Add", ["logits", "b"], ["biased"], name="bias"),
        helper.make_node("Softmax", ["biased"], ["probs"], axis=1),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 16, 4, 4])
    y = helper.make_tensor_value_info("probs", TensorProto.FLOAT, [-1, 3])
    model = helper.make_model(helper.make_graph(nodes, "open_rank", [x], [y]), opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 7
    return model, {"x": rng.standard_normal((48, 16, 4, 4)).astype(np.float32)}


def test_prepare_asks_onnx_runtime_where_the_matmul_inputs_rank_is_open(monkeypatch):
    import qlinear.quantize as qq
    import qlinear.quantize._prepare as prepare_pass

    model, data = _open_rank_classifier()
    assert load_float_model(model).shapes.get("flat") is None  # onnx's inference leaves it open
    fm, _ = _plan(model)
    assert fm.node("fc").op_type == "Gemm" and "bias" not in {n.name for n in fm.graph.node}
    r = qq.quantize_model(model, None, data, promote=False).report
    assert r.fusion.unfused == [] and r.nodes[0].runs_as == "QGemm"
    # Left a MatMul, ONNX Runtime still makes its own Gemm of it with the float bias: no integer kernel matches.
    monkeypatch.setattr(prepare_pass, "_gemm_outputs_onnx_runtime_makes", lambda fm: set())
    r = qq.quantize_model(model, None, data, promote=False).report
    assert r.fusion.unfused == ["fc"]


def test_prepare_puts_a_fixed_shape_matmul_with_bias_between_reshapes_as_onnx_runtime_does():
    import qlinear.quantize as qq
    from qlinear.quantize._session import session

    model, data = dense_on_sequences()
    fm, _ = _plan(model)
    ops = [(n.op_type, n.name) for n in fm.graph.node if n.op_type in ("Reshape", "Gemm", "MatMul")]
    assert ops[:3] == [("Reshape", "fc1_rows"), ("Gemm", "fc1"), ("Reshape", "fc1_restore")]
    feeds = {"x": data["x"][:4]}
    (want,), (got,) = session(model).run(None, feeds), session(fm.model).run(None, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    r = qq.quantize_model(model, None, data, promote=False).report
    assert r.fusion.unfused == []  # as a MatMul, fc1 became ONNX Runtime's own float Gemm
    assert {n.name: n.runs_as for n in r.nodes} == {"fc1": "QGemm", "fc2": "QGemm", "head": "MatMulIntegerToFloat"}


@pytest.mark.parametrize("opset", [13, 17])
def test_prepare_puts_a_matmul_with_bias_on_an_input_of_open_shape_between_reshapes(opset):
    # A transformer exported with a dynamic batch and sequence length: the bias went to a float Add after the
    # integer MatMul. The leading dimensions are read at run time (Shape with end=-1 from opset 15, Shape and Slice
    # before), once for each input.
    import qlinear.quantize as qq
    from qlinear.quantize._session import session

    model, data = dense_on_sequences(("N", "T", 32), opset=opset)
    fm, _ = _plan(model)
    ops = [n.op_type for n in fm.graph.node]
    leading = ["Shape"] if opset >= 15 else ["Shape", "Slice"]
    assert ops[: len(leading) + 4] == [*leading, "Reshape", "Gemm", "Concat", "Reshape"]
    assert ops.count("Gemm") == 2 and "Add" not in ops
    for n, t in ((4, 12), (3, 5)):  # other batches and lengths than calibrated
        feeds = {"x": data["x"][:n, :t]}
        (want,), (got,) = session(model).run(None, feeds), session(fm.model).run(None, feeds)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    r = qq.quantize_model(model, None, data, promote=False).report
    assert r.fusion.unfused == []
    assert {n.name: n.runs_as for n in r.nodes} == {"fc1": "QGemm", "fc2": "QGemm", "head": "MatMulIntegerToFloat"}
    # Weight-only: the MatMul stays (MatMulNBits and the float MatMul take any rank, and nothing is gained).
    fm, _ = _plan(model, weights="int4", granularity="blocked", activations=None)
    assert fm.node("fc1").op_type == "MatMul"


def test_a_conv_whose_relu_output_a_subgraph_reads_takes_its_q_before_the_relu():
    # A branch reads the Relu's output by name (Silero VAD's decoder reads its encoder's this way): no DQ can
    # reach that reader, so a Q after the Relu would leave the Relu a second reader and the Conv unfused.
    from onnx import TensorProto, helper, numpy_helper

    import qlinear.quantize as qq

    rng = np.random.default_rng(0)
    branch = helper.make_graph(
        [helper.make_node("ReduceMean", ["h"], ["y_then"], axes=[2], keepdims=0)], "then", [],
        [helper.make_tensor_value_info("y_then", TensorProto.FLOAT, ["batch", 8])],
    )  # fmt: skip
    other = helper.make_graph(
        [helper.make_node("ReduceMax", ["h"], ["y_else"], axes=[2], keepdims=0)], "else", [],
        [helper.make_tensor_value_info("y_else", TensorProto.FLOAT, ["batch", 8])],
    )  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1]),
        helper.make_node("Relu", ["c"], ["h"], name="relu"),
        helper.make_node("Greater", ["gate", "zero"], ["on"]),
        helper.make_node("If", ["on"], ["y"], then_branch=branch, else_branch=other),
    ]
    graph = helper.make_graph(
        nodes, "encoder_decoder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 16]), helper.make_tensor_value_info("gate", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [numpy_helper.from_array((rng.standard_normal((8, 4, 3)) * 0.4).astype(np.float32), "w"), numpy_helper.from_array(np.float32(0), "zero")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    fm, p = _plan(model)
    assert "h" in fm.read_in_subgraphs and p.nodes[0].output == "c"
    data = {"x": rng.standard_normal((40, 4, 16)).astype(np.float32), "gate": np.float32(1)}
    r = qq.quantize_model(model, None, data, promote=False).report
    assert r.fusion.unfused == [] and r.nodes[0].runs_as == "QLinearConv"


def test_prepare_removes_identities_and_folds_a_constant_add_after_a_conv_into_its_bias():
    model, data = squeeze_excite(paddle=True)
    fm, p = _plan(model)
    # paddle2onnx's bias (Add of a Reshape of Constants) and its Identity are gone: the Conv holds the bias.
    assert [n.op_type for n in fm.graph.node if n.name.startswith("se")] == ["Conv", "Relu", "Conv", "HardSigmoid"]
    assert all(len(fm.node(name).input) == 3 for name in ("se1", "se2"))
    ref = qo.run(model, data, backend="onnxruntime")["logits"]
    got = qo.run(fm.model, data, backend="onnxruntime")["logits"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))
    # So the Relu after the first 1x1 Conv folds into its Q, as in the model written with Conv biases.
    plain_fm, plain = _plan(squeeze_excite()[0])
    q_after = lambda fm, p: {n.name: fm.producer[n.output].op_type for n in p.nodes if n.output}  # noqa: E731
    assert q_after(fm, p) == q_after(plain_fm, plain) == {"conv0": "Conv", "se1": "Relu", "se2": "Conv", "conv1": "Relu"}
    assert p.nodes[1].output == fm.producer_output("se_relu") and p.nodes[1].bias is not None


def test_prepare_keeps_an_identity_that_is_a_graph_output_and_an_add_that_is_not_per_channel():
    rng = np.random.default_rng(0)
    g = qo.Graph("kept", opset=17)
    x = g.input("x", "float", ("N", 4, 6, 6))
    conv = g.op("Conv", [x, rng.standard_normal((8, 4, 3, 3)).astype(np.float32)], name="conv")
    # One value a pixel, not a channel: not a bias.
    g.output(g.op("Add", [conv, rng.standard_normal((1, 1, 4, 4)).astype(np.float32)], name="add", output_names=["y"]))
    g.output(g.op("Identity", [x], name="tap", output_names=["tap"]))
    fm, _ = _plan(g.to_model())
    assert [n.op_type for n in fm.graph.node] == ["Conv", "Add", "Identity"]


def test_a_pool_whose_output_is_quantized_takes_a_quantized_input():
    model, _ = squeeze_excite()
    fm, p = _plan(model)
    a, squeezed = fm.node("squeeze").input[0], fm.producer_output("squeeze")
    # The block's pool reads its input quantized, and so does the gate's product: DQ -> pool -> Q fuses.
    assert p.activation_types[a] == "uint8" and p.activation_types[squeezed] == "uint8"
    assert a in p.all_consumers_dequantize
    # The last pool's output reaches the Gemm through a Flatten, which shares the pooled range.
    pooled = fm.producer_output("pool")
    assert pooled in p.calibrate and p.shared[fm.producer_output("flat")] == pooled
    # int8 activations: ONNX Runtime fuses no int8 pool, so the pool's input stays as its readers ask.
    fm, p = _plan(model, activations="int8")
    assert a not in p.activations and a not in p.all_consumers_dequantize
    # A pool that only float nodes read keeps its input as it was.
    fm, p = _plan(model, exclude=["se1"])
    assert a not in p.activations


def test_dense_layers_reading_one_input_of_open_shape_share_its_rows():
    # As q, k and v read one LayerNorm: one Reshape to rows, one Shape, so one QuantizeLinear for the three Gemms.
    rng = np.random.default_rng(0)
    g = qo.Graph("qkv", opset=17)
    x = g.input("x", "float", ("N", "T", 16))
    outs = [
        g.op("Add", [g.op("MatMul", [x, rng.standard_normal((16, 16)).astype(np.float32)], name=name), np.ones(16, np.float32)])
        for name in ("q", "k", "v")
    ]
    g.output(g.op("Add", [g.op("Add", [outs[0], outs[1]]), outs[2]], output_names=["y"]))
    fm, p = _plan(g.to_model())
    ops = [n.op_type for n in fm.graph.node]
    assert (ops.count("Reshape"), ops.count("Shape"), ops.count("Gemm")) == (4, 1, 3)
    rows = {fm.node(name).input[0] for name in ("q", "k", "v")}
    assert len(rows) == 1 and p.calibrate == [*rows]


def test_a_bias_add_after_a_conv_with_an_omitted_bias_fills_input_2():
    # A Conv may name its optional bias as "" (left out): the folded bias goes there, not in a fourth input.
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((8, 4, 3, 3)) * 0.3).astype(np.float32), "w")
    c = numpy_helper.from_array(rng.standard_normal((1, 8, 1, 1)).astype(np.float32), "c")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", ""], ["y0"], name="conv"), helper.make_node("Add", ["y0", "c"], ["y"], name="add")],
        "omitted_bias",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w, c],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    fm, _ = _plan(model)
    assert [n.op_type for n in fm.graph.node] == ["Conv"] and len(fm.node("conv").input) == 3
    x = {"x": rng.standard_normal((2, 4, 6, 6)).astype(np.float32)}
    np.testing.assert_allclose(
        qo.run(fm.model, x, backend="onnxruntime")["y"], qo.run(model, x, backend="onnxruntime")["y"], rtol=1e-5, atol=1e-5
    )


def test_exclude_patterns_name_nodes_by_glob_expression_op_type_and_region():
    from qlinear.quantize._exclusion import excluded_nodes

    model, _ = layernorm_attention()
    fm = load_float_model(model)
    assert excluded_nodes(fm, ["*_proj"]) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert excluded_nodes(fm, [r"re:^[qk]_p"]) == {"q_proj", "k_proj"}
    assert excluded_nodes(fm, ["Gemm", "embed"]) == {"head", "embed"}
    # A region: every node on a path from the tensor to the node, both ends included; the side branch to v is not.
    assert excluded_nodes(fm, ["ln_div_output..scores"]) == {"q_proj", "k_proj", "k_t", "scores"}
    assert excluded_nodes(fm, ["ids..ln_div"]) == {"embed", "ln_mean", "ln_sub", "ln_sq", "ln_var", "ln_eps", "ln_sqrt", "ln_div"}
    _, p = _plan(model, exclude=("ln_div_output..scores",))
    assert {n.name for n in p.nodes} == {"embed", "v_proj", "context", "o_proj", "head"}


def test_an_exclude_pattern_that_names_no_node_is_refused_naming_it():
    model, data = layernorm_attention()
    with pytest.raises(QuantizationError, match=r"exclude pattern\(s\) 'q_prj', '/enc/\*' name no node of the model"):
        qq.quantize_model(model, None, data, exclude=["q_proj", "q_prj", "/enc/*"])
    # An op type the model does not hold is no typo: one list serves models of every kind.
    r = qq.quantize_model(model, None, data, exclude=["Conv", "ConvTranspose"], promote=False)
    assert {n.name for n in r.report.nodes} >= {"q_proj", "head"}
    with pytest.raises(QuantizationError, match=r"exclude pattern 're:\(' is not a regular expression"):
        qq.quantize_model(model, None, data, exclude=["re:("])
    with pytest.raises(QuantizationError, match=r"exclude region 'ids\.\.nowhere': no node is named 'nowhere'"):
        qq.quantize_model(model, None, data, exclude=["ids..nowhere"])
    with pytest.raises(QuantizationError, match=r"exclude region 'nothing\.\.head': no node reads a tensor named 'nothing'"):
        qq.quantize_model(model, None, data, exclude=["nothing..head"])
    with pytest.raises(QuantizationError, match=r"node 'embed' is not downstream of 'mask'"):
        qq.quantize_model(model, None, data, exclude=["mask..embed"])


def _front_end(tail: str) -> onnx.ModelProto:
    """waveform -> a bank of 1-D Conv filters -> ``tail`` -> Conv -> Gemm; ``tail`` names the magnitude's form."""
    rng = np.random.default_rng(0)
    g = qo.Graph("front_end", opset=17)
    wave = g.input("waveform", "float", ("N", 1, 256))

    def w(*shape):
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)

    h = g.op("Conv", [wave, w(8, 1, 16)], name="filters", strides=[8])  # (N, 8, 31): 4 filters, re and im
    bands = 4
    if tail in ("octaves", "activated"):  # a constant-Q transform's second octave: low-passed, halved, filtered again
        low = g.op("Conv", [wave, w(1, 1, 2)], name="down", strides=[2])  # (N, 1, 128)
        if tail == "activated":  # an activation between: a learned layer, not a filter of the front end
            low = g.op("Relu", [low], name="act")
        low = g.op("Reshape", [low, np.array([0, 1, 128], np.int64)], name="moved")
        octave = g.op("Conv", [low, w(8, 1, 8)], name="filters2", strides=[4])  # (N, 8, 31)
        h = g.op("Concat", [h, octave], name="octaves", axis=1)  # (N, 16, 31)
        bands = 8
    if tail == "interior":  # two linear layers in a row inside the network, after an activation: no filter bank
        h = g.op("Conv", [g.op("Conv", [g.op("Relu", [h], name="act0"), w(8, 8, 1)], name="mixa"), w(8, 8, 1)], name="mixb")
    if tail in ("cqt", "sqrt", "octaves", "activated", "interior", "weighted"):
        h = g.op("Transpose", [h], name="t", perm=[0, 2, 1])
        h = g.op("Reshape", [h, np.array([0, 31, 2, bands], np.int64)], name="pairs")
        re_ = g.op("Slice", [h, np.array([0], np.int64), np.array([1], np.int64), np.array([2], np.int64)], name="re")
        im = g.op("Slice", [h, np.array([1], np.int64), np.array([2], np.int64), np.array([2], np.int64)], name="im")
        both = g.op("Concat", [g.op("Mul", [re_, re_], name="re2"), g.op("Mul", [im, im], name="im2")], name="join", axis=2)
        power = g.op("ReduceSum", [both, np.array([2], np.int64)], name="sum", keepdims=0)  # (N, 31, 4)
        if tail == "weighted":  # a weight for each bin on the power: no mean, the walk back from the root goes on
            power = g.op("Mul", [power, rng.uniform(0.1, 0.9, (31, bands)).astype(np.float32)], name="bins")
        h = g.op("Mul", [g.op("Sqrt", [power], name="magnitude"), np.float32(2.0)], name="gain")
        if tail not in ("sqrt", "weighted"):  # twelve ops between the filters and the Log: more than any fixed depth
            h = g.op("Log", [g.op("Add", [h, np.float32(1e-6)], name="floor")], name="log")
        h = g.op("Transpose", [h], name="channels", perm=[0, 2, 1])  # (N, 4, 31)
    elif tail == "compressed":
        h = g.op("Pow", [g.op("Relu", [h], name="rectify"), np.float32(0.3)], name="compress")
    elif tail in ("layernorm", "summed"):  # a patch embedding's shape: Conv, then a LayerNorm written out
        if tail == "layernorm":

            def mean(v, name):
                return g.op("ReduceMean", [v], name=name, axes=[1])
        else:  # as jax2tf writes a mean: a sum times 1 / n

            def mean(v, name):
                return g.op(
                    "Mul", [g.op("ReduceSum", [v, np.array([1], np.int64)], name=f"{name}_sum"), np.float32(1 / 8)], name=name
                )

        centred = g.op("Sub", [h, mean(h, "mean")], name="centre")
        var = mean(g.op("Pow", [centred, np.float32(2.0)], name="square"), "var")
        h = g.op("Div", [centred, g.op("Sqrt", [g.op("Add", [var, np.float32(1e-5)], name="eps")], name="std")], name="norm")
    elif tail == "deep":  # the root comes after a second layer: not the front end's
        h = g.op("Conv", [g.op("Relu", [h], name="r0"), w(8, 8, 1)], name="mix")
        h = g.op("Sqrt", [g.op("Relu", [h], name="r1")], name="root")
    channels = {"cqt": 4, "sqrt": 4, "interior": 4, "weighted": 4}.get(tail, 8)
    h = g.op("Relu", [g.op("Conv", [h, w(6, channels, 3)], name="conv")], name="relu")
    h = g.op("ReduceMean", [h], name="pool", axes=[-1], keepdims=0)
    g.output(g.op("Gemm", [h, w(3, 6)], name="classifier", transB=1, output_names=["logits"]))
    return g.to_model()


@pytest.mark.parametrize(
    ("tail", "left", "why"),
    [
        ("cqt", {"filters"}, "output reaches a Log"),
        ("octaves", {"filters", "filters2"}, "output reaches a Log"),
        ("octaves", {"down"}, "a filter before a front end's float filters"),  # the octave's low-pass: the same front end
        ("activated", {"filters", "filters2"}, "output reaches a Log"),  # a Relu after "down": quantized
        ("activated", set(), "a filter before a front end's float filters"),
        ("interior", {"mixb"}, "output reaches a Log"),  # "mixa" feeds it with nothing between, but reads no raw input
        ("interior", set(), "a filter before a front end's float filters"),
        ("weighted", {"filters"}, "a front end on the raw input whose output reaches a Sqrt"),
        ("sqrt", {"filters"}, "a front end on the raw input whose output reaches a Sqrt"),
        ("compressed", {"filters"}, "a front end on the raw input whose output reaches a Sqrt or fractional Pow"),
        ("layernorm", set(), None),  # a normalization's root: the patch embedding is quantized
        ("summed", set(), None),  # the same, its means written as sums scaled by 1 / n
        ("deep", set(), None),  # the root is the second layer's: both layers quantized
    ],
)
def test_a_front_end_whose_magnitude_reaches_a_log_or_a_root_stays_float(tail, left, why):
    _, p = _plan(_front_end(tail))
    kept_float = {name for name, _, reason in p.left_float if why is not None and reason.startswith(why)}
    assert kept_float == left
    learned = {"conv", "classifier"} | ({"down"} if tail == "activated" else set()) | ({"filters"} if why is None else set())
    learned |= {"mixa", "filters"} if tail == "interior" else set()
    assert {n.name for n in p.nodes} >= learned
    assert not {n.name for n in p.nodes} & left
