"""The per-node analysis runs each node's part downstream of it on the float values it reads, and gets the whole model's figure."""

from __future__ import annotations

import numpy as np
import pytest

import qlinear.quantize._sensitivity as sensitivity
from qlinear.quantize import _stages as stage
from qlinear.quantize._downstream import Unchanged, downstream
from qlinear.quantize._evaluate import Reference, output_figures
from qlinear.quantize._execution import Bars, Execution
from qlinear.quantize._model import load_float_model
from qlinear.quantize._options import QuantizeOptions, resolve
from qlinear.quantize._precision import FLOAT
from qlinear.quantize.targets import ORT_CPU
from quantize_models import conv_batchnorm, detection_head, gated_convs, layernorm_attention, squeeze_excite


def _built(make, eval_data=None, **options):
    """The builder, the model at the requested types and the float reference, as the pipeline makes them."""
    model, data = make()
    fm = load_float_model(model)
    o = QuantizeOptions(**options)
    ORT_CPU.prepare(o.activations is None)(fm)
    run_data = stage.datasets(fm, o, data, eval_data, None, None, None)
    o = resolve(o, run_data.facts, batch_size=run_data.fixed_batch)
    bars = Bars(None)
    run = stage.calibration(fm, o, run_data.calibration, Execution(1, None, None, None, None), bars)
    builder, requested = stage.build(fm, o, run, bars)
    reference = Reference(fm.model, run_data.eval, batch_size=o.batch_size, runtime=ORT_CPU)
    return builder, requested, reference


def _whole_model_figures(builder, requested, reference) -> dict[str, float | None]:
    """The oracle: each node's output SQNR from the whole model with only that node quantized."""
    names = [p.name for p in requested.plan.nodes]
    out = {}
    for p in requested.plan.nodes:
        alone = {other: FLOAT for other in names if other != p.name}
        alone[p.name] = p.precision
        out[p.name] = output_figures(builder.build(alone).model, reference)[0]
    return out


MODELS = {
    "concatenated detections": detection_head,
    "two outputs": lambda: detection_head(separate=True),
    "squeeze-excite (a skip into a Mul)": squeeze_excite,
    "paddle's squeeze-excite (weights in Constant nodes)": lambda: squeeze_excite(paddle=True),
    "gated convolutions": lambda: gated_convs("Sigmoid"),
    "attention": layernorm_attention,
    "a branch": lambda: conv_batchnorm(branch=True),
}


@pytest.mark.parametrize("case", list(MODELS))
def test_each_nodes_figure_is_the_whole_models_with_that_node_alone_quantized(case, monkeypatch):
    builder, requested, reference = _built(MODELS[case], batch_size=4)  # several batches of held-out data
    want = _whole_model_figures(builder, requested, reference)
    got = {name: f.sensitivity_db for name, f in sensitivity.analyze(builder, requested, reference).items()}
    assert list(got) == list(want) and len(got) >= 2
    for name in want:
        assert (got[name] is None) == (want[name] is None), name
        if want[name] is not None:
            assert got[name] == pytest.approx(want[name], abs=1e-6), name
    # The float values computed once a batch for all the nodes' parts: one float run a batch, on data of several
    # batches (so a run over all the samples at once is told apart).
    assert len(reference.batches) >= 2
    runs = []
    made = sensitivity._float_values

    def counted(*args):
        values = made(*args)
        return lambda feeds: runs.append(1) or values(feeds)

    monkeypatch.setattr(sensitivity, "_float_values", counted)
    sensitivity.analyze(builder, requested, reference)
    assert len(runs) == len(reference.batches)
    # Float values or weights held for one node at a time: each node its own group, one float run a batch each, the
    # same figures.
    for bound in ("HELD_BYTES", "PARTS_HELD_BYTES", "PARTS_HELD"):
        with monkeypatch.context() as m:
            m.setattr(sensitivity, bound, 1)
            runs.clear()
            again = {name: f.sensitivity_db for name, f in sensitivity.analyze(builder, requested, reference).items()}
            assert again == got, bound
            assert len(runs) == len(want) * len(reference.batches), bound


