"""Models run in parts: the cut, the run against a whole session, the optimized graph, the weights a part holds."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qlinear._errors import QuantizationError
from qlinear.onnx import _large as large
from qlinear.onnx import _parts as parts
from qlinear.quantize._session import optimized_graph, session, with_outputs

_WIDTH = 64
_LAYER_BYTES = _WIDTH * _WIDTH  # an int8 layer's codes
_PART = 2 * _LAYER_BYTES + 1024  # two layers' codes and scales


def _layers(rng: np.random.Generator, count: int = 6) -> onnx.ModelProto:
    """x -> count x (a uint8 activation, an int8 weight, their MatMul, its output uint8, Relu) -> a Softmax -> y."""
    nodes, inits = [], [numpy_helper.from_array(np.float32(0.05), n) for n in ("xs", "ms")]
    inits.append(numpy_helper.from_array(np.uint8(128), "xz"))
    x = "x"
    for k in range(count):
        codes = rng.integers(-127, 128, (_WIDTH, _WIDTH), dtype=np.int8)
        scale = (rng.random(_WIDTH) * 0.01 + 0.002).astype(np.float32)
        inits += [numpy_helper.from_array(codes, f"w{k}"), numpy_helper.from_array(scale, f"s{k}")]
        nodes += [
            helper.make_node("QuantizeLinear", [x, "xs", "xz"], [f"q{k}"], name=f"q{k}"),
            helper.make_node("DequantizeLinear", [f"q{k}", "xs", "xz"], [f"d{k}"], name=f"d{k}"),
            helper.make_node("DequantizeLinear", [f"w{k}", f"s{k}"], [f"wf{k}"], name=f"wd{k}", axis=1),
            helper.make_node("MatMul", [f"d{k}", f"wf{k}"], [f"m{k}"], name=f"mm{k}"),
            helper.make_node("QuantizeLinear", [f"m{k}", "ms", "xz"], [f"mq{k}"], name=f"mq{k}"),
            helper.make_node("DequantizeLinear", [f"mq{k}", "ms", "xz"], [f"md{k}"], name=f"md{k}"),
            helper.make_node("Relu", [f"md{k}"], [f"h{k}"], name=f"relu{k}"),
        ]
        x = f"h{k}"
    nodes.append(helper.make_node("Softmax", [x], ["y"], name="softmax", axis=-1))
    graph = helper.make_graph(
        nodes, "layers", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", _WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", _WIDTH])], initializer=inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


@pytest.fixture
def small_parts(monkeypatch):
    # Parts of two layers' codes, and a model runs in parts from 256 bytes beside its graph: these tiny models
    # are cut as a 3 GB one is.
    monkeypatch.setattr(parts, "PART_BYTES", _PART)
    monkeypatch.setattr(parts, "WHOLE_BYTES", 1 << 40)


def _marked(model: onnx.ModelProto) -> tuple[onnx.ModelProto, large.TensorStore]:
    store = large.TensorStore()
    return large.into_store(model, store, threshold=_LAYER_BYTES), store


def test_a_weights_dequantize_goes_with_its_matmul_and_parts_hold_about_the_budget():
    model = _layers(np.random.default_rng(0))
    cut = parts.cut(model.graph, _PART)
    assert len(cut) == 3
    for k, part in enumerate(cut):
        names = [n.name for n in part.nodes]
        for layer in (2 * k, 2 * k + 1):  # each layer whole in one part: its weight's DequantizeLinear with its MatMul
            assert {f"wd{layer}", f"mm{layer}"} <= set(names)
        assert sum(large.tensor_bytes(t) for t in model.graph.initializer if t.name in part.initializers) < 3 * _LAYER_BYTES
        assert all(name == "x" or name.startswith("q") for name in part.reads)  # an activation's codes cross a cut
    assert [n.name for part in cut for n in part.nodes] == [n.name for n in model.graph.node]


def test_a_constant_read_by_two_parts_goes_with_each():
    # One weight's DequantizeLinear read by the first and the last layer: each part computes it, none passes it.
    model = _layers(np.random.default_rng(1), count=4)
    g = model.graph
    last = next(n for n in g.node if n.name == "mm3")
    last.input[1] = "wf0"
    cut = parts.cut(g, _PART)
    assert "wd0" in [n.name for n in cut[0].nodes] and "wd0" in [n.name for n in cut[-1].nodes]
    assert "wf0" not in cut[-1].reads


@pytest.mark.usefixtures("small_parts")
def test_a_run_in_parts_gives_the_whole_sessions_tensors():
    rng = np.random.default_rng(2)
    model = _layers(rng)
    marked, _store = _marked(model)
    assert parts.runs_in_parts(marked) and not parts.runs_in_parts(model)
    sess = session(marked)
    assert isinstance(sess, parts.PartedSession) and len(sess.parts) == 3
    plain = ort.SessionOptions()
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # every tensor computed
    shown = with_outputs(model, ["q2", "m4"])
    whole = ort.InferenceSession(shown.SerializeToString(), plain, providers=["CPUExecutionProvider"])
    x = rng.standard_normal((5, _WIDTH)).astype(np.float32)
    names = ["y", "q2", "m4"]  # an output and tensors inside parts (one an integer one)
    got = sess.run(names, {"x": x})
    want = whole.run(names, {"x": x})
    for name, a, b in zip(names, got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)
    assert np.array_equal(got[1], want[1])  # the codes a QuantizeLinear makes: exact
    assert [a.shape for a in sess.run(None, {"x": x})] == [(5, _WIDTH)]
    assert np.array_equal(sess.run(["x"], {"x": x})[0], x)  # an input asked for: the feed
    with pytest.raises(QuantizationError, match="no tensor named 'nothing'"):
        sess.run(["nothing"], {"x": x})


@pytest.mark.usefixtures("small_parts")
def test_each_part_holds_its_own_weights_only(monkeypatch):
    # What bounds a run's memory: the weights of the one part whose session is alive, never the model's.
    marked, _store = _marked(_layers(np.random.default_rng(3)))
    sess = session(marked)
    held, alive = [], []
    make = sess._make_session

    def counted(model, options):
        alive.append(1)
        assert len(alive) == 1  # the part before was let go
        held.append(sum(large.tensor_bytes(t) for t in model.graph.initializer))
        return _Released(make(model, options), alive)

    monkeypatch.setattr(sess, "_make_session", counted)
    sess.run(None, {"x": np.ones((2, _WIDTH), np.float32)})
    assert len(held) == 3 and max(held) < 3 * _LAYER_BYTES


class _Released:
    """A session that says when it is let go."""

    def __init__(self, session, alive: list) -> None:
        self._session, self._alive = session, alive

    def run_with_ort_values(self, *args):
        return self._session.run_with_ort_values(*args)

    def __del__(self) -> None:
        self._alive.pop()


@pytest.mark.usefixtures("small_parts")
def test_the_optimized_graph_of_a_model_in_parts_has_each_parts_fusions():
    marked, _store = _marked(_layers(np.random.default_rng(4)))
    whole = optimized_graph(_layers(np.random.default_rng(4)))
    in_parts = optimized_graph(marked)
    assert in_parts is not None and whole is not None
    fused = [n.op_type for n in whole.graph.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear")]
    assert sorted(n.op_type for n in in_parts.graph.node if n.op_type in set(fused)) == sorted(fused)
    assert fused.count("QLinearMatMul") == 6  # every MatMul an integer kernel, in parts as whole
    assert [i.name for i in in_parts.graph.input] == ["x"] and [o.name for o in in_parts.graph.output] == ["y"]


@pytest.mark.usefixtures("small_parts")
def test_a_model_in_parts_has_no_profile_or_optimized_file_of_its_own(tmp_path):
    marked, _store = _marked(_layers(np.random.default_rng(5)))
    with pytest.raises(QuantizationError, match="never held whole"):
        session(marked, profile_prefix=str(tmp_path / "p"))


def test_a_spilled_value_reads_back_from_the_stores_file(monkeypatch):
    monkeypatch.setattr(large, "SPILLED_BYTES", 1024)
    store = large.TensorStore()
    value = np.arange(4096, dtype=np.float32).reshape(64, 64)
    marker = store.marker("w", value)
    got = large.value_of(marker)
    assert isinstance(got, np.memmap) and not got.flags.writeable  # the file's bytes, not the array given
    assert np.array_equal(got, value)
    small = large.value_of(store.marker("b", np.ones(8, np.float32)))
    assert not isinstance(small, np.memmap)  # under the threshold: kept as given
    assert large.tensor_bytes(marker) == value.nbytes


@pytest.mark.usefixtures("small_parts")
def test_constants_only_the_outputs_read_and_an_activations_scale_made_by_a_node_are_placed():
    # A graph output made from initializers alone (no node reads it), and an activation's DequantizeLinear whose
    # scale a Reshape of an initializer makes: each goes into a part, with what it reads.
    model = _layers(np.random.default_rng(6), count=4)
    g = model.graph
    g.node.append(helper.make_node("Identity", ["s0"], ["scales_out"], name="scales_copy"))
    g.output.append(helper.make_tensor_value_info("scales_out", TensorProto.FLOAT, [_WIDTH]))
    g.initializer.append(numpy_helper.from_array(np.array([0.05], np.float32), "ms_vector"))
    g.initializer.append(numpy_helper.from_array(np.array([], np.int64), "scalar_shape"))
    g.node.insert(0, helper.make_node("Reshape", ["ms_vector", "scalar_shape"], ["ms_made"], name="make_ms"))
    dq = next(n for n in g.node if n.name == "md2")
    dq.input[1] = "ms_made"
    cut = parts.cut(g, _PART)
    with_dq = next(part for part in cut if "md2" in [n.name for n in part.nodes])
    assert "make_ms" in [n.name for n in with_dq.nodes] and "ms_made" not in with_dq.reads
    assert "scales_copy" in [n.name for n in cut[-1].nodes]
    marked, _store = _marked(model)
    x = np.random.default_rng(7).standard_normal((3, _WIDTH)).astype(np.float32)
    y, scales = session(marked).run(None, {"x": x})
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(y, want[0], rtol=1e-5, atol=1e-6)
    assert np.array_equal(scales, want[1])
