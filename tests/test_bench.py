"""The benchmark runs end to end on a small size and reports what it measured; so do the start-up figures."""

from __future__ import annotations

import json
import os

import pytest

from qlinear.bench import _startup, run_benchmark, run_ort_pairs, run_store_pairs
from qlinear.cli import main


def test_run_benchmark_reports_every_case():
    report = run_benchmark(
        size=4096,
        threads=1,
        repeats=1,
        reference=True,
        types=("int4", "float8e4m3fn"),
        granularities=("per-tensor", "blocked 32 last"),
    )
    rows = report["rows"]
    assert [(r["op"], r["type"], r["granularity"]) for r in rows][:2] == [
        ("Q", "int4", "per-tensor"),
        ("DQ", "int4", "per-tensor"),
    ]
    assert len(rows) == 8 and report["copy_bandwidth"] > 0
    for r in rows:
        assert r["qlinear_s"] > 0 and r["qlinear_plain_s"] > 0 and r["floor_s"] > 0 and r["reference_s"] > 0
        # A copy is timed before each type and granularity; the floor takes their median.
        assert r["floor_s"] == pytest.approx(r["bytes_moved"] / report["copy_bandwidth"])
        low, high = report["copy_bandwidth_range"]
        assert low <= r["copy_bandwidth"] <= high and low <= report["copy_bandwidth"] <= high
        assert r["ort_mode"] in ("node", "Q+DQ pair", "unsupported", "not installed")
        # An allocating call holds its output plus small scale copies and per-thread tiles.
        assert r["output_bytes"] <= r["peak_extra_bytes"] <= r["output_bytes"] + r["scale_bytes"] + 256 * 1024
    q_int4 = rows[0]
    assert q_int4["packed"] and q_int4["output_bytes"] == 4096 // 2


def test_run_benchmark_with_float16_x():
    # x, the scale and DequantizeLinear's result in float16: half the bytes
    # of x to move, and ONNX Runtime's node takes float16 too.
    report = run_benchmark(
        size=4096, threads=1, repeats=1, reference=True, types=("int8",), granularities=("per-tensor",), x_dtype="float16"
    )
    q, dq = report["rows"]
    assert report["x_dtype"] == "float16"
    assert q["bytes_moved"] == 4096 * 2 + 4096 + 2 + 1  # x, codes, one float16 scale, one zero point
    assert q["ort_mode"] == dq["ort_mode"] == "node" and q["reference_s"] > 0
    assert dq["output_bytes"] == 4096 * 2