def test_every_node_is_screened_on_the_first_samples_and_the_most_sensitive_measured_on_all(monkeypatch):
    model, data = gated_convs("Sigmoid")
    rng = np.random.default_rng(3)
    held_out = {"x": (data["x"][:1] + 0.5 * rng.standard_normal((48, *data["x"].shape[1:]))).astype(np.float32)}
    builder, requested, reference = _built(lambda: (model, data), held_out, batch_size=8)
    assert len(reference.batches) == 6  # 48 samples in batches of 8: the screening holds the first two
    monkeypatch.setattr(sensitivity, "REFINED_FEWEST", 1)
    monkeypatch.setattr(sensitivity, "REFINED_SHARE", 0.5)
    names = [p.name for p in requested.plan.nodes]
    refined = sensitivity.refined_count(len(names))
    assert 1 <= refined < len(names)
    screen = _whole_model_figures(builder, requested, reference.head(sensitivity.SCREEN_SAMPLES))
    whole = _whole_model_figures(builder, requested, reference)
    assert screen != whole  # the two sample sets give different figures, so the test tells them apart
    ticks = []
    got = sensitivity.analyze(builder, requested, reference, progress=ticks.append)
    again = sorted(names, key=lambda n: screen[n])[:refined]  # the most sensitive on the screening samples
    want = {name: whole[name] if name in again else screen[name] for name in names}
    for name in names:
        assert got[name].sensitivity_db == pytest.approx(want[name], abs=1e-6), name
    # A tick a part run: every node's part on the two screening batches, the refined ones' on the other four.
    assert sum(ticks) == 2 * len(names) + 4 * refined == sensitivity.analysis_runs(len(names), reference)
    # The order the search promotes by: on all the samples where measured so, else on the screening ones.
    assert sensitivity.most_sensitive_first(got) == sorted(names, key=lambda n: want[n])


def test_the_part_holds_what_follows_the_node_and_reads_the_rest_from_the_float_model():
    builder, requested, reference = _built(lambda: detection_head(separate=True))
    names = [p.name for p in requested.plan.nodes]
    alone = {name: FLOAT for name in names if name != "box_fc"}
    alone["box_fc"] = next(p.precision for p in requested.plan.nodes if p.name == "box_fc")
    built = builder.build(alone)
    part = downstream(built.model, Unchanged.of(builder.float_at(built.opset)), reference.outputs)
    ops = [n.op_type for n in part.nodes]
    assert part.outputs == ("boxes",)  # the scores' branch is the float model's own
    assert "Gemm" in ops and ops.count("Gemm") == 1 and "Softmax" not in ops and "Conv" not in ops
    assert set(ops) >= {"QuantizeLinear", "DequantizeLinear", "Sigmoid", "Mul", "Identity"}
    assert len(part.reads) == 1 and part.reads[0] not in {i.name for i in built.model.graph.input}  # the Flatten's output
    # Run on the float model's value of what it reads, the part gives the whole changed model's output.
    feeds = reference.batches[0][0]
    from qlinear.quantize._evaluate import Runner

    flat = Runner(builder.fm.model, list(part.reads), ORT_CPU)(feeds)
    whole = Runner(built.model, ["boxes"], ORT_CPU)(feeds)["boxes"]
    got = Runner(part.model({part.reads[0]: 1}), [], ORT_CPU)({part.reads[0]: flat[part.reads[0]]})["boxes"]
    np.testing.assert_array_equal(got, whole)


def test_an_unchanged_model_has_an_empty_part():
    builder, requested, reference = _built(lambda: detection_head(separate=True))
    float_model = builder.float_at(requested.opset)
    part = downstream(float_model, Unchanged.of(float_model), reference.outputs)
    assert part.nodes == () and part.outputs == () and part.reads == ()
