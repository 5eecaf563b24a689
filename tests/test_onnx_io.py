"""qlinear.onnx.save / load: external data, packed and float8 initializers, the model left as it was."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest

from qlinear import QuantizationError, from_tensor_proto
from qlinear.onnx import Graph, load, run, save

WEIGHT_TYPES = [
    ml_dtypes.int4,
    ml_dtypes.uint2,
    ml_dtypes.float4_e2m1fn,
    ml_dtypes.float8_e4m3fn,
    ml_dtypes.float8_e5m2,
    np.int16,
]


def _model():
    """One DQ a weight type, each weight large enough to go external at a 1 KiB threshold."""
    rng = np.random.default_rng(3)
    g = Graph(opset=25)
    for i, dtype in enumerate(WEIGHT_TYPES):
        w = rng.integers(-2, 2, (96, 64)).astype(np.float32).astype(dtype)
        g.output(g.dequantize_linear(w, np.float32(0.25), name=f"dq{i}", output_names=[f"w{i}"]))
    g.output(g.dequantize_linear(np.arange(6, dtype=np.int8), np.float32(2), name="small", output_names=["s"]))
    return g.to_model()


def test_save_load_round_trip_with_external_data(tmp_path):
    model = _model()
    before = model.SerializeToString()
    path = tmp_path / "weights.onnx"
    save(model, path, external_threshold=1024)
    assert model.SerializeToString() == before  # saving leaves the model in memory as it was
    on_disk = onnx.load(path, load_external_data=False)
    external = [t for t in on_disk.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert len(external) == len(WEIGHT_TYPES)  # the small tensors stay inline
    for t in external:
        info = {e.key: e.value for e in t.external_data}
        assert info["location"] == "weights.onnx.data" and int(info["offset"]) % 4096 == 0
    loaded = load(path)
    assert [from_tensor_proto(t).tobytes() for t in loaded.graph.initializer] == [
        from_tensor_proto(t).tobytes() for t in model.graph.initializer
    ]
    types = {t.name: from_tensor_proto(t).dtype for t in loaded.graph.initializer}
    assert [types[f"dq{i}_input0"] for i in range(len(WEIGHT_TYPES))] == [np.dtype(d) for d in WEIGHT_TYPES]
    onnx.checker.check_model(loaded, full_check=True)
    want, got = run(model, {}), run(path, {})
    assert all(want[k].tobytes() == got[k].tobytes() for k in want)


def test_save_below_threshold_writes_one_file(tmp_path):
    path = tmp_path / "inline.onnx"
    g = Graph(opset=21)
    g.output(g.dequantize_linear(np.zeros(8, ml_dtypes.int4), np.float32(1)))
    g.save(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inline.onnx"]
    assert from_tensor_proto(load(path).graph.initializer[0]).dtype == ml_dtypes.int4


def test_onnx_reads_what_qlinear_saves(tmp_path):
    path = tmp_path / "m.onnx"
    save(_model(), path, external_threshold=1024)
    model = onnx.load(path)
    assert from_tensor_proto(model.graph.initializer[0]).tobytes() == from_tensor_proto(load(path).graph.initializer[0]).tobytes()


def test_save_refuses_unloaded_external_data(tmp_path):
    path = tmp_path / "m.onnx"
    save(_model(), path, external_threshold=1024)
    with pytest.raises(QuantizationError, match="external data that is not loaded"):
        save(onnx.load(path, load_external_data=False), tmp_path / "copy.onnx")


def test_load_missing_file_says_so(tmp_path):
    with pytest.raises(QuantizationError, match="load: cannot read"):
        load(tmp_path / "absent.onnx")
