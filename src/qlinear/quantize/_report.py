"""The report pass: one JSON-able dict of what the quantizer did and measured, and its printed form."""

from __future__ import annotations

import json
import math
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["MOST_DEGRADED", "print_report", "report_json"]

MOST_DEGRADED = 15


def report_json(report: dict[str, Any]) -> str:
    """The report as strict JSON (an infinite SQNR, which no JSON number holds, is written as null)."""
    return json.dumps(_strict(report), indent=2)


def _strict(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def _db(value: float | None) -> str:
    return "exact" if value is None else f"{value:.1f}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def _bytes(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.2f} MiB"


def print_report(report: dict[str, Any], console: Console) -> None:
    """A summary table and the most degraded nodes (at most :data:`MOST_DEGRADED`)."""
    summary = Table(title="qlinear quantize", show_header=False, box=None, pad_edge=False)
    summary.add_column(style="bold")
    summary.add_column()
    size = report["size_bytes"]
    summary.add_row("model", f"{report['model']['input']} -> {report['model']['output']}")
    settings = report["settings"]
    acts = settings["activations"] or "float (weight-only)"
    summary.add_row(
        "types", f"weights {settings['weights']} {settings['granularity']}, activations {acts}, opset {settings['opset']}"
    )
    summary.add_row("size", f"{_bytes(size['before'])} -> {_bytes(size['after'])} ({size['after'] / size['before']:.2f}x)")
    lat = report.get("latency_ms")
    if lat:
        summary.add_row(
            "latency (ORT)",
            f"{lat['before']:.3f} ms -> {lat['after']:.3f} ms a batch of {lat['batch']} ({lat['after'] / lat['before']:.2f}x)",
        )
    out = report["output"]
    summary.add_row("output SQNR", f"{_db(out['sqnr_db'])} dB")
    summary.add_row("top-1 agreement", _share(out["top1_agreement"]))
    if out.get("accuracy"):
        acc = out["accuracy"]
        summary.add_row("accuracy", f"{_share(acc['before'])} -> {_share(acc['after'])}")
    cal = report["calibration"]
    if cal.get("from_stats"):
        summary.add_row("calibration", f"from saved statistics {cal['from_stats']} ({cal['method']})")
    else:
        summary.add_row(
            "calibration",
            f"{cal['method']} on {cal['source']}: {cal['samples']} samples in {cal['batches']} batches, "
            f"{cal['seconds']:.2f} s, peak RSS {_bytes(cal['peak_rss_bytes'])}",
        )
    summary.add_row(
        "evaluation", f"{report['eval']['source']} ({report['eval']['samples']} samples, {report['eval']['backend']})"
    )
    fusion = report["fusion"]
    if fusion["checked"]:
        unfused = fusion["unfused"]
        summary.add_row(
            "fused by ORT",
            f"{len(report['nodes']) - len(unfused)} of {len(report['nodes'])} quantized nodes; {fusion['qdq_nodes_left']} Q/DQ nodes left",
        )
    else:
        summary.add_row("fused by ORT", "not checked (ONNX Runtime cannot load the model's types)")
    console.print(summary)
    for w in report.get("warnings", []):
        console.print(f"[yellow]warning:[/] {w}")
    nodes = sorted(report["nodes"], key=lambda n: math.inf if n["output_sqnr_db"] is None else n["output_sqnr_db"])
    if not nodes:
        return
    table = Table(title=f"most degraded nodes ({min(len(nodes), MOST_DEGRADED)} of {len(nodes)}; SQNR in dB)")
    table.add_column("node", overflow="fold", ratio=1)
    for col in ("op", "weights", "activations", "weight dB", "output dB", "ORT runs as"):
        table.add_column(col, no_wrap=True, justify="right" if col.endswith("dB") else "left")
    for n in nodes[:MOST_DEGRADED]:
        table.add_row(
            n["name"], n["op_type"], n["weight_type"] or "-", n["activation_type"] or "-",
            _db(n["weight_sqnr_db"]), _db(n["output_sqnr_db"]), n["runs_as"] or "-",
        )  # fmt: skip
    console.print(table)
