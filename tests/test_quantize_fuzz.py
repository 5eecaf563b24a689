"""The quantizer on generated models (tests/graph_fuzz.py): never a crash, a hang or a model its runtime cannot load unsaid.

For every case, either one clear QuantizationError line and nothing
written, or a model that passes onnx's full check and that ONNX Runtime
loads wherever the report says it runs it (else the report says why not);
the float model's file is untouched, and a model larger than the float one
says why. ``QLINEAR_FUZZ_CASES=N`` runs N cases (release checks); CI runs
:data:`CI_CASES`.
"""

from __future__ import annotations

import hashlib
import os
import signal

import onnx
import onnxruntime as ort
import pytest

import qlinear.quantize as qq
from graph_fuzz import fuzz_case
from qlinear._errors import QuantizationError

CI_CASES = 300
CASES = int(os.environ.get("QLINEAR_FUZZ_CASES", CI_CASES))
CASE_SECONDS = 60  # a case that runs longer is a hang
# The least output SQNR with 16-bit activations and 8-bit weights, judged on the calibration data (the weights' own
# error, about 45 dB a layer, bounds it).
SIXTEEN_BIT_DB = 25.0


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang


@pytest.mark.parametrize("seed", range(CASES))
def test_generated_model(seed, tmp_path):
    case = fuzz_case(seed)
    float_path = tmp_path / "float.onnx"
    onnx.save(case.model, float_path)
    digest = hashlib.sha256(float_path.read_bytes()).hexdigest()
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "q.onnx"
    what = f"case {seed} ({', '.join(case.description)}; options {case.options})"
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    try:
        # Judged on the data it calibrates on: ranges from 19 samples clip held-out ones, which says nothing of a bug.
        r = qq.quantize_model(str(float_path), out, case.data, eval=case.data, **case.options)
    except QuantizationError as e:
        assert "\n" not in str(e), f"{what}: a message of more than one line: {e}"
        assert list(out_dir.iterdir()) == [], f"{what}: files left beside the output: {list(out_dir.iterdir())}"
        return
    except _Hang:
        pytest.fail(f"{what}: no result in {CASE_SECONDS} s")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert hashlib.sha256(float_path.read_bytes()).hexdigest() == digest, f"{what}: the float model's file changed"
    assert sorted(p.name for p in out_dir.iterdir()) == ["q.onnx"], f"{what}: {list(out_dir.iterdir())}"
    onnx.checker.check_model(str(out), full_check=True)
    report = r.report
    if report["eval"]["onnxruntime_error"] is None:
        ort.InferenceSession(str(out))  # loads with ONNX Runtime's default optimizations
    else:
        assert any(w.startswith("ONNX Runtime cannot load") for w in report["warnings"]), what
    size = report["size_bytes"]
    if size["after"] > size["before"]:
        assert any("larger than the float model" in w for w in report["warnings"]), f"{what}: {size} unsaid"
    o = r.report["settings"]
    if o["activations"] in ("uint16", "int16") and o["weights"] in ("int8", "uint8"):
        sqnr = report["output"]["sqnr_db"]
        assert sqnr is None or sqnr > SIXTEEN_BIT_DB, f"{what}: output SQNR {sqnr} dB at 16-bit activations"


def test_found_a_float8_conv_that_loads_only_with_extra_outputs_is_said(tmp_path):
    # Found by case 270: the evaluation, which adds outputs to watch tensors, ran on ONNX Runtime, while the model as
    # written fused its float8 Q/DQ into a QLinearConv that ONNX Runtime cannot load; the report said nothing.
    case = fuzz_case(270)
    assert case.options["activations"] == "float8e4m3fn" and "conv8+LeakyRelu" in case.description
    out = tmp_path / "q.onnx"
    r = qq.quantize_model(case.model, out, case.data, eval=case.data, **case.options).report
    with pytest.raises(Exception, match="QLinearConv"):
        ort.InferenceSession(str(out))
    assert "QLinearConv" in r["eval"]["onnxruntime_error"]
    assert any(w.startswith("ONNX Runtime cannot load the quantized model") for w in r["warnings"])


def test_found_a_float16_layer_without_a_bias_is_a_valid_model():
    # Found by case 44; its own test is tests/test_quantize_bias_correction.py's float16 one.
    case = fuzz_case(44)
    assert "float16" in case.description and case.options["activations"] == "int16"
    r = qq.quantize_model(case.model, None, case.data, eval=case.data, bias_correction=True, **case.options)
    onnx.checker.check_model(r.model, full_check=True)
