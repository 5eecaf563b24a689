"""Fine-tuning a quantized model's scales and weights against the float model, written back as the same QDQ model."""

from __future__ import annotations

from importlib import resources

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")

import qlinear  # noqa: E402
import qlinear.onnx as qo  # noqa: E402
import qlinear.quantize as qq  # noqa: E402
from qlinear._errors import QuantizationError  # noqa: E402
from qlinear.quantize.algorithms.finetune import _float_prefix  # noqa: E402
from qlinear.torch._from_onnx import QDQModule, UnsupportedOperator  # noqa: E402
from quantize_models import GATES, audio_front_end, dense_on_sequences, gated_convs, layernorm_attention  # noqa: E402

DEMO = resources.files("qlinear.quantize") / "_demo"
MODEL = str(DEMO / "digits_cnn.onnx")
W4A8 = {"weights": "int4", "granularity": "blocked", "block_size": 32, "activations": "uint8", "promote": False}


def _data():
    cal = dict(np.load(str(DEMO / "digits_calibration.npz")))
    ev = dict(np.load(str(DEMO / "digits_eval.npz")))
    return cal, {"image": ev["image"]}


def test_the_torch_module_is_the_quantized_model():
    # Before any step, the module computes what ONNX Runtime computes on the QDQ model (float ops aside).
    cal, ev = _data()
    qmodel = qq.quantize_model(MODEL, None, cal, eval=ev, **W4A8).model
    module = QDQModule(qmodel, {})
    x = ev["image"][:32]
    with torch.no_grad():
        got = module({"image": torch.from_numpy(x)})[0].numpy()
    want = qo.run(qmodel, {"image": x}, backend="onnxruntime")["logits"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    assert len(module.weights) == 4 and len(module.scales) >= 4 + 3  # 4 weights; the input's and 2 activations'


@pytest.mark.parametrize("gate", GATES)
def test_the_torch_module_is_a_quantized_model_with_gates(gate):
    # HardSwish, HardSigmoid and Clip have torch forms, and so has the gate chain written for integer kernels
    # (a QuantizeLinear and a DequantizeLinear of different scales): before any step, ONNX Runtime's values.
    model, data = gated_convs(gate)
    r = qq.quantize_model(model, None, data, promote=False)
    assert r.report.fusion.integer_gates
    x = data["x"][-16:]
    with torch.no_grad():
        got = QDQModule(r.model, {})({"x": torch.from_numpy(x)})[0].numpy()
    want = qo.run(r.model, {"x": x}, backend="onnxruntime")["logits"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3 * float(np.abs(want).max()))
    # A gate's Q/DQ pair of different scales and its shift stored as one code encode its function: not trained.
    gates = [t.name for t in r.model.graph.initializer if "_gate_" in t.name or "_shift_" in t.name]
    tuned = qq.quantize_model(model, None, data, promote=False, finetune=10)
    assert "no torch form" not in (tuned.report.finetune.note or "")
    inits = {t.name: t.SerializeToString() for t in tuned.model.graph.initializer}
    assert gates and all(inits[name] == t.SerializeToString() for t in r.model.graph.initializer if (name := t.name) in gates)


@pytest.mark.parametrize("opset", [13, 17])
def test_the_torch_module_reads_leading_dimensions_at_run_time(opset):
    # Dense layers on (batch, length, width) inputs of open shape run as Gemms between Reshapes whose target is read
    # with Shape (and Slice before opset 15): the torch module computes them, for any batch and length.
    model, data = dense_on_sequences(("N", "T", 32), opset=opset)
    r = qq.quantize_model(model, None, data, promote=False)
    assert {"Shape", "Gemm"} <= {n.op_type for n in r.model.graph.node}
    module = QDQModule(r.model, {})
    for x in (data["x"][:4], data["x"][:3, :5]):
        with torch.no_grad():
            got = module({"x": torch.from_numpy(x)})[0].numpy()
        want = qo.run(r.model, {"x": x}, backend="onnxruntime")["y"]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3 * float(np.abs(want).max()))
    tuned = qq.quantize_model(model, None, data, promote=False, finetune=5)
    assert "no torch form" not in (tuned.report.finetune.note or "")


def test_slice_and_cast_have_torch_forms():
    # What exporters write before a classifier's head: a Slice of a shape, and Casts.
    g = qo.Graph("slice_cast", opset=13)
    x = g.input("x", "float", ("N", 6, 4))
    picked = g.op("Slice", [x, np.array([1, -1], np.int64), np.array([5, -5], np.int64), np.array([1, 2], np.int64),
                            np.array([2, -1], np.int64)], name="pick")  # fmt: skip
    g.output(
        g.op("Cast", [g.op("Cast", [picked], name="to_int", to=onnx.TensorProto.INT32)], name="back", to=1, output_names=["y"])
    )
    model = g.to_model()
    x = np.random.default_rng(0).standard_normal((2, 6, 4)).astype(np.float32) * 10
    with torch.no_grad():
        got = QDQModule(model, {})({"x": torch.from_numpy(x)})[0].numpy()
    want = qo.run(model, {"x": x}, backend="onnxruntime")["y"]
    np.testing.assert_array_equal(got, want)


