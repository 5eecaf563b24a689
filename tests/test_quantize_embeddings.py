"""An embedding judged by the cosine similarity of its vectors: which outputs are, the figure, the default target."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest

import qlinear.onnx as qo
import qlinear.quantize as qq
from qlinear.quantize._embeddings import DEFAULT_COSINE, _cosines, cosine_similarity, embeds
from qlinear.quantize.targets import target


def _embedder(*, offset: float = 0.0, width: int = 48, pooled: bool = True):
    """A sentence embedder's shape: dense layers over 8 tokens, then their mean, one vector a sample.

    ``offset``: added to every value; ``pooled=False``: the tokens' vectors, (N, 8, width).
    """
    rng = np.random.default_rng(0)
    g = qo.Graph("embedder", opset=17)
    h = g.input("x", "float", ("N", 8, 32))
    w1, w2 = (rng.standard_normal((32, 64)) * 0.3).astype(np.float32), (rng.standard_normal((64, width)) * 0.2).astype(np.float32)
    h = g.op("Relu", [g.op("MatMul", [h, w1], name="dense1")], name="relu")
    h = g.op("Add", [g.op("MatMul", [h, w2], name="dense2"), np.full(width, offset, np.float32)], name="offset")
    if pooled:
        h = g.op("ReduceMean", [h], name="pool", axes=[1], keepdims=0)
    g.output(g.op("Identity", [h], name="out", output_names=["embedding"]))
    return g.to_model(), {"x": rng.standard_normal((192, 8, 32)).astype(np.float32)}


def _cosine_by_hand(float_model, quantized, feeds) -> tuple[float, float]:
    want = ort.InferenceSession(float_model.SerializeToString()).run(None, feeds)[0].astype(np.float64)
    got = ort.InferenceSession(quantized.SerializeToString()).run(None, feeds)[0].astype(np.float64)
    cos = [float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))) for a, b in zip(want, got, strict=True)]
    return float(np.mean(cos)), min(cos)


def test_an_embedding_is_judged_by_the_cosine_similarity_of_its_vectors_by_default():
    model, data = _embedder()
    held_out = {"x": data["x"][128:]}
    r = qq.quantize_model(model, None, data, eval=held_out)
    target = r.report.promotions.target
    assert target.metric == "cosine" and target.value == DEFAULT_COSINE
    assert target.text == "mean cosine similarity >= 0.998 (an embedding: one centred vector a sample)"
    mean, lowest = _cosine_by_hand(model, r.model, held_out)
    cos = r.report.output.cosine_similarity
    assert cos.mean == pytest.approx(mean, abs=1e-9) and cos.lowest == pytest.approx(lowest, abs=1e-9)
    assert r.report.promotions.after == pytest.approx(mean, abs=1e-9) and r.target_met
    assert "target met (mean cosine similarity >= 0.998" in r.report.decision.line
    assert qq.Report.from_json(r.report.to_json()).output.cosine_similarity == cos
    # 2-bit weights miss it: the search promotes until the same figure holds.
    low = qq.quantize_model(model, None, data, eval=held_out, weights="int2", max_float=1.0).report
    assert low.promotions.target.metric == "cosine" and low.promotions.steps
    assert low.promotions.before < DEFAULT_COSINE <= low.promotions.after == low.output.cosine_similarity.mean


def test_the_reports_show_the_cosine_and_no_top1_row_for_an_embedding():
    import io

    from rich.console import Console

    from qlinear.quantize._html import render_html
    from qlinear.quantize._report_print import print_report

    model, data = _embedder()
    report = qq.quantize_model(model, None, data).report
    console = Console(file=io.StringIO(), width=160)
    print_report(report, console)
    printed = console.file.getvalue()
    cos = report.output.cosine_similarity
    row = next(line for line in printed.splitlines() if line.startswith("cosine similarity"))
    assert row.split() == [
        "cosine",
        "similarity",
        f"{cos.mean:.4f}",
        "mean,",
        f"{cos.lowest:.4f}",
        "lowest",
        "(each",
        "sample's",
        "vector)",
    ]
    assert "top-1 agreement" not in printed  # no row for an output without classes
    pytest.importorskip("plotly")
    page = render_html(report)
    assert f"<th>cosine similarity</th><td>{cos.mean:.4f} mean, {cos.lowest:.4f} lowest" in page
    assert "<th>top-1 agreement</th>" not in page


def test_vectors_that_are_not_centred_or_not_one_a_sample_keep_their_sqnr():
    # Every coordinate near 5: any error keeps the cosine near 1, as a landmark regressor's pixels would.
    shifted, data = _embedder(offset=5.0)
    r = qq.quantize_model(shifted, None, data, promote=True)
    assert r.report.promotions.target.metric == "sqnr" and r.report.output.cosine_similarity is None
    # By the float values' shape: one axis past the batch wider than 1, 16 to 4096 wide.
    centred = np.random.default_rng(1).standard_normal((64, 1, 96, 1)).astype(np.float32)  # openWakeWord's (N, 1, 1, 96)
    assert embeds(_values(centred)) and not embeds(_values(centred + 5))
    assert not embeds(_values(centred.reshape(64, 8, 12)))  # a vector a token, or a map: not one a sample
    assert not embeds(_values(centred[:, :, :8]))  # narrower than an embedding
    assert not embeds(_values(np.zeros((64, 96), np.float32)))  # no spread to judge
    assert not embeds(_values(np.arange(64 * 96, dtype=np.int64).reshape(64, 96)))  # not float


def _values(first_output: np.ndarray, second: np.ndarray | None = None, outputs: tuple[str, ...] = ("e",)) -> SimpleNamespace:
    """A reference holding ``first_output`` in two batches (``second``: the second batch), as :func:`embeds` reads it."""
    half = len(first_output) // 2
    later = first_output[half:] if second is None else second
    return SimpleNamespace(output="e", outputs=list(outputs), batches=[({}, {"e": first_output[:half]}), ({}, {"e": later})])


def test_an_embedding_is_one_output_of_one_width():
    vectors = np.random.default_rng(2).standard_normal((64, 96)).astype(np.float32)
    assert embeds(_values(vectors))
    # A model judged on two outputs keeps the worst one's SQNR: a cosine on the first leaves the other unguarded.
    assert not embeds(_values(vectors, outputs=("e", "logits")))
    # Batches of another width (a sequence whose length changes): no vector a sample, and no error.
    assert not embeds(_values(vectors, second=np.zeros((8, 120), np.float32)))


def test_a_sample_whose_float_vector_is_not_finite_is_left_out_of_the_cosine():
    model, data = _embedder()
    float_out = ort.InferenceSession(model.SerializeToString()).run(None, data)[0]
    broken = float_out.copy()
    broken[0, 3] = np.nan  # the float model's own NaN on one sample
    reference = SimpleNamespace(
        output="embedding", outputs=["embedding"], runtime=target("ort-cpu"), batches=[(data, {"embedding": broken})]
    )
    mean, lowest = cosine_similarity(model, reference)  # the float model against itself: every finite sample agrees
    assert mean == pytest.approx(1.0, abs=1e-12) and lowest == pytest.approx(1.0, abs=1e-12)


def test_class_scores_are_not_taken_for_an_embedding():
    # Centred vectors of 48 made by a MatMul and a bias: a classifier's logits, judged by top-1, no cosine reported.
    rng = np.random.default_rng(0)
    g = qo.Graph("classifier", opset=17)
    h = g.input("x", "float", ("N", 32))
    h = g.op("Relu", [g.op("MatMul", [h, (rng.standard_normal((32, 64)) * 0.3).astype(np.float32)], name="dense1")])
    h = g.op("MatMul", [h, (rng.standard_normal((64, 48)) * 0.2).astype(np.float32)], name="dense2")
    g.output(g.op("Add", [h, np.zeros(48, np.float32)], name="bias", output_names=["logits"]))
    r = qq.quantize_model(g.to_model(), None, {"x": rng.standard_normal((192, 32)).astype(np.float32)})
    assert r.report.promotions.target.metric == "agreement" and r.report.output.cosine_similarity is None


def test_a_target_given_for_an_embedding_is_kept():
    model, data = _embedder()
    r = qq.quantize_model(model, None, data, target_sqnr_db=20)
    assert r.report.promotions.target.metric == "sqnr" and r.report.output.cosine_similarity is not None


def test_cosines_of_zero_and_broken_vectors():
    a = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [1.0, 1.0], [1.0, 0.0]])
    b = np.array([[2.0, 0.0], [0.0, 0.0], [1.0, 0.0], [np.nan, 1.0], [-1.0, 0.0]])
    # Same direction 1; two zero vectors agree; a zero beside another, or a NaN, do not; opposite -1.
    assert _cosines(a, b).tolist() == [1.0, 1.0, 0.0, 0.0, -1.0]
