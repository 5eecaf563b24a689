"""The HTML report: self-contained, every node in its chart and sortable table, and drawn by a real browser offline."""

from __future__ import annotations

import html
import io
import json
import os
import re
import shutil
import subprocess
from dataclasses import replace
from importlib import resources

import numpy as np
import pytest

import qlinear.quantize as qq
from qlinear.cli import main
from qlinear.quantize._html import render_html
from quantize_models import audio_front_end, layernorm_attention

DEMO = resources.files("qlinear.quantize") / "_demo"
MODEL, CALIBRATION, EVAL = str(DEMO / "digits_cnn.onnx"), str(DEMO / "digits_calibration.npz"), str(DEMO / "digits_eval.npz")
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


@pytest.fixture(scope="module")
def report():
    # int2 weights: the target promotes nodes, so the page shows promotions too.
    return qq.quantize_model(MODEL, None, CALIBRATION, eval=EVAL, labels="label", weights="int2").report


def test_page_is_self_contained_with_every_node(report):
    page = render_html(report)
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    # Nothing is fetched: no script, style or image from elsewhere.
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=\"(https?:)?//", page)
    assert "Plotly.newPlot" in page and len(page) > 1_000_000  # the chart library inlined
    table = page[page.index('id="node-table"') :]
    for node in report.analysis:
        assert f"<td>{node.name}</td>" in table
    assert table.count("<tr>") == len(report.analysis) + 1
    assert "Promotions, most sensitive node first" in page and "--weights int2" in page
    # A search told the nodes' costs says its order and each step's predicted cost in float.
    steps = [replace(s, predicted_cost=-0.0412) for s in report.promotions.steps]
    costed = render_html(replace(report, promotions=replace(report.promotions, steps=steps, order="cost")))
    assert "Promotions, cheapest for the noise they remove first" in costed and "<th>predicted cost</th>" in costed
    assert '<td class="num">-4.1%</td>' in costed and '<td class="num">-</td></tr>' in page
    from rich.console import Console

    from qlinear.quantize._report_print import print_report

    out = io.StringIO()
    print_report(replace(report, promotions=replace(report.promotions, steps=steps, order="cost")), Console(file=out, width=200))
    assert "promotions (cheapest for the noise they remove first)" in out.getvalue() and "-4.1%" in out.getvalue()
    assert report.analysis and "The sensitivity was not measured" not in page
    # Names are escaped.
    assert "<script>alert(1)</script>" not in render_html(_first_named(report, "<script>alert(1)</script>"))


def test_page_shows_the_fine_tuning_and_repeats_it():
    pytest.importorskip("torch")
    tuned = qq.quantize_model(
        MODEL, None, CALIBRATION, eval=EVAL, weights="int4", granularity="blocked", promote=False, finetune=20
    ).report
    page = render_html(tuned)
    f = tuned.finetune
    assert "<th>fine-tuned</th>" in page and f"{f.steps} steps" in page
    assert "--finetune 20" in page
    # No step searched: the nodes' sensitivity was not measured, and the page says why.
    assert tuned.analysis == [] and "The sensitivity was not measured: the search took no step (analyze=True, --analyze" in page


def test_without_an_analysis_the_table_keeps_the_nodes_now_float(report):
    # No step searched: the rows come from the nodes as written, and the requested nodes now float follow them.
    from qlinear.quantize._report_schema import LeftFloat
    from qlinear.quantize._speed import FASTER_IN_FLOAT

    faster = LeftFloat("conv_faster", "Conv", FASTER_IN_FLOAT.why)
    bare = replace(report, analysis=[], left_float=[*report.left_float, faster])
    table = render_html(bare)[render_html(bare).index('id="node-table"') :]
    assert all(f"<td>{n.name}</td>" in table for n in report.nodes)
    assert "<td>conv_faster</td>" in table and "float (faster)" in table


def test_page_lists_the_nodes_left_float_and_why():
    model, data = audio_front_end()
    page = render_html(qq.quantize_model(model, None, data, exclude=["Gemm"]).report)
    section = page[page.index("<h2>Left float</h2>") :]
    section = section[: section.index("</table>")]
    assert "<td>mel</td>" in section and "output reaches a Log" in section
    assert "<td>classifier</td><td>Gemm</td><td>excluded</td>" in section


def test_page_names_the_tables_stored_wider_than_asked():
    model, data = layernorm_attention()
    page = render_html(qq.quantize_model(model, None, data, weights="int4", promote=False).report)
    assert "<tr><th>weights widened</th><td>embed int4 → int8 (ONNX Runtime gathers 8-bit codes" in page


