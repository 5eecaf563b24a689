"""The command line's shared rules: --version, python -m qlinear, one-line argument errors, --json everywhere."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import resources

import pytest

import qlinear
from qlinear.cli import main

DEMO = resources.files("qlinear.quantize") / "_demo"
SMALL_BENCH = ["bench", "--types", "int8", "--granularities", "per-tensor", "--size", "4096", "--repeats", "1"]


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"qlinear {qlinear.__version__}"


def test_python_dash_m_runs_the_command():
    proc = subprocess.run([sys.executable, "-m", "qlinear", "--version"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == f"qlinear {qlinear.__version__}"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "--threads", "0"], "argument --threads: expected a thread count from 1 to"),
        (["bench", "--threads", "999"], "argument --threads: expected a thread count from 1 to"),
        (["bench", "--repeats", "0"], "argument --repeats: expected a repeat count of at least 1, got 0"),
        (["bench", "--size", "-5"], "argument --size: expected a size of at least 1, got -5"),
        (["bench", "--size", "big"], "argument --size: expected a size (an integer), got 'big'"),
        (["bench", "--granularities", "per-row"], "argument --granularities: expected one of per-tensor, per-axis-0"),
        (["quantize", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["no-such-command"], "invalid choice: 'no-such-command'"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err.count("\n") == 1 and message in err and err.startswith("qlinear")


def test_granularity_names_take_hyphens_and_the_old_spaces(capsys):
    assert main([*SMALL_BENCH[:4], "per-axis-0", "per-axis last", *SMALL_BENCH[5:], "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert {r["granularity"] for r in rows} == {"per-axis 0", "per-axis last"}


def test_json_means_stdout_in_every_subcommand(capsys, tmp_path):
    # bench: --json prints (tables to stderr); --json PATH, the older spelling, and --json-file write files.
    assert main([*SMALL_BENCH, "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["rows"] and "qlinear" in out.err
    assert main([*SMALL_BENCH, "--json", str(tmp_path / "a.json"), "--json-file", str(tmp_path / "b.json")]) == 0
    assert json.loads((tmp_path / "a.json").read_text()) and json.loads((tmp_path / "b.json").read_text())
    assert not (tmp_path / "-").exists()
    capsys.readouterr()
    # inspect and quantize: --json prints the report, --json-file writes it as well.
    model = str(DEMO / "digits_cnn.onnx")
    assert main(["inspect", model, "--json", "--json-file", str(tmp_path / "i.json")]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads((tmp_path / "i.json").read_text())
    argv = ["quantize", model, "-o", str(tmp_path / "q.onnx"), "--calibration", str(DEMO / "digits_calibration.npz")]
    assert main([*argv, "--no-promote", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"]["output"] == str(tmp_path / "q.onnx")


def test_a_missing_optional_dependency_names_what_to_install(monkeypatch):
    # Stand in for an environment without PyTorch: importing qlinear.torch says which extra to install.
    for name in [m for m in sys.modules if m == "qlinear.torch" or m.startswith("qlinear.torch.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match=r"qlinear.torch needs PyTorch: pip install 'qlinear\[torch\]'"):
        import qlinear.torch  # noqa: F401


def test_tables_at_80_columns_fold_rather_than_cut(tmp_path):
    import io

    from rich.console import Console

    from qlinear.cli._inspect import _print
    from qlinear.onnx import load
    from qlinear.onnx._inspect import inspect_model
    from qlinear.quantize import quantize_model
    from qlinear.quantize._report_print import print_report

    result = quantize_model(str(DEMO / "digits_cnn.onnx"), tmp_path / "q.onnx", str(DEMO / "digits_calibration.npz"))
    for show in (
        lambda c: print_report(result.report, c, analysis=True),
        lambda c: _print(c, inspect_model(load(tmp_path / "q.onnx"))),
    ):
        out = io.StringIO()
        show(Console(file=out, width=80))
        text = out.getvalue()
        assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
        assert "conv1" in text  # node names stay readable


def test_degraded_nodes_table_keeps_node_names_beside_long_kernel_names(tmp_path):
    import io
    from dataclasses import replace

    from rich.console import Console

    from qlinear.quantize import quantize_model
    from qlinear.quantize._report_print import print_report

    result = quantize_model(str(DEMO / "digits_cnn.onnx"), tmp_path / "q.onnx", str(DEMO / "digits_calibration.npz"))
    # As on a transformer: MatMuls run as ORT's longest kernel name.
    nodes = [replace(n, name=f"block{i}_fc1", runs_as="MatMulIntegerToFloat") for i, n in enumerate(result.report.nodes)]
    out = io.StringIO()
    print_report(replace(result.report, nodes=nodes), Console(file=out, width=80))
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80
    for n in nodes:
        assert any(n.name in line and "MatMulIntegerToFloat" in line for line in lines), n.name
