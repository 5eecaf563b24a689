"""`qlinear quantize`: the demo from a fresh process, and every class of bad input met with one line and exit 2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import resources

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import qlinear.onnx as qo
from qlinear.cli import main
from quantize_models import single_op

DEMO = resources.files("qlinear.quantize") / "_demo"
MODEL, CALIBRATION = str(DEMO / "digits_cnn.onnx"), str(DEMO / "digits_calibration.npz")


def test_demo_runs_and_writes_model_and_report(tmp_path):
    out, report = tmp_path / "demo.onnx", tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "qlinear.cli", "quantize", "--demo", "-o", str(out), "--report", str(report)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "top-1 agreement" in proc.stdout and "accuracy" in proc.stdout and "QLinearConv" in proc.stdout
    r = json.loads(report.read_text())
    assert r["output"]["accuracy"]["after"] > 0.98 and out.exists()


def test_json_prints_the_report_on_stdout(tmp_path, capsys):
    assert main(["quantize", MODEL, "-o", str(tmp_path / "q.onnx"), "--calibration", CALIBRATION, "--json", "--quiet"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["settings"]["weights"] == "int8" and len(r["nodes"]) == 4


def _fails(argv, capsys, message, out_path):
    status = main(argv)
    err = capsys.readouterr().err.strip()
    assert status == 2
    assert len(err.splitlines()) == 1 and err.startswith("qlinear quantize: ") and message in err, err
    assert "quantize: quantize:" not in err
    assert not os.path.exists(out_path)
    folder = os.path.dirname(out_path) or "."
    assert not os.path.isdir(folder) or not [p for p in os.listdir(folder) if p.startswith(".")]  # no temporary left


def test_bad_model_files(tmp_path, capsys):
    out = str(tmp_path / "q.onnx")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not an onnx model")
    _fails(["quantize", str(junk), "-o", out, "--calibration", CALIBRATION], capsys, "truncated or corrupt", out)
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(open(MODEL, "rb").read()[:3000])
    _fails(["quantize", str(cut), "-o", out, "--calibration", CALIBRATION], capsys, "truncated or corrupt", out)
    _fails(["quantize", str(tmp_path / "missing.onnx"), "-o", out, "--calibration", CALIBRATION], capsys, "cannot read", out)


def test_model_with_nothing_to_quantize(tmp_path, capsys):
    g = qo.Graph("relu_only", opset=17)
    g.output(g.op("Relu", [g.input("x", "float", ("N", 4))], name="r", output_names=["y"]))
    path = tmp_path / "relu.onnx"
    g.save(str(path))
    out = str(tmp_path / "q.onnx")
    _fails(["quantize", str(path), "-o", out, "--calibrate-random", "8"], capsys, "nothing to quantize", out)
    # A model quantized already (ONNX Runtime's dynamic quantization: its inputs quantized as it runs, integer MatMuls)
    # has nothing left to quantize either: the line says so, and what to give instead.
    g = qo.Graph("dynamic", opset=17)
    x = g.input("x", "float", ("N", 4))
    codes, scale, zero = g.op("DynamicQuantizeLinear", [x], output_names=["codes", "scale", "zero"])
    w = np.arange(-6, 6, dtype=np.int8).reshape(4, 3)
    product = g.op("MatMulInteger", [codes, w, zero, np.int8(0)])
    g.output(g.op("Mul", [g.op("Cast", [product], to=1), scale], output_names=["y"]))
    g.save(str(path))
    _fails(
        ["quantize", str(path), "-o", out, "--calibrate-random", "8"], capsys,
        "it is quantized already (1 DynamicQuantizeLinear, 1 MatMulInteger): quantize the float model it was made from", out,
    )  # fmt: skip
    # Every layer in the branches of an If (an export that picks its weights by a flag): none in the main graph.
    branch = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["b"])], "branch", [], [helper.make_tensor_value_info("b", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.ones((4, 3), np.float32), "w")],
    )  # fmt: skip
    g = qo.Graph("chooses", opset=17)
    g.input("x", "float", ("N", 4))
    flag = g.input("flag", "bool", ())
    g.output(g.op("If", [flag], then_branch=branch, else_branch=branch, output_names=["y"]))
    g.save(str(path))
    _fails(["quantize", str(path), "-o", out, "--calibrate-random", "8"], capsys,
           "in its main graph; its compute nodes (2 MatMul) lie inside If, Loop or Scan bodies, which stay float", out)  # fmt: skip


def test_calibration_that_does_not_fit(tmp_path, capsys):
    out = str(tmp_path / "q.onnx")
    images = np.load(CALIBRATION)["image"]
    for arrays, message in (
        ({"pixels": images}, "no array for model input 'image'"),
        ({"image": images.astype(np.float16)}, "dtype float16, expected float32"),
        ({"image": images[:, 0]}, "expected (samples, 1, 8, 8)"),
    ):
        path = tmp_path / "cal.npz"
        np.savez(path, **arrays)
        _fails(["quantize", MODEL, "-o", out, "--calibration", str(path)], capsys, message, out)
    (tmp_path / "bad.npz").write_bytes(b"nope")
    _fails(["quantize", MODEL, "-o", out, "--calibration", str(tmp_path / "bad.npz")], capsys, "cannot be read as an .npz", out)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--weights", "int3"], "weights must be one of int8"),
        (["--activations", "uint4"], "activations must be one of"),
        (["--method", "kl"], "method must be one of minmax"),
        (["--granularity", "per-row"], "granularity must be one of"),
        (["--opset", "11"], "opset 11 cannot hold the chosen types; they need opset >= 13"),
        (["--weights", "int4", "--opset", "19"], "they need opset >= 21"),
    ],
)
def test_unknown_type_method_granularity(tmp_path, capsys, flags, message):
    out = str(tmp_path / "q.onnx")
    _fails(["quantize", MODEL, "-o", out, "--calibration", CALIBRATION, *flags], capsys, message, out)


def test_output_paths(tmp_path, capsys):
    _fails(
        ["quantize", MODEL, "-o", str(tmp_path / "no" / "such" / "q.onnx"), "--calibration", CALIBRATION],
        capsys,
        "does not exist",
        str(tmp_path / "no" / "such" / "q.onnx"),
    )
    model, _ = single_op("Gemm")
    path = tmp_path / "m.onnx"
    qo.save(model, str(path))
    before = path.read_bytes()
    assert main(["quantize", str(path), "-o", str(path), "--calibrate-random", "8"]) == 2
    assert "is the input model" in capsys.readouterr().err and path.read_bytes() == before
    locked = tmp_path / "locked"
    locked.mkdir()
    os.chmod(locked, 0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user whose writes ignore file modes (root without dropped capabilities)")
        _fails(
            ["quantize", MODEL, "-o", str(locked / "q.onnx"), "--calibration", CALIBRATION],
            capsys,
            "permission denied",
            str(locked / "q.onnx"),
        )
    finally:
        os.chmod(locked, 0o700)


def test_model_onnx_runtime_cannot_run(tmp_path, capsys):
    # A valid model that fails inside ONNX Runtime on this data (16 values reshaped into rows of 5):
    # the runtime's error becomes one line naming the batch, not a traceback.
    g = qo.Graph("bad_reshape", opset=17)
    x = g.input("x", "float", ("N", 4))
    y = g.op("MatMul", [x, np.ones((4, 2), np.float32)], name="mm")
    g.output(g.op("Reshape", [y, np.array([-1, 5], np.int64)], name="rows_of_5", output_names=["y"]))
    path = tmp_path / "bad.onnx"
    g.save(str(path))
    out = str(tmp_path / "q.onnx")
    cal = tmp_path / "cal.npz"
    np.savez(cal, x=np.ones((8, 4), np.float32))
    status = main(["quantize", str(path), "-o", out, "--calibration", str(cal), "--batch-size", "8"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1 and not os.path.exists(out), err
    # The first pass over the data (SmoothQuant's, then calibration's) is where it fails.
    assert "ONNX Runtime failed on smoothing batch 0:" in err or "ONNX Runtime failed on calibration batch 0:" in err


def test_missed_target_exits_1_with_the_model_written(tmp_path, capsys):
    out = tmp_path / "q.onnx"
    argv = ["quantize", MODEL, "-o", str(out), "--calibration", CALIBRATION, "--target-sqnr", "200", "--max-float", "0"]
    assert main([*argv, "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "target not met (output SQNR >= 200 dB)" in err and out.exists()
    # The line names the flag the user types, not the Python option's name, as the printed warning does.
    assert "--max-float" in err and "max_float" not in err
    assert main(argv) == 1
    printed = " ".join(capsys.readouterr().out.split())  # as the console wrapped it
    assert "allow more nodes in float (--max-float)" in printed and "max_float" not in printed


def test_analyze_prints_every_nodes_sensitivity(tmp_path, capsys):
    argv = ["quantize", MODEL, "-o", str(tmp_path / "q.onnx"), "--calibration", CALIBRATION, "--analyze", "--no-promote"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "sensitivity" in printed and all(name in printed for name in ("conv1", "conv2", "fc1", "fc2"))
    assert not re.search(r"^target ", printed, re.MULTILINE)  # --no-promote: no target row


def test_bias_correction_flag_reaches_every_layer(tmp_path, capsys):
    argv = ["quantize", MODEL, "-o", str(tmp_path / "q.onnx"), "--calibration", CALIBRATION, "--bias-correction"]
    assert main([*argv, "--json", "--quiet", "--no-promote", "--weights", "int4"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["settings"]["bias_correction"] and all(n["bias_corrected"] and n["bias_int32"] for n in r["nodes"])


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--finetune", "-1"], "qlinear quantize: --finetune must be an int >= 0 (training steps), got -1"),
        (["--awq"], "qlinear quantize: --awq scales weight-only layers"),
        (["--calibrate-random", "8"], "give calibration data or --calibrate-random, not both"),
        (["--weights", "int3"], "qlinear quantize: --weights must be one of int8,"),
        (
            ["--latency-budget", "0.8", "--no-promote"],
            "--latency-budget needs promotion (it picks the promotions); drop --no-promote",
        ),
        (["--target-metric", "3"], "qlinear quantize: --target-metric is a value of a metric: give --metric too"),
        (["--resume", "nosuch.npz"], "qlinear quantize: --resume nosuch.npz cannot be read as calibration statistics"),
        (["--max-float", "0.5", "--no-promote"], "qlinear quantize: --max-float needs promotion (it bounds the nodes promoted"),
    ],
)
def test_errors_name_the_flags_the_user_typed(tmp_path, capsys, flags, said):
    # The library's messages name its keywords (calibrate_random); the command's name its flags.
    argv = ["quantize", MODEL, "-o", str(tmp_path / "q.onnx"), "--calibration", CALIBRATION, "--quiet", *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert said in err and "calibrate_random" not in err and not (tmp_path / "q.onnx").exists()


def test_an_html_report_without_plotly_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    import importlib.util

    from qlinear.cli import _quantize as cli_quantize

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "plotly" else find_spec(name, *a))
    monkeypatch.setattr(cli_quantize, "quantize_model", lambda *a, **k: pytest.fail("the job ran"))
    argv = ["quantize", MODEL, "-o", str(tmp_path / "q.onnx"), "--calibration", CALIBRATION, "--report", str(tmp_path / "r.html")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "plotly" in err and "pip install 'qlinear[report]'" in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_the_demo_writes_into_a_temporary_folder_not_the_current_one(tmp_path, monkeypatch):
    import tempfile

    from qlinear.cli import _quantize as cli_quantize

    written = []
    monkeypatch.setattr(cli_quantize, "quantize_model", lambda model, output, *a, **k: written.append(output) or 1 / 0)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    with pytest.raises(ZeroDivisionError):
        main(["quantize", "--demo", "--quiet"])
    assert written == [str(tmp_path / "tmp" / "qlinear-demo" / "digits_resized_cnn.qdq.onnx")]
    assert list((tmp_path / "here").iterdir()) == []


@pytest.mark.parametrize("flag", ["--report", "--json-file"])
def test_a_report_into_a_missing_folder_is_refused_before_any_work(tmp_path, capsys, monkeypatch, flag):
    from qlinear.cli import _quantize as cli_quantize

    monkeypatch.setattr(cli_quantize, "quantize_model", lambda *a, **k: pytest.fail("the job ran"))
    report = tmp_path / "missing" / "r.json"
    argv = ["quantize", MODEL, "-o", str(tmp_path / "q.onnx"), "--calibration", CALIBRATION, flag, str(report)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"qlinear quantize: {flag} {report} cannot be written: folder {report.parent} does not exist"
    assert list(tmp_path.iterdir()) == []


def test_activations_the_target_cannot_load_are_refused_naming_the_flags(tmp_path, capsys):
    argv = ["quantize", MODEL, "-o", str(tmp_path / "q.onnx"), "--calibration", CALIBRATION, "--activations", "float8e4m3fn"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("qlinear quantize: --activations float8e4m3fn cannot be written around Conv and Gemm for ONNX")
    assert "exclude Conv and Gemm" in err and len(err.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_flag_is_named_by_its_subcommand(capsys):
    with pytest.raises(SystemExit) as e:
        main(["quantize", MODEL, "--bogus"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("qlinear quantize: error: unrecognized arguments: --bogus") and len(err.splitlines()) == 1


def test_ctrl_c_is_one_line_and_leaves_no_file(tmp_path, capsys, monkeypatch):
    import qlinear.quantize._stages as stages

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(stages, "calibrate", interrupted)
    out = tmp_path / "out"
    out.mkdir()
    assert main(["quantize", MODEL, "-o", str(out / "q.onnx"), "--calibration", CALIBRATION, "--quiet"]) == 130
    assert capsys.readouterr().err == "qlinear quantize: interrupted\n"
    assert list(out.iterdir()) == []


def test_a_model_onnx_runtime_cannot_load_is_said_even_when_quiet(tmp_path, capsys):
    out = tmp_path / "f4.onnx"
    argv = ["quantize", MODEL, "-o", str(out), "--calibration", CALIBRATION, "--weights", "float4e2m1", "--activations", "none"]
    assert main([*argv, "--no-promote", "--quiet"]) == 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("qlinear quantize: warning: ONNX Runtime cannot load the quantized model (")
    assert "--weights int8" in err and len(err.splitlines()) == 1 and out.exists()


def test_ctrl_c_while_the_subcommands_import_is_one_line(capsys, monkeypatch):
    import qlinear.cli as cli

    def interrupted(name):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.importlib, "import_module", interrupted)
    assert main(["quantize", "--demo"]) == 130
    assert capsys.readouterr().err == "qlinear: interrupted\n"


def test_the_command_line_is_in_its_own_code_before_numpy_loads():
    # Ctrl-C is one line from main() on; what imports before it (qlinear, qlinear.cli) must be quick, so numpy and the
    # kernels load inside main(), where an interrupt is caught (they took 0.27 s of an interrupt's window before).
    code = "import sys, qlinear.cli; assert 'numpy' not in sys.modules, sorted(m for m in sys.modules if 'numpy' in m)"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_console_script_ignores_ctrl_c_once_the_run_has_ended(monkeypatch):
    import signal

    import qlinear.cli as cli

    before = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(cli, "main", lambda: 1)
    try:
        with pytest.raises(SystemExit) as e:
            cli.command()
        assert e.value.code == 1 and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_report_of_a_file_that_is_not_json_text_is_one_line(tmp_path, capsys):
    stats = tmp_path / "calib.npz"
    np.savez(stats, x=np.zeros(4, np.float32))
    assert main(["report", str(stats), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert "is not a report" in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "r.html").exists()


def test_sigterm_is_one_line_and_leaves_no_file(tmp_path, capsys, monkeypatch):
    import signal

    import qlinear.quantize._stages as stages

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler stops a job
        raise AssertionError("SIGTERM did not stop the run")

    monkeypatch.setattr(stages, "calibrate", terminated)
    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "out"
    out.mkdir()
    assert main(["quantize", MODEL, "-o", str(out / "q.onnx"), "--calibration", CALIBRATION, "--quiet"]) == 143
    assert capsys.readouterr().err == "qlinear quantize: terminated\n"
    assert list(out.iterdir()) == [] and signal.getsignal(signal.SIGTERM) == before


def test_a_full_disk_is_one_line_and_leaves_no_file(tmp_path, capsys, monkeypatch):
    import qlinear.quantize._execution as execution

    def full(model, path):
        path.write_bytes(b"part of a model")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(execution, "save", full)
    out = tmp_path / "out"
    out.mkdir()
    assert main(["quantize", MODEL, "-o", str(out / "q.onnx"), "--calibration", CALIBRATION, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"qlinear quantize: output {out / 'q.onnx'} cannot be written: No space left on device"
    assert list(out.iterdir()) == []


def _digest(path) -> str:
    import hashlib

    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_an_output_folder_removed_during_the_run_is_one_line_and_the_input_untouched(tmp_path, capsys, monkeypatch):
    import shutil

    import qlinear.quantize._stages as stages

    calibrate = stages.calibrate
    out = tmp_path / "out"
    out.mkdir()

    def folder_removed(*args, **kwargs):  # as a cleanup job or the user removes the folder while the run works
        shutil.rmtree(out)
        return calibrate(*args, **kwargs)

    monkeypatch.setattr(stages, "calibrate", folder_removed)
    model = tmp_path / "model.onnx"
    shutil.copy(MODEL, model)
    before = _digest(model)
    argv = ["quantize", str(model), "-o", str(out / "q.onnx"), "--calibration", CALIBRATION, "--quiet", "--no-promote"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"qlinear quantize: output {out / 'q.onnx'} cannot be written: ") and len(err.splitlines()) == 1
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]
    assert _digest(model) == before