def test_report_command_renders_a_saved_report(tmp_path, capsys):
    saved = tmp_path / "r.json"
    assert (
        main(["quantize", MODEL, "-o", str(tmp_path / "q.onnx"), "--calibration", CALIBRATION, "--report", str(saved), "--quiet"])
        == 0
    )
    assert main(["report", str(saved), "-o", str(tmp_path / "r.html")]) == 0
    assert "Every node (click a column to sort)" in (tmp_path / "r.html").read_text()
    # --report with .html writes the page directly.
    assert (
        main(
            [
                "quantize",
                MODEL,
                "-o",
                str(tmp_path / "q.onnx"),
                "--calibration",
                CALIBRATION,
                "--report",
                str(tmp_path / "d.html"),
                "--quiet",
            ]
        )
        == 0
    )
    assert (tmp_path / "d.html").read_text().startswith("<!doctype html>")
    # Bad input: one line, exit 2, nothing written.
    (tmp_path / "bad.json").write_text('{"model": 1}')
    assert main(["report", str(tmp_path / "bad.json"), "-o", str(tmp_path / "bad.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a qlinear quantize report" in err and not (tmp_path / "bad.html").exists()


@pytest.fixture(scope="module")
def chromium():
    """Debian's chromium; installed with apt-get where it is missing and this process may (QLINEAR_NO_BROWSER_INSTALL=1: never)."""
    found = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if found is None and os.environ.get("QLINEAR_NO_BROWSER_INSTALL") != "1" and shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], capture_output=True, timeout=900, check=False, env=env)
        found = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if found is None:
        pytest.skip(
            "no Chromium here and it cannot be installed (apt-get needs root); the page is checked without a browser above"
        )
    return found


def _chromium(browser: str, page: str, *flags: str) -> subprocess.CompletedProcess:
    # A proxy that refuses every connection: any fetch the page tried would fail and be logged.
    return subprocess.run(
        [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--proxy-server=127.0.0.1:9", "--enable-logging=stderr",
         "--v=0", "--virtual-time-budget=5000", *flags, f"file://{page}"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_page_draws_in_chromium_offline(report, chromium, tmp_path):
    page = tmp_path / "report.html"
    page.write_text(render_html(report))
    dom = _chromium(chromium, str(page), "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line or "net::ERR" in line]
    assert console == []  # no script error, no failed fetch
    # plotly drew the chart: its SVG, one bar a node, and the node table.
    assert dom.stdout.count('class="main-svg"') >= 2
    bars = re.findall(r'<g class="point"><path d="M[^"]+"', dom.stdout)
    assert len(bars) >= len(report.analysis)
    shot = tmp_path / "report.png"
    result = _chromium(chromium, str(page), "--window-size=1400,1800", f"--screenshot={shot}")
    assert result.returncode == 0 and shot.stat().st_size > 50_000
    if os.environ.get("QLINEAR_SCREENSHOT_DIR"):  # for a reader to look at
        shutil.copy(shot, os.environ["QLINEAR_SCREENSHOT_DIR"])


def test_a_report_saved_before_the_decision_and_the_batches_timed_still_renders(report):
    # Saved by an earlier qlinear: one timed batch as an object, no decision, trade-off, interval or target text.
    from rich.console import Console

    from qlinear.quantize._report_print import print_report

    saved = json.loads(report.to_json())  # the JSON as an earlier qlinear wrote it
    for key in ("decision", "tradeoff", "float_where_faster"):
        saved.pop(key)
    saved["latency_ms"] = {"before": 2.0, "after": 1.5, "batch": 16}
    saved["output"].pop("top1_agreement_interval")
    saved["promotions"]["target"].pop("text")
    old = qq.Report.from_json(json.dumps(saved))
    page = render_html(old)
    assert "2.000 ms → 1.500 ms a batch of 16 (0.75x" in page and "top-1 agreement ≥ 99.00%" in page
    printed = io.StringIO()
    print_report(old, Console(file=printed, width=200))
    assert "2.000 ms -> 1.500 ms a batch of 16 (0.75x" in printed.getvalue()


def test_the_settings_line_is_the_whole_command_with_its_data(tmp_path):
    out, saved = tmp_path / "q.onnx", tmp_path / "r.json"
    argv = ["quantize", MODEL, "-o", str(out), "--calibration", CALIBRATION, "--eval", EVAL, "--labels", "label",
            "--weights", "int4", "--report", str(saved), "--quiet"]  # fmt: skip
    assert main(argv) in (0, 1)
    page = render_html(qq.Report.from_json(saved.read_text()))
    command = html.unescape(re.search(r"<th>settings</th><td><code>(.*?)</code>", page).group(1))
    assert command.startswith(f"qlinear quantize {MODEL} -o {out} ")
    assert f"--calibration {CALIBRATION} --eval {EVAL} --labels label" in command and "--weights int4" in command
    # Data given as arrays in Python: a placeholder where the file goes.
    r = qq.quantize_model(MODEL, None, dict(np.load(CALIBRATION)), promote=False).report
    assert r.data_flags == ["--calibration", "CALIBRATION.npz"]


def test_long_node_names_show_their_ends_on_the_axis_and_whole_on_hover(report):
    name = "/model/backbone/stage3/block7/depthwise_separable/conv_bank.17/Conv"
    long = _first_named(report, name)
    page = render_html(long)
    start = page.index('"ticktext":[') + len('"ticktext":')
    ticks = json.JSONDecoder().raw_decode(page[start:])[0]  # the chart's axis labels, as plotly wrote them
    assert ticks[0] == "…" + name[-23:] and len(ticks[0]) == 24 and ticks[1:] == [n.name for n in long.analysis[1:]]
    assert name in page  # whole, in the hover and the node table


def _first_named(report: qq.Report, name: str) -> qq.Report:
    """``report`` with its first node (in the node list and the analysis) named ``name``."""
    nodes = [replace(report.nodes[0], name=name), *report.nodes[1:]]
    return replace(report, nodes=nodes, analysis=[replace(report.analysis[0], name=name), *report.analysis[1:]])


def test_the_page_names_the_runtime_the_model_was_placed_for(report):
    assert "<h2>On ONNX Runtime</h2>" in render_html(report) and "latency (ONNX Runtime)" in render_html(report)
    placed = qq.quantize_model(MODEL, None, CALIBRATION, eval=EVAL, labels="label", target="openvino", promote=False)
    page = render_html(placed.report)
    assert "<h2>On OpenVINO</h2>" in page and "latency (OpenVINO)" in page and "ONNX Runtime" not in page
