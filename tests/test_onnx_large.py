"""Weights held beside the graph: markers, their store, and every consumer of a model with them (ORT, save, checker)."""

from __future__ import annotations

import gc

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import qlinear.onnx as qo
from qlinear._errors import QuantizationError
from qlinear.onnx import _large as large
from qlinear.onnx import _parts as parts
from qlinear.onnx._io import load_mapped


def _qdq_model(rng: np.random.Generator) -> onnx.ModelProto:
    """x -> MatMul(float w) -> DequantizeLinear'd int8 weight MatMul -> y: a float weight and a quantized one."""
    w1 = rng.standard_normal((64, 96)).astype(np.float32)
    codes = rng.integers(-128, 128, (96, 32), dtype=np.int8)
    scale = np.float32(0.01)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"]),
            helper.make_node("DequantizeLinear", ["codes", "scale"], ["w2"]),
            helper.make_node("MatMul", ["h", "w2"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 32])],
        initializer=[
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(codes, "codes"),
            numpy_helper.from_array(scale, "scale"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def _ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return parts.session(model, ort.SessionOptions, ["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_markers_run_save_and_check_as_the_inline_model(tmp_path):
    rng = np.random.default_rng(0)
    model = _qdq_model(rng)
    store = large.TensorStore()
    marked = large.into_store(model, store, threshold=1000)  # w1 (24 KB) and codes (3 KB) move; the scale stays
    assert [large.is_marker(t) for t in marked.graph.initializer] == [True, True, False]
    assert marked.ByteSize() < 1000 and large.byte_size(marked) >= model.ByteSize() - 100
    x = rng.standard_normal((5, 64)).astype(np.float32)
    assert np.array_equal(_ort(marked, x), _ort(model, x))
    large.check_model(marked)  # markers checked as inputs of their type and shape
    qo.save(marked, tmp_path / "m.onnx")
    assert all(large.is_marker(t) for t in marked.graph.initializer[:2])  # save leaves the model as it was
    onnx.checker.check_model(str(tmp_path / "m.onnx"), full_check=True)
    loaded = qo.load(tmp_path / "m.onnx")
    for a, b in zip(loaded.graph.initializer, model.graph.initializer, strict=True):
        assert np.array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))
    assert large.inline(marked).SerializeToString() == model.SerializeToString()


def test_a_changed_value_is_a_new_marker_and_copies_keep_theirs():
    store = large.TensorStore()
    first = store.marker("w", np.ones(3, np.float32))
    second = store.marker("w", np.zeros(3, np.float32))
    assert np.array_equal(large.value_of(first), np.ones(3)) and np.array_equal(large.value_of(second), np.zeros(3))


def test_a_marker_outlives_its_store_as_a_clear_error():
    store = large.TensorStore()
    t = store.marker("w", np.ones(3, np.float32))
    del store
    gc.collect()
    with pytest.raises(QuantizationError, match="'w' names values of a model that no longer exists"):
        large.value_of(t)


def test_load_mapped_maps_external_tensors_and_reads_none(tmp_path):
    rng = np.random.default_rng(1)
    model = _qdq_model(rng)
    qo.save(model, tmp_path / "m.onnx", external_threshold=1000)
    store = large.TensorStore()
    mapped = load_mapped(tmp_path / "m.onnx", store)
    w1 = large.value_of(mapped.graph.initializer[0])
    assert isinstance(w1, np.memmap) and not w1.flags.writeable
    assert np.array_equal(w1, numpy_helper.to_array(model.graph.initializer[0]))
    x = rng.standard_normal((3, 64)).astype(np.float32)
    assert np.array_equal(_ort(mapped, x), _ort(model, x))


def test_load_mapped_refuses_data_outside_the_folder(tmp_path):
    model = _qdq_model(np.random.default_rng(2))
    t = model.graph.initializer[0]
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value="../secret.bin")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "m.onnx").write_bytes(model.SerializeToString())
    with pytest.raises(QuantizationError, match="outside the model's folder"):
        load_mapped(tmp_path / "m" / "m.onnx", large.TensorStore())


def test_digest_follows_the_values_not_the_store():
    rng = np.random.default_rng(3)
    model = _qdq_model(rng)
    first, second = large.TensorStore(), large.TensorStore()
    a = large.into_store(model, first, threshold=1000)
    b = large.into_store(model, second, threshold=1000)
    assert large.digest(a) == large.digest(b)
    changed = large.TensorStore()
    c = large.into_store(model, changed, threshold=1000)
    c.graph.initializer[0].CopyFrom(changed.marker("w1", np.zeros((64, 96), np.float32)))
    assert large.digest(c) != large.digest(a)


def test_run_reads_a_model_with_markers():
    rng = np.random.default_rng(4)
    model = _qdq_model(rng)
    store = large.TensorStore()
    marked = large.into_store(model, store, threshold=1000)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    for backend in ("qlinear", "onnxruntime"):
        assert np.array_equal(qo.run(marked, {"x": x}, backend=backend)["y"], qo.run(model, {"x": x}, backend=backend)["y"])


def test_tensor_bytes_counts_a_markers_value_and_an_inline_tensors_size():
    store = large.TensorStore()
    value = np.zeros((256, 64), np.float32)
    marker = store.marker("w", value)
    assert marker.ByteSize() < 200  # the marker itself names the value, it does not hold it
    assert large.tensor_bytes(marker) == value.nbytes
    inline = numpy_helper.from_array(value, "w")
    assert large.tensor_bytes(inline) == inline.ByteSize() >= value.nbytes
