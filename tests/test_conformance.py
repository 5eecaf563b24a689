"""The conformance command: qlinear conforms, and the check can fail."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qlinear.cli import main
from qlinear.kernels import BACKENDS, reference
from qlinear.onnx import run_conformance


def test_qlinear_conforms_on_every_case():
    report = run_conformance(onnxruntime=False, reference=False)
    assert report.qlinear_conforms()
    counts = report.counts("qlinear[reference]")
    assert counts["agree"] > 1300 and counts["disagree"] == counts["error"] == 0


def test_conformance_detects_a_wrong_kernel(monkeypatch):
    class Truncating:
        """Rounds toward zero instead of half to even: a classic mistake."""

        @staticmethod
        def quantize(plan, x, scale, zero_point):
            y = reference.quantize(plan, x, scale, zero_point)
            if plan.output_type.is_integer and x.dtype == np.float32 and x.size:
                with np.errstate(all="ignore"):
                    q = np.trunc(x / scale)
                ok = np.isfinite(q) & (np.abs(q) < 100)
                y = np.where(
                    ok,
                    np.clip(
                        q + (0 if zero_point is None else zero_point.astype(np.float64)),
                        plan.output_type.qmin,
                        plan.output_type.qmax,
                    ),
                    y,
                ).astype(y.dtype)
            return y

        dequantize = staticmethod(reference.dequantize)

    monkeypatch.setitem(BACKENDS, "truncating", Truncating)
    report = run_conformance(onnxruntime=False, reference=False)
    assert not report.qlinear_conforms()
    assert report.counts("qlinear[truncating]")["disagree"] > 10
    assert report.counts("qlinear[reference]")["disagree"] == 0


def test_conformance_command_json_and_exit_status(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert main(["conformance", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["conforms"] is True
    summary = data["summary"]
    assert summary["qlinear[reference]"]["backend"]["agree"] >= 30
    assert summary["qlinear[reference]"]["generated"]["disagree"] == 0
    # The other implementations' disagreements are listed, each with its case and detail.
    others = [d for d in data["disagreements"] if d["implementation"] == "onnx.reference"]
    assert others and all(d["case"] and d["detail"] for d in others)
    printed = capsys.readouterr().out
    assert "qlinear agrees with the specification on every case." in printed
    assert "onnx.reference disagrees with the spec" in printed


def test_conformance_command_fails_when_qlinear_disagrees(monkeypatch):
    class Broken:
        @staticmethod
        def quantize(plan, x, scale, zero_point):
            return np.zeros(x.shape, plan.output_type.dtype)

        dequantize = staticmethod(reference.dequantize)

    monkeypatch.setitem(BACKENDS, "broken", Broken)
    assert main(["conformance", "--backend-only", "--no-onnxruntime", "--no-reference"]) == 1


@pytest.mark.parametrize("flag", ["--help"])
def test_command_help(flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["conformance", flag])
    assert exit_info.value.code == 0
    assert "Exit status 0 when qlinear agrees" in capsys.readouterr().out