def test_finetune_lowers_the_loss_and_keeps_the_better_model(tmp_path):
    # What the pass promises: training lowers its loss and raises the held-out output SQNR; the tuned model
    # replaces the post-training one exactly when it is better on the held-out data (higher SQNR, no lower
    # agreement), and otherwise the post-training model is written unchanged, with the reason. Which of the two
    # a machine takes turns on a few held-out images, so both are asserted.
    cal, ev = _data()
    ptq = qq.quantize_model(MODEL, None, cal, eval=ev, **W4A8)
    tuned = qq.quantize_model(MODEL, tmp_path / "q.onnx", cal, eval=ev, finetune=300, **W4A8)
    f = tuned.report.finetune
    assert f.steps == 300 and f.loss_after < f.loss_before
    assert (f.held_out.sqnr_db_before, f.held_out.agreement_before) == (
        ptq.report.output.sqnr_db,
        ptq.report.output.top1_agreement,
    )
    assert f.held_out.sqnr_db_after > f.held_out.sqnr_db_before + 2
    assert f.kept == (
        f.held_out.sqnr_db_after > f.held_out.sqnr_db_before and f.held_out.agreement_after >= f.held_out.agreement_before
    )
    written = onnx.load(str(tmp_path / "q.onnx"))
    onnx.checker.check_model(str(tmp_path / "q.onnx"), full_check=True)
    if f.kept:
        assert f.note is None
        assert tuned.report.output.sqnr_db == pytest.approx(f.held_out.sqnr_db_after)
        assert tuned.model.SerializeToString() != ptq.model.SerializeToString()
    else:
        assert "not better on the held-out data" in f.note
        assert tuned.model.SerializeToString() == ptq.model.SerializeToString()
    assert written.graph.SerializeToString() == tuned.model.graph.SerializeToString()


def test_the_tuned_model_is_the_same_qdq_graph_with_new_values(tmp_path):
    # Written back after training, kept or not: the same nodes, initializer names and types, a valid model.
    from qlinear.quantize.algorithms.finetune import _written_back

    cal, ev = _data()
    ptq = qq.quantize_model(MODEL, None, cal, eval=ev, **W4A8).model
    module = QDQModule(ptq, {})
    optimizer = torch.optim.Adam([*module.scales, *module.weights], lr=1e-3)
    feeds = {"image": torch.from_numpy(cal["image"][:32])}
    for _ in range(5):
        loss = module(feeds)[0].square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    tuned = _written_back(ptq, module)
    onnx.save(tuned, str(tmp_path / "t.onnx"))
    onnx.checker.check_model(str(tmp_path / "t.onnx"), full_check=True)
    assert [n.op_type for n in tuned.graph.node] == [n.op_type for n in ptq.graph.node]
    types = {t.name: t.data_type for t in ptq.graph.initializer}
    assert {t.name: t.data_type for t in tuned.graph.initializer} == types
    changed = [t.name for t, u in zip(ptq.graph.initializer, tuned.graph.initializer, strict=True) if t.raw_data != u.raw_data]
    assert any(name.endswith("_scale") for name in changed) and any(name.endswith("_q") for name in changed)


def test_int32_biases_follow_the_new_scales():
    # Written back with every scale 10% larger: each int32 bias takes the product of its layer's new input and
    # weight scales, and its codes hold the same float bias at that scale.
    from qlinear.quantize.algorithms.finetune import _written_back

    cal, ev = _data()
    ptq = qq.quantize_model(MODEL, None, cal, eval=ev, promote=False).model  # int8 weights: int32 biases
    module = QDQModule(ptq, {})
    with torch.no_grad():
        for p in module.scales:
            p.mul_(1.1)
    tuned = _written_back(ptq, module)
    values = {t.name: onnx.numpy_helper.to_array(t) for t in tuned.graph.initializer}
    old = {t.name: onnx.numpy_helper.to_array(t) for t in ptq.graph.initializer}
    producer = {o: n for n in tuned.graph.node for o in n.output}
    checked = 0
    for node in tuned.graph.node:
        if node.op_type not in ("Conv", "Gemm") or len(node.input) < 3 or node.input[2] not in producer:
            continue
        bias_dq, act_dq, w_dq = (producer[node.input[i]] for i in (2, 0, 1))
        if values[bias_dq.input[0]].dtype != np.int32:
            continue
        scale = values[bias_dq.input[1]]
        assert np.array_equal(scale, np.float32(values[act_dq.input[1]]) * values[w_dq.input[1]].astype(np.float32))
        before = old[bias_dq.input[0]].astype(np.float64) * old[bias_dq.input[1]].astype(np.float64)
        after = values[bias_dq.input[0]].astype(np.float64) * scale.astype(np.float64)
        np.testing.assert_allclose(after, before, atol=float(scale.max()))  # within one step of the new scale
        checked += 1
    assert checked == 4  # the two convolutions and the two Gemms


