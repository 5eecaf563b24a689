"""Int8 activations laid out so that ONNX Runtime's x86 integer kernels take them, with the same values."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import qlinear.quantize as qq
from qlinear.onnx._passes import Sequential
from qlinear.quantize._fusion import check_fusion
from qlinear.quantize._session import session
from qlinear.quantize._signed_layout import lay_out_signed
from qlinear.quantize.targets import TARGETS
from qlinear.quantize.targets.ort_cpu import ORT_CPU
from quantize_models import conv_batchnorm, layernorm_attention


def _as_written(monkeypatch, model, data, **kw) -> tuple[onnx.ModelProto, onnx.ModelProto, list[str]]:
    """The QDQ model before and after the rewrite, and the quantized nodes' names."""
    # The target's layout rewrites less this one.
    kept = [p for p in ORT_CPU.finalize.passes if p.name != "lay_out_signed"]
    assert len(kept) == len(ORT_CPU.finalize.passes) - 1
    monkeypatch.setitem(TARGETS, "ort-cpu", dataclasses.replace(ORT_CPU, finalize=Sequential(*kept)))
    r = qq.quantize_model(model, None, data, activations="int8", promote=False, **kw)
    monkeypatch.undo()
    after = onnx.ModelProto()
    after.CopyFrom(r.model)
    assert lay_out_signed(after)
    onnx.checker.check_model(after)
    return r.model, after, [n.name for n in r.report.nodes]


def _same_values(before: onnx.ModelProto, after: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    """Each node as written (ONNX Runtime without its graph rewrites: float Conv, MatMul and Relu between Q and DQ)."""
    want = session(before, optimize=False).run(None, feeds)
    got = session(after, optimize=False).run(None, feeds)
    for w, g in zip(want, got, strict=True):
        assert np.array_equal(w, g)


def _with_clips(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each Relu a Clip to [0, 6] (ReLU6)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    g.initializer.extend(
        [numpy_helper.from_array(np.float32(0), "clip_low"), numpy_helper.from_array(np.float32(6), "clip_high")]
    )
    for n in g.node:
        if n.op_type == "Relu":
            n.op_type = "Clip"
            n.input.extend(["clip_low", "clip_high"])
    return out


@pytest.mark.parametrize("clamp", ["Relu", "Clip"])
def test_a_conv_before_a_relu_gets_its_own_quantize_linear_and_fuses(monkeypatch, clamp):
    model, data = conv_batchnorm()
    if clamp == "Clip":
        model = _with_clips(model)
    before, after, nodes = _as_written(monkeypatch, model, data, symmetric=True)
    convs = {"conv0", "conv1"}
    # Without it, ONNX Runtime keeps the clamp (zero point 0 is not int8's minimum) and runs each Conv in float.
    assert convs <= set(check_fusion(before, nodes).unfused)
    assert check_fusion(after, nodes).unfused == []
    for conv in convs:
        (node,) = [n for n in after.graph.node if n.name == conv]
        (q,) = [n for n in after.graph.node if node.output[0] in n.input]
        assert q.op_type == "QuantizeLinear"
    _same_values(before, after, {"x": data["x"][:8]})


def test_int8_activations_read_by_several_nodes_get_a_quantize_linear_each_and_fuse(monkeypatch):
    model, data = layernorm_attention()  # q, k and v read one LayerNorm output
    before, after, nodes = _as_written(monkeypatch, model, data, symmetric=True)
    projections = {"q_proj", "k_proj", "v_proj"}
    # One QuantizeLinear for the three: ONNX Runtime converts no pair to uint8 and runs all three in float.
    assert projections <= set(check_fusion(before, nodes).unfused)
    assert check_fusion(after, nodes).unfused == []
    g = after.graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    by_input: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        if n.op_type == "QuantizeLinear":
            by_input.setdefault(n.input[0], []).append(n)
    shared = [qs for qs in by_input.values() if len(qs) > 1]
    assert shared
    for qs in shared:  # one tensor, one scale, equal zero points each its own initializer, one reader each
        assert len({q.input[1] for q in qs}) == 1 and len({q.input[2] for q in qs}) == len(qs)
        assert all(np.array_equal(inits[q.input[2]], inits[qs[0].input[2]]) for q in qs)
        for q in qs:
            (dq,) = [n for n in g.node if q.output[0] in n.input]
            assert dq.op_type == "DequantizeLinear" and dq.input[2] == q.input[2]
    _same_values(before, after, {k: v[:4] for k, v in data.items()})


def test_the_quantizer_writes_the_rewritten_layout_and_asymmetric_types_need_no_clamp_rewrite():
    model, data = conv_batchnorm()
    r = qq.quantize_model(model, None, data, activations="int8", symmetric=True, promote=False)
    assert r.report.fusion.unfused == [] and not [w for w in r.report.warnings if "ONNX Runtime runs" in w]
    # Asymmetric int8 and uint8: a Relu's zero point is the type's minimum, and a ReLU6's codes span [0, 6] at
    # most, so ONNX Runtime drops the clamp itself; no activation has two readers.
    for m in (model, _with_clips(model)):
        for kw in ({"activations": "int8"}, {}):
            u = qq.quantize_model(m, None, data, promote=False, **kw)
            assert u.report.fusion.unfused == []
            assert lay_out_signed(u.model) == []
