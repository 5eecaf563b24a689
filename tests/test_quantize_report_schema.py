"""The typed report: written as JSON and read back to the same report, older reports read, bad input refused."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from importlib import resources

import pytest

import qlinear.quantize as qq
from qlinear._errors import QuantizationError
from qlinear.quantize._records import from_plain, plain
from qlinear.quantize.algorithms.empirical_bias_correction import Corrected
from qlinear.quantize.algorithms.finetune import FinetuneResult

DEMO = resources.files("qlinear.quantize") / "_demo"
MODEL, CALIBRATION, EVAL = (str(DEMO / f) for f in ("digits_cnn.onnx", "digits_calibration.npz", "digits_eval.npz"))


@dataclass(frozen=True)
class _Inner:
    a: int
    b: float | None = None


@dataclass(frozen=True)
class _Outer:
    name: str
    inner: _Inner
    many: list[_Inner]
    pair: tuple[str, ...]
    renamed: str = field(default="x", metadata={"key": "from"})
    merged: _Inner = field(default_factory=lambda: _Inner(0), metadata={"flatten": True})
    by_name: dict[str, _Inner] = field(default_factory=dict)
    later: int | None = 7  # a field an older writer did not write


def test_records_write_their_fields_in_order_and_read_back():
    record = _Outer("n", _Inner(1, 0.5), [_Inner(2)], ("p", "q"), "y", _Inner(3, 1.5), {"k": _Inner(4)}, 8)
    data = plain(record)
    assert data == {
        "name": "n",
        "inner": {"a": 1, "b": 0.5},
        "many": [{"a": 2, "b": None}],
        "pair": ["p", "q"],
        "from": "y",
        "a": 3,
        "b": 1.5,
        "by_name": {"k": {"a": 4, "b": None}},
        "later": 8,
    }
    assert list(data) == ["name", "inner", "many", "pair", "from", "a", "b", "by_name", "later"]
    assert from_plain(_Outer, json.loads(json.dumps(data))) == record
    # A key the writer did not write takes the field's default, or None where the field has none.
    older = {k: v for k, v in data.items() if k not in ("later", "inner")}
    back = from_plain(_Outer, older)
    assert back.later == 7 and back.inner is None and back.many == [_Inner(2)]


def test_a_record_is_read_from_an_object_only():
    with pytest.raises(TypeError, match="_Inner is read from a JSON object, got list"):
        from_plain(_Inner, [1, 2])


@pytest.fixture(scope="module")
def refined():
    pytest.importorskip("torch")
    return qq.quantize_model(
        MODEL, None, CALIBRATION, eval=EVAL, labels="label", empirical_bias_correction=True, finetune=5, smoothquant=True
    ).report


def test_the_report_reads_back_from_its_json_as_the_same_report(refined):
    text = refined.to_json()
    back = qq.Report.from_json(text)
    assert back.to_json() == text
    # Typed all the way down: the algorithms' results are their records, the settings the run's options.
    assert isinstance(back.finetune, FinetuneResult) and isinstance(back.algorithms["empirical_bias_correction"], Corrected)
    assert back.algorithms["empirical_bias_correction"].held_out == refined.algorithms["empirical_bias_correction"].held_out
    assert back.settings == refined.settings and back.settings.finetune == 5 and back.settings.opset >= 13
    assert back.nodes == refined.nodes and back.output == refined.output and back.promotions == refined.promotions
    assert back.latency_ms == refined.latency_ms and back.decision == refined.decision
    # The JSON's keys are the attributes' names, held-out figures merged into their algorithm's object.
    saved = json.loads(text)
    assert saved["finetune"]["sqnr_db_after"] == pytest.approx(refined.finetune.held_out.sqnr_db_after)
    assert saved["empirical_bias_correction"]["layers"] == refined.algorithms["empirical_bias_correction"].layers
    assert saved["output"]["sqnr_db"] == refined.output.sqnr_db and saved["settings"]["smoothquant"] is True


def test_an_infinite_sqnr_is_null_in_the_json_and_the_dict_keeps_it():
    report = qq.quantize_model(MODEL, None, CALIBRATION, promote=False).report
    report = replace(report, output=replace(report.output, sqnr_db=math.inf))
    assert report.to_dict()["output"]["sqnr_db"] == math.inf
    assert json.loads(report.to_json())["output"]["sqnr_db"] is None


def test_a_report_that_timed_its_tradeoff_at_one_batch_reads_back():
    report = qq.quantize_model(MODEL, None, CALIBRATION, target_sqnr_db=45).report
    data = json.loads(report.to_json())
    assert data["tradeoff"] and all(len(row["latency"]) == 2 for row in data["tradeoff"])  # batches 1 and 16
    for row in data["tradeoff"]:  # as a report written before each batch was timed: one object
        row["latency"] = row["latency"][0]
    back = qq.Report.from_dict(data)
    assert [row.latency for row in back.tradeoff] == [row.latency[:1] for row in report.tradeoff]


def test_reading_a_report_as_a_dict_warns_and_gives_the_json_part():
    report = qq.quantize_model(MODEL, None, CALIBRATION, promote=False).report
    with pytest.warns(DeprecationWarning, match=r"report\['output'\] is deprecated: the report is typed, read report.output"):
        part = report["output"]
    assert part == report.to_dict()["output"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "the report is not JSON"),
        ("[1, 2]", "not a qlinear quantize report: it lacks model, settings, size_bytes, output, nodes"),
        ('{"model": {}, "settings": {}, "size_bytes": {}, "output": {}}', "it lacks nodes"),
        (
            '{"model": {"input": "m", "output": null}, "settings": {}, "size_bytes": {"before": 1, "after": 1},'
            ' "output": {"sqnr_db": 1}, "nodes": "conv", "calibration": {}, "eval": {}, "fusion": {}}',
            "not a qlinear quantize report: .*NodeRow is read from a JSON object, got str",
        ),
    ],
)
def test_what_is_not_a_report_is_refused_in_one_line(text, message):
    with pytest.raises(QuantizationError, match=message) as e:
        qq.Report.from_json(text)
    assert "\n" not in str(e.value)