def test_scales_only_leave_the_weights_codes_to_the_scales():
    cal, ev = _data()
    tuned = qq.quantize_model(MODEL, None, cal, eval=ev, finetune=50, finetune_weights=False, **W4A8)
    f = tuned.report.finetune
    assert f.steps == 50 and f.loss_after < f.loss_before
    assert tuned.report.settings.finetune_weights is False


def test_an_operator_torch_cannot_run_keeps_the_post_training_model():
    # Elu has no torch form here: the run warns and returns the post-training model unchanged.
    model, data = layernorm_attention()
    node = onnx.helper.make_node("Elu", ["logits_pre"], ["logits"], name="act")
    head = next(n for n in model.graph.node if n.name == "head")
    head.output[0] = "logits_pre"
    model.graph.node.append(node)
    ptq = qq.quantize_model(model, None, data, promote=False)
    tuned = qq.quantize_model(model, None, data, promote=False, finetune=10)
    assert not tuned.report.finetune.kept
    assert "Elu" in tuned.report.finetune.note
    assert any("Elu" in w for w in tuned.report.warnings)
    assert tuned.model.SerializeToString() == ptq.model.SerializeToString()
    with pytest.raises(UnsupportedOperator, match="Elu"):
        QDQModule(ptq.model, {})


def test_a_float_front_end_torch_cannot_run_is_computed_by_onnx_runtime():
    # STFT, ReduceSum and Log have no torch form, but they read only the waveform: they run once a batch in
    # ONNX Runtime and the quantized Conv and Gemm after them train (before, the post-training model was kept).
    model, data = audio_front_end()
    qmodel = qq.quantize_model(model, None, data, **W4A8).model
    prefix, rest = _float_prefix(qmodel)
    assert {n.op_type for n in prefix.graph.node} >= {"STFT", "ReduceSum", "Log", "MatMul"}
    assert not {"STFT", "Log"} & {n.op_type for n in rest.graph.node}
    # Prefix then rest is the whole model.
    feeds = {"waveform": data["waveform"][:20]}
    cut = qo.run(prefix, feeds, backend="onnxruntime")
    got = qo.run(rest, cut, backend="onnxruntime")["logits"]
    np.testing.assert_array_equal(got, qo.run(qmodel, feeds, backend="onnxruntime")["logits"])
    tuned = qq.quantize_model(model, None, data, finetune=100, **W4A8).report
    f = tuned.finetune
    assert f.seconds > 0 and f.loss_after < f.loss_before
    assert f.held_out.sqnr_db_after > f.held_out.sqnr_db_before + 2 and not any("torch form" in w for w in tuned.warnings)
    assert f.kept == (f.held_out.agreement_after >= f.held_out.agreement_before)


def test_a_model_with_no_float_front_end_has_no_prefix():
    cal, ev = _data()
    qmodel = qq.quantize_model(MODEL, None, cal, eval=ev, **W4A8).model
    prefix, rest = _float_prefix(qmodel)
    assert prefix is None and rest is qmodel


@pytest.mark.parametrize("steps", [-1, 1.5, True])
def test_bad_step_counts_are_named(steps):
    with pytest.raises(QuantizationError, match="finetune must be an int >= 0"):
        qq.QuantizeOptions(finetune=steps)


def test_finetuned_codes_are_the_kernels_codes_of_the_learned_weights():
    # Written-back codes are qlinear.quantize_linear of a latent weight at the learned scale: they round-trip.
    cal, ev = _data()
    tuned = qq.quantize_model(MODEL, None, cal, eval=ev, finetune=20, **W4A8).model
    values = {t.name: onnx.numpy_helper.to_array(t) for t in tuned.graph.initializer}
    for node in tuned.graph.node:
        codes_name = node.input[0] if node.input else ""
        if node.op_type == "DequantizeLinear" and codes_name in values and values[codes_name].dtype != np.int32:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            codes, scale, zp = (values[n] for n in node.input)
            w = qlinear.dequantize_linear(codes, scale, zp, axis=attrs["axis"], block_size=attrs["block_size"])
            again = qlinear.quantize_linear(w, scale, zp, axis=attrs["axis"], block_size=attrs["block_size"], output_dtype="int4")
            assert np.array_equal(again.view(np.uint8), codes.view(np.uint8))
