"""Calibrated quantization of models kept beside their graph: the model an in-memory run gives, and one past 2 GB."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import qlinear.onnx as qo
import qlinear.quantize as qq
import qlinear.quantize._model as model_pass
from qlinear.onnx import _large as large
from quantize_models import layernorm_attention, outlier_mlp


def _by_value(model: onnx.ModelProto) -> tuple[list[bytes], dict[str, tuple[str, bytes]]]:
    nodes = [n.SerializeToString() for n in model.graph.node]
    values = {
        t.name: (str(v.dtype), np.ascontiguousarray(v).tobytes()) for t in model.graph.initializer for v in [large.value_of(t)]
    }
    return nodes, values


@pytest.mark.parametrize("source", ["path", "proto"])
@pytest.mark.parametrize("make", [layernorm_attention, outlier_mlp])
def test_weights_beside_the_graph_give_the_in_memory_model(tmp_path, monkeypatch, source, make):
    # Every weight of these small models moves to the store, as a model's of 1 GB or more does: the
    # quantized model, its report's figures and its file must be those of the in-memory run.
    model, data = make()
    path = tmp_path / "model.onnx"
    qo.save(model, path, external_threshold=256)
    given = str(path) if source == "path" else model
    kwargs = {"calibration": data, "promote": True}
    expected = qq.quantize_model(given, tmp_path / "a.onnx", **kwargs)
    monkeypatch.setattr(model_pass, "STORE_THRESHOLD", 0)
    monkeypatch.setattr(large, "MOVED_THRESHOLD", 256)
    got = qq.quantize_model(given, tmp_path / "b.onnx", **kwargs)
    assert got.weights is not None and len(got.weights) > 0  # the run kept its weights in a store
    assert _by_value(got.model) == _by_value(expected.model)
    for part in ("output", "nodes", "analysis", "promotions"):
        assert getattr(got.report, part) == getattr(expected.report, part), part
    for when in ("before", "after"):  # a marker's header is not a tensor's: sizes agree to a few bytes a tensor
        assert getattr(got.report.size_bytes, when) == pytest.approx(getattr(expected.report.size_bytes, when), rel=0.02)
    assert _by_value(qo.load(tmp_path / "b.onnx")) == _by_value(qo.load(tmp_path / "a.onnx"))
    onnx.checker.check_model(str(tmp_path / "b.onnx"), full_check=True)


def test_calibrated_quantization_of_a_model_over_2_gb(tmp_path):
    # An embedding table of 2.1 GB (external data written straight from numpy) and a MatMul head: past
    # protobuf's limit, calibrated with uint8 activations. Nothing of it is serialized whole.
    vocab, d, classes, t = 262_144, 2048, 16, 8
    folder = tmp_path / "big"
    folder.mkdir()
    rng = np.random.default_rng(5)
    try:
        with open(folder / "model.onnx.data", "wb") as f:
            for _ in range(0, vocab, 16_384):  # written in slices: never the whole table in memory
                (rng.standard_normal((16_384, d), dtype=np.float32) * np.float32(0.1)).tofile(f)
        table = TensorProto(name="table", data_type=TensorProto.FLOAT, dims=[vocab, d], data_location=TensorProto.EXTERNAL)
        table.external_data.add(key="location", value="model.onnx.data")
        head = (rng.standard_normal((d, classes)) * 0.05).astype(np.float32)
        graph = helper.make_graph(
            [
                helper.make_node("Gather", ["table", "ids"], ["x"], name="embed"),
                helper.make_node("ReduceMean", ["x"], ["pooled"], name="pool", axes=[1], keepdims=0),
                helper.make_node("MatMul", ["pooled", "head"], ["logits"], name="classify"),
            ],
            "embedding",
            [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", t])],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])],
            initializer=[table, onnx.numpy_helper.from_array(head, "head")],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 10
        (folder / "model.onnx").write_bytes(model.SerializeToString())
        ids = rng.integers(0, vocab, (64, t)).astype(np.int64)
        out = tmp_path / "q.onnx"
        result = qq.quantize_model(str(folder / "model.onnx"), out, {"ids": ids}, promote=False)
        assert result.report.size_bytes.before > 2 << 30
        onnx.checker.check_model(str(out), full_check=True)
        quantized = qo.load(out)
        assert large.byte_size(quantized) < 0.3 * result.report.size_bytes.before  # int8 codes of the table
        ops = [n.op_type for n in quantized.graph.node]
        assert ops.count("DequantizeLinear") >= 2 and "QuantizeLinear" in ops
        # The quantized model runs in ONNX Runtime and agrees with the float one on the eval samples.
        assert result.report.output.top1_agreement >= 0.9 and result.report.output.sqnr_db > 20
        # It runs in parts, a session a part: what would be timed is the sessions, so it is not timed, and says why.
        assert result.report.decision.faster is None and "runs in parts" in result.report.decision.line
        assert result.report.fusion.checked  # ONNX Runtime's graph read part by part
    finally:
        for f in tmp_path.rglob("*.data"):
            f.unlink()


def test_a_large_models_builds_share_the_codes_their_store_holds(monkeypatch):
    # Each build of a run (the requested types, every candidate of the search) quantizes the same weights alike:
    # a large model's codes are stored once a run and every build's marker names them.
    from qlinear.quantize._placement import plan
    from qlinear.quantize._to_qdq import convert

    monkeypatch.setattr(model_pass, "STORE_THRESHOLD", 0)
    monkeypatch.setattr(large, "MOVED_THRESHOLD", 256)
    model, _ = outlier_mlp()
    fm = model_pass.load_float_model(model)
    options = qq.QuantizeOptions(activations=None, bias_correction=False, gptq=False)
    rounded: dict = {}
    first, _ = convert(fm, plan(fm, options), options, {}, fm.opset, rounded=rounded)
    held = len(fm.store)
    second, _ = convert(fm, plan(fm, options), options, {}, fm.opset, rounded=rounded)
    assert len(fm.store) == held  # nothing stored again

    def codes(m):
        return {t.name: t.external_data[0].value for t in m.graph.initializer if large.is_marker(t) and t.name.endswith("_q")}

    assert codes(first) and codes(first) == codes(second)
    assert _by_value(first) == _by_value(second)
