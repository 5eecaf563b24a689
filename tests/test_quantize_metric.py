"""A user's accuracy measure (``metric=`` / ``--metric``): the target search, the report and bad metrics."""

from __future__ import annotations

from importlib import resources

import numpy as np
import onnxruntime as ort
import pytest

import qlinear.quantize as qq
from qlinear._errors import QuantizationError
from qlinear.cli import main

DEMO = resources.files("qlinear.quantize") / "_demo"
MODEL, CALIBRATION, EVAL = str(DEMO / "digits_cnn.onnx"), str(DEMO / "digits_calibration.npz"), str(DEMO / "digits_eval.npz")

METRICS = """
import numpy as np

def closeness(ref, got, labels):
    # Minus the mean absolute difference of the logits: higher is better.
    (name,) = ref
    return -float(np.mean(np.abs(ref[name] - got[name])))

def accuracy(ref, got, labels):
    (name,) = got
    return float(np.mean(np.argmax(got[name], axis=-1) == labels))

def raises(ref, got, labels):
    raise ValueError("no boxes in this batch")

def text(ref, got, labels):
    return "good"

def not_finite(ref, got, labels):
    return float("nan")
"""


@pytest.fixture
def metrics(tmp_path):
    path = tmp_path / "my_metrics.py"
    path.write_text(METRICS)
    return path


def _closeness_by_hand(model_path: str) -> float:
    # The eval batches of 16 over the demo's 450 digits, weighted by their samples: the mean over all of them.
    x = np.load(EVAL)["image"]
    ref = ort.InferenceSession(MODEL).run(None, {"image": x})[0]
    got = ort.InferenceSession(model_path).run(None, {"image": x})[0]
    per_batch = [(-np.mean(np.abs(ref[k : k + 16] - got[k : k + 16])), len(ref[k : k + 16])) for k in range(0, len(x), 16)]
    return sum(v * n for v, n in per_batch) / sum(n for _, n in per_batch)


def test_a_users_metric_drives_the_search_and_the_report(metrics, tmp_path, capsys):
    out = tmp_path / "q.onnx"
    argv = ["quantize", MODEL, "-o", str(out), "--calibration", CALIBRATION, "--eval", EVAL, "--labels", "label",
            "--metric", f"{metrics}:closeness", "--target-metric", "-0.01", "--max-float", "1.0", "--json"]  # fmt: skip
    assert main(argv) == 0
    report = qq.Report.from_json(capsys.readouterr().out)
    target = report.promotions.target
    assert target.metric == "metric" and target.text == f"{metrics}:closeness >= -0.01"
    assert report.promotions.before < -0.01 <= report.promotions.after  # the requested types missed it
    assert report.promotions.steps and report.decision.target_met
    assert f"{metrics}:closeness >= -0.01" in report.decision.line
    value = report.output.metric.value
    assert report.output.metric.name == f"{metrics}:closeness" and value >= -0.01
    assert value == pytest.approx(_closeness_by_hand(str(out)), rel=1e-5)
    assert report.settings.metric == f"{metrics}:closeness"


def test_a_metric_of_the_labels_and_a_python_function(metrics):
    import importlib.util

    spec = importlib.util.spec_from_file_location("my_metrics", metrics)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    r = qq.quantize_model(MODEL, None, CALIBRATION, eval=EVAL, labels="label", metric=module.accuracy, target_metric=0.98)
    assert r.target_met and r.report.output.metric.value == pytest.approx(r.report.output.accuracy.after)
    assert r.report.settings.metric == "my_metrics:accuracy"


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("raises", "metric '{path}:raises' raised ValueError: no boxes in this batch"),
        ("text", "metric '{path}:text' must return a finite number, returned 'good'"),
        ("not_finite", "metric '{path}:not_finite' must return a finite number, returned nan"),
        ("missing", "metric '{path}:missing': '{path}' has no function 'missing'"),
    ],
)
def test_a_bad_metric_is_one_line_and_exit_2_with_nothing_written(metrics, tmp_path, capsys, function, message):
    out = tmp_path / "q.onnx"
    argv = ["quantize", MODEL, "-o", str(out), "--calibration", CALIBRATION, "--metric", f"{metrics}:{function}",
            "--target-metric", "0.5"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message.format(path=metrics) in err
    assert not out.exists() and list(tmp_path.iterdir()) == [metrics]


def test_metric_options_are_checked(tmp_path):
    with pytest.raises(QuantizationError, match=r"metric module 'no_such_module_here' cannot be imported"):
        qq.QuantizeOptions(metric="no_such_module_here:f", target_metric=1.0)
    with pytest.raises(QuantizationError, match=r"metric must be 'module:function' or 'file.py:function', got 'f'"):
        qq.QuantizeOptions(metric="f", target_metric=1.0)
    with pytest.raises(QuantizationError, match=r"metric file 'nowhere/m\.py' does not exist"):
        qq.QuantizeOptions(metric="nowhere/m.py:f", target_metric=1.0)
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_dependency\n")
    with pytest.raises(QuantizationError, match=r"importing '.*broken.py' failed: ModuleNotFoundError"):
        qq.QuantizeOptions(metric=f"{broken}:f", target_metric=1.0)
    with pytest.raises(QuantizationError, match="target_metric is a value of a metric: give metric= too"):
        qq.QuantizeOptions(target_metric=1.0)
    with pytest.raises(QuantizationError, match="metric needs target_metric"):
        qq.QuantizeOptions(metric=np.mean)
    with pytest.raises(QuantizationError, match="give one target, got target_sqnr_db and target_metric"):
        qq.QuantizeOptions(metric=np.mean, target_metric=1.0, target_sqnr_db=30.0)
    qq.QuantizeOptions(metric=np.mean, promote=False)  # only reported
    qq.QuantizeOptions(metric=np.mean, latency_budget=0.8)  # the budget picks, the metric is reported
