"""backend="onnxruntime+qlinear": bit for bit what backend="qlinear" gives on Q/DQ graphs, with ONNX Runtime running the rest."""

from __future__ import annotations

import numpy as np
import pytest

import qlinear
from qlinear import QuantizationError
from qlinear.conformance._edge_cases import generated_cases
from qlinear.conformance._run import backend_cases
from qlinear.onnx import Graph, run
from qlinear.onnx._ort_with_qlinear import MixedRunner

pytest.importorskip("onnxruntime")


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.asarray(a).tobytes() == np.asarray(b).tobytes()


# ONNX's backend cases and the generated matrix (every version, type and granularity).
CASES = backend_cases() + generated_cases()


def _feeds(model, case):
    present = [a for a in case.inputs if a is not None]
    return {vi.name: a for vi, a in zip(model.graph.input, present, strict=False)}


@pytest.mark.parametrize("constant", [False, True], ids=["fed", "initializers"])
def test_conformance_cases_match_the_qlinear_backend(constant):
    # Inputs fed: each Q/DQ node runs between segments or on ONNX Runtime; as initializers: folded when built.
    on_ort = 0
    for case in CASES:
        model = case.model(constant=(lambda a: True) if constant else (lambda a: False))
        feeds = {} if constant else _feeds(model, case)
        try:
            want = run(model, feeds, backend="qlinear")
        except QuantizationError as e:
            with pytest.raises(QuantizationError):
                run(model, feeds, backend="onnxruntime+qlinear")
            del e
            continue
        got = run(model, feeds, backend="onnxruntime+qlinear")
        for name in want:
            assert _same(got[name], want[name]), (case.name, name)
        runner = MixedRunner(model)
        on_ort += not runner.cut and not runner.folded and bool(runner._steps)
    # Some cases did run their Q/DQ node on ONNX Runtime (the 8/16-bit ones at opsets it loads).
    assert on_ort > 20


TYPES = ("int2", "uint2", "int4", "float4e2m1", "float8e4m3fn", "int8", "uint16")


def _weights_and_activations_of_every_type():
    """Weights of each type behind a DequantizeLinear, activations through Q/DQ of each type, joined by Identity (ONNX Runtime and numpy differ on -0 in Relu)."""
    rng = np.random.default_rng(3)
    g = Graph("mixed", opset=25)
    x = g.input("x", "float", ("N", 8))
    for t in TYPES:
        codes = qlinear.quantize_linear(rng.standard_normal((8, 4)).astype(np.float32), np.float32(0.3), output_dtype=t)
        w = g.dequantize_linear(codes, np.float32(0.3), name=f"dq_w_{t}")
        g.output(g.op("Identity", [w], name=f"id_w_{t}", output_names=[f"w_{t}"]))
        q = g.quantize_linear(x, np.float32(0.1), output_dtype=t, name=f"q_a_{t}")
        a = g.dequantize_linear(q, np.float32(0.1), name=f"dq_a_{t}")
        g.output(g.op("Identity", [a], name=f"id_a_{t}", output_names=[f"a_{t}"]))
    data = rng.standard_normal((5, 8)).astype(np.float32) * 2
    data[0, :3] = [np.nan, np.inf, -0.0]
    return g.to_model(), {"x": data}


def test_weights_fold_activations_cut_and_both_match():
    model, feeds = _weights_and_activations_of_every_type()
    want = run(model, feeds, backend="qlinear")
    got = run(model, feeds, backend="onnxruntime+qlinear")
    for name in want:
        assert _same(got[name], want[name]), name
    runner = MixedRunner(model)
    # Weights of the types ONNX Runtime lacks are computed once; its own 8/16-bit DequantizeLinear it runs itself.
    assert sorted(runner.folded) == sorted(f"dq_w_{t}" for t in TYPES if t not in ("int8", "uint16"))
    # Every activation QuantizeLinear runs on qlinear (NaN), and the DequantizeLinear of the types ONNX Runtime lacks.
    assert sorted(runner.cut) == sorted([f"q_a_{t}" for t in TYPES] + [f"dq_a_{t}" for t in TYPES if t not in ("int8", "uint16")])


def test_float4_weights_run_at_onnx_runtime_speed():
    # The quantizer's evaluation runs such models this way: a few ms a batch, not the reference evaluator's hundreds.
    rng = np.random.default_rng(0)
    g = Graph("mlp", opset=23)
    h = g.input("x", "float", ("N", 256))
    for k in range(3):
        codes = qlinear.quantize_linear(
            rng.standard_normal((256, 256)).astype(np.float32), np.float32(0.05), output_dtype="float4e2m1"
        )
        h = g.op("Relu", [g.op("MatMul", [h, g.dequantize_linear(codes, np.float32(0.05))], name=f"mm{k}")], name=f"r{k}")
    g.output(g.op("Identity", [h], name="out", output_names=["y"]))
    model, feeds = g.to_model(), {"x": rng.standard_normal((64, 256)).astype(np.float32)}
    runner = MixedRunner(model)
    assert len(runner.folded) == 3 and runner.cut == [] and len(runner._steps) == 1  # one ONNX Runtime session
    np.testing.assert_allclose(runner(feeds)["y"], run(model, feeds, backend="qlinear")["y"], rtol=1e-4, atol=1e-4)


def test_segments_leave_no_threads_spinning_for_the_kernels_between_them():
    model, feeds = _weights_and_activations_of_every_type()
    runner = MixedRunner(model)
    runner(feeds, [o.name for o in model.graph.output])
    sessions = [s for s, _, _ in runner._sessions.values() if hasattr(s, "get_session_options")]
    assert sessions
    assert not any(_spins(s) for s in sessions)


def test_a_model_that_is_one_session_keeps_onnx_runtimes_spinning():
    # Weight-only float4: the weights fold, nothing is cut, and ONNX Runtime's own runs are faster spinning.
    rng = np.random.default_rng(0)
    g = Graph("w4", opset=23)
    h = g.input("x", "float", ("N", 64))
    codes = qlinear.quantize_linear(rng.standard_normal((64, 32)).astype(np.float32), np.float32(0.05), output_dtype="float4e2m1")
    h = g.op("MatMul", [h, g.dequantize_linear(codes, np.float32(0.05))], name="mm")
    g.output(g.op("Identity", [h], name="out", output_names=["y"]))
    runner = MixedRunner(g.to_model())
    runner({"x": rng.standard_normal((4, 64)).astype(np.float32)})
    assert runner.cut == [] and len(runner._sessions) == 1
    ((session, _, _),) = runner._sessions.values()
    assert _spins(session)


def _spins(session) -> bool:
    """Whether an ONNX Runtime session's idle threads spin (its default, where the entry is not set)."""
    try:
        return session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") != "0"
    except RuntimeError:  # ONNX Runtime raises for an entry never set
        return True