def test_bench_command_writes_json(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert (
        main(
            [
                "bench",
                "--size",
                "2048",
                "--threads",
                "1",
                "--repeats",
                "1",
                "--types",
                "uint8",
                "--granularities",
                "per-axis last",
                "--json",
                str(path),
            ]
        )
        == 0
    )
    assert "qlinear/ORT" in capsys.readouterr().out
    report = json.loads(path.read_text())
    assert {r["op"] for r in report["rows"]} == {"Q", "DQ"} and report["threads"] == 1


def test_startup_child_reports_first_calls():
    small = _startup.run_child("auto", _startup.SMALL)
    assert not small["numba_loaded"] and small["numba_import_s"] == 0
    assert 0 < small["import_s"] and 0 < small["q_s"] and 0 < small["dq_s"]
    # The cpu kernels' first calls: a cache load here, or one compile of the
    # uint8 per-tensor specializations on a fresh checkout.
    large = _startup.run_child("cpu", _startup.LARGE, import_numba=True)
    assert large["numba_loaded"] and large["numba_import_s"] > 0 and large["q_s"] > 0


def test_bench_startup_command_writes_json(tmp_path, capsys, monkeypatch):
    children = []

    def fake_child(backend, size, *, import_numba=False, env=None):
        cache = (env or {}).get("NUMBA_CACHE_DIR")
        children.append((backend, size, import_numba, cache is not None and not os.listdir(cache)))
        return {
            "import_s": 0.1,
            "numba_import_s": 0.2 if import_numba else 0.0,
            "q_s": 9.0 if cache else 0.3,
            "dq_s": 4.0 if cache else 0.02,
            "numba_loaded": backend == "cpu",
        }

    monkeypatch.setattr(_startup, "run_child", fake_child)
    monkeypatch.setattr(_startup, "_import_wall", lambda: 0.25)
    path = tmp_path / "startup.json"
    assert main(["bench", "--startup", "--repeats", "2", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "qlinear start-up" in out and "numba imported: no" in out
    # Two of each timed step, one warm-up, one cold run on an empty cache.
    assert children == [("auto", _startup.SMALL, False, False)] * 2 + [("cpu", _startup.LARGE, False, False)] + [
        ("cpu", _startup.LARGE, True, False)
    ] * 2 + [("cpu", _startup.LARGE, False, True)]
    steps = {s["step"]: s["seconds"] for s in json.loads(path.read_text())["startup"]["steps"]}
    assert steps == pytest.approx(
        {
            "import qlinear": 0.25,
            "first call, small (auto)": 0.3,
            "first call on numba, warm cache": 0.5,
            "cold compile, first Q": 9.0,
            "cold compile, first DQ": 4.0,
        }
    )


def test_store_pairs_time_both_ways_and_restore_the_threshold(tmp_path, capsys):
    from qlinear.kernels.cpu import _lines

    report = run_store_pairs(size=8192, threads=1, pairs=3, types=("uint8", "int4"), granularities=("blocked 32 last",))
    assert [(r["op"], r["type"]) for r in report["rows"]] == [("Q", "uint8"), ("DQ", "uint8"), ("Q", "int4"), ("DQ", "int4")]
    for r in report["rows"]:
        assert r["streamed_s"] > 0 and r["plain_s"] > 0 and r["ratio_q1"] <= r["ratio"] <= r["ratio_q3"]
    assert _lines.STREAM_MIN_BYTES is None
    path = tmp_path / "stores.json"
    args = ["bench", "--stores", "--size", "4096", "--threads", "1", "--repeats", "2", "--types", "int8"]
    assert main([*args, "--granularities", "per-tensor", "--json", str(path)]) == 0
    assert "streamed/plain" in capsys.readouterr().out
    assert [r["op"] for r in json.loads(path.read_text())["rows"]] == ["Q", "DQ"]


def test_paired_ratio_alternates_the_order_of_each_pair():
    from qlinear.bench._measure import paired_ratio

    prepared, called = [], []
    measured = paired_ratio(lambda: called.append(0), lambda: called.append(1), 3, settle_s=0, calls=2, prepare=prepared.append)
    assert prepared == [0, 1, 1, 0, 0, 1]  # first then second, then second then first, ...
    assert called == [0] * 3 + [1] * 3 + [1] * 3 + [0] * 3 + [0] * 3 + [1] * 3  # a warm-up and two timed calls a side
    assert measured["first_s"] > 0 and measured["second_s"] > 0
    assert measured["ratio_q1"] <= measured["ratio"] <= measured["ratio_q3"]


def test_ort_pairs_time_qlinear_against_onnx_runtime(tmp_path, capsys):
    types = ("uint8", "int4", "float8e4m3fn", "float4e2m1")
    report = run_ort_pairs(size=8192, threads=1, pairs=2, types=types, granularities=("per-tensor",))
    rows = {(r["op"], r["type"]): r for r in report["rows"]}
    # ONNX Runtime takes float8e4m3fn codes from numpy only as its own Q's
    # output: its DQ is timed as a pair, against qlinear's Q then DQ.
    assert list(rows) == [
        ("Q", "uint8"),
        ("DQ", "uint8"),
        ("Q+DQ", "int4"),
        ("Q", "float8e4m3fn"),
        ("Q+DQ", "float8e4m3fn"),
        ("Q", "float4e2m1"),
        ("DQ", "float4e2m1"),
    ]
    for key in (("Q", "uint8"), ("DQ", "uint8"), ("Q+DQ", "int4"), ("Q", "float8e4m3fn"), ("Q+DQ", "float8e4m3fn")):
        r = rows[key]
        assert r["ort_mode"] == ("Q+DQ pair" if key[0] == "Q+DQ" else "node")
        assert r["qlinear_s"] > 0 and r["ort_s"] > 0 and r["ratio_q1"] <= r["ratio"] <= r["ratio_q3"]
    assert rows[("Q", "float4e2m1")]["ort_mode"] == "unsupported" and rows[("Q", "float4e2m1")]["ratio"] is None
    path = tmp_path / "pairs.json"
    args = ["bench", "--ort-pairs", "--size", "4096", "--threads", "1", "--repeats", "2", "--types", "int8"]
    assert main([*args, "--granularities", "per-tensor", "--json", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "qlinear/ORT" in printed
    written = json.loads(path.read_text())
    assert [r["op"] for r in written["rows"]] == ["Q", "DQ"]
    # The table and the JSON name the processor that gave the figures.
    assert printed.startswith("CPU: ") and written["machine"]["cpu"] in printed.splitlines()[0]


def test_the_machine_is_described_by_its_name_and_the_vector_features_llvm_targets(monkeypatch):
    from llvmlite import binding

    from qlinear.bench._machine import VECTOR_FEATURES, machine, machine_line

    host = binding.get_host_cpu_features()
    described = machine()
    assert described["llvm_cpu"] == binding.get_host_cpu_name()
    assert described["vector_features"] == [name for name in VECTOR_FEATURES if host.get(name, False)]
    assert described["logical_cpus"] >= 1 and described["cpu"]
    line = machine_line(described)
    assert line.startswith(f"CPU: {described['cpu']} (") and described["llvm_cpu"] in line
    assert all(name in line for name in described["vector_features"])
    # A numba told to compile for other features says so beside them.
    monkeypatch.setattr("numba.core.config.CPU_FEATURES", "-avx512f")
    assert machine()["numba_features_override"] == "-avx512f"
    assert line != machine_line() and machine_line().endswith("NUMBA_CPU_FEATURES=-avx512f)")
