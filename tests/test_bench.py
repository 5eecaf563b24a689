"""The benchmark runs end to end on a small size and reports what it measured."""

from __future__ import annotations

import json

from qlinear.bench import run_benchmark
from qlinear.cli import main


def test_run_benchmark_reports_every_case():
    report = run_benchmark(size=4096, threads=1, repeats=1, reference=True, types=("int4", "float8e4m3fn"),
                           granularities=("per-tensor", "blocked 32 last"))
    rows = report["rows"]
    assert [(r["op"], r["type"], r["granularity"]) for r in rows][:2] == [("Q", "int4", "per-tensor"), ("DQ", "int4", "per-tensor")]
    assert len(rows) == 8 and report["copy_bandwidth"] > 0
    for r in rows:
        assert r["qlinear_s"] > 0 and r["floor_s"] > 0 and r["reference_s"] > 0
        assert r["ort_mode"] in ("node", "Q+DQ pair", "unsupported", "not installed")
        # An allocating call holds its output plus small scale copies and per-thread tiles.
        assert r["output_bytes"] <= r["peak_extra_bytes"] <= r["output_bytes"] + r["scale_bytes"] + 256 * 1024
    q_int4 = rows[0]
    assert q_int4["packed"] and q_int4["output_bytes"] == 4096 // 2


def test_bench_command_writes_json(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert main(["bench", "--size", "2048", "--threads", "1", "--repeats", "1", "--types", "uint8",
                 "--granularities", "per-axis last", "--json", str(path)]) == 0
    assert "qlinear/ORT" in capsys.readouterr().out
    report = json.loads(path.read_text())
    assert {r["op"] for r in report["rows"]} == {"Q", "DQ"} and report["threads"] == 1
