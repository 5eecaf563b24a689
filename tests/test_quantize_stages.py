"""The quantizer's stages: what the evaluation stage reports of each node."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import qlinear.quantize as qq
from qlinear.quantize import _stages as stage
from qlinear.quantize._session import with_outputs
from quantize_models import gated_convs


def test_the_reports_node_sqnr_is_the_nodes_output_against_float_on_the_first_samples(tmp_path):
    """Each node's output in the model written against the float model's, over the first NODE_SAMPLES eval samples."""
    model, data = gated_convs("Sigmoid")
    rng = np.random.default_rng(5)
    held_out = {"x": (data["x"][:1] + 0.5 * rng.standard_normal((40, *data["x"].shape[1:]))).astype(np.float32)}
    out = tmp_path / "q.onnx"
    report = qq.quantize_model(model, str(out), data, eval=held_out, promote=False).report
    assert stage.NODE_SAMPLES < 40  # fewer than the eval data holds, so the test tells the two apart
    made = {n.name: n.output[0] for n in model.graph.node}
    rows = {row.name: row.output_sqnr_db for row in report.nodes}
    tensors = [made[name] for name in rows]
    first = {"x": held_out["x"][: stage.NODE_SAMPLES]}

    def values(m):
        s = ort.InferenceSession(with_outputs(m, tensors).SerializeToString(), providers=["CPUExecutionProvider"])
        return dict(zip(tensors, s.run(tensors, first), strict=True))

    ref, got = values(model), values(onnx.load(str(out)))
    assert len(rows) >= 3
    for name, db in rows.items():
        t = made[name]
        r, g = ref[t].astype(np.float64), got[t].astype(np.float64)
        want = 10 * np.log10(np.sum(r**2) / np.sum((r - g) ** 2))
        assert db == pytest.approx(want, abs=1e-3), name
